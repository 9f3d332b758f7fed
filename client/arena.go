package client

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
)

// arenaMap is one arena file mapped read-only, plus a descriptor opened
// read-write for writing reserved slots.
type arenaMap struct {
	path string
	size int64
	ino  uint64
	mem  []byte // PROT_READ, MAP_SHARED
	rw   *os.File

	wonce sync.Once
	wmem  []byte // PROT_READ|PROT_WRITE, MAP_SHARED (WriteMapped), made on first use
	werr  error

	konce   sync.Once
	kmem    []byte // PROT_READ|PROT_WRITE, MAP_SHARED, tagged with writeKey (WriteKeyed), made on first use
	kerr    error
	kfilled []atomic.Bool // per fillChunk of kmem: its page table filled (fill)
	knofill atomic.Bool   // the kernel cannot (before Linux 5.14): writes fault page by page
}

// errNoArenas reports a server that offers no arenas or that this host
// cannot map (the client does not share the sidecar's volume).
func errNoArenas(format string, args ...any) error {
	return &Error{Code: CodeUnavailable, Message: "zero-copy: " + fmt.Sprintf(format, args...)}
}

// mapArenas maps the arenas listed by Hello unless they are mapped
// already; with remap it replaces the current mappings (the server
// restarted and made new files).
func (c *Client) mapArenas(ctx context.Context, remap bool) error {
	z := &c.zc
	if !remap {
		// The common case, without z.mu (every GetInto and PutFrom asks).
		z.rw.RLock()
		mapped := z.arenas != nil && !z.closed
		z.rw.RUnlock()
		if mapped {
			return nil
		}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	z.rw.RLock()
	have, closed := z.arenas != nil, z.closed
	z.rw.RUnlock()
	if closed {
		return errNoArenas("client closed")
	}
	if have && !remap {
		return nil
	}
	h, err := c.Hello(ctx)
	if err != nil {
		return err
	}
	if len(h.Arenas) == 0 {
		return errNoArenas("the server offers no shared arenas")
	}
	if h.LayoutVersion != ArenaLayoutVersion {
		return errNoArenas("arena layout version %d, this client knows %d", h.LayoutVersion, ArenaLayoutVersion)
	}
	if h.Limits != nil && h.Limits.MaxBatch > 0 {
		z.maxBatch.Store(h.Limits.MaxBatch)
	}
	z.commitNext.Store(slices.Contains(h.Features, FeatureCommitNext))
	if remap {
		c.abortQuietly(z.dropSpares()) // reserved in the arenas being replaced
	}
	var out []*arenaMap
	fail := func(err error) error {
		for _, a := range out {
			a.close()
		}
		return err
	}
	for i, ai := range h.Arenas {
		if ai == nil || int(ai.Id) != i || ai.Size <= 0 {
			return fail(errNoArenas("malformed arena list"))
		}
		a, err := openArena(ai.Path, ai.Size)
		if err != nil {
			return fail(errNoArenas("%v (is the arena directory shared with this container?)", err))
		}
		out = append(out, a)
	}
	z.rw.Lock()
	defer z.rw.Unlock()
	if z.closed {
		return fail(errNoArenas("client closed"))
	}
	for _, a := range z.arenas {
		a.close()
	}
	z.arenas = out
	return nil
}

// withArenas maps the arenas if needed and runs fn while they stay mapped.
func (c *Client) withArenas(ctx context.Context, fn func([]*arenaMap) error) error {
	if err := c.mapArenas(ctx, false); err != nil {
		return err
	}
	z := &c.zc
	z.rw.RLock()
	defer z.rw.RUnlock()
	if z.closed || z.arenas == nil {
		return errNoArenas("client closed")
	}
	return fn(z.arenas)
}

func openArena(path string, size int64) (*arenaMap, error) {
	rw, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := rw.Stat()
	if err != nil {
		rw.Close()
		return nil, err
	}
	if st.Size() < size {
		rw.Close()
		return nil, fmt.Errorf("arena %s is %d bytes, Hello says %d", path, st.Size(), size)
	}
	var ino uint64
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = s.Ino
	}
	mem, err := syscall.Mmap(int(rw.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		rw.Close()
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &arenaMap{path: path, size: size, ino: ino, mem: mem, rw: rw}, nil
}

// stale reports whether the file at a.path is no longer the mapped one.
func (a *arenaMap) stale() bool {
	var st syscall.Stat_t
	if err := syscall.Stat(a.path, &st); err != nil {
		return true
	}
	return st.Ino != a.ino
}

func (a *arenaMap) close() {
	if a.wmem != nil {
		_ = syscall.Munmap(a.wmem)
		a.wmem = nil
	}
	if a.kmem != nil {
		_ = syscall.Munmap(a.kmem)
		a.kmem = nil
	}
	if a.mem != nil {
		_ = syscall.Munmap(a.mem)
		a.mem = nil
	}
	if a.rw != nil {
		a.rw.Close()
		a.rw = nil
	}
}

// view returns the read-only bytes of s.
func view(arenas []*arenaMap, s Slot) ([]byte, error) {
	if s.Arena < 0 || int(s.Arena) >= len(arenas) || s.Offset < 0 || s.Length < 0 || s.Offset+s.Length > arenas[s.Arena].size {
		return nil, &Error{Code: CodeInternal, Message: fmt.Sprintf("zero-copy: slot %+v outside the arenas", s)}
	}
	return arenas[s.Arena].mem[s.Offset : s.Offset+s.Length : s.Offset+s.Length], nil
}

// remapIfStale remaps the arenas when a file was replaced (server restart)
// and reports whether it did.
func (c *Client) remapIfStale(ctx context.Context) bool {
	z := &c.zc
	z.rw.RLock()
	stale := false
	for _, a := range z.arenas {
		if a.stale() {
			stale = true
			break
		}
	}
	z.rw.RUnlock()
	return stale && c.mapArenas(ctx, true) == nil
}
