package peerapi

import (
	"encoding/binary"
	"io"
	"net"
)

// Whole frames for Kitex's Go net transport.
//
// Kitex's gonet transport reads a connection through gopkg's
// bufiox.DefaultReader, whose Next(n) and Peek(n) make at most 100 Read
// calls (its maxConsecutiveEmptyReads) to gather n bytes and then return
// nothing, and no error, when those calls brought fewer: the Thrift
// decoder then fails on an empty buffer ("read field 0 begin error:
// ReadFieldBegin: buf too small"). A peer API message is one frame
// (transport.Framed: a 4-byte big-endian length, then that many bytes),
// and Kitex decodes its payload with one Next of the payload's length, so
// a Put of B bytes fails whenever the connection delivers less than B/100
// bytes per Read: always on an encrypted connection past about 1.6 MiB
// (internal/peerauth hands out one 16 KiB record per Read), and on a plain
// one when the network delivers small segments.
//
// frameReader makes every Read inside a frame return as many of the
// frame's bytes as the caller has room for (blocking until they come: the
// sender has committed to send the whole frame), so a Next within a frame
// needs two Reads at most. It never blocks past the end of the frame in
// hand, so a reply is never waited for. A stream that does not start with
// a frame length (unframed Thrift, whose first word has the top bit set)
// is passed through as it comes.
type frameReader struct {
	r     io.Reader
	hdr   [4]byte
	nh    int   // header bytes read
	sent  int   // header bytes handed out
	body  int64 // bytes of the frame's body still to hand out
	plain bool  // not framed: pass through
}

// Read implements io.Reader.
func (f *frameReader) Read(p []byte) (int, error) {
	if f.plain && f.sent == f.nh {
		return f.r.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if f.nh < len(f.hdr) {
		// A frame begins: its first 4 bytes say how many follow.
		k, err := io.ReadFull(f.r, f.hdr[f.nh:])
		f.nh += k
		if err != nil {
			return 0, err
		}
		l := binary.BigEndian.Uint32(f.hdr[:])
		if l >= 1<<31 {
			f.plain = true
		} else {
			f.body = int64(l)
		}
	}
	n := copy(p, f.hdr[f.sent:f.nh])
	f.sent += n
	if f.plain {
		return n, nil
	}
	if k := min(int64(len(p)-n), f.body); k > 0 {
		m, err := io.ReadFull(f.r, p[n:n+int(k)])
		n += m
		f.body -= int64(m)
		if err != nil {
			return n, err
		}
	}
	if f.sent == len(f.hdr) && f.body == 0 {
		f.nh, f.sent = 0, 0 // the frame is out: the next Read starts another
	}
	return n, nil
}

// frameConn is a connection read through a frameReader.
type frameConn struct {
	net.Conn
	fr frameReader
}

func newFrameConn(c net.Conn) *frameConn {
	fc := &frameConn{Conn: c}
	fc.fr.r = c
	return fc
}

func (c *frameConn) Read(p []byte) (int, error) { return c.fr.Read(p) }

// frameListener hands out accepted connections as frameConns.
type frameListener struct{ net.Listener }

func (l frameListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newFrameConn(c), nil
}
