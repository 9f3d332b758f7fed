package client

import (
	"time"
)

// spareKey groups unbound reservations: a put uses one of its namespace
// and exact size.
type spareKey struct {
	ns   string
	size int64
}

// spareMargin: a spare reservation with less time than this left before
// its deadline is not used (the write and the Commit must land before it).
const spareMargin = 5 * time.Second

// takeSpare returns an unbound reservation of ns for size bytes, if the
// client holds one with time left.
func (z *zeroCopy) takeSpare(ns string, size int64) (Reservation, bool) {
	z.spareMu.Lock()
	defer z.spareMu.Unlock()
	k := spareKey{ns, size}
	list := z.spares[k]
	for len(list) > 0 {
		r := list[len(list)-1]
		list = list[:len(list)-1]
		z.nspares--
		if time.Until(r.Deadline) > spareMargin {
			z.spares[k] = list
			return r, true
		}
		// Too close to its deadline: dropped (the server reclaims it).
	}
	delete(z.spares, k)
	return Reservation{}, false
}

// keepSpare keeps an unbound reservation for a later put; it reports false
// (the caller aborts it) when the client holds enough.
func (z *zeroCopy) keepSpare(ns string, size int64, r Reservation) bool {
	z.spareMu.Lock()
	defer z.spareMu.Unlock()
	if z.nspares >= z.maxSpares {
		return false
	}
	if z.spares == nil {
		z.spares = map[spareKey][]Reservation{}
	}
	k := spareKey{ns, size}
	z.spares[k] = append(z.spares[k], r)
	z.nspares++
	return true
}

// dropSpares forgets every spare reservation and returns their tokens.
func (z *zeroCopy) dropSpares() []int64 {
	z.spareMu.Lock()
	defer z.spareMu.Unlock()
	var tokens []int64
	for _, list := range z.spares {
		for _, r := range list {
			tokens = append(tokens, r.Token)
		}
	}
	z.spares, z.nspares = nil, 0
	return tokens
}
