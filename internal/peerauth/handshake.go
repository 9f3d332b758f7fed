// Package peerauth authenticates the TCP connections between cluster
// members (peer API and transfer port) before anything else is read from
// them, and guards the listeners that accept them: a cap on connections,
// back-off on accept errors, a handshake deadline and an idle timeout.
//
// The handshake is a mutual challenge-response over a pre-shared cluster
// secret (HMAC-SHA256 over both sides' random nonces). Each side proves it
// holds the secret without sending it; a recorded handshake cannot be
// replayed (fresh nonces), nor reflected (the two proofs are bound to their
// role). The server reads a fixed number of bytes for the whole handshake,
// so a peer that does not hold the secret never reaches a decoder.
package peerauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Errors.
var (
	// ErrRefused is a handshake whose proof did not match: the other side
	// does not hold the same secret (or label), or is not a tidepool peer.
	ErrRefused = errors.New("peerauth: credentials refused")
	// ErrSecret is a secret too short to be one.
	ErrSecret = errors.New("peerauth: invalid secret")
)

// MinSecretLen is the shortest secret accepted (128 bits).
const MinSecretLen = 16

// Purpose binds a handshake to the port it is made on, so that a proof for
// one cannot be used on the other.
type Purpose byte

// Purposes.
const (
	PurposePeerAPI  Purpose = 1
	PurposeTransfer Purpose = 2
	// PurposeVerbs is the control port of the verbs transport (rdma/verbs):
	// queue-pair connection data and owner-side checks.
	PurposeVerbs Purpose = 3
)

const (
	magic    = "TPA2"
	nonceLen = 32
	macLen   = sha256.Size
	helloLen = len(magic) + 2 + nonceLen // magic, purpose, flags, client nonce
	okByte   = 0x01

	flagEncrypt = 0x01
)

// Key is the cluster secret and label that both ends of a connection must
// share, and whether connections are encrypted after the handshake. Safe
// for concurrent use.
type Key struct {
	secret  []byte
	label   string
	encrypt bool
}

// Encrypting returns a copy of k whose connections are encrypted after the
// handshake (AES-256-GCM records, keys derived from the secret and both
// nonces). Both ends must agree: a handshake between an encrypting and a
// plain end fails.
func (k *Key) Encrypting() *Key {
	c := *k
	c.encrypt = true
	return &c
}

// Encrypts reports whether k encrypts its connections.
func (k *Key) Encrypts() bool { return k.encrypt }

func (k *Key) flags() byte {
	if k.encrypt {
		return flagEncrypt
	}
	return 0
}

// NewKey returns a key for secret (at least MinSecretLen bytes) and the
// cluster label (may be empty).
func NewKey(secret []byte, label string) (*Key, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("%w: %d bytes, want at least %d", ErrSecret, len(secret), MinSecretLen)
	}
	return &Key{secret: bytes.Clone(secret), label: label}, nil
}

// mac is the proof of role ("client" or "server") over both nonces; with
// role "c2s" or "s2c" it is the encryption key of that direction.
func (k *Key) mac(role string, p Purpose, cn, sn []byte) []byte {
	h := hmac.New(sha256.New, k.secret)
	h.Write([]byte("tidepool-peerauth-v1\x00" + role + "\x00"))
	h.Write([]byte{byte(p), k.flags(), byte(len(k.label) >> 8), byte(len(k.label))})
	h.Write([]byte(k.label))
	h.Write(cn)
	h.Write(sn)
	return h.Sum(nil)
}

