package peerapi

import (
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// Errors of the peer API's own making.
var (
	// ErrUnknownNode: the cluster view cannot resolve the node's peer
	// address. It wraps cache.ErrUnavailable.
	ErrUnknownNode = fmt.Errorf("peerapi: unknown node: %w", cache.ErrUnavailable)
	// ErrRefused: the peer refused the call's credentials (cluster label,
	// protocol version or token). It wraps cache.ErrUnavailable.
	ErrRefused = fmt.Errorf("peerapi: refused by peer: %w", cache.ErrUnavailable)
	// ErrProtocol: the peer answered something malformed (wrong item count,
	// a slot outside its region). It wraps cache.ErrUnavailable.
	ErrProtocol = fmt.Errorf("peerapi: malformed answer: %w", cache.ErrUnavailable)
	// ErrClosed: the client or server is closed. It wraps
	// cache.ErrUnavailable.
	ErrClosed = fmt.Errorf("peerapi: closed: %w", cache.ErrUnavailable)
)

// refusedMessage is the message of the refusal PeerError. Peers read the
// refusal from PeerError.refused; the message stays what it was because
// peers that predate that field recognise a refusal by it.
const refusedMessage = "peer credentials refused (cluster label, protocol version or token)"

// refusal is the PeerError that answers a call with the wrong credentials.
func refusal() *peer.PeerError {
	refused := true
	return &peer.PeerError{Code: tp.ErrorCode_UNAVAILABLE, Message: refusedMessage, Refused: &refused}
}

// peerErr makes the declared exception for a request-level error.
func peerErr(err error) *peer.PeerError {
	return &peer.PeerError{Code: wirecode.Code(err), Message: err.Error()}
}

// codeErr converts a code and message from node to an error (nil for OK):
// the code's domain sentinel (wirecode.Err), wrapped with where it came
// from. A NOT_FOUND without a message is the bare sentinel (a miss is
// common and says nothing more).
func codeErr(node string, code tp.ErrorCode, msg string) error {
	base := wirecode.Err(code)
	if base == nil || (code == tp.ErrorCode_NOT_FOUND && msg == "") {
		return base
	}
	return fmt.Errorf("%w (peer %s: %s: %s)", base, node, code, msg)
}

// callErr converts an RPC error: a declared PeerError keeps its code, a
// refusal becomes ErrRefused, anything else (transport) is unavailability.
func callErr(node string, err error) error {
	if err == nil {
		return nil
	}
	var pe *peer.PeerError
	if errors.As(err, &pe) {
		if pe.GetRefused() {
			return fmt.Errorf("%w (peer %s)", ErrRefused, node)
		}
		return codeErr(node, pe.Code, pe.Message)
	}
	return fmt.Errorf("peerapi: call %s: %w: %w", node, cache.ErrUnavailable, err)
}
