package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestClusterDefaultsFromPodFacts: --join alone turns cluster mode on with
// the well-known ports on one bind address; POD_IP and POD_NAME (the
// downward API) supply the bind, advertise and metrics addresses and the
// node name; every explicit setting still wins.
func TestClusterDefaultsFromPodFacts(t *testing.T) {
	host, _ := os.Hostname()
	creds := []string{"--gossip-key-file", "/k", "--peer-secret-file", "/s"}
	pod := []string{"POD_IP=10.1.2.3", "POD_NAME=vllm-0"}
	type want struct{ node, bind, gossip, advertise, peer, transfer, metrics string }
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want want
	}{
		{"join alone, outside a pod", append([]string{"--join", "tidepool.inference.svc"}, creds...), nil,
			want{host, "127.0.0.1", "127.0.0.1:7946", "127.0.0.1", "127.0.0.1:7947", "127.0.0.1:7948", "127.0.0.1:9464"}},
		{"join alone, in a pod", append([]string{"--join", "tidepool.inference.svc"}, creds...), pod,
			want{"vllm-0", "0.0.0.0", "0.0.0.0:7946", "10.1.2.3", "0.0.0.0:7947", "0.0.0.0:7948", "10.1.2.3:9464"}},
		{"bind address", append([]string{"--join", "peers", "--bind-addr", "127.0.0.2"}, creds...), nil,
			want{host, "127.0.0.2", "127.0.0.2:7946", "127.0.0.2", "127.0.0.2:7947", "127.0.0.2:7948", "127.0.0.1:9464"}},
		{"gossip_addr names the bind host", append([]string{"--gossip-addr", "10.0.0.5:8000"}, creds...), nil,
			want{host, "10.0.0.5", "10.0.0.5:8000", "10.0.0.5", "10.0.0.5:7947", "10.0.0.5:7948", "127.0.0.1:9464"}},
		{"explicit settings win", append([]string{"--join", "peers", "--peer-addr", "0.0.0.0:9000", "--node-name", "n1",
			"--advertise-addr", "10.9.9.9", "--metrics-addr", "0.0.0.0:9999"}, creds...), pod,
			want{"n1", "0.0.0.0", "0.0.0.0:7946", "10.9.9.9", "0.0.0.0:9000", "0.0.0.0:7948", "0.0.0.0:9999"}},
		{"variables win over pod facts", creds, append([]string{"TIDEPOOL_NODE_NAME=n2", "TIDEPOOL_METRICS_ADDR=127.0.0.1:1"}, pod...),
			want{"n2", "", "", "", "", "", "127.0.0.1:1"}},
		{"single node in a pod", nil, pod,
			want{"vllm-0", "", "", "", "", "", "10.1.2.3:9464"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parse(t, tc.args, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			got := want{c.NodeID, c.BindAddr, c.GossipAddr, c.AdvertiseAddr, c.PeerAddr, c.TransferAddr, c.MetricsAddr}
			if got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestAdvertiseFallback: bound to every interface outside a pod, a node
// advertises the first non-loopback address.
func TestAdvertiseFallback(t *testing.T) {
	c := Config{Join: []string{"peers"}, BindAddr: "0.0.0.0"}
	c.deriveCluster("", func() string { return "192.168.7.7" })
	if c.AdvertiseAddr != "192.168.7.7" || c.GossipAddr != "0.0.0.0:7946" {
		t.Fatalf("advertise %q gossip %q", c.AdvertiseAddr, c.GossipAddr)
	}
	c = Config{BindAddr: "0.0.0.0"}
	c.deriveCluster("", func() string { return "192.168.7.7" })
	if c.GossipAddr != "" || c.AdvertiseAddr != "" {
		t.Fatalf("a single node got cluster addresses: %+v", c)
	}
}

// TestClusterAddressErrors: bad addresses and a shutdown bound below the
// drain are refused with the setting named; credentials stay required.
func TestClusterAddressErrors(t *testing.T) {
	creds := []string{"--gossip-key-file", "/k", "--peer-secret-file", "/s"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bind not an IP", append([]string{"--join", "peers", "--bind-addr", "pod.local"}, creds...), "bind_addr"},
		{"advertise not an IP", append([]string{"--join", "peers", "--advertise-addr", "pod.local"}, creds...), "advertise_addr"},
		{"join without credentials", []string{"--join", "peers"}, "needs credentials"},
		{"shutdown shorter than drain", []string{"--shutdown-timeout", "5s", "--drain-timeout", "10s"}, "shutdown_timeout"},
		{"metrics not host:port", []string{"--metrics-addr", "9464"}, "metrics_addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.args, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestSettingsDocumented: every setting has a row in docs/config.md.
func TestSettingsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if !strings.Contains(string(doc), "| `"+s.key+"` |") {
			t.Errorf("docs/config.md has no row for %s", s.key)
		}
	}
}

// TestStopWatchdog: a stop that outlasts shutdown_timeout ends the process
// with status 1 and a log line saying why; one that finishes in time (the
// timer stopped) never does.
func TestStopWatchdog(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	codes := make(chan int, 1)
	stopWatchdog(10*time.Millisecond, zap.New(core), func(code int) { codes <- code })
	if code := <-codes; code != 1 {
		t.Fatalf("exit(%d), want 1", code)
	}
	if logs.FilterMessageSnippet("longer than shutdown_timeout").Len() != 1 {
		t.Fatalf("no log line saying why: %v", logs.All())
	}

	called := make(chan int, 1)
	w := stopWatchdog(time.Hour, zap.NewNop(), func(code int) { called <- code })
	if !w.Stop() {
		t.Fatal("watchdog fired early")
	}
	select {
	case code := <-called:
		t.Fatalf("exit(%d) after the stop finished", code)
	default:
	}
}
