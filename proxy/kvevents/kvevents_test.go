package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// msgspecBatch is what the pinned vLLM's msgspec encoder writes for the
// batch TestEncodeBatchMatchesMsgspec builds (the same structs, generated
// with msgspec 0.23; tests/python/test_kv_events.py checks live batches
// against vLLM's own classes).
const msgspecBatch = "93cb3ff80000000000009488a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf18191a1b1c1d1e1fb1706172656e745f626c6f636b5f68617368cf7c7d7e7f80818283a9746f6b656e5f6964739401ccc8ce00011170ce2a05f200aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf18191a1b1c1d1e1fa66d656469756da753544f5241474581a474797065b0416c6c426c6f636b73436c656172656488a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da753544f52414745a96c6f72615f6e616d65c000"

func seq(n int, from byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}

func TestEncodeBatchMatchesMsgspec(t *testing.T) {
	key, parent := seq(32, 0), seq(32, 100)
	m := &meta{tokens: []uint32{1, 200, 70000, 5000000000 % (1 << 32)}, parent: parent, blockSize: 4}
	evs := []*event{
		{kind: stored, key: string(key), medium: MediumDRAM, meta: m},
		{kind: removed, key: string(key), medium: MediumSSD},
		{kind: cleared},
	}
	got := encodeBatch(nil, 1.5, evs, true)
	// The last event with the key as bytes (kv_events_block_hash: bytes)
	// and no description.
	e := enc{b: got[:len(got)-1]}
	e.event(&event{kind: stored, key: string(key), medium: MediumSSD}, false)
	e.uint(0)
	got = e.b
	got[10] = 0x94 // four events
	want, _ := hex.DecodeString(msgspecBatch)
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding differs from msgspec's:\n got %x\nwant %x", got, want)
	}
}

func TestHashInt(t *testing.T) {
	for _, c := range []struct {
		key  []byte
		want uint64
	}{{seq(32, 0), 0x18191a1b1c1d1e1f}, {[]byte{1, 2}, 0x0102}, {seq(8, 1), 0x0102030405060708}} {
		if got := HashInt(c.key); got != c.want {
			t.Errorf("HashInt(%x) = %x, want %x", c.key, got, c.want)
		}
	}
}

// dialSub connects to addr as a ZeroMQ SUB subscribed to "kv@".
func dialSub(t *testing.T, addr net.Addr, typ string) (net.Conn, *bufio.Reader, *bufio.Writer) {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	if _, err := handshake(c, r, w, typ); err != nil {
		t.Fatal(err)
	}
	if typ == "SUB" {
		if err := writeMessage(w, []byte("\x01kv@")); err != nil {
			t.Fatal(err)
		}
		w.Flush()
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	return c, r, w
}

func started(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	cfg.Endpoint, cfg.ReplayEndpoint, cfg.Pod = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "pod-a"
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// recvSeq reads published messages until one numbered at least min.
func recvSeq(t *testing.T, r *bufio.Reader, min int64) (topic string, seq int64, payload []byte) {
	t.Helper()
	for {
		parts, cmd, err := readMessageLarge(r)
		if err != nil {
			t.Fatal(err)
		}
		if cmd || len(parts) != 3 {
			t.Fatalf("message of %d frames", len(parts))
		}
		seq = int64(binary.BigEndian.Uint64(parts[1]))
		if seq >= min {
			return string(parts[0]), seq, parts[2]
		}
	}
}

// readMessageLarge is readMessage without the cap on frames (published
// payloads are larger than what a peer may send us).
func readMessageLarge(r *bufio.Reader) ([][]byte, bool, error) {
	var parts [][]byte
	for {
		flags, err := r.ReadByte()
		if err != nil {
			return nil, false, err
		}
		var n uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return nil, false, err
			}
			n = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := r.ReadByte()
			if err != nil {
				return nil, false, err
			}
			n = uint64(b)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, false, err
		}
		parts = append(parts, body)
		if flags&flagMore == 0 {
			return parts, flags&flagCommand != 0, nil
		}
	}
}

