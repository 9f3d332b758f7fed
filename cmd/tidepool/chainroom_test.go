package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
)

// TestServeChainLargerThanRoomKeepsHead is issue 34's "Also" against a
// real `tidepool serve` (16 MiB DRAM, no SSD tier or one on a disk below
// its free-space floor, the prefix policy): three chains read back three times fill three quarters of the
// DRAM tier, then a fresh 16-block chain, twice the free room, is stored in
// one BatchPut (and, in the second case, block by block through Put, which
// takes the put socket for values this large). The chain must keep a
// contiguous head and be refused the rest with NO_SPACE per block: no block
// stored past a refused one, `tidepool lookup` matching every block it
// stored, nothing past the head present, and none of the read chains
// evicted for it. Before the chain rule the BatchPut answered OK for all 16
// blocks and kept blocks 0–6 and 15: each block pushed out the one stored
// before it (lookup 7, block 15 an orphan).
func TestServeChainLargerThanRoomKeepsHead(t *testing.T) {
	noSSD := []string{"--ssd-capacity", "0"}
	// An SSD tier on a disk below its free-space floor: it starts degraded
	// and takes no writes, so a DRAM eviction loses its block.
	fullSSD := []string{"--ssd-capacity", "256MiB", "--ssd-min-free", "1000TiB"}
	for _, tc := range []struct {
		name  string
		batch bool
		ssd   []string
	}{{"batch put", true, noSSD}, {"put socket", false, noSSD}, {"batch put, full ssd", true, fullSSD}} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, append([]string{"--dram-capacity", "16MiB", "--eviction-policy", "prefix"}, tc.ssd...)...)
			c, err := client.New(d.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			const ns, size = "llama", 512 << 10 // 16 MiB holds 32 blocks
			value := bytes.Repeat([]byte{3}, size)
			put := func(keys [][]byte) []error {
				t.Helper()
				if !tc.batch {
					errs := make([]error, len(keys))
					for i, k := range keys {
						_, errs[i] = c.Put(ctx, ns, k, value, int32(i))
					}
					return errs
				}
				items := make([]client.Item, len(keys))
				for i, k := range keys {
					items[i] = client.Item{Key: k, Value: value, Depth: int32(i)}
				}
				errs, err := c.BatchPut(ctx, ns, items)
				if err != nil {
					t.Fatal(err)
				}
				return errs
			}

			// 24 blocks the policy ranks above a fresh chain: read 3 times.
			var read [][][]byte
			for i := range 3 {
				keys := chainKeys(uint32(100*i+1), 8)
				for j, err := range put(keys) {
					if err != nil {
						t.Fatalf("read chain %d block %d: %v", i, j, err)
					}
				}
				for range 3 {
					res, err := c.BatchGet(ctx, ns, keys)
					if err != nil {
						t.Fatal(err)
					}
					for j, r := range res {
						if r.Code != client.CodeOK {
							t.Fatalf("read chain %d block %d: %v", i, j, r.Code)
						}
					}
				}
				read = append(read, keys)
			}

			fresh := chainKeys(5000, 16)
			errs := put(fresh)
			head := 0
			for head < len(errs) && errs[head] == nil {
				head++
			}
			for i := head; i < len(errs); i++ {
				if client.CodeOf(errs[i]) != client.CodeNoSpace {
					t.Errorf("block %d after a head of %d: %v, want NO_SPACE", i, head, errs[i])
				}
			}
			t.Logf("head of %d blocks stored; block %d: %v", head, head, errs[min(head, len(errs)-1)])
			if head < 8 {
				t.Fatalf("stored a head of %d of %d blocks into room for 8: the case is not set up", head, len(fresh))
			}
			if head == len(fresh) {
				t.Errorf("all %d blocks answered OK into room for 8: the chain was stored by pushing out its own blocks", head)
			}

			// lookup and exists through the CLI, as an operator would.
			lookup := func(keys [][]byte) (matched int, present []bool) {
				t.Helper()
				args := []string{"--ns", ns, "--hex"}
				for _, k := range keys {
					args = append(args, hex.EncodeToString(k))
				}
				out, errs, code := d.tp(t, nil, append([]string{"lookup", "--json"}, args...)...)
				var lj struct{ Matched, Keys int }
				if code != 0 || json.Unmarshal([]byte(out), &lj) != nil || lj.Keys != len(keys) {
					t.Fatalf("lookup: %d %q %q", code, out, errs)
				}
				out, errs, code = d.tp(t, nil, append([]string{"exists", "--json"}, args...)...)
				var rows []struct{ Present bool }
				if (code != 0 && code != exitNotFound) || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != len(keys) {
					t.Fatalf("exists: %d %q %q", code, out, errs)
				}
				for _, r := range rows {
					present = append(present, r.Present)
				}
				return lj.Matched, present
			}
			m, present := lookup(fresh)
			res := make([]byte, len(present))
			for i, p := range present {
				res[i] = '.'
				if p {
					res[i] = '#'
				}
			}
			t.Logf("fresh chain %s (lookup %d)", res, m)
			if m != head {
				t.Errorf("lookup matches %d blocks of the fresh chain, its puts stored a head of %d", m, head)
			}
			for i := head; i < len(fresh); i++ {
				if present[i] {
					t.Errorf("block %d present past the head of %d: an orphan", i, head)
				}
			}
			for i, keys := range read {
				if m, _ := lookup(keys); m != len(keys) {
					t.Errorf("read chain %d: lookup %d of %d: evicted for the fresh chain", i, m, len(keys))
				}
			}
		})
	}
}
