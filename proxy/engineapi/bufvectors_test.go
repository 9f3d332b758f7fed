package engineapi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/internal/testvec"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// TestBufVectorsDecode: every request of protocol/testdata/bufsock.txt
// decodes to its fields, and every malformed one is refused by the head's
// checks or by the decoder (TestBufVectorsServer sends them to a real
// server).
func TestBufVectorsDecode(t *testing.T) {
	t.Parallel()
	n := 0
	for _, v := range testvec.Load(t, "bufsock.txt") {
		switch v.Kind {
		case "req":
			n++
			head, body := v.Bytes[:bufHeader], v.Bytes[bufHeader:]
			if head[1] != bufVersion || head[2] != 0 || head[3] != 0 || int(binary.BigEndian.Uint32(head[4:])) != len(body) {
				t.Errorf("%s: head %x refused", v.Name, head)
				continue
			}
			req, err := decodeBufRequest(head[0], body)
			if err != nil {
				t.Errorf("%s: %v", v.Name, err)
				continue
			}
			if got, want := describeBufRequest(head[0], req), describeVector(t, v); got != want {
				t.Errorf("%s: decoded\n  %s\nwant\n  %s", v.Name, got, want)
			}
		case "bad":
			n++
			head := v.Bytes[:bufHeader]
			if head[1] != bufVersion || head[2] != 0 || head[3] != 0 || binary.BigEndian.Uint32(head[4:]) > bufMaxBody {
				continue // refused by serve before the body is read
			}
			if _, err := decodeBufRequest(head[0], v.Bytes[bufHeader:]); err == nil {
				t.Errorf("%s: decoded", v.Name)
			}
		}
	}
	if n < 10 {
		t.Fatalf("%d request vectors", n)
	}
}

// TestBufVectorsAnswer: the server writes each answer of bufsock.txt
// byte for byte.
func TestBufVectorsAnswer(t *testing.T) {
	t.Parallel()
	n := 0
	for _, v := range testvec.Load(t, "bufsock.txt") {
		if v.Kind != "ans" {
			continue
		}
		n++
		code, err := tp.ErrorCodeFromString(v.Fields["code"])
		if err != nil {
			t.Fatalf("%s: code %q", v.Name, v.Fields["code"])
		}
		var items []bufItem
		for _, it := range v.Items {
			items = append(items, bufItem{code: tp.ErrorCode(testvec.Uint(t, v, it[0])), sum: uint32(testvec.Uint(t, v, it[1])), value: testvec.Uint(t, v, it[2])})
		}
		got := bufAnswer(code, string(testvec.Hex(t, v, v.Fields["msg"])), uint32(testvec.Uint(t, v, v.Fields["sum"])), testvec.Uint(t, v, v.Fields["value"]), items)
		if !bytes.Equal(got, v.Bytes) {
			t.Errorf("%s: wrote\n  %x\nwant\n  %x", v.Name, got, v.Bytes)
		}
	}
	if n < 5 {
		t.Fatalf("%d answer vectors", n)
	}
}

// describeBufRequest and describeVector write a request the same way, the
// fields its op has, for comparison.
func describeBufRequest(op byte, r bufRequest) string {
	s := fmt.Sprintf("op=%d", op)
	sum := func(p *uint32) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	flags := 0
	if r.opts.Durable {
		flags |= bufDurable
	}
	switch op {
	case bufOpRegister:
		s += fmt.Sprintf(" size=%d", r.size)
	case bufOpUnregister:
		s += fmt.Sprintf(" id=%d", r.id)
	case bufOpGet:
		s += fmt.Sprintf(" id=%d off=%d len=%d scope=%d ns=%x key=%x", r.id, r.off, r.n, r.scope, r.ns, r.key)
	case bufOpPut:
		if r.sum != nil {
			flags |= bufChecksum
		}
		s += fmt.Sprintf(" id=%d off=%d len=%d depth=%d flags=%d sync=%d sum=%s ns=%x key=%x", r.id, r.off, r.n, r.opts.Depth, flags, r.syncReplicas, sum(r.sum), r.ns, r.key)
	case bufOpBatchGet:
		s += fmt.Sprintf(" id=%d scope=%d ns=%x", r.id, r.scope, r.ns)
		for _, it := range r.items {
			s += fmt.Sprintf(" item=%d,%d,%x", it.off, it.n, it.key)
		}
	case bufOpBatchPut:
		s += fmt.Sprintf(" id=%d flags=%d sync=%d ns=%x", r.id, flags, r.syncReplicas, r.ns)
		for _, it := range r.items {
			s += fmt.Sprintf(" item=%d,%d,%d,%s,%x", it.off, it.n, it.depth, sum(it.sum), it.key)
		}
	}
	return s
}

func describeVector(t testing.TB, v testvec.Vector) string {
	op := byte(testvec.Uint(t, v, v.Fields["op"]))
	s := fmt.Sprintf("op=%d", op)
	f := func(names ...string) {
		for _, k := range names {
			val, ok := v.Fields[k]
			if !ok {
				t.Fatalf("%s: no field %s", v.Name, k)
			}
			s += " " + k + "=" + val
		}
	}
	switch op {
	case bufOpRegister:
		f("size")
	case bufOpUnregister:
		f("id")
	case bufOpGet:
		f("id", "off", "len", "scope", "ns", "key")
	case bufOpPut:
		f("id", "off", "len", "depth", "flags", "sync", "sum", "ns", "key")
	case bufOpBatchGet:
		f("id", "scope", "ns")
	case bufOpBatchPut:
		f("id", "flags", "sync", "ns")
	}
	for _, it := range v.Items {
		s += " item=" + strings.Join(it, ",")
	}
	return s
}
