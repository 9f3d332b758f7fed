package replaycmd

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/cache/evict/sim"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/cli"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/clitest"
	"github.com/tidepool-kv/tidepool/internal/trace"
)

// binPath is the tidepool binary built once for the process tests.
var binPath string

func TestMain(m *testing.M) { clitest.MainUnlessShort(m, &binPath) }

// replayTraceRequests is how many trace requests the replay tests use.
const replayTraceRequests = 300

// firstRequests loads the first n requests of the shared conversation trace,
// skipping the test when the trace is not there.
func firstRequests(t *testing.T, n int) (string, []trace.Request) {
	t.Helper()
	path, err := sim.FindTrace(sim.ConversationTrace)
	if err != nil {
		t.Skipf("replay test needs the Mooncake conversation trace: %v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reqs, err := trace.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	return path, reqs[:min(n, len(reqs))]
}

// runTP runs the tidepool binary and returns stdout, failing on a non-zero
// exit.
func runTP(t *testing.T, args ...string) []byte {
	t.Helper()
	out, errs, code := clitest.Exec(t, binPath, nil, args...)
	if code != 0 {
		t.Fatalf("tidepool %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
	return []byte(out)
}

// unboundedHits is an independent computation of the prefix hit count of a
// cache that never evicts: per request, the leading ids already seen.
func unboundedHits(reqs []trace.Request) (hits, blocks int64) {
	seen := map[uint64]bool{}
	for _, r := range reqs {
		i := 0
		for i < len(r.HashIDs) && seen[r.HashIDs[i]] {
			i++
		}
		hits += int64(i)
		blocks += int64(len(r.HashIDs))
		for _, id := range r.HashIDs {
			seen[id] = true
		}
	}
	return hits, blocks
}

// TestReplayMatchesIndependentCount replays the first requests of the trace
// against real sidecars and checks the measured hit rate against
// computations done here: exactly for a cache that never evicts (counted
// directly); for an LRU sidecar whose capacity is exact in blocks, against
// cache/evict/sim with the same policy and capacity within 0.2 % of the blocks
// (they usually agree exactly, but the sidecar's recency is not strictly
// sequential: reads reach the policy in per-shard batches, and a block
// still pinned by a read lease is skipped by eviction); within bounds for
// the prefix policy.
//
// Every run also checks the chain rule from what the sidecar answers and
// holds (--check-chains): no put fails; a put refused for room (NO_SPACE)
// is followed only by refusals in its request (no block stored past a gap:
// orphan_puts 0); and right after its puts each request still has every
// block it read and every block it stored (chains_cut 0), i.e. a chain
// larger than the room keeps a contiguous head instead of pushing itself
// out. Refusals are expected only where the sidecar ranks a request's new
// blocks below everything else it holds (the prefix policy at 320
// blocks); the never-evicting and LRU runs, whose models know no refusal,
// must have none.
func TestReplayMatchesIndependentCount(t *testing.T) {
	path, reqs := firstRequests(t, replayTraceRequests)
	uniq := map[uint64]bool{}
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			uniq[id] = true
		}
	}
	wantHits, wantBlocks := unboundedHits(reqs)
	if wantHits == 0 || len(uniq) < 1000 {
		t.Fatalf("trace sample too small: %d hits, %d distinct blocks", wantHits, len(uniq))
	}
	const blockTokens = trace.BlockTokens
	tests := []struct {
		name   string
		policy string
		blocks int // per-node capacity in blocks
		// exact: hit blocks must equal want (near: within 0.2 % of the
		// blocks); else the hit rate must lie within [lo, hi].
		exact, near bool
		want        func() int64
		lo, hi      float64
		// refusals: puts refused for room are allowed.
		refusals bool
	}{
		{"never evicts", "lru", len(uniq) + 100, true, false, func() int64 { return wantHits }, 0, 0, false},
		{"lru evicting", "lru", 320, false, true, func() int64 {
			r, err := sim.Run(reqs, sim.Config{CapacityBlocks: 320, Nodes: 1}, evict.NewLRU)
			if err != nil {
				t.Fatal(err)
			}
			return r.HitBlocks
		}, 0, 0, false},
		{"prefix evicting", "prefix", 320, false, false, nil, 0.005, float64(wantHits) / float64(wantBlocks), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := runTP(t, "replay", "--trace", path, "--requests", fmt.Sprint(replayTraceRequests),
				"--nodes", "1", "--capacity-tokens", fmt.Sprint(tc.blocks*blockTokens), "--block-bytes", "4KiB",
				"--policy", tc.policy, "--json", "--progress", "none", "--check-chains")
			var got replayRun
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got.Requests != int64(len(reqs)) || got.Blocks != wantBlocks || got.CapacityBlocks != int64(tc.blocks) {
				t.Fatalf("replayed %d requests / %d blocks at %d blocks capacity, want %d / %d at %d",
					got.Requests, got.Blocks, got.CapacityBlocks, len(reqs), wantBlocks, tc.blocks)
			}
			if len(got.BlocksAtEnd) != 1 || got.BlocksAtEnd[0] > int64(tc.blocks) {
				t.Fatalf("sidecar holds %v blocks, capacity %d", got.BlocksAtEnd, tc.blocks)
			}
			if got.FailedPuts != 0 {
				t.Fatalf("%d failed puts", got.FailedPuts)
			}
			if got.OrphanPuts != 0 || got.ChainsCut != 0 {
				t.Fatalf("%d blocks stored past a refused one, %d requests whose puts pushed out their own chain", got.OrphanPuts, got.ChainsCut)
			}
			if got.RefusedPuts != 0 && !tc.refusals {
				t.Fatalf("%d puts refused for room", got.RefusedPuts)
			}
			if tc.exact {
				if want := tc.want(); got.HitBlocks != want {
					t.Fatalf("sidecar hit %d of %d blocks (%.4f), independent count %d (%.4f)",
						got.HitBlocks, got.Blocks, got.HitRate, want, float64(want)/float64(got.Blocks))
				}
			} else if tc.near {
				want := tc.want()
				if d := got.HitBlocks - want; d*d > (got.Blocks/500)*(got.Blocks/500) {
					t.Fatalf("sidecar hit %d of %d blocks, simulator %d: more than 0.2%% apart", got.HitBlocks, got.Blocks, want)
				}
				t.Logf("%s: sidecar %d hit blocks, simulator %d", tc.name, got.HitBlocks, want)
			} else if got.HitRate < tc.lo || got.HitRate > tc.hi {
				t.Fatalf("hit rate %.4f outside [%.4f, %.4f]", got.HitRate, tc.lo, tc.hi)
			}
			t.Logf("%s: hit rate %.4f (%d of %d blocks), %d blocks at end, %d puts refused for room, %.2fs",
				tc.name, got.HitRate, got.HitBlocks, got.Blocks, got.BlocksAtEnd[0], got.RefusedPuts, got.Seconds)
		})
	}
}

// TestReplayAgainstSockets drives two running sidecars given by socket,
// with longest-prefix routing, and checks per-node figures add up; an
// unbounded cache split over two nodes can never beat one.
func TestReplayAgainstSockets(t *testing.T) {
	path, reqs := firstRequests(t, replayTraceRequests)
	a, b := clitest.Start(t, binPath, nil, "--eviction-policy", "lru"), clitest.Start(t, binPath, nil, "--eviction-policy", "lru")
	out := runTP(t, "replay", "--trace", path, "--requests", fmt.Sprint(replayTraceRequests),
		"--sockets", a.Socket+","+b.Socket, "--route", "prefix", "--block-bytes", "1KiB", "--json", "--progress", "none")
	var got replayRun
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	hits, blocks := unboundedHits(reqs)
	if len(got.Nodes) != 2 || got.Blocks != blocks || got.HitBlocks > hits || got.HitBlocks == 0 {
		t.Fatalf("got %+v; one unbounded cache hits %d of %d", got.Result, hits, blocks)
	}
	if got.Nodes[0].Requests+got.Nodes[1].Requests != int64(len(reqs)) ||
		got.Nodes[0].HitBlocks+got.Nodes[1].HitBlocks != got.HitBlocks || got.Nodes[0].Requests == 0 || got.Nodes[1].Requests == 0 {
		t.Fatalf("per-node figures %+v do not add up", got.Nodes)
	}
	if got.BytesStored <= 0 || got.BytesStored > (got.Blocks-got.HitBlocks)*1024 {
		t.Fatalf("stored %d bytes for %d missed blocks of 1 KiB", got.BytesStored, got.Blocks-got.HitBlocks)
	}
}

func TestReplaySweepPlotAndErrors(t *testing.T) {
	path, _ := firstRequests(t, replayTraceRequests)
	png := filepath.Join(t.TempDir(), "hit.png")
	out := runTP(t, "replay", "--trace", path, "--requests", "2000", "--sim", "--capacity-tokens", "200k,500k,1M",
		"--policy", "lru,prefix", "--references", "--json", "--plot", png)
	var sweep struct{ Runs []replayRun }
	if err := json.Unmarshal(out, &sweep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(sweep.Runs) != 2*3+2*3 {
		t.Fatalf("%d runs, want 12", len(sweep.Runs))
	}
	for _, r := range sweep.Runs {
		if !r.Simulated || r.HitRate <= 0 || r.HitRate > 0.5 {
			t.Fatalf("run %+v", r)
		}
	}
	clitest.CheckPNG(t, png)

	for _, args := range [][]string{
		{"replay", "--policy", "fifo"},
		{"replay", "--route", "random"},
		{"replay", "--sim", "--route", "prefix"},
		{"replay", "--sockets", "/a,/b", "--policy", "lru,prefix"},
		{"replay", "--capacity-tokens", "lots"},
	} {
		cmd := exec.Command(binPath, args...)
		if out, err := cmd.CombinedOutput(); err == nil || cmd.ProcessState.ExitCode() != cli.ExitUsage {
			t.Errorf("%v: exit %v, want usage error\n%s", args, err, out)
		}
	}
}

func TestFootprintMatchesDRAMClasses(t *testing.T) {
	for size, want := range map[int64]int64{1: 512, 512: 512, 513: 640, 4096: 4096, 4097: 5120, 16 << 10: 16 << 10, 32 << 10: 32 << 10, 32<<10 + 1: 64 << 10, 1 << 20: 1 << 20, 1<<20 + 1: 1<<20 + 64<<10} {
		if got := footprint(size); got != want {
			t.Errorf("footprint(%d) = %d, want %d", size, got, want)
		}
	}
}

// TestReplayClusterReadsBackEveryHit replays against two real clustered
// sidecars whose DRAM fills (320 blocks each, far less than the trace
// sample): every block a cluster-scope Lookup counts as a hit must read
// back whole through a cluster-scope BatchGet, including blocks only the
// other node holds while this node has no room to keep a copy of them.
func TestReplayClusterReadsBackEveryHit(t *testing.T) {
	path, _ := firstRequests(t, replayTraceRequests)
	const blocks = 320
	for _, policy := range []string{"lru", "prefix"} {
		t.Run(policy, func(t *testing.T) {
			out := runTP(t, "replay", "--trace", path, "--requests", fmt.Sprint(replayTraceRequests),
				"--nodes", "2", "--scope", "cluster", "--capacity-tokens", fmt.Sprint(blocks*trace.BlockTokens),
				"--block-bytes", "4KiB", "--policy", policy, "--json", "--progress", "none")
			var got replayRun
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if len(got.BlocksAtEnd) != 2 || got.BlocksAtEnd[0] < blocks*9/10 || got.BlocksAtEnd[1] < blocks*9/10 {
				t.Fatalf("sidecars hold %v blocks at the end: not full (capacity %d each)", got.BlocksAtEnd, blocks)
			}
			if got.HitBlocks == 0 || got.BytesRemote == 0 {
				t.Fatalf("no hits (%d) or none from the other node (%d bytes): nothing tested", got.HitBlocks, got.BytesRemote)
			}
			if got.ReadBlocks != got.HitBlocks || len(got.UnreadBlocks) != 0 || got.BytesFetched != got.ReadBlocks*4096 {
				t.Fatalf("lookups counted %d hit blocks, reads returned %d (%d bytes); not read back: %v",
					got.HitBlocks, got.ReadBlocks, got.BytesFetched, got.UnreadBlocks)
			}
			t.Logf("%s: %d hit blocks read back, %d bytes from the other node", policy, got.ReadBlocks, got.BytesRemote)
		})
	}
}
