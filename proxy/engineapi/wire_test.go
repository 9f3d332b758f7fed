package engineapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// TestUnframedRequestBounded: an unframed ("buffered") request states no
// length, so Kitex's size limit never applies to it; the safe codec counts
// its bytes and stops at max_request_size with a protocol exception and a
// closed connection, instead of reading on (the old server read the 3 MiB
// and replied TOO_LARGE).
func TestUnframedRequestBounded(t *testing.T) {
	ts := startServer(t, serverOpts{maxValue: 256 << 10, maxReqest: 1 << 20})
	msg := unframedPut(&tp.PutRequest{Ns: "ns", Key: []byte("k"), Value: make([]byte, 3<<20)})

	conn, err := net.Dial("unix", ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	go conn.Write(msg) // the server may stop reading midway
	reply, err := io.ReadAll(conn)
	if bytes.HasPrefix(reply, []byte{0x80, 1, 0, 2}) { // a REPLY, not an exception
		t.Fatalf("the server answered a request beyond max_request_size (%d bytes): %q", len(reply), reply[:min(len(reply), 64)])
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the server neither answered nor closed")
	}
	// Other clients are served.
	if _, err := ts.c.Put(context.Background(), "ns", []byte("k2"), []byte("v"), 0); err != nil {
		t.Fatalf("put after the oversized request: %v", err)
	}
}

// unframedPut returns req as an unframed ("buffered") Thrift Put call,
// sequence id 1.
func unframedPut(req *tp.PutRequest) []byte {
	args := &tp.TidepoolPutArgs{Req: req}
	body := make([]byte, args.BLength())
	args.FastWriteNocopy(body, nil)
	var msg []byte
	msg = binary.BigEndian.AppendUint32(msg, 0x80010001)
	msg = binary.BigEndian.AppendUint32(msg, 3)
	msg = append(msg, "Put"...)
	msg = binary.BigEndian.AppendUint32(msg, 1)
	return append(msg, body...)
}
