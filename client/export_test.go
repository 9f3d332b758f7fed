package client

import (
	"bufio"
	"errors"
	"io"
	"time"

	"github.com/tidepool-kv/tidepool/internal/pkey"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/thriftstream"
)

// Queued returns how many GetInto Acquires, PutFrom Reserves and PutFrom
// Commits of c wait behind a call in flight.
func Queued(c *Client) (acquire, reserve, commit int) {
	return c.zc.acquires.queued(), c.zc.reserves.queued(), c.zc.commits.queued()
}

// DecodeAppendGet decodes a Get reply message (header and
// TidepoolGetResult) from stream as AppendGet does, appending the value to
// dst; maxValue is MaxResponseBytes.
func DecodeAppendGet(dst []byte, stream io.Reader, seq int32, maxValue int) (value []byte, found bool, exc *tp.TidepoolError, err error) {
	r := appendGet{dst: dst, base: len(dst), maxValue: maxValue}
	d := thriftstream.Decoder{R: bufio.NewReaderSize(stream, rawReadBuffer), What: "reply"}
	err = readReply(&d, "Get", seq, r.readResultField)
	return r.dst, r.found, r.err, err
}

// RawIdleClosed returns how many of c's idle AppendGet connections the
// sidecar has closed, and how many are idle.
func RawIdleClosed(c *Client) (closed, idle int) {
	c.raw.mu.Lock()
	defer c.raw.mu.Unlock()
	for _, rc := range c.raw.idle {
		rc.conn.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := rc.r.Peek(1); errors.Is(err, io.EOF) {
			closed++
		}
		rc.conn.SetReadDeadline(time.Time{})
	}
	return closed, len(c.raw.idle)
}

// KeyedMaps returns the WriteKeyed mappings of c's arenas (nil for an
// arena not written that way yet).
func KeyedMaps(c *Client) (mems [][]byte) {
	z := &c.zc
	z.rw.RLock()
	defer z.rw.RUnlock()
	for _, a := range z.arenas {
		mems = append(mems, a.kmem)
	}
	return mems
}

// KeyedFilled counts the chunks of c's keyed mappings whose page tables
// were filled at a first write (fill), of how many; nofill when the kernel
// could not.
func KeyedFilled(c *Client) (filled, chunks int, nofill bool) {
	z := &c.zc
	z.rw.RLock()
	defer z.rw.RUnlock()
	for _, a := range z.arenas {
		if a.kmem == nil {
			continue
		}
		nofill = nofill || a.knofill.Load()
		for i := range a.kfilled {
			chunks++
			if a.kfilled[i].Load() {
				filled++
			}
		}
	}
	return filled, chunks, nofill
}

// WithoutProtectionKeys makes the package see no protection keys until
// the test ends (as on a machine without PKU).
func WithoutProtectionKeys(t interface{ Cleanup(func()) }) {
	saved := keyForWrites
	keyForWrites = func() (pkey.Key, error) { return 0, pkey.ErrUnsupported }
	t.Cleanup(func() { keyForWrites = saved })
}
