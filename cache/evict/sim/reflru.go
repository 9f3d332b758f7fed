package sim

import (
	"container/list"

	"github.com/tidepool-kv/tidepool/cache/evict"
)

// NewRefLRU returns textbook LRU with no refinements (no depth order, no
// low-priority class): the policy the traces README's reference figures were
// computed with. It exists to reproduce those figures; tiers use evict.NewLRU.
func NewRefLRU() evict.Policy {
	return &refLRU{l: list.New(), m: make(map[uint64]*list.Element)}
}

type refLRU struct {
	l *list.List // front = most recent
	m map[uint64]*list.Element
}

func (r *refLRU) Admit(e evict.Entry) {
	if el, ok := r.m[e.ID]; ok {
		r.l.MoveToFront(el)
		return
	}
	r.m[e.ID] = r.l.PushFront(e.ID)
}

func (r *refLRU) Touch(id uint64) {
	if el, ok := r.m[id]; ok {
		r.l.MoveToFront(el)
	}
}

func (r *refLRU) Remove(id uint64) {
	if el, ok := r.m[id]; ok {
		r.l.Remove(el)
		delete(r.m, id)
	}
}

func (r *refLRU) Victim(skip func(uint64) bool) (uint64, bool) {
	for el := r.l.Back(); el != nil; el = el.Prev() {
		if id := el.Value.(uint64); skip == nil || !skip(id) {
			return id, true
		}
	}
	return 0, false
}

func (r *refLRU) Len() int { return len(r.m) }

var _ evict.Policy = (*refLRU)(nil)
