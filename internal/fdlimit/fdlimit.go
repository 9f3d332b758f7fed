// Package fdlimit keeps the descriptors that clients can make the process
// hold (their connections, the files they pass with SCM_RIGHTS) out of
// the top of the descriptor table, so that the process's own files
// (RocksDB's logs and tables, the metrics listener, peer connections) can
// always be opened.
//
// The kernel gives a new descriptor the lowest free number, and fails with
// EMFILE exactly when no number below RLIMIT_NOFILE's soft limit is free.
// So a descriptor that a client made the process take, numbered N, proves
// that every number below N is taken; a Guard refuses (the caller closes)
// every such descriptor numbered at or above limit − reserve. Then the
// descriptors clients hold have distinct numbers below that ceiling — at
// most limit − reserve of them — and the process keeps reserve numbers
// for itself, whatever the clients do. The check costs a comparison: no
// count of the table.
package fdlimit

import (
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
)

// Raise sets the soft RLIMIT_NOFILE to the hard limit (the Go runtime
// does so too at start; doing it here makes the figure the process logs
// the one it runs under) and returns both.
func Raise() (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("fdlimit: getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		want := lim
		want.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return lim.Cur, lim.Max, fmt.Errorf("fdlimit: setrlimit to %d: %w", lim.Max, err)
		}
		lim = want
	}
	return lim.Cur, lim.Max, nil
}

// Guard refuses client descriptors numbered at or above a ceiling. The
// zero Guard and a nil *Guard admit everything.
type Guard struct {
	ceiling int
	reserve int
	limit   int
	refused atomic.Uint64
}

// New returns a Guard for the current soft RLIMIT_NOFILE that keeps
// reserve descriptors for the process; reserve is lowered to a quarter
// of the limit where the limit is that small, so that clients always get
// some.
func New(reserve int) (*Guard, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil, fmt.Errorf("fdlimit: getrlimit: %w", err)
	}
	limit := int(min(lim.Cur, 1<<30))
	return NewFor(limit, reserve), nil
}

// NewFor returns a Guard for a limit of limit descriptors (New reads it
// from the process).
func NewFor(limit, reserve int) *Guard {
	reserve = max(min(reserve, limit/4), 0)
	return &Guard{ceiling: limit - reserve, reserve: reserve, limit: limit}
}

// Admit reports whether a client may hold descriptor fd; when not, it
// counts a refusal and the caller closes fd at once.
func (g *Guard) Admit(fd int) bool {
	if g == nil || g.ceiling == 0 || fd < g.ceiling {
		return true
	}
	g.refused.Add(1)
	return false
}

// AdmitConn is Admit for an accepted connection's descriptor; a
// connection without one is admitted.
func (g *Guard) AdmitConn(c net.Conn) bool {
	if g == nil {
		return true
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		return true
	}
	return g.Admit(fd)
}

// Stats is what a Guard did and what it guards.
type Stats struct {
	// Limit is the soft RLIMIT_NOFILE the Guard was made for.
	Limit int
	// Reserve is the descriptors kept for the process's own files.
	Reserve int
	// Refused counts client descriptors closed because they would have
	// entered the reserve.
	Refused uint64
}

// Stats returns the counters; zero for a nil Guard.
func (g *Guard) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return Stats{Limit: g.limit, Reserve: g.reserve, Refused: g.refused.Load()}
}
