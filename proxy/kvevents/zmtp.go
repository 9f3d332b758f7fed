package kvevents

// A ZeroMQ (ZMTP 3.0, NULL mechanism) server side, just what the publisher
// needs: a PUB socket's peers (SUB/XSUB: subscriptions in, messages out)
// and a ROUTER socket's peers (DEALER/REQ: replay requests in, replies
// out). Written here rather than taken from github.com/go-zeromq/zmq4
// because that PUB writes to every subscriber from one goroutine with no
// write deadline (one stalled subscriber stalls them all), drops silently
// at its high-water mark, and tells nobody how many subscribers there are;
// here each subscriber has its own bounded queue, counted drops and a
// write deadline. Every length read from a peer is checked against a small
// cap before anything is allocated; a peer that breaks the protocol is
// disconnected.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04

	// maxFrame caps a frame a peer may send: subscriptions, commands and
	// replay requests are all small.
	maxFrame = 4096
	// maxParts caps the frames of one message a peer may send.
	maxParts = 8
	// handshakeTimeout bounds the greeting and READY exchange.
	handshakeTimeout = 5 * time.Second
)

var errProtocol = errors.New("kvevents: ZMTP protocol error")

// greeting is ZMTP 3.0's: signature, version 3.0, mechanism NULL, not
// as-server, filler.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:], "NULL")
	return g
}

// handshake exchanges greetings and READY commands on c as a socket of
// type typ and returns the peer's Socket-Type.
func handshake(c net.Conn, r *bufio.Reader, w *bufio.Writer, typ string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return "", err
	}
	if _, err := w.Write(greeting()); err != nil {
		return "", err
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	var g [64]byte
	if _, err := io.ReadFull(r, g[:]); err != nil {
		return "", err
	}
	if g[0] != 0xff || g[9] != 0x7f || g[10] < 3 || string(g[12:16]) != "NULL" || g[16] != 0 {
		return "", fmt.Errorf("%w: bad greeting", errProtocol)
	}
	ready := []byte{5, 'R', 'E', 'A', 'D', 'Y', 11}
	ready = append(ready, "Socket-Type"...)
	ready = binary.BigEndian.AppendUint32(ready, uint32(len(typ)))
	ready = append(ready, typ...)
	if err := writeFrame(w, ready, flagCommand); err != nil {
		return "", err
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	flags, body, err := readFrame(r)
	if err != nil {
		return "", err
	}
	if flags&flagCommand == 0 || len(body) < 6 || string(body[:6]) != "\x05READY" {
		return "", fmt.Errorf("%w: no READY", errProtocol)
	}
	peer := ""
	for p := body[6:]; len(p) > 0; {
		nl := int(p[0])
		if len(p) < 1+nl+4 {
			return "", fmt.Errorf("%w: bad READY property", errProtocol)
		}
		name := string(p[1 : 1+nl])
		vl := binary.BigEndian.Uint32(p[1+nl:])
		p = p[1+nl+4:]
		if uint64(vl) > uint64(len(p)) {
			return "", fmt.Errorf("%w: bad READY property", errProtocol)
		}
		if name == "Socket-Type" {
			peer = string(p[:vl])
		}
		p = p[vl:]
	}
	return peer, c.SetDeadline(time.Time{})
}

// readFrame reads one frame of at most maxFrame bytes.
func readFrame(r *bufio.Reader) (flags byte, body []byte, err error) {
	flags, err = r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, nil, fmt.Errorf("%w: frame flags %#x", errProtocol, flags)
	}
	var n uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n = uint64(b)
	}
	if n > maxFrame {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes (cap %d)", errProtocol, n, maxFrame)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// readMessage reads one message (commands are returned alone, as a
// one-frame message with command set).
func readMessage(r *bufio.Reader) (parts [][]byte, command bool, err error) {
	for {
		flags, body, err := readFrame(r)
		if err != nil {
			return nil, false, err
		}
		if flags&flagCommand != 0 {
			if len(parts) > 0 {
				return nil, false, fmt.Errorf("%w: command inside a message", errProtocol)
			}
			return [][]byte{body}, true, nil
		}
		parts = append(parts, body)
		if flags&flagMore == 0 {
			return parts, false, nil
		}
		if len(parts) >= maxParts {
			return nil, false, fmt.Errorf("%w: message of more than %d frames", errProtocol, maxParts)
		}
	}
}

func writeFrame(w *bufio.Writer, body []byte, flags byte) error {
	if len(body) > 255 {
		flags |= flagLong
		var h [9]byte
		h[0] = flags
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
		if _, err := w.Write(h[:]); err != nil {
			return err
		}
	} else if _, err := w.Write([]byte{flags, byte(len(body))}); err != nil {
		return err
	}
	_, err := w.Write(body)
	return err
}

// writeMessage writes the frames of one message (not flushed).
func writeMessage(w *bufio.Writer, parts ...[]byte) error {
	for i, p := range parts {
		var f byte
		if i < len(parts)-1 {
			f = flagMore
		}
		if err := writeFrame(w, p, f); err != nil {
			return err
		}
	}
	return nil
}

// commandName is the name of a command frame's body.
func commandName(body []byte) string {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return ""
	}
	return string(body[1 : 1+body[0]])
}
