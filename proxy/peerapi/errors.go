package peerapi

import (
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
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
	// ErrRemote: the peer failed internally.
	ErrRemote = errors.New("peerapi: peer internal error")
	// ErrClosed: the client or server is closed.
	ErrClosed = errors.New("peerapi: closed")
)

// Codes are tidepool.thrift ErrorCode values; domain errors map to them
// through engineapi.Code, the one table of the Thrift edge.
const (
	codeOK          = 0
	codeUnavailable = 8
)

// toCode returns the protocol code for err.
func toCode(err error) int32 { return int32(engineapi.Code(err)) }

// peerErr makes the declared exception for a request-level error.
func peerErr(err error) *peer.PeerError {
	return &peer.PeerError{Code: toCode(err), Message: err.Error()}
}

// fromCode maps a code back to the domain sentinel callers test with
// errors.Is: the inverse of engineapi's table for the codes a peer sends.
var fromCode = map[int32]error{
	1:  cache.ErrNotFound,
	2:  cache.ErrExists,
	3:  cache.ErrTooLarge,
	4:  proxy.ErrInvalidArgument,
	5:  cache.ErrNoSpace,
	6:  cache.ErrLeaseExpired,
	7:  cache.ErrChecksum,
	8:  cache.ErrUnavailable,
	9:  ErrRemote,
	10: proxy.ErrUnknownNamespace,
	11: proxy.ErrBatchTooLarge,
}

// codeErr converts a code and message from node to an error (nil for OK).
func codeErr(node string, code int32, msg string) error {
	if code == codeOK {
		return nil
	}
	base, ok := fromCode[code]
	if !ok {
		base = ErrRemote
	}
	if code == 1 && msg == "" {
		return cache.ErrNotFound
	}
	return fmt.Errorf("%w (peer %s: code %d: %s)", base, node, code, msg)
}

// callErr converts an RPC error: a declared PeerError keeps its code, a
// refusal becomes ErrRefused, anything else (transport) is unavailability.
func callErr(node string, err error) error {
	if err == nil {
		return nil
	}
	var pe *peer.PeerError
	if errors.As(err, &pe) {
		if pe.Code == codeUnavailable && pe.Message == refusedMessage {
			return fmt.Errorf("%w (peer %s)", ErrRefused, node)
		}
		return codeErr(node, pe.Code, pe.Message)
	}
	return fmt.Errorf("peerapi: call %s: %w: %w", node, cache.ErrUnavailable, err)
}
