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

// TestGetReplyVectors: AppendGet's reader (client/rawget.go) reads each
// Get reply of protocol/testdata/getreply.txt as its fields say, the value
// appended to the caller's buffer, and a reply cut short is an error.
func TestGetReplyVectors(t *testing.T) {
	ctx := context.Background()
	pool := &rawPool{timeout: 10 * time.Second, maxValue: 1 << 20}
	n := 0
	for _, v := range testvec.Load(t, "getreply.txt") {
		if v.Kind != "ans" && v.Kind != "badans" {
			continue
		}
		n++
		c, peer := vectorRawConn(t)
		req := &tp.GetRequest{Ns: "ns", Key: []byte("k")}
		want := appendCall(nil, "Get", 1, &tp.TidepoolGetArgs{Req: req})
		done := make(chan error, 1)
		go func() {
			got := make([]byte, len(want))
			_, err := io.ReadFull(peer, got)
			if err == nil && !bytes.Equal(got, want) {
				err = errors.New("the request differs")
			}
			if err == nil {
				_, err = peer.Write(v.Bytes)
			}
			if v.Kind == "badans" {
				peer.Close()
			}
			done <- err
		}()
		prefix := []byte("kept:")
		res, _, err := c.get(ctx, pool, prefix, req)
		if e := <-done; e != nil {
			t.Fatalf("%s: %v", v.Name, e)
		}
		f := v.Fields
		switch {
		case v.Kind == "badans":
			if err == nil {
				t.Errorf("%s: read as %+v", v.Name, res)
			}
		case f["code"] != "":
			if err != nil || res.err == nil || res.err.Code.String() != f["code"] || res.err.Message != string(testvec.Hex(t, v, f["msg"])) {
				t.Errorf("%s: read %+v, %v; want %s %q", v.Name, res.err, err, f["code"], testvec.Hex(t, v, f["msg"]))
			}
		default:
			wantValue := append([]byte("kept:"), testvec.Hex(t, v, f["value"])...)
			if err != nil || res.found != (f["found"] == "1") || (res.found && !bytes.Equal(res.dst, wantValue)) {
				t.Errorf("%s: read found %v, %d bytes, %v; want found=%s, %d bytes", v.Name, res.found, len(res.dst), err, f["found"], len(wantValue))
			}
		}
	}
	if n < 6 {
		t.Fatalf("%d vectors", n)
	}
}
