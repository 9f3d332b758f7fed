package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/protocol"
)

// chainKeys returns the chained keys of n blocks of 16 tokens, the tokens
// starting at seed.
func chainKeys(seed uint32, n int) [][]byte {
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = seed + uint32(i)
	}
	var keys [][]byte
	for _, k := range protocol.ChainKeys(tokens, 16, nil) {
		keys = append(keys, bytes.Clone(k[:]))
	}
	return keys
}

// TestServeFreshChainKeepsHead is issue 12 against a real `tidepool serve`
// with the default prefix policy and no SSD tier: after reads have taught
// the policy a short reuse interval, two chains are stored with one
// BatchPut each into a DRAM tier that holds about a chain and a half. The
// first chain must lose its tail, not its head: its resident blocks must be
// a leading run (so `tidepool lookup` counts them all), not the last blocks
// behind an evicted head (Lookup 0 and the space wasted).
func TestServeFreshChainKeepsHead(t *testing.T) {
	d := startDaemon(t, "--ssd-capacity", "0", "--dram-capacity", "16MiB", "--eviction-policy", "prefix")
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const ns, chain, size = "llama", 40, 256 << 10 // 16 MiB holds about 64 blocks
	value := bytes.Repeat([]byte{7}, size)
	put := func(keys [][]byte) {
		t.Helper()
		items := make([]client.Item, len(keys))
		for i, k := range keys {
			items[i] = client.Item{Key: k, Value: value, Depth: int32(i)}
		}
		res, err := c.BatchPut(ctx, ns, items)
		if err != nil {
			t.Fatal(err)
		}
		for i, err := range res {
			if err != nil {
				t.Fatalf("put of block %d: %v", i, err)
			}
		}
	}

	// A system prompt read back often: the policy measures a reuse interval
	// of a few accesses, so its clock moves fast.
	system := chainKeys(1, 4)
	put(system)
	for range 100 {
		res, err := c.BatchGet(ctx, ns, system)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Code != client.CodeOK {
				t.Fatalf("system block %d not found", i)
			}
		}
	}

	a, b := chainKeys(1000, chain), chainKeys(5000, chain)
	put(a)
	put(b)

	// residency runs `tidepool exists` and `tidepool lookup` on a chain and
	// returns its residency by depth ('#' present) and the lookup count.
	residency := func(keys [][]byte) (string, int) {
		t.Helper()
		args := []string{"--ns", ns, "--hex"}
		for _, k := range keys {
			args = append(args, hex.EncodeToString(k))
		}
		out, errs, code := d.tp(t, nil, append([]string{"exists", "--json"}, args...)...)
		var rows []struct{ Present bool }
		if (code != 0 && code != exitNotFound) || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != len(keys) {
			t.Fatalf("exists: %d %q %q", code, out, errs)
		}
		res := make([]byte, len(rows))
		for i, r := range rows {
			res[i] = '.'
			if r.Present {
				res[i] = '#'
			}
		}
		out, errs, code = d.tp(t, nil, append([]string{"lookup", "--json"}, args...)...)
		var lj struct{ Matched, Keys int }
		if code != 0 || json.Unmarshal([]byte(out), &lj) != nil || lj.Keys != len(keys) {
			t.Fatalf("lookup: %d %q %q", code, out, errs)
		}
		return string(res), lj.Matched
	}
	ra, la := residency(a)
	rb, lb := residency(b)
	rs, ls := residency(system)
	t.Logf("first chain %s (lookup %d), second chain %s (lookup %d), system prompt %s", ra, la, rb, lb, rs)
	if ls != len(system) {
		t.Errorf("system prompt, read 100 times: lookup %d of %d", ls, len(system))
	}
	if !strings.Contains(ra, ".") {
		t.Fatalf("first chain fully resident: the tier did not evict, the case is not set up")
	}
	for _, c := range []struct {
		name   string
		res    string
		lookup int
	}{{"first", ra, la}, {"second", rb, lb}} {
		present := strings.Count(c.res, "#")
		if c.lookup != present {
			t.Errorf("%s chain: %d blocks resident (%s) but lookup matches %d: blocks behind a missing head are useless", c.name, present, c.res, c.lookup)
		}
	}
	if la == 0 {
		t.Errorf("first chain: lookup 0: its head was evicted before its tail (%s)", ra)
	}
	if lb != chain {
		t.Errorf("second chain: lookup %d of %d right after its BatchPut", lb, chain)
	}
}
