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
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"

	"github.com/tidepool-kv/tidepool/client"
)

const (
	pod       = "pod-a"
	model     = "tiny-llama"
	blockSize = 16
	ns        = "vllm/tiny-llama/tp0/pp0/test"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serve builds (unless TIDEPOOL_BIN names it) and starts tidepool serve with
// KV events on, a 64 MiB DRAM tier and no SSD tier (an evicted block is
// gone), as pod POD_NAME=pod-a.
func serve(t *testing.T, endpoint string) *client.Client {
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
	sock := filepath.Join(dir, "tp.sock")
	cmd := exec.Command(bin, "serve", "--socket", sock, "--data-dir", filepath.Join(dir, "data"),
		"--arena-dir", filepath.Join(dir, "arenas"), "--dram-capacity", "64MiB", "--arena-size", "16MiB",
		"--ssd-capacity", "0", "--metrics-addr", "", "--log-level", "warn", "--max-value-size", "8MiB",
		"--kv-events-endpoint", endpoint, "--kv-events-model", model)
	cmd.Env = append(os.Environ(), "POD_NAME="+pod)
	log, _ := os.Create(filepath.Join(dir, "server.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			t.Logf("server log:\n%s", b)
		}
	})
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
				t.Cleanup(func() { c.Close() })
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

func TestIndexerScoresTidepoolPod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	c := serve(t, endpoint)

	// llm-d's indexer, wired as its kv-cache manager wires it.
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	icfg, err := kvcache.NewDefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	indexer, err := kvcache.NewKVCacheIndexer(ctx, icfg, tp)
	if err != nil {
		t.Fatal(err)
	}
	go indexer.Run(ctx)
	pool := kvevents.NewPool(&kvevents.Config{TopicFilter: "kv@", Concurrency: 2}, indexer.KVBlockIndex(), tp,
		engineadapter.NewVLLMAdapter())
	pool.Start(ctx)
	defer pool.Shutdown(ctx)
	subs := kvevents.NewSubscriberManager(pool)
	defer subs.Shutdown(ctx)
	if err := subs.EnsureSubscriber(ctx, pod, endpoint, "kv@", true); err != nil {
		t.Fatal(err)
	}

	score := func(tokens []uint32) float64 {
		s, err := indexer.ScoreTokens(ctx, tokens, model, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s[pod]
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The subscriber joins late (a PUB delivers nothing before a SUB's
	// subscription arrives): put probe prompts until the index sees one.
	probe := 1000
	waitFor("the indexer's subscriber to receive", func() bool {
		toks := prompt(probe, 1)
		putPrompt(t, c, probe, toks, 4096)
		probe++
		time.Sleep(100 * time.Millisecond)
		return score(toks) > 0
	})

	// A 4-block prompt put the connector's way: the pod scores for it, for
	// its prefixes, and not for a prompt it does not hold.
	toks := prompt(0, 4)
	if score(toks) != 0 {
		t.Fatal("scored before the put")
	}
	putPrompt(t, c, 0, toks, 1<<20)
	waitFor("the prompt's score", func() bool { return score(toks) >= 4*0.8-1e-9 })
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
	waitFor("the evicted prompt's score to drop", func() bool { return score(toks) < 4*0.8-1e-9 })
	t.Logf("score of the prompt after eviction: %v", score(toks))
}
