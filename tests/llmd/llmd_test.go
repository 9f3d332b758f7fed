// Package llmd runs llm-d's kv-cache indexer (github.com/llm-d/llm-d-kv-cache,
// pinned in go.mod) against a real `tidepool serve` publishing KV events:
// llm-d's own ZMQ subscriber (go-zeromq/zmq4), its vLLM event adapter, its
// in-memory index and its longest-prefix scorer, as its kv-cache manager
// wires them. It is a module of its own so that the sidecar's module does
// not take on llm-d's dependencies; scripts/test-llmd.sh runs it.
package llmd

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/porttest"
)

const (
	pod       = "pod-a"
	model     = "tiny-llama"
	blockSize = 16
	ns        = "vllm/tiny-llama/tp0/pp0/test"
)

// serve builds (unless TIDEPOOL_BIN names it) and starts tidepool serve with
// KV events on, a 64 MiB DRAM tier and no SSD tier (an evicted block is
// gone), as pod POD_NAME=pod-a.
func serve(t *testing.T, endpoint string) *client.Client {
	t.Helper()
	return newSidecar(t, endpoint, "--ssd-capacity", "0").start()
}

// sidecar is a `tidepool serve` process publishing KV events on endpoint
// as pod POD_NAME=pod-a with a 64 MiB DRAM tier, args added; start may be
// called again after stop, on the same directories (a restart).
type sidecar struct {
	t        *testing.T
	bin, dir string
	pod      string // POD_NAME (pod unless set before start)
	args     []string
	cmd      *exec.Cmd
	c        *client.Client
}

func newSidecar(t *testing.T, endpoint string, args ...string) *sidecar {
	t.Helper()
	bin := os.Getenv("TIDEPOOL_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "tidepool")
		b := exec.Command("go", "build", "-o", bin, "./cmd/tidepool")
		b.Dir = "../.."
		if out, err := b.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	dir, err := os.MkdirTemp("/dev/shm", "tp-llmd-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	sc := &sidecar{t: t, bin: bin, dir: dir, pod: pod, args: append([]string{"--socket", filepath.Join(dir, "tp.sock"),
		"--data-dir", filepath.Join(dir, "data"), "--arena-dir", filepath.Join(dir, "arenas"),
		"--dram-capacity", "64MiB", "--arena-size", "16MiB", "--metrics-addr", "", "--log-level", "warn",
		"--max-value-size", "8MiB", "--kv-events-endpoint", endpoint, "--kv-events-model", model}, args...)}
	t.Cleanup(func() {
		sc.stop()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			t.Logf("server log:\n%s", b)
		}
	})
	return sc
}

