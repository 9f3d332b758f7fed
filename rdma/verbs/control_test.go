//go:build verbs

package verbs

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/rdma"
)

// TestControlGolden: every control message, framed, against its bytes as
// the inline coding before internal/wire wrote them (ctlVersion 1), so
// that owners and initiators of either build speak to each other; each
// decodes back to what was encoded.
func TestControlGolden(t *testing.T) {
	conn := connData{QPN: 0x123456, PSN: 0xabcdef, MTU: 3, LID: 0x0102}
	for i := range conn.GID {
		conn.GID[i] = byte(i)
	}
	const gid = "000102030405060708090a0b0c0d0e0f"
	check := checkReq{id: 7, key: 0xdeadbeef, addr: 0x1000, n: 4096, sum: 0xcafef00d}
	stats := statsReq{writes: 1, reads: 2, in: 3, out: 4}
	res := resolveReq{id: 7, key: 0xdeadbeef, base: 0x7f0000001000}
	ans := resolveAnswer{addr: 0x7f0000001000, size: 0x200000, rkeys: []uint32{0x11, 0x22}}
	tests := []struct {
		name    string
		typ     byte
		payload []byte
		want    string
		decode  func(p []byte) (any, error) // nil: no payload to decode
		value   any
	}{
		{"hello", msgHello, encodeHello(), "01 0005 54505642 01",
			func(p []byte) (any, error) { return nil, decodeHello(p) }, nil},
		{"hello answer", msgOK, encodeHelloAnswer(2), "07 0001 02",
			func(p []byte) (any, error) { return decodeHelloAnswer(p) }, 2},
		{"connect", msgConnect, connectReq{conn: conn, dev: 1}.encode(), "02 001c" + gid + "00123456 00abcdef 03 0102 01",
			func(p []byte) (any, error) { return decodeConnect(p) }, connectReq{conn: conn, dev: 1}},
		{"connect answer", msgOK, conn.encode(), "07 001b" + gid + "00123456 00abcdef 03 0102",
			func(p []byte) (any, error) { return decodeConnData(p) }, conn},
		{"destroy", msgDestroy, encodeDestroy(0x123456), "03 0004 00123456",
			func(p []byte) (any, error) { return decodeDestroy(p) }, uint32(0x123456)},
		{"check", msgCheck, check.encode(), "04 0020 0000000000000007 deadbeef 0000000000001000 0000000000001000 cafef00d",
			func(p []byte) (any, error) { return decodeCheck(p) }, check},
		{"stats", msgStats, stats.encode(), "05 0020 0000000000000001 0000000000000002 0000000000000003 0000000000000004",
			func(p []byte) (any, error) { return decodeStats(p) }, stats},
		{"ping", msgPing, nil, "06 0000", nil, nil},
		{"resolve", msgResolve, res.encode(), "09 0014 0000000000000007 deadbeef 00007f0000001000",
			func(p []byte) (any, error) { return decodeResolve(p) }, res},
		{"resolve answer", msgOK, ans.encode(), "07 0019 00007f0000001000 0000000000200000 02 00000011 00000022",
			func(p []byte) (any, error) { return decodeResolveAnswer(p) }, ans},
		{"ok", msgOK, nil, "07 0000", nil, nil},
		{"error", msgErr, encodeErr(errRefused, "bad hello"), "08 000a 04 626164206865 6c6c6f", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := writeMsg(&buf, tt.typ, tt.payload); err != nil {
				t.Fatal(err)
			}
			want, err := hex.DecodeString(strings.ReplaceAll(tt.want, " ", ""))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("encoded\n %x\nwant\n %x", buf.Bytes(), want)
			}
			typ, p, err := readMsg(&buf)
			if err != nil || typ != tt.typ || !bytes.Equal(p, tt.payload) || buf.Len() != 0 {
				t.Fatalf("read back: type %d, %x, %v", typ, p, err)
			}
			if tt.decode == nil {
				return
			}
			got, err := tt.decode(p)
			if err != nil || !reflect.DeepEqual(got, tt.value) {
				t.Fatalf("decoded %+v, %v; want %+v", got, err, tt.value)
			}
			// One byte short or one byte over is refused.
			for _, bad := range [][]byte{p[:max(len(p)-1, 0)], append(bytes.Clone(p), 0)} {
				if len(bad) == len(p) {
					continue
				}
				if _, err := tt.decode(bad); !errors.Is(err, rdma.ErrProtocol) {
					t.Fatalf("payload of %d bytes: %v, want ErrProtocol", len(bad), err)
				}
			}
		})
	}
}

// TestControlBadInput: payloads a peer may send that are refused before
// anything is allocated or touched, and error answers read whatever their
// code.
func TestControlBadInput(t *testing.T) {
	for name, p := range map[string][]byte{
		"rkeys claimed, absent": {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 255},
		"no rkeys":              {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0},
	} {
		if _, err := decodeResolveAnswer(p); !errors.Is(err, rdma.ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
	if _, err := decodeHelloAnswer([]byte{0}); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("hello answer of no devices: %v", err)
	}
	if err := decodeHello(append([]byte(helloPayload), ctlVersion+1)); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("hello of another version: %v", err)
	}
	if _, err := decodeConnect(connectReq{conn: connData{QPN: 1, MTU: 9}}.encode()); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("connect with MTU 9: %v", err)
	}
	var buf bytes.Buffer
	_, _ = buf.Write([]byte{msgOK, 0xff, 0xff})
	if _, _, err := readMsg(&buf); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("message claiming 65535 bytes: %v", err)
	}
	if err := writeMsg(&buf, msgOK, make([]byte, maxMsg+1)); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("writing %d bytes: %v", maxMsg+1, err)
	}
	for _, c := range []struct {
		p    []byte
		want error
	}{
		{nil, rdma.ErrProtocol},
		{encodeErr(errUnknown, "x"), rdma.ErrUnknownRegion},
		{encodeErr(errRange, "x"), rdma.ErrOutOfRange},
		{encodeErr(errChecksum, "x"), rdma.ErrChecksum},
		{encodeErr(99, "x"), rdma.ErrProtocol},
	} {
		if err := decodeErr(c.p); !errors.Is(err, c.want) {
			t.Errorf("error answer %x: %v, want %v", c.p, err, c.want)
		}
	}
	if p := encodeErr(errInternal, strings.Repeat("x", 1000)); len(p) != maxMsg {
		t.Errorf("long error text encoded in %d bytes, want %d", len(p), maxMsg)
	}
}
