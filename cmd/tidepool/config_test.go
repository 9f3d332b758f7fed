package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/proxy"
)

func parse(t *testing.T, args []string, env []string) (Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "")
	vals := bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return loadConfig(fs, vals, *configPath, env)
}

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	yml := filepath.Join(dir, "tp.yaml")
	os.WriteFile(yml, []byte(`
socket: /tmp/from-yaml.sock
dram_capacity: 256MiB
max_value_size: 8MiB
log_level: warn
namespaces: [a, b]
lease_timeout: 2s
`), 0o600)

	// YAML over defaults.
	c, err := parse(t, []string{"--config", yml}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/from-yaml.sock" || c.DRAMCapacity != 256<<20 || c.LogLevel != "warn" ||
		strings.Join(c.Namespaces, ",") != "a,b" || c.LeaseTimeout != 2*time.Second || c.MaxBatch != 1024 {
		t.Fatalf("yaml: %+v", c)
	}
	// Environment over YAML (and TIDEPOOL_CONFIG names the file).
	env := []string{"TIDEPOOL_CONFIG=" + yml, "TIDEPOOL_DRAM_CAPACITY=512MiB", "TIDEPOOL_SOCKET=/tmp/from-env.sock"}
	c, err = parse(t, nil, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/from-env.sock" || c.DRAMCapacity != 512<<20 || c.LogLevel != "warn" {
		t.Fatalf("env: %+v", c)
	}
	// Flags over everything.
	c, err = parse(t, []string{"--dram-capacity", "1GiB", "--socket", "/tmp/from-flag.sock"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/from-flag.sock" || c.DRAMCapacity != 1<<30 || c.LogLevel != "warn" {
		t.Fatalf("flags: %+v", c)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("dram_capacty: 1GiB\nsocket_mode: 9999\n"), 0o600)
	_, err := parse(t, []string{"--config", bad}, nil)
	if err == nil || !strings.Contains(err.Error(), `unknown key "dram_capacty"`) || !strings.Contains(err.Error(), "socket_mode") {
		t.Fatalf("bad yaml: %v", err)
	}
	// Every invalid value is reported at once, including contradictions.
	_, err = parse(t, []string{"--socket", "relative.sock", "--dram-capacity", "4MiB", "--max-value-size", "8MiB", "--log-level", "loud", "--max-batch", "0",
		"--ssd-background-priority", "idle", "--demotion-wait", "-1s", "--transfer-tcp-congestion", "cubic,BBR"}, nil)
	if err == nil {
		t.Fatal("invalid flags accepted")
	}
	for _, want := range []string{"absolute path", "exceeds dram_capacity", "log_level", "max_batch", `ssd_background_priority "idle": low or normal`, "demotion_wait -1s: must not be negative", `transfer_tcp_congestion: "BBR"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	// KV events: a replay socket without the PUB socket, an endpoint that
	// is not tcp://HOST:PORT, an unknown hash form, a topic's '@'.
	_, err = parse(t, []string{"--kv-events-replay-endpoint", "tcp://127.0.0.1:5558", "--kv-events-block-hash", "hex"}, nil)
	for _, want := range []string{"kv_events_replay_endpoint needs kv_events_endpoint", `kv_events_block_hash "hex": int or bytes`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	_, err = parse(t, []string{"--kv-events-endpoint", "udp://127.0.0.1:5557", "--kv-events-model", "a@b"}, nil)
	for _, want := range []string{"want tcp://HOST:PORT", "must not contain '@'"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	_, err = parse(t, []string{"--dram-capacity", "lots"}, nil)
	if err == nil || !strings.Contains(err.Error(), "--dram-capacity") {
		t.Fatalf("bad size: %v", err)
	}
	_, err = parse(t, nil, []string{"TIDEPOOL_LEASE_TIMEOUT=forever"})
	if err == nil || !strings.Contains(err.Error(), "TIDEPOOL_LEASE_TIMEOUT") {
		t.Fatalf("bad env: %v", err)
	}
}

func TestDefaultsAreValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.DRAMCapacity < 64<<20 || c.DRAMCapacity > 4<<30 {
		t.Fatalf("default DRAM capacity %d out of range", c.DRAMCapacity)
	}
	// Every setting has a flag, a variable and a documented YAML key.
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatalf("docs/config.md: %v", err)
	}
	for _, s := range settings {
		if !strings.Contains(string(doc), "`"+s.key+"`") {
			t.Errorf("docs/config.md does not document %q", s.key)
		}
	}
}

// TestMetricsDocumented: every metric the sidecar exports is in
// docs/metrics.md.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(func() cache.Stats {
		return cache.Stats{Tiers: []cache.TierStats{{Name: "dram"}}, Namespaces: []cache.NamespaceStats{{Namespace: "ns"}}}
	}, nil)
	m.calls.WithLabelValues("Put", "OK").Observe(0.001)
	dc := dram.DefaultConfig()
	dc.Dir, dc.Capacity, dc.ArenaSize = t.TempDir(), 1<<20, 1<<20
	tier, err := dram.New(dc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	p, err := proxy.New(proxy.DefaultConfig(), proxy.Deps{Store: tier, ZeroCopy: tier, Scan: tier}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := dram.NewScrubber(tier, dram.ScrubConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	m.reg.MustRegister(newZeroCopyCollector(p), newRouteCollector(p, nil), newGuardCollector(nil), newScrubCollector(sc),
		newSlotIndexCollector(tier))
	kc := DefaultConfig()
	kc.KVEventsEndpoint = "tcp://127.0.0.1:0"
	ev, err := newKVEvents(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.reg.MustRegister(newKVEventsCollector(ev))
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "tidepool_") {
			continue
		}
		n++
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/metrics.md does not document %s", name)
		}
	}
	if n < 35 {
		t.Fatalf("only %d tidepool metrics gathered", n)
	}
}