// start starts the process and returns a client once it answers Hello.
func (sc *sidecar) start() *client.Client {
	t := sc.t
	t.Helper()
	sock := filepath.Join(sc.dir, "tp.sock")
	sc.cmd = exec.Command(sc.bin, append([]string{"serve"}, sc.args...)...)
	sc.cmd.Env = append(os.Environ(), "POD_NAME="+sc.pod)
	log, _ := os.OpenFile(filepath.Join(sc.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	sc.cmd.Stdout, sc.cmd.Stderr = log, log
	if err := sc.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(sock); err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("serve not ready: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		c, err := client.New(sock)
		if err == nil {
			if _, err = c.Hello(context.Background()); err == nil {
				sc.c = c
				return c
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop closes the client and stops the process as Kubernetes does
// (SIGTERM: a clean stop, which spills DRAM into SSD), waiting for it.
func (sc *sidecar) stop() {
	if sc.c != nil {
		sc.c.Close()
		sc.c = nil
	}
	if sc.cmd != nil {
		sc.cmd.Process.Signal(syscall.SIGTERM)
		sc.cmd.Wait()
		sc.cmd = nil
	}
}

// key is an engine block key (vLLM's block hashes are 32 bytes).
func key(i int) []byte {
	k := sha256.Sum256([]byte("llmd block " + strconv.Itoa(i)))
	return k[:]
}

func prompt(first, n int) []uint32 {
	out := make([]uint32, n*blockSize)
	for i := range out {
		out[i] = uint32(first*blockSize + i + 1)
	}
	return out
}

// putPrompt puts the blocks of one prompt as the vLLM connector does:
// Reserve, write, Commit with each block's token ids, parent key and block
// size.
func putPrompt(t *testing.T, c *client.Client, first int, tokens []uint32, size int64) {
	t.Helper()
	ctx := context.Background()
	n := len(tokens) / blockSize
	items := make([]client.ReserveItem, n)
	for i := range items {
		items[i] = client.ReserveItem{Key: key(first + i), Size: size, Depth: int32(i)}
	}
	rs, err := c.Reserve(ctx, ns, items, 0)
	if err != nil {
		t.Fatal(err)
	}
	var commits []client.CommitItem
	for i, r := range rs {
		if r.Code != client.CodeOK {
			t.Fatalf("reserve %d: %v %s", i, r.Code, r.Message)
		}
		crc, err := c.WriteSlot(ctx, r.Slot, make([]byte, size))
		if err != nil {
			t.Fatal(err)
		}
		m := &client.BlockMeta{Tokens: tokens[i*blockSize : (i+1)*blockSize], BlockSize: blockSize}
		if i > 0 {
			m.Parent = key(first + i - 1)
		}
		commits = append(commits, client.CommitItem{Token: r.Token, Checksum: crc, HasChecksum: true, Meta: m})
	}
	errs, err := c.Commit(ctx, commits)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("commit %d: %v", i, e)
		}
	}
}

// indexer is llm-d's indexer, wired as its kv-cache manager wires it,
// subscribed to endpoint as pod's: score is the pod's score for a prompt.
func indexer(ctx context.Context, t *testing.T, endpoint string) (score func(tokens []uint32) float64) {
	t.Helper()
	scores := indexerOf(ctx, t, map[string]string{pod: endpoint})
	return func(tokens []uint32) float64 { return scores(tokens)[pod] }
}

// indexerOf is indexer subscribed to several pods (pod name → endpoint):
// scores gives every pod's score for a prompt.
func indexerOf(ctx context.Context, t *testing.T, pods map[string]string) (scores func(tokens []uint32) map[string]float64) {
	t.Helper()
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	icfg, err := kvcache.NewDefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	ix, err := kvcache.NewKVCacheIndexer(ctx, icfg, tp)
	if err != nil {
		t.Fatal(err)
	}
	go ix.Run(ctx)
	pool := kvevents.NewPool(&kvevents.Config{TopicFilter: "kv@", Concurrency: 2}, ix.KVBlockIndex(), tp,
		engineadapter.NewVLLMAdapter())
	pool.Start(ctx)
	t.Cleanup(func() { pool.Shutdown(context.Background()) })
	subs := kvevents.NewSubscriberManager(pool)
	t.Cleanup(func() { subs.Shutdown(context.Background()) })
	for name, endpoint := range pods {
		if err := subs.EnsureSubscriber(ctx, name, endpoint, "kv@", true); err != nil {
			t.Fatal(err)
		}
	}
	return func(tokens []uint32) map[string]float64 {
		s, err := ix.ScoreTokens(ctx, tokens, model, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// waitFor polls cond for up to 60 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitSubscriber puts probe prompts (blocks from first) until the index
// scores one: the subscriber joins late (a PUB delivers nothing before a
// SUB's subscription arrives).
func awaitSubscriber(t *testing.T, c *client.Client, score func([]uint32) float64, first int) {
	t.Helper()
	probe := first
	waitFor(t, "the indexer's subscriber to receive", func() bool {
		toks := prompt(probe, 1)
		putPrompt(t, c, probe, toks, 4096)
		probe++
		time.Sleep(100 * time.Millisecond)
		return score(toks) > 0
	})
}

func TestIndexerScoresTidepoolPod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", porttest.Free(t))
	c := serve(t, endpoint)
	score := indexer(ctx, t, endpoint)
	awaitSubscriber(t, c, score, 1000)
	// A 4-block prompt put the connector's way: the pod scores for it, for
	// its prefixes, and not for a prompt it does not hold.
	toks := prompt(0, 4)
	if score(toks) != 0 {
		t.Fatal("scored before the put")
	}
	putPrompt(t, c, 0, toks, 1<<20)
	waitFor(t, "the prompt's score", func() bool { return score(toks) >= 4*0.8-1e-9 })
	t.Logf("score of the 4-block prompt: %v (llm-d weighs cpu 0.8 per block)", score(toks))
	if s := score(toks[:2*blockSize]); s < 2*0.8-1e-9 {
		t.Fatalf("score of its 2-block prefix: %v", s)
	}
	if s := score(prompt(50, 4)); s != 0 {
		t.Fatalf("score of another prompt: %v", s)
	}

	// Evict it: 80 blocks of 1 MiB through a 64 MiB DRAM tier with no SSD.
	for i := range 20 {
		putPrompt(t, c, 100+i*4, prompt(100+i*4, 4), 1<<20)
	}
	waitFor(t, "the evicted prompt's score to drop", func() bool { return score(toks) < 4*0.8-1e-9 })
	t.Logf("score of the prompt after eviction: %v", score(toks))
}

// TestIndexerScoresAfterSidecarRestart: the blocks a sidecar's SSD tier
// kept across a restart are indexed by a router that restarts with it.
// The prompt's blocks are put the connector's way (with token ids) and
// some are demoted to SSD by DRAM pressure, the rest spilled there by the
// clean stop (SIGTERM); the sidecar restarts on the same data_dir, with
// kv_events_subscribe_snapshot (llm-d's subscriber never asks the replay
// socket), and a fresh llm-d indexer scores the pod for the prompt from
// the snapshot, which carries the token ids the SSD tier kept.
func TestIndexerScoresAfterSidecarRestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", porttest.Free(t))
	sc := newSidecar(t, endpoint, "--ssd-capacity", "512MiB", "--kv-events-subscribe-snapshot", "true")
	c := sc.start()
	// 24 blocks of 4 MiB (6 prompts of 4) through 64 MiB of DRAM: the
	// first prompts are demoted to SSD while serving.
	for p := range 6 {
		putPrompt(t, c, p*4, prompt(p*4, 4), 4<<20)
	}
	toks := prompt(0, 4)  // demoted
	last := prompt(20, 4) // in DRAM at the stop: spilled
	sc.stop()
	sc.start()
	score := indexer(ctx, t, endpoint)
	waitFor(t, "the restarted pod's score for a prompt its SSD kept", func() bool {
		return score(toks) > 0 && score(last) > 0
	})
	full, prefix := score(toks), score(toks[:2*blockSize])
	t.Logf("after the restart: score %v for the 4-block prompt, %v for its 2-block prefix (medium STORAGE)", full, prefix)
	if full < 2*prefix-1e-9 || prefix <= 0 {
		t.Fatalf("scores %v (4 blocks) and %v (2 blocks): not one per block", full, prefix)
	}
	if s := score(prompt(50, 4)); s != 0 {
		t.Fatalf("score of a prompt never put: %v", s)
	}
}

// TestIndexerScoresPodThatFetched: two clustered sidecars, pod-a and
// pod-b. A prompt's blocks are put on pod-a (the connector's way, with
// token ids), which owns every one of them, so nothing is pushed to
// pod-b: an llm-d indexer subscribed to pod-b does not score it. The
// blocks are then read through pod-b, which fetches them from pod-a and
// keeps a copy; that copy's BlockStored carries the token ids pod-a was
// told (the description travels with the fetch), so the indexer now
// scores pod-b for the prompt. Without it pod-b's events have no token
// ids and the indexer drops them: pod-b scores 0 (checked against the
// binary before the change). The indexer hears pod-b only: llm-d keeps
// one engine-hash → request-key mapping for all pods, so an indexer that
// also heard pod-a's events for these blocks (while it keeps them) would
// index pod-b's token-less events through pod-a's mapping.
func TestIndexerScoresPodThatFetched(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const podA, podB = "pod-a", "pod-b"
	endA := fmt.Sprintf("tcp://127.0.0.1:%d", porttest.Free(t))
	endB := fmt.Sprintf("tcp://127.0.0.1:%d", porttest.Free(t))
	member := func(endpoint, name, join string) (sc *sidecar, gossip string) {
		gossip = fmt.Sprintf("127.0.0.1:%d", porttest.Free(t))
		args := []string{"--ssd-capacity", "0", "--gossip-addr", gossip,
			"--peer-addr", fmt.Sprintf("127.0.0.1:%d", porttest.Free(t)),
			"--transfer-addr", fmt.Sprintf("127.0.0.1:%d", porttest.Free(t)),
			"--cluster-label", "llmd-test", "--insecure-cluster", "true"}
		if join != "" {
			args = append(args, "--join", join)
		}
		sc = newSidecar(t, endpoint, args...)
		sc.pod = name // node_name defaults to $POD_NAME
		return sc, gossip
	}
	scA, gossipA := member(endA, podA, "")
	a := scA.start()
	scB, _ := member(endB, podB, gossipA)
	b := scB.start()
	waitFor(t, "pod-b to see both members alive", func() bool {
		ms, err := b.Members(ctx)
		alive := 0
		for _, m := range ms {
			if m.State == "alive" {
				alive++
			}
		}
		return err == nil && alive == 2
	})

	// A prompt whose 4 blocks pod-a owns (serve's placement: the ring over
	// the members' names, cluster.DefaultRingConfig, owner key ns NUL key).
	ring, err := cluster.NewRing([]string{podA, podB}, cluster.DefaultRingConfig())
	if err != nil {
		t.Fatal(err)
	}
	ownedByA := func(first int) bool {
		for i := range 4 {
			if ring.Owners([]byte(ns+"\x00"+string(key(first+i))), 1)[0] != podA {
				return false
			}
		}
		return true
	}
	first := 3000
	for !ownedByA(first) {
		first++
	}

	scores := indexerOf(ctx, t, map[string]string{podB: endB})
	awaitSubscriber(t, b, func(toks []uint32) float64 { return scores(toks)[podB] }, 1000)
	toks := prompt(first, 4)
	putPrompt(t, a, first, toks, 1<<20)
	if s := scores(toks)[podB]; s != 0 {
		t.Fatalf("pod-b scored %v before it read the prompt (its blocks are pod-a's only)", s)
	}
	for i := range 4 {
		if v, found, err := b.Get(ctx, ns, key(first+i), client.ScopeLocal); err != nil || found {
			t.Fatalf("block %d on pod-b before the read: %d bytes, %v, %v", i, len(v), found, err)
		}
		v, found, err := b.Get(ctx, ns, key(first+i), client.ScopeCluster)
		if err != nil || !found || len(v) != 1<<20 {
			t.Fatalf("read of block %d through pod-b: %d bytes, %v, %v", i, len(v), found, err)
		}
	}
	waitFor(t, "pod-b's score for the prompt it fetched", func() bool { return scores(toks)[podB] >= 4*0.8-1e-9 })
	t.Logf("after the read through pod-b: pod-b scores %v for the 4-block prompt (cpu 0.8 per block)", scores(toks)[podB])
	if p := scores(toks[:2*blockSize])[podB]; p < 2*0.8-1e-9 {
		t.Fatalf("pod-b's score for the prompt's 2-block prefix: %v", p)
	}
}
