package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/thriftstream"
)

// Put's values of PutSocketMin bytes and more go through the sidecar's put
// socket (the engine socket's path plus ".put", FeaturePutSocket): a Put
// call on a connection of the client's own, the value written from the
// caller's slice with one writev, and read by the sidecar from the socket
// straight into its arena slot. Through Kitex the sidecar copies the value
// once more, out of netpoll's buffers. The request's fields come before
// the value, which lets the sidecar reserve the slot first.
//
// A sidecar without the put socket (an older one, put_socket off, a socket
// the client cannot dial) is served through the engine socket as before;
// the put socket is tried again after putSocketRetry.

// FeaturePutSocket, in HelloResponse.Features: the sidecar serves the put
// socket.
const FeaturePutSocket = "put_socket"

// PutSocketMin is the smallest value Put sends through the put socket.
const PutSocketMin = 32 << 10

// putSocketRetry is how long Put keeps to the engine socket after the put
// socket could not be dialled.
const putSocketRetry = 10 * time.Second

// putSocket is the pool of put socket connections.
type putSocket struct {
	pool rawPool
	// downUntil (unix nanoseconds): the put socket could not be dialled;
	// not tried again before then.
	downUntil atomic.Int64
}

// putViaSocket makes the Put through the put socket. ok is false when it
// did not (a small value, no put socket): the caller puts through Kitex.
func (c *Client) putViaSocket(ctx context.Context, req *tp.PutRequest) (existed, ok bool, err error) {
	if len(req.Value) < PutSocketMin || time.Now().UnixNano() < c.puts.downUntil.Load() {
		return false, false, nil
	}
	err = c.puts.pool.call(ctx, func(conn *rawConn) (replied bool, err error) {
		existed, replied, err = conn.put(ctx, &c.puts.pool, req)
		return replied, err
	})
	var de dialError
	if errors.As(err, &de) && ctx.Err() == nil {
		c.puts.downUntil.Store(time.Now().Add(putSocketRetry).UnixNano())
		return false, false, nil
	}
	return existed, true, err
}

// put writes a Put call (its value straight from req.Value) and reads its
// reply. replied reports whether any byte of a reply arrived.
func (c *rawConn) put(ctx context.Context, p *rawPool, req *tp.PutRequest) (existed, replied bool, err error) {
	deadline := time.Now().Add(p.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return false, false, fmt.Errorf("tidepool: %w", err)
	}
	c.seq++
	b := thrift.Binary
	w := b.AppendMessageBegin(c.w[:0], "Put", thrift.CALL, c.seq)
	w = b.AppendFieldBegin(w, thrift.STRUCT, 1) // the arguments' req
	w = b.AppendFieldBegin(w, thrift.STRING, 1)
	w = b.AppendString(w, req.Ns)
	w = b.AppendFieldBegin(w, thrift.STRING, 2)
	w = b.AppendBinary(w, req.Key)
	w = b.AppendFieldBegin(w, thrift.I32, 4)
	w = b.AppendI32(w, req.Depth)
	w = b.AppendFieldBegin(w, thrift.BOOL, 5)
	w = b.AppendBool(w, req.Durable)
	w = b.AppendFieldBegin(w, thrift.I32, 6)
	w = b.AppendI32(w, req.SyncReplicas)
	w = b.AppendFieldBegin(w, thrift.STRING, 3)
	w = b.AppendI32(w, int32(len(req.Value)))
	head := len(w)
	w = b.AppendFieldStop(w) // PutRequest
	w = b.AppendFieldStop(w) // the arguments
	c.w = w
	bufs := net.Buffers{w[:head], req.Value, w[head:]}
	if _, err := bufs.WriteTo(c.conn); err != nil {
		return false, false, c.ioError(ctx, err)
	}
	if _, err := c.r.Peek(1); err != nil {
		return false, false, c.ioError(ctx, err)
	}
	var res putReply
	d := thriftstream.Decoder{R: c.r, What: "reply"}
	if err := readReply(&d, "Put", c.seq, res.resultField); err != nil {
		var ioe thriftstream.IOError
		if errors.As(err, &ioe) {
			return false, true, c.ioError(ctx, ioe.Err)
		}
		return false, true, fmt.Errorf("tidepool: %w", err)
	}
	if res.err != nil {
		return false, true, &Error{Code: res.err.Code, Message: res.err.Message}
	}
	if !res.ok {
		return false, true, fmt.Errorf("tidepool: %w", thrift.NewProtocolException(thrift.INVALID_DATA, "reply: Put result carries neither a response nor an error"))
	}
	return res.existed, true, nil
}

// putReply is a Put result as it is read.
type putReply struct {
	ok, existed bool
	err         *tp.TidepoolError
}

func (r *putReply) resultField(d *thriftstream.Decoder, t thrift.TType, id int16) (err error) {
	switch {
	case id == 0 && t == thrift.STRUCT:
		r.ok, r.existed = true, false // a repeated field replaces
		return d.ReadStruct(func(d *thriftstream.Decoder, t thrift.TType, id int16) error {
			if id == 1 && t == thrift.BOOL {
				b, err := d.Byte()
				r.existed = b == 1
				return err
			}
			return d.Skip(t, 0)
		})
	case id == 1 && t == thrift.STRUCT:
		r.err, err = readError(d)
		return err
	}
	return d.Skip(t, 0)
}
