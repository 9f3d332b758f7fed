package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/testvec"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// TestPutSocketVectors: the Go client writes the put socket's calls of
// protocol/testdata/putsock.txt in its own field order ("go-order" lines)
// byte for byte, and reads every reply as its fields say.
func TestPutSocketVectors(t *testing.T) {
	ctx := context.Background()
	vecs := testvec.Load(t, "putsock.txt")
	stored := vecs[0].Bytes
	for _, v := range vecs {
		if v.Kind == "ans" && v.Name == "stored" {
			stored = v.Bytes
		}
	}
	pool := &rawPool{timeout: 10 * time.Second}
	put := func(req *tp.PutRequest, want int, answer []byte) (sent []byte, existed bool, err error) {
		t.Helper()
		c, peer := vectorRawConn(t)
		done := make(chan error, 1)
		go func() {
			// Read the request's want bytes (all of it, for a vector to
			// compare with), then answer.
			sent = make([]byte, want)
			_, err := io.ReadFull(peer, sent)
			if err == nil {
				_, err = peer.Write(answer)
			}
			done <- err
		}()
		existed, _, err = c.put(ctx, pool, req)
		if e := <-done; e != nil {
			t.Fatal(e)
		}
		return sent, existed, err
	}
	n := 0
	for _, v := range vecs {
		f := v.Fields
		switch {
		case v.Kind == "req" && len(v.Name) >= 8 && v.Name[:8] == "go-order":
			n++
			req := &tp.PutRequest{Ns: string(testvec.Hex(t, v, f["ns"])), Key: testvec.Hex(t, v, f["key"]),
				Value: testvec.Hex(t, v, f["value"]), Depth: int32(testvec.Int(t, v, f["depth"])),
				Durable: f["durable"] == "1", SyncReplicas: int32(testvec.Int(t, v, f["sync"]))}
			sent, existed, err := put(req, len(v.Bytes), stored)
			if !bytes.Equal(sent, v.Bytes) {
				t.Errorf("%s: wrote\n  %x\nwant\n  %x", v.Name, sent, v.Bytes)
			}
			if err != nil || existed {
				t.Errorf("%s: read the stored reply as existed %v, %v", v.Name, existed, err)
			}
		case v.Kind == "ans":
			n++
			req := &tp.PutRequest{Ns: "ns", Key: []byte("k"), Value: []byte("v")}
			_, existed, err := put(req, 0, v.Bytes) // the request, small, waits in the socket
			if code, ok := f["code"]; ok {
				var te *Error
				if !errors.As(err, &te) || te.Code.String() != code || te.Message != string(testvec.Hex(t, v, f["msg"])) {
					t.Errorf("%s: read %v; want %s %q", v.Name, err, code, testvec.Hex(t, v, f["msg"]))
				}
				continue
			}
			if err != nil || existed != (f["existed"] == "1") {
				t.Errorf("%s: read existed %v, %v; want existed=%s", v.Name, existed, err, f["existed"])
			}
		}
	}
	if n < 4 {
		t.Fatalf("%d vectors the Go client speaks", n)
	}
}
