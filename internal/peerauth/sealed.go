package peerauth

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// maxRecord is the most plaintext bytes in one sealed record.
const maxRecord = 16 << 10

// ErrRecord is a sealed record that is too large, too small or fails its
// authentication tag: the connection is broken or tampered with.
var ErrRecord = errors.New("peerauth: bad encrypted record")

// sealed is a connection encrypted after the handshake: each Write is cut
// into records (u32 length, then AES-256-GCM ciphertext and tag, the length
// as additional data, the record's sequence number as nonce), one key per
// direction. A record cannot be replayed, reordered or cut (sequence
// numbers), and a reader never allocates more than one record.
type sealed struct {
	net.Conn

	wmu  sync.Mutex
	w    cipher.AEAD
	wseq uint64
	wbuf []byte

	rmu   sync.Mutex
	r     cipher.AEAD
	rseq  uint64
	rbuf  []byte
	plain []byte // decrypted bytes not read yet (inside rbuf)
	rerr  error
}

func newSealed(c net.Conn, wkey, rkey []byte) (net.Conn, error) {
	w, err := gcm(wkey)
	if err != nil {
		return nil, err
	}
	r, err := gcm(rkey)
	if err != nil {
		return nil, err
	}
	return &sealed{Conn: c, w: w, r: r}, nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key) // 32 bytes: AES-256
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

func nonce(dst []byte, seq uint64) []byte {
	clear(dst[:4])
	binary.BigEndian.PutUint64(dst[4:12], seq)
	return dst[:12]
}

// Write seals p into records and writes them.
func (s *sealed) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.wbuf == nil {
		s.wbuf = make([]byte, 4+maxRecord+s.w.Overhead())
	}
	var nb [12]byte
	done := 0
	for done < len(p) {
		chunk := p[done:min(len(p), done+maxRecord)]
		n := len(chunk) + s.w.Overhead()
		binary.BigEndian.PutUint32(s.wbuf[:4], uint32(n))
		s.w.Seal(s.wbuf[4:4], nonce(nb[:], s.wseq), chunk, s.wbuf[:4])
		s.wseq++
		if _, err := s.Conn.Write(s.wbuf[:4+n]); err != nil {
			return done, err
		}
		done += len(chunk)
	}
	return done, nil
}

// Read returns decrypted bytes, reading and opening one record when none
// are pending.
func (s *sealed) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	for len(s.plain) == 0 {
		if s.rerr != nil {
			return 0, s.rerr
		}
		if started, err := s.readRecord(); err != nil {
			var ne net.Error
			if started || !errors.As(err, &ne) || !ne.Timeout() {
				s.rerr = err // a record cut halfway cannot be resumed
			}
			return 0, err
		}
	}
	n := copy(p, s.plain)
	s.plain = s.plain[n:]
	return n, nil
}

// readRecord reads and opens one record; started reports whether any of
// it was consumed (then an error leaves the stream unusable).
func (s *sealed) readRecord() (started bool, err error) {
	if s.rbuf == nil {
		s.rbuf = make([]byte, 4+maxRecord+s.r.Overhead())
	}
	if k, err := io.ReadFull(s.Conn, s.rbuf[:4]); err != nil {
		return k > 0, err
	}
	n := int(binary.BigEndian.Uint32(s.rbuf[:4]))
	if n < s.r.Overhead() || n > maxRecord+s.r.Overhead() {
		return true, fmt.Errorf("%w: length %d", ErrRecord, n)
	}
	body := s.rbuf[4 : 4+n]
	if _, err := io.ReadFull(s.Conn, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return true, err
	}
	var nb [12]byte
	plain, err := s.r.Open(body[:0], nonce(nb[:], s.rseq), body, s.rbuf[:4])
	if err != nil {
		return true, fmt.Errorf("%w: %v", ErrRecord, err)
	}
	s.rseq++
	s.plain = plain
	return true, nil
}