// Client runs the initiator's side of the handshake on c, bounded by
// deadline (the connection's deadlines are cleared on success), and
// returns the connection to use: c, or c encrypted (Encrypting). It proves
// the server holds the key before proving it does itself. On error the
// caller closes c.
func (k *Key) Client(c net.Conn, p Purpose, deadline time.Time) (net.Conn, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	var hello [helloLen]byte
	copy(hello[:], magic)
	hello[len(magic)] = byte(p)
	hello[len(magic)+1] = k.flags()
	cn := hello[len(magic)+2:]
	if _, err := rand.Read(cn); err != nil {
		return nil, err
	}
	if _, err := c.Write(hello[:]); err != nil {
		return nil, err
	}
	var reply [nonceLen + macLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return nil, fmt.Errorf("%w: reading the server's proof: %v", ErrRefused, err)
	}
	sn := reply[:nonceLen]
	if !hmac.Equal(reply[nonceLen:], k.mac("server", p, cn, sn)) {
		return nil, fmt.Errorf("%w: the server does not hold the cluster secret (or another label or encryption setting)", ErrRefused)
	}
	if _, err := c.Write(k.mac("client", p, cn, sn)); err != nil {
		return nil, err
	}
	var ok [1]byte
	if _, err := io.ReadFull(c, ok[:]); err != nil || ok[0] != okByte {
		return nil, fmt.Errorf("%w: the server refused this node's proof", ErrRefused)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if !k.encrypt {
		return c, nil
	}
	return newSealed(c, k.mac("c2s", p, cn, sn), k.mac("s2c", p, cn, sn))
}

// Server runs the acceptor's side of the handshake on c, bounded by
// deadline (the connection's deadlines are cleared on success), and
// returns the connection to use: c, or c encrypted (Encrypting). It reads
// exactly helloLen+macLen bytes and nothing else before the peer is
// authenticated. On error the caller closes c.
func (k *Key) Server(c net.Conn, p Purpose, deadline time.Time) (net.Conn, error) {
	return k.server(c, p, deadline, func() {})
}

// server is Server; hello is called once a well-formed hello arrived.
func (k *Key) server(c net.Conn, p Purpose, deadline time.Time, hello func()) (net.Conn, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	var hi [helloLen]byte
	if _, err := io.ReadFull(c, hi[:]); err != nil {
		return nil, fmt.Errorf("%w: reading the hello: %v", ErrRefused, err)
	}
	if string(hi[:len(magic)]) != magic || Purpose(hi[len(magic)]) != p {
		return nil, fmt.Errorf("%w: not a tidepool handshake for this port", ErrRefused)
	}
	hello()
	if hi[len(magic)+1] != k.flags() {
		return nil, fmt.Errorf("%w: the client's encryption setting differs from this node's", ErrRefused)
	}
	cn := hi[len(magic)+2:]
	var reply [nonceLen + macLen]byte
	sn := reply[:nonceLen]
	if _, err := rand.Read(sn); err != nil {
		return nil, err
	}
	copy(reply[nonceLen:], k.mac("server", p, cn, sn))
	if _, err := c.Write(reply[:]); err != nil {
		return nil, err
	}
	var proof [macLen]byte
	if _, err := io.ReadFull(c, proof[:]); err != nil {
		return nil, fmt.Errorf("%w: reading the client's proof: %v", ErrRefused, err)
	}
	if !hmac.Equal(proof[:], k.mac("client", p, cn, sn)) {
		return nil, fmt.Errorf("%w: the client does not hold the cluster secret", ErrRefused)
	}
	if _, err := c.Write([]byte{okByte}); err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if !k.encrypt {
		return c, nil
	}
	return newSealed(c, k.mac("s2c", p, cn, sn), k.mac("c2s", p, cn, sn))
}

// Proof returns an HMAC-SHA256 of msg under the secret, bound to what
// (domain separation), the label and the encryption setting: membership
// uses it to sign what a node announces, so that nodes that could not talk
// to each other (another secret, label or encryption setting) refuse each
// other as members.
func (k *Key) Proof(what string, msg []byte) []byte {
	h := hmac.New(sha256.New, k.secret)
	h.Write([]byte("tidepool-peerauth-v1\x00" + what + "\x00" + k.label + "\x00"))
	h.Write([]byte{k.flags()})
	h.Write(msg)
	return h.Sum(nil)
}

// Verify reports whether proof is Proof(what, msg).
func (k *Key) Verify(what string, msg, proof []byte) bool {
	return hmac.Equal(proof, k.Proof(what, msg))
}