func TestPublishGapAndSnapshot(t *testing.T) {
	// One event per batch: the goroutine that took "stall" below cannot
	// also take queued changes before it waits for smu.
	p := started(t, Config{QueueEvents: 2, BatchEvents: 1})
	_, r, _ := dialSub(t, p.Addr(), "SUB")
	// The subscription arrives asynchronously: publish until one is seen.
	k := []byte("first-key")
	deadline := time.Now().Add(30 * time.Second)
	for p.Stats().Subscribers == 0 || !subscribed(p) {
		if time.Now().After(deadline) {
			t.Fatal("no subscription")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Describe("ns", k, &cache.BlockMeta{Tokens: []uint32{7, 8}, BlockSize: 2})
	p.Stored("ns", k, "dram", nil)
	topic, s1, payload := recvSeq(t, r, 1)
	if topic != "kv@pod-a@ns" || !bytes.Contains(payload, []byte{0x92, 7, 8}) {
		t.Fatalf("topic %q payload %x", topic, payload)
	}
	// Stall the publishing goroutine (it needs smu to hand a batch to the
	// subscribers): changes beyond the queue's 2 are dropped and counted.
	p.smu.Lock()
	p.Stored("ns", []byte("stall"), "dram", nil) // taken by the goroutine, which then waits
	for len(p.ch) != 0 {
		time.Sleep(time.Millisecond)
	}
	for i := range 10 {
		p.Stored("ns", []byte{byte(i)}, "dram", nil)
	}
	p.smu.Unlock()
	if d := p.Stats().Dropped; d != 8 {
		t.Fatalf("dropped %d, want 8", d)
	}
	// The batch after the drops skips a number.
	for p.Stats().Events < 4 { // first-key, stall and the two queued
		time.Sleep(time.Millisecond)
	}
	first := s1
	var seqs []int64
	for int64(len(seqs)) < p.Stats().Published-2 {
		_, s, _ := recvSeq(t, r, s1+1)
		seqs = append(seqs, s)
		s1 = s
	}
	last := seqs[len(seqs)-1]
	if last != first+int64(len(seqs))+1 {
		t.Fatalf("sequence %v after %d: no gap after the drops", seqs, first)
	}
	gap := first + 1
	for _, q := range seqs {
		if q != gap {
			break
		}
		gap++
	}
	// Replay from the gap: a snapshot with every block held, numbered with
	// the last published.
	c, rr, w := dialSub(t, p.ReplayAddr(), "DEALER")
	_ = c
	writeMessage(w, []byte{}, binary.BigEndian.AppendUint64(nil, uint64(gap)))
	w.Flush()
	held := 0
	for {
		parts, _, err := readMessageLarge(rr)
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) != 4 || len(parts[0]) != 0 {
			t.Fatalf("reply of %d frames", len(parts))
		}
		s := int64(binary.BigEndian.Uint64(parts[2]))
		if s == -1 {
			break
		}
		if s != last {
			t.Fatalf("snapshot batch numbered %d, want %d", s, last)
		}
		held += bytes.Count(parts[3], []byte("BlockStored"))
	}
	if held != 12 { // first-key, stall, and the ten
		t.Fatalf("snapshot of %d blocks, want 12", held)
	}
	// Garbage: a request that is not one is dropped and counted; the
	// connection still answers.
	writeMessage(w, []byte{}, []byte("abc"))
	writeMessage(w, []byte{}, binary.BigEndian.AppendUint64(nil, uint64(last)))
	w.Flush()
	parts, _, err := readMessageLarge(rr)
	if err != nil || int64(binary.BigEndian.Uint64(parts[2])) != last {
		t.Fatalf("replay after garbage: %v %v", parts, err)
	}
	if p.Stats().BadRequests != 1 {
		t.Fatalf("bad requests %d", p.Stats().BadRequests)
	}
}

func subscribed(p *Publisher) bool { return subscribedTo(p, "kv@x") }

func TestRemovedKeepsDescriptionForDemotion(t *testing.T) {
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := []byte("k")
	p.Describe("ns", k, &cache.BlockMeta{Tokens: []uint32{1}, BlockSize: 1})
	p.Stored("ns", k, "dram", nil)
	p.Removed("ns", k, "dram")    // evicted: no tier holds it for a moment
	p.Stored("ns", k, "ssd", nil) // the demotion is written
	snap := p.snapshotLocked()
	if len(snap) != 1 || snap[0].medium != MediumSSD || snap[0].meta == nil || snap[0].meta.tokens[0] != 1 {
		t.Fatalf("snapshot %+v", snap)
	}
	p.Forget("ns", []byte("never-stored"))
	p.Describe("ns", []byte("failed"), &cache.BlockMeta{BlockSize: 1})
	p.Forget("ns", []byte("failed"))
	if p.Stats().Held != 1 {
		t.Fatalf("held %d", p.Stats().Held)
	}
}

// TestStoredDescription: a tier's record of a block's description (the
// SSD tier's, for the blocks it finds at start) describes a block nothing
// else described, never replaces token ids a put gave, and Description
// hands it back while the block is held or just removed, for its copy.
func TestStoredDescription(t *testing.T) {
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &cache.BlockMeta{Tokens: []uint32{7, 8}, Parent: []byte("p"), BlockSize: 2}
	p.Stored("ns", []byte("recovered"), "ssd", rec)
	rec.Tokens[0] = 99 // the tier's copy is not kept by reference
	snap := p.snapshotLocked()
	if len(snap) != 1 || snap[0].meta == nil || snap[0].meta.tokens[0] != 7 || string(snap[0].meta.parent) != "p" || snap[0].meta.blockSize != 2 {
		t.Fatalf("snapshot %+v", snap)
	}
	if d := p.Description("ns", []byte("recovered")); d == nil || d.Tokens[0] != 7 || d.BlockSize != 2 {
		t.Fatalf("Description = %+v", d)
	}

	k := []byte("put")
	p.Describe("ns", k, &cache.BlockMeta{Tokens: []uint32{1, 2}, BlockSize: 2})
	p.Stored("ns", k, "dram", nil)
	p.Stored("ns", k, "ssd", &cache.BlockMeta{Tokens: []uint32{5, 6}, BlockSize: 2}) // an older record
	p.Removed("ns", k, "dram")
	p.Removed("ns", k, "ssd") // no tier holds it: its description is kept a while
	if d := p.Description("ns", k); d == nil || d.Tokens[0] != 1 {
		t.Fatalf("Description after removal = %+v, want the put's", d)
	}
	p.Stored("ns", []byte("bare"), "dram", &cache.BlockMeta{BlockSize: 2})
	p.Stored("ns", []byte("bare"), "ssd", &cache.BlockMeta{Tokens: []uint32{3, 4}, BlockSize: 2})
	if d := p.Description("ns", []byte("bare")); d == nil || len(d.Tokens) != 2 {
		t.Fatalf("a record with token ids does not describe a block known without: %+v", d)
	}
	if d := p.Description("ns", []byte("unknown")); d != nil {
		t.Fatalf("Description of an unknown block = %+v", d)
	}
}

// TestSubscribeSnapshot: with SubscribeSnapshot, a new subscription gets
// what is held under its prefix (the startup snapshot it could not see,
// with the descriptions an SSD tier recovered) numbered with the last
// sequence number published, then the live batches; without it, only the
// live batches.
func TestSubscribeSnapshot(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			cfg := Config{SubscribeSnapshot: on}
			cfg.Endpoint, cfg.Pod = "tcp://127.0.0.1:0", "pod-a"
			p, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			// What a reopened SSD tier reports before the sidecar starts.
			p.Stored("a", []byte("kept-a"), "ssd", &cache.BlockMeta{Tokens: []uint32{7, 8}, BlockSize: 2})
			p.Stored("b", []byte("kept-b"), "ssd", &cache.BlockMeta{Tokens: []uint32{9, 10}, BlockSize: 2})
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			c, err := net.Dial("tcp", p.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			r, w := bufio.NewReader(c), bufio.NewWriter(c)
			if _, err := handshake(c, r, w, "SUB"); err != nil {
				t.Fatal(err)
			}
			if err := writeMessage(w, []byte("\x01kv@pod-a@a")); err != nil || w.Flush() != nil {
				t.Fatal(err)
			}
			for !subscribedTo(p, "kv@pod-a@a") {
				time.Sleep(time.Millisecond)
			}
			if on {
				topic, seq, payload := recvSeq(t, r, 0)
				// The startup snapshot was two batches (one per topic),
				// 0 and 1.
				if topic != "kv@pod-a@a" || seq != 1 || !bytes.Contains(payload, []byte{0x92, 7, 8}) || bytes.Contains(payload, []byte{0x92, 9, 10}) {
					t.Fatalf("first batch %q %d %x: want the snapshot of kv@pod-a@a, numbered 1", topic, seq, payload)
				}
			}
			// A live change after the subscription.
			p.Stored("a", []byte("live"), "dram", &cache.BlockMeta{Tokens: []uint32{11, 12}, BlockSize: 2})
			topic, seq, payload := recvSeq(t, r, 0)
			if topic != "kv@pod-a@a" || seq != 2 || !bytes.Contains(payload, []byte{0x92, 11, 12}) {
				t.Fatalf("batch %q %d %x: want the live change, numbered 2", topic, seq, payload)
			}
		})
	}
}

func subscribedTo(p *Publisher, topic string) bool {
	p.smu.Lock()
	defer p.smu.Unlock()
	for s := range p.subs {
		if s.wants(topic) {
			return true
		}
	}
	return false
}

// TestSnapshotListsParentsFirst: a snapshot lists each block after its
// parent (llm-d indexes a chain only from its head), whatever the order
// the blocks were stored in, for chains that share a prefix too.
func TestSnapshotListsParentsFirst(t *testing.T) {
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := func(chain, i int) string {
		if i < 10 {
			chain = 0 // the chains share their first 10 blocks
		}
		return fmt.Sprintf("c%d-%03d", chain, i)
	}
	parent := map[string]string{}
	for _, chain := range []int{1, 2} {
		for i := 39; i >= 0; i-- { // children stored first
			m := &cache.BlockMeta{BlockSize: 1, Tokens: []uint32{uint32(i)}}
			if i > 0 {
				m.Parent = []byte(key(chain, i-1))
				parent[key(chain, i)] = key(chain, i-1)
			}
			p.Stored("ns", []byte(key(chain, i)), "ssd", m)
		}
	}
	p.Stored("ns", []byte("orphan"), "dram", &cache.BlockMeta{BlockSize: 1, Tokens: []uint32{1}, Parent: []byte("gone")})
	snap := p.snapshotLocked()
	at := map[string]int{}
	for i, ev := range snap {
		if _, dup := at[ev.key]; dup {
			t.Fatalf("%s listed twice", ev.key)
		}
		at[ev.key] = i
	}
	if len(at) != 10+2*30+1 {
		t.Fatalf("%d blocks listed, want 71", len(at))
	}
	for k, par := range parent {
		if at[par] >= at[k] {
			t.Errorf("%s listed at %d, its parent %s at %d", k, at[k], par, at[par])
		}
	}
}
