package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/cache/gpu"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/internal/units"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
	"github.com/tidepool-kv/tidepool/proxy/kvevents"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
	"github.com/tidepool-kv/tidepool/rdma/auto"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// Config is every setting of `tidepool serve`. Each field is one setting,
// named the same in YAML (key), flags (--key with '-' for '_') and the
// environment (TIDEPOOL_KEY). Precedence: flags, then environment, then the
// YAML file, then the embedded defaults. docs/config.md lists them all.
type Config struct {
	Socket                  string        // engine API Unix socket path
	SocketMode              os.FileMode   // socket file mode (octal)
	SocketGroup             string        // group (name or gid) given the socket; empty keeps the process group
	DataDir                 string        // persistent data (SSD tier)
	ArenaDir                string        // DRAM arena files (tmpfs; shared with the engine); empty: derived from Socket
	TrustedDirs             []string      // directories accepted whatever their owner and mode
	DRAMCapacity            int64         // DRAM tier budget in bytes
	ArenaSize               int64         // bytes per arena file
	MaxKeySize              int           // longest key, bytes
	MaxValueSize            int64         // largest value, bytes
	MaxBatch                int           // most items per batch call
	MaxRequestSize          int64         // largest framed request, bytes
	EngineMaxConns          int           // most engine API connections open at once
	EngineIdle              time.Duration // engine API connection idle timeout
	PutSocket               bool          // serve Put on Socket+".put" too, values read straight into the arenas
	BufferSocket            bool          // serve registered engine buffers on Socket+".buf"
	BufMaxPerConn           int           // most buffers one buffer socket connection holds registered
	BufMax                  int           // most buffers registered on the buffer socket, all connections
	FDReserve               int           // descriptors kept from clients for the process's own files
	Namespaces              []string      // allow-list of namespaces; empty allows any
	MaxNamespaces           int           // most namespaces holding data at once
	LeaseTimeout            time.Duration // longest read pin
	EvictionPolicy          string        // prefix (default) or lru
	MetricsAddr             string        // HTTP address for /metrics, /healthz, /readyz (read-only GETs); empty disables
	LogLevel                string        // debug, info, warn, error
	LogFormat               string        // json or console
	NodeID                  string        // this sidecar's name (node_name); default $POD_NAME, then the host name
	BindAddr                string        // IP the cluster listeners bind; empty: 0.0.0.0 in a pod ($POD_IP set), else 127.0.0.1
	GossipAddr              string        // host:port of gossip (memberlist); empty: bind_addr:7946 in cluster mode
	AdvertiseAddr           string        // host or host:port peers use to reach gossip; empty: derived (deriveCluster)
	PeerAddr                string        // host:port of the peer API (TCP); empty: bind_addr:7947
	TransferAddr            string        // host:port of the block transfer layer (TCP); empty: bind_addr:7948
	Transport               string        // auto, tcp or rdma: how blocks move between nodes
	RDMADevice              string        // RDMA device for transport auto/rdma; empty: the first active one
	GPULibrary              string        // CUDA driver library the GPU end loads; "off" disables it
	RDMAGIDIndex            int           // GID index; -1: the first RoCE v2 GID (IPv4-mapped first)
	TCPCongestion           []string      // congestion controls of the TCP transfer connections, first accepted wins; "system": the host's
	Join                    []string      // addresses or DNS names of members to join
	Replicas                int           // owners per block (R)
	GossipKeyFile           string        // file holding the gossip encryption key
	ClusterLabel            string        // cluster label; peers with another are refused
	PeerTokenFile           string        // file holding the peer API shared token (legacy, checked after decoding)
	PeerSecretFile          string        // file holding the cluster secret that authenticates peer API and transfer connections
	Insecure                bool          // insecure_cluster: run a cluster without credentials
	PeerEncrypt             bool          // encrypt peer API and transfer connections (AES-256-GCM) after authenticating them
	PeerMaxConns            int           // most connections open at once on the peer API port and on the transfer port (each)
	PeerIdleTime            time.Duration // a peer API or transfer connection idle that long is closed
	PeerNamedReads          bool          // serve named reads to peers (else they fetch by Acquire and a one-sided read)
	PeerHandshakes          int           // most connections authenticating at once on each cluster port (their own budget)
	PeerHandshakesPerSource int           // of those, most from one source address
	DrainTimeout            time.Duration // how long shutdown waits for in-flight calls
	ShutdownTimeout         time.Duration // bound on the whole stop after SIGTERM (leave, drain, spill); past it the process exits

	RemoteTimeout     time.Duration // bound on the remote part of a read (owners asked, the owner's answer)
	PeerDownFor       time.Duration // how long a node that failed a call is not asked
	RebalanceRate     int64         // bytes/s the rebalancer pushes to new owners; 0 disables
	RebalanceDelay    time.Duration // quiet time after a membership change before a pass
	RebalanceMaxBytes int64         // most bytes one pass moves; 0: no bound
	HotThreshold      int           // fetches within hot_window that make a block a hot replica; 0 disables
	HotWindow         time.Duration // counting window of hot_threshold
	HotTTL            time.Duration // how long a hot replica keeps full priority
	HotMaxReplicas    int           // most hot replicas at once
	HotMaxBytes       int64         // most bytes of hot replicas at once; 0: none (no hot replicas). Default dram_capacity/16

	SSDCapacity      int64         // SSD tier budget in bytes; 0 disables the tier
	SSDMinFree       int64         // free-space floor of data_dir's filesystem (SSD degraded below)
	SSDPriority      string        // CPU priority of RocksDB's background threads: low or normal
	SSDValueLogMin   int64         // blocks of this size and up go to the SSD tier's value log; 0: none
	DemotionQueue    int64         // bytes of evicted DRAM blocks waiting to be written to SSD
	DemotionWait     time.Duration // how long an eviction waits for room in a full demotion queue; 0: none
	StopSpillTimeout time.Duration // how long a clean stop spends copying DRAM into SSD; 0 disables

	ScrubRate             int64    // bytes/s the DRAM scrubber re-checks; 0 disables it
	VerifyReads           bool     // same-host DRAM reads check the CRC-32C
	VerifyReadsNamespaces []string // namespaces whose same-host DRAM reads check the CRC-32C

	KVEventsEndpoint       string // tcp://HOST:PORT of the KV-event PUB socket; empty: no events
	KVEventsReplayEndpoint string // tcp://HOST:PORT of its replay (ROUTER) socket; empty: none
	KVEventsModel          string // the topic's model (kv@<pod>@<model>); empty: the namespace
	KVEventsSubSnapshot    bool   // each new subscription first gets a snapshot of what is held
	KVEventsBlockHash      string // int (vLLM's default) or bytes
	KVEventsQueue          int    // changes waiting to be published; more are dropped
}

// setting binds one Config field to its YAML key, flag and variable.
type setting struct {
	key   string // YAML key
	usage string
	get   func(c *Config) string
	set   func(c *Config, v string) error
	kind  string // the value's syntax, named in serve's help: string, bytes, int, true|false, duration, list, mode
}

func (s setting) flagName() string { return strings.ReplaceAll(s.key, "_", "-") }
func (s setting) envName() string  { return "TIDEPOOL_" + strings.ToUpper(s.key) }

func sizeSetting(key, usage string, p func(c *Config) *int64) setting {
	return setting{key, usage,
		func(c *Config) string { return units.FormatBytes(*p(c)) },
		func(c *Config, v string) error {
			n, err := units.ParseBytes(v)
			if err != nil {
				return err
			}
			*p(c) = n
			return nil
		}, "bytes"}
}

func stringSetting(key, usage string, p func(c *Config) *string) setting {
	return setting{key, usage,
		func(c *Config) string { return *p(c) },
		func(c *Config, v string) error { *p(c) = v; return nil }, "string"}
}

func intSetting(key, usage string, p func(c *Config) *int) setting {
	return setting{key, usage,
		func(c *Config) string { return strconv.Itoa(*p(c)) },
		func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			*p(c) = n
			return nil
		}, "int"}
}

func boolSetting(key, usage string, p func(c *Config) *bool) setting {
	return setting{key, usage,
		func(c *Config) string { return strconv.FormatBool(*p(c)) },
		func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%q is not a boolean (true or false)", v)
			}
			*p(c) = b
			return nil
		}, "true|false"}
}

func durationSetting(key, usage string, p func(c *Config) *time.Duration) setting {
	return setting{key, usage,
		func(c *Config) string { return p(c).String() },
		func(c *Config, v string) error {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%q is not a duration (examples: 500ms, 5s)", v)
			}
			*p(c) = d
			return nil
		}, "duration"}
}

// listSetting is a comma-separated list (a YAML sequence in the file);
// blank items are dropped.
func listSetting(key, usage string, p func(c *Config) *[]string) setting {
	return setting{key, usage,
		func(c *Config) string { return strings.Join(*p(c), ",") },
		func(c *Config, v string) error {
			*p(c) = nil
			for _, e := range strings.Split(v, ",") {
				if e = strings.TrimSpace(e); e != "" {
					*p(c) = append(*p(c), e)
				}
			}
			return nil
		}, "list"}
}

var settings = []setting{
	stringSetting("socket", "engine API Unix socket path", func(c *Config) *string { return &c.Socket }),
	{"socket_mode", "socket file mode, octal",
		func(c *Config) string { return fmt.Sprintf("%04o", uint32(c.SocketMode)) },
		func(c *Config, v string) error {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil || m > 0o777 {
				return fmt.Errorf("%q is not an octal file mode (example: 0660)", v)
			}
			c.SocketMode = os.FileMode(m)
			return nil
		}, "mode"},
	stringSetting("socket_group", "group (name or numeric gid) given the socket; empty keeps the process's group", func(c *Config) *string { return &c.SocketGroup }),
	stringSetting("data_dir", "directory for persistent data", func(c *Config) *string { return &c.DataDir }),
	stringSetting("arena_dir", "directory of the DRAM arena files (use a tmpfs); empty: one of this socket's own under /dev/shm", func(c *Config) *string { return &c.ArenaDir }),
	listSetting("trusted_dirs", "comma-separated directories used whatever their owner and mode (such as a Kubernetes emptyDir mount)", func(c *Config) *[]string { return &c.TrustedDirs }),
	sizeSetting("dram_capacity", "DRAM tier budget (e.g. 512MiB, 4GiB)", func(c *Config) *int64 { return &c.DRAMCapacity }),
	sizeSetting("arena_size", "size of one DRAM arena file", func(c *Config) *int64 { return &c.ArenaSize }),
	intSetting("max_key_size", "longest block key in bytes", func(c *Config) *int { return &c.MaxKeySize }),
	sizeSetting("max_value_size", "largest block value", func(c *Config) *int64 { return &c.MaxValueSize }),
	intSetting("max_batch", "most items in one batch call or lookup", func(c *Config) *int { return &c.MaxBatch }),
	sizeSetting("max_request_size", "largest framed request accepted", func(c *Config) *int64 { return &c.MaxRequestSize }),
	intSetting("engine_max_connections", "most engine API connections open at once; more are closed on accept", func(c *Config) *int { return &c.EngineMaxConns }),
	durationSetting("engine_idle_timeout", "close an engine API connection idle this long", func(c *Config) *time.Duration { return &c.EngineIdle }),
	boolSetting("buffer_socket", "also serve a third socket, the engine socket's path plus .buf, through which an engine registers memory of its own (a sealed memfd) and reads blocks straight into it: a block from another node lands there from the network, with no copy into this node's arenas", func(c *Config) *bool { return &c.BufferSocket }),
	intSetting("buffer_socket_max_buffers_per_conn", "most buffers one buffer socket connection holds registered", func(c *Config) *int { return &c.BufMaxPerConn }),
	intSetting("buffer_socket_max_buffers", "most buffers registered on the buffer socket, all connections together", func(c *Config) *int { return &c.BufMax }),
	intSetting("fd_reserve", "file descriptors kept for the process's own files (RocksDB, metrics, peers): a client connection or passed descriptor that would take one of the last fd_reserve below the limit is closed at once (at most a quarter of the limit)", func(c *Config) *int { return &c.FDReserve }),
	boolSetting("put_socket", "also serve Put on a second socket, the engine socket's path plus .put, that reads each value straight into the DRAM arenas (one copy fewer than the engine socket)", func(c *Config) *bool { return &c.PutSocket }),
	listSetting("namespaces", "comma-separated allow-list of namespaces; empty allows any", func(c *Config) *[]string { return &c.Namespaces }),
	intSetting("max_namespaces", "most namespaces holding data at once", func(c *Config) *int { return &c.MaxNamespaces }),
	stringSetting("eviction_policy", "eviction policy of every tier: prefix (frequency and prefix aware) or lru", func(c *Config) *string { return &c.EvictionPolicy }),
	durationSetting("lease_timeout", "longest time a read may pin a block", func(c *Config) *time.Duration { return &c.LeaseTimeout }),
	stringSetting("metrics_addr", "HTTP address of the read-only /metrics, /healthz, /readyz (default 127.0.0.1:9464; $POD_IP:9464 in a pod); empty disables", func(c *Config) *string { return &c.MetricsAddr }),
	stringSetting("log_level", "debug, info, warn or error", func(c *Config) *string { return &c.LogLevel }),
	stringSetting("log_format", "json or console", func(c *Config) *string { return &c.LogFormat }),
	stringSetting("node_name", "this sidecar's name in the cluster and in responses (default: $POD_NAME, then the host name)", func(c *Config) *string { return &c.NodeID }),
	stringSetting("bind_addr", "IP address the gossip, peer API and transfer listeners bind in cluster mode (default: 0.0.0.0 when $POD_IP is set, else 127.0.0.1)", func(c *Config) *string { return &c.BindAddr }),
	stringSetting("gossip_addr", "host:port for gossip (TCP and UDP); default bind_addr:7946 in cluster mode (join or gossip_addr set); empty and no join runs a single node", func(c *Config) *string { return &c.GossipAddr }),
	stringSetting("advertise_addr", "IP (or IP:port) peers use to reach this node (default: $POD_IP, else bind_addr when specific, else the first non-loopback address)", func(c *Config) *string { return &c.AdvertiseAddr }),
	stringSetting("peer_addr", "host:port of the peer API (TCP); default bind_addr:7947 in cluster mode", func(c *Config) *string { return &c.PeerAddr }),
	stringSetting("transfer_addr", "host:port of the block transfer layer (TCP); default bind_addr:7948 in cluster mode", func(c *Config) *string { return &c.TransferAddr }),
	stringSetting("transport", "how blocks move between nodes: auto (RDMA to peers that serve it, when this binary has the verbs binding and the host a device; TCP otherwise), tcp, or rdma (like auto, but refuse to start without a device); docs/rdma.md", func(c *Config) *string { return &c.Transport }),
	stringSetting("gpu_library", "CUDA driver library of the GPU end (engines' GPU blocks saved and loaded by the sidecar; docs/gpu.md): a name dlopen finds or a path; off disables it. Without the library or a device the sidecar runs without the GPU end", func(c *Config) *string { return &c.GPULibrary }),
	stringSetting("rdma_device", "RDMA device(s) for transport auto or rdma (e.g. mlx5_0, or mlx5_0,mlx5_1 to slice transfers across several); empty: the first with an active port", func(c *Config) *string { return &c.RDMADevice }),
	listSetting("transfer_tcp_congestion", "comma-separated TCP congestion controls for the TCP transfer connections, in order: each connection gets the first the kernel accepts; system keeps the host's default (net.ipv4.tcp_congestion_control); docs/config.md says why not BBR", func(c *Config) *[]string { return &c.TCPCongestion }),
	intSetting("rdma_gid_index", "GID index of the RDMA port; -1: the first RoCE v2 GID, preferring an IPv4-mapped one", func(c *Config) *int { return &c.RDMAGIDIndex }),
	listSetting("join", "comma-separated addresses or DNS names (default port 7946) of cluster members to join; turns cluster mode on; retried in the background until a peer answers", func(c *Config) *[]string { return &c.Join }),
	intSetting("replicas", "owners per block (R)", func(c *Config) *int { return &c.Replicas }),
	stringSetting("gossip_key_file", "file holding the gossip encryption key (16, 24 or 32 bytes, raw or base64)", func(c *Config) *string { return &c.GossipKeyFile }),
	stringSetting("cluster_label", "cluster label; peers with another label are refused", func(c *Config) *string { return &c.ClusterLabel }),
	stringSetting("peer_token_file", "legacy: file holding a token every peer API call must carry (checked after the call is decoded; peer_secret_file is what authenticates)", func(c *Config) *string { return &c.PeerTokenFile }),
	stringSetting("peer_secret_file", "file holding the cluster secret (at least 16 bytes, raw or base64) that authenticates every peer API and transfer connection and every member; required in cluster mode (join or gossip_addr)", func(c *Config) *string { return &c.PeerSecretFile }),
	boolSetting("insecure_cluster", "run a cluster without gossip_key_file and peer_secret_file: any host that reaches the ports can read, write and join (logged loudly; never on a shared network)", func(c *Config) *bool { return &c.Insecure }),
	boolSetting("peer_encrypt", "encrypt every peer API and transfer connection (AES-256-GCM, keys from peer_secret_file); every member must agree", func(c *Config) *bool { return &c.PeerEncrypt }),
	intSetting("peer_max_conns", "most connections open at once on the peer API port, and on the transfer port; more are closed as they come", func(c *Config) *int { return &c.PeerMaxConns }),
	intSetting("peer_max_handshakes", "most connections still authenticating at once on the peer API port, and on the transfer port: a budget apart from peer_max_conns; a new connection over it displaces the oldest that has sent nothing", func(c *Config) *int { return &c.PeerHandshakes }),
	intSetting("peer_max_handshakes_per_source", "most connections still authenticating at once from one source address, on each cluster port; a new one over it displaces that address's oldest that has sent nothing", func(c *Config) *int { return &c.PeerHandshakesPerSource }),
	boolSetting("peer_named_reads", "serve peers' fetches as named reads on the transfer port (one exchange each); false: peers fetch by Acquire, a one-sided read and a lease release", func(c *Config) *bool { return &c.PeerNamedReads }),
	durationSetting("peer_idle_timeout", "a peer API or transfer connection that sends nothing for this long is closed", func(c *Config) *time.Duration { return &c.PeerIdleTime }),
	durationSetting("drain_timeout", "how long shutdown waits for in-flight calls", func(c *Config) *time.Duration { return &c.DrainTimeout }),
	durationSetting("shutdown_timeout", "bound on the whole stop after SIGTERM or SIGINT (leave the cluster, drain, spill DRAM to SSD); past it the process exits with status 1", func(c *Config) *time.Duration { return &c.ShutdownTimeout }),
	durationSetting("remote_timeout", "bound on the remote part of a cluster read: the owners asked by Lookup/Exists, the owner's answer in Get/BatchGet/Acquire; past it the read is a miss", func(c *Config) *time.Duration { return &c.RemoteTimeout }),
	durationSetting("peer_down_for", "how long a node that failed a call (timeout, refused, unreachable) is not asked again; reads that need it miss at once", func(c *Config) *time.Duration { return &c.PeerDownFor }),
	sizeSetting("rebalance_rate", "bytes per second the rebalancer pushes to new owners after a membership change; 0 disables it", func(c *Config) *int64 { return &c.RebalanceRate }),
	durationSetting("rebalance_delay", "quiet time after the last membership change before a rebalance pass starts", func(c *Config) *time.Duration { return &c.RebalanceDelay }),
	sizeSetting("rebalance_max_bytes", "most bytes one rebalance pass moves, hottest first; 0: no bound", func(c *Config) *int64 { return &c.RebalanceMaxBytes }),
	intSetting("hot_threshold", "fetches of one block from other nodes within hot_window that keep it as a hot replica; 0 disables", func(c *Config) *int { return &c.HotThreshold }),
	durationSetting("hot_window", "counting window of hot_threshold", func(c *Config) *time.Duration { return &c.HotWindow }),
	durationSetting("hot_ttl", "how long a hot replica keeps full priority before it is demoted to a low-priority copy", func(c *Config) *time.Duration { return &c.HotTTL }),
	intSetting("hot_max_replicas", "most hot replicas held at once", func(c *Config) *int { return &c.HotMaxReplicas }),
	sizeSetting("hot_max_bytes", "most bytes of hot replicas held at once (default: a sixteenth of dram_capacity); 0: none, no hot replicas", func(c *Config) *int64 { return &c.HotMaxBytes }),
	sizeSetting("ssd_capacity", "SSD tier budget under data_dir/ssd (capped by the disk's free space at start); 0 disables the SSD tier", func(c *Config) *int64 { return &c.SSDCapacity }),
	sizeSetting("ssd_min_free", "free space the SSD tier leaves on data_dir's filesystem (it stops admitting blocks below)", func(c *Config) *int64 { return &c.SSDMinFree }),
	sizeSetting("ssd_value_log_min", "SSD blocks of this size and up are written to the value log (segment files written with O_DIRECT, RocksDB keeping only their metadata) instead of RocksDB's blob files; 0: every block in RocksDB", func(c *Config) *int64 { return &c.SSDValueLogMin }),
	stringSetting("ssd_background_priority", "CPU priority of the SSD tier's background writes (RocksDB flushes and compactions): normal, or low (nice 19: reads and puts get a busy node's CPU first, and evicted blocks the spill cannot keep up with are dropped from the cache)", func(c *Config) *string { return &c.SSDPriority }),
	sizeSetting("demotion_queue", "bytes of evicted DRAM blocks that may wait to be written to SSD (more are dropped)", func(c *Config) *int64 { return &c.DemotionQueue }),
	durationSetting("demotion_wait", "how long an eviction that finds the demotion queue full waits for room before dropping the block (its put waits with it); 0: never wait, drop", func(c *Config) *time.Duration { return &c.DemotionWait }),
	durationSetting("stop_spill_timeout", "on a clean stop, how long to spend copying DRAM blocks into SSD; 0 disables", func(c *Config) *time.Duration { return &c.StopSpillTimeout }),
	sizeSetting("scrub_rate", "bytes per second the background scrubber re-checks the CRC-32C of resident DRAM blocks (removing any that fail); 0 disables it", func(c *Config) *int64 { return &c.ScrubRate }),
	boolSetting("verify_reads", "check every same-host read of a DRAM block (Get, Acquire, zero-copy GetInto) against its CRC-32C before answering; off, the scrubber finds damage instead", func(c *Config) *bool { return &c.VerifyReads }),
	listSetting("verify_reads_namespaces", "comma-separated namespaces whose same-host DRAM reads are verified as with verify_reads", func(c *Config) *[]string { return &c.VerifyReadsNamespaces }),
	stringSetting("kv_events_endpoint", "tcp://HOST:PORT where KV events (vLLM's format: what this sidecar holds, for llm-d's and Dynamo's routers) are published on a ZeroMQ PUB socket; empty: no events (docs/events.md)", func(c *Config) *string { return &c.KVEventsEndpoint }),
	stringSetting("kv_events_replay_endpoint", "tcp://HOST:PORT of the KV events' replay socket (ZeroMQ ROUTER, vLLM's replay protocol); empty: none", func(c *Config) *string { return &c.KVEventsReplayEndpoint }),
	stringSetting("kv_events_model", "model name in the KV events' topic kv@<node_name>@<model>; empty: the block's namespace", func(c *Config) *string { return &c.KVEventsModel }),
	stringSetting("kv_events_block_hash", "how KV events carry block keys: int (the key's last 8 bytes as an integer, vLLM's default) or bytes", func(c *Config) *string { return &c.KVEventsBlockHash }),
	boolSetting("kv_events_subscribe_snapshot", "send each new KV-event subscriber a snapshot of what this sidecar holds before the live events, for routers that never use the replay socket (llm-d's indexer), so that they see the blocks a restart kept", func(c *Config) *bool { return &c.KVEventsSubSnapshot }),
	intSetting("kv_events_queue", "changes that may wait to be published as KV events; more are dropped and counted (tidepool_kv_events_dropped_total), never waited for", func(c *Config) *int { return &c.KVEventsQueue }),
}

// runtimeDir is where the socket lives by default: $XDG_RUNTIME_DIR/tidepool,
// else /tmp/tidepool-<uid>.
func runtimeDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "tidepool")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("tidepool-%d", os.Getuid()))
}

// defaultSocket is the socket path used by serve and the client commands
// when none is given.
func defaultSocket() string { return filepath.Join(runtimeDir(), "tidepool.sock") }

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "tidepool")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "tidepool")
	}
	return filepath.Join(runtimeDir(), "data")
}

// defaultDRAMCapacity is an eighth of the machine's memory, at most 4 GiB
// and at least 64 MiB, rounded down to 64 MiB: room for the engine, which
// needs the rest.
func defaultDRAMCapacity() int64 {
	const step = 64 << 20
	var si unix.Sysinfo_t
	c := int64(1 << 30)
	if unix.Sysinfo(&si) == nil {
		c = int64(si.Totalram) * int64(si.Unit) / 8
	}
	c = min(c, 4<<30)
	c = max(c/step*step, step)
	return c
}

// hotShare: hot replicas may hold at most 1/hotShare of DRAM by default
// (hot_max_bytes). They compete with owned blocks for it (DESIGN.md §6).
const hotShare = 16

// DefaultConfig returns the embedded defaults. A setting that configures
// one component takes that component's default, so each default is
// written once (in the component).
func DefaultConfig() Config {
	host, _ := os.Hostname()
	dc, ec, pc := dram.DefaultConfig(), engineapi.DefaultConfig(), peerapi.DefaultServerConfig()
	lc := peerauth.DefaultListenerConfig()
	dramCapacity := defaultDRAMCapacity()
	rc, sc, tc := proxy.DefaultRouteConfig(), ssd.DefaultConfig(), tiered.DefaultConfig()
	return Config{
		Socket:                  defaultSocket(),
		SocketMode:              0o600,
		DataDir:                 defaultDataDir(),
		ArenaDir:                defaultArenaDir(defaultSocket()),
		DRAMCapacity:            dramCapacity,
		ArenaSize:               dc.ArenaSize,
		MaxKeySize:              cache.DefaultMaxKeyBytes,
		MaxValueSize:            cache.DefaultMaxValueBytes,
		MaxBatch:                cache.DefaultMaxBatch,
		MaxRequestSize:          int64(ec.MaxRequestBytes),
		EngineMaxConns:          ec.MaxConnections,
		EngineIdle:              ec.IdleTimeout,
		PutSocket:               true,
		BufferSocket:            true,
		BufMaxPerConn:           ec.MaxBuffersPerConn,
		BufMax:                  ec.MaxBuffers,
		FDReserve:               512,
		MaxNamespaces:           proxy.DefaultConfig().MaxNamespaces,
		LeaseTimeout:            dc.LeaseTimeout,
		EvictionPolicy:          "prefix",
		MetricsAddr:             "127.0.0.1:9464",
		LogLevel:                "info",
		LogFormat:               "console",
		NodeID:                  host,
		Replicas:                cluster.DefaultRingConfig().Replicas,
		DrainTimeout:            ec.DrainTimeout,
		ShutdownTimeout:         20 * time.Second,
		PeerMaxConns:            pc.MaxConns,
		PeerIdleTime:            pc.IdleTimeout,
		PeerNamedReads:          true,
		PeerHandshakes:          lc.MaxHandshakes,
		PeerHandshakesPerSource: lc.MaxHandshakesPerSource,
		Transport:               auto.ModeAuto,
		GPULibrary:              gpu.DefaultLibrary,
		RDMAGIDIndex:            verbs.DefaultConfig().GIDIndex,
		TCPCongestion:           tcp.DefaultConfig().Congestion,

		RemoteTimeout:     rc.RemoteTimeout,
		PeerDownFor:       rc.PeerDownFor,
		RebalanceRate:     rc.RebalanceRate,
		RebalanceDelay:    rc.RebalanceDelay,
		RebalanceMaxBytes: rc.RebalanceMaxBytes,
		HotThreshold:      rc.HotThreshold,
		HotWindow:         rc.HotWindow,
		HotTTL:            rc.HotTTL,
		HotMaxReplicas:    rc.HotMaxReplicas,
		HotMaxBytes:       dramCapacity / hotShare,

		SSDCapacity:      sc.Capacity,
		SSDMinFree:       sc.MinFreeBytes,
		SSDPriority:      sc.BackgroundPriority,
		SSDValueLogMin:   sc.ValueLogMin,
		DemotionQueue:    tc.QueueBytes,
		StopSpillTimeout: 30 * time.Second,

		ScrubRate: dram.DefaultScrubRate,

		KVEventsBlockHash: "int",
		KVEventsQueue:     kvevents.DefaultConfig().QueueEvents,
	}
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	c.checkPlaces(bad)
	c.checkLimits(bad)
	c.checkTiers(bad)
	c.checkCluster(bad)
	c.checkLogsAndEvents(bad)
	return errors.Join(errs...)
}

// checkPlaces checks the paths, directories and addresses serve uses.
func (c Config) checkPlaces(bad func(format string, a ...any)) {
	if !filepath.IsAbs(c.Socket) {
		bad("socket %q: must be an absolute path", c.Socket)
	}
	if len(c.Socket) > 107 {
		bad("socket %q: longer than the 107 bytes a Unix socket path may have", c.Socket)
	}
	if c.SocketMode&0o600 != 0o600 {
		bad("socket_mode %04o: the owner needs read and write", uint32(c.SocketMode))
	}
	if c.DataDir == "" {
		bad("data_dir: empty")
	}
	if c.GPULibrary == "" {
		bad("gpu_library: empty (off disables the GPU end)")
	}
	if c.ArenaDir == "" {
		bad("arena_dir: empty")
	}
	for _, d := range c.TrustedDirs {
		if !filepath.IsAbs(d) {
			bad("trusted_dirs %q: must be an absolute path", d)
		}
	}
	if c.BindAddr != "" && net.ParseIP(c.BindAddr) == nil {
		bad("bind_addr %q: want an IP address", c.BindAddr)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			bad("metrics_addr %q: want host:port (%v)", c.MetricsAddr, err)
		}
	}
}

// checkLimits checks the engine edge: memory, request bounds, connections and timeouts.
func (c Config) checkLimits(bad func(format string, a ...any)) {
	if c.DRAMCapacity < 1<<20 {
		bad("dram_capacity %s: at least 1MiB", units.FormatBytes(c.DRAMCapacity))
	}
	if c.ArenaSize < 1<<20 {
		bad("arena_size %s: at least 1MiB", units.FormatBytes(c.ArenaSize))
	}
	if c.MaxKeySize < 1 || c.MaxKeySize > cache.MaxKeyBytesBound {
		bad("max_key_size %d: must be in [1, %d]", c.MaxKeySize, cache.MaxKeyBytesBound)
	}
	if c.MaxValueSize < 1 {
		bad("max_value_size %d: must be positive", c.MaxValueSize)
	}
	if c.MaxValueSize > c.DRAMCapacity && c.DRAMCapacity > 0 {
		bad("max_value_size %s exceeds dram_capacity %s", units.FormatBytes(c.MaxValueSize), units.FormatBytes(c.DRAMCapacity))
	}
	if c.MaxBatch < 1 || c.MaxBatch > cache.MaxBatchBound {
		bad("max_batch %d: must be between 1 and %d (the longest list the decoders accept)", c.MaxBatch, cache.MaxBatchBound)
	}
	if c.MaxRequestSize < c.MaxValueSize+64<<10 {
		bad("max_request_size %s: must exceed max_value_size by at least 64KiB", units.FormatBytes(c.MaxRequestSize))
	}
	if c.MaxRequestSize > 2<<30-1 {
		bad("max_request_size %s: at most 2GiB", units.FormatBytes(c.MaxRequestSize))
	}
	if c.EngineMaxConns < 1 {
		bad("engine_max_connections %d: must be positive", c.EngineMaxConns)
	}
	if c.BufMaxPerConn < 1 || c.BufMax < 1 {
		bad("buffer_socket_max_buffers_per_conn %d, buffer_socket_max_buffers %d: must be positive", c.BufMaxPerConn, c.BufMax)
	}
	if c.FDReserve < 0 {
		bad("fd_reserve %d: must not be negative", c.FDReserve)
	}
	if c.EngineIdle <= 0 {
		bad("engine_idle_timeout %s: must be positive", c.EngineIdle)
	}
	if c.MaxNamespaces < 1 {
		bad("max_namespaces %d: must be positive", c.MaxNamespaces)
	}
	if c.LeaseTimeout <= 0 {
		bad("lease_timeout %s: must be positive", c.LeaseTimeout)
	}
	if c.DrainTimeout <= 0 {
		bad("drain_timeout %s: must be positive", c.DrainTimeout)
	}
	if c.ShutdownTimeout <= c.DrainTimeout {
		bad("shutdown_timeout %s: must exceed drain_timeout %s (the drain is one part of the stop)", c.ShutdownTimeout, c.DrainTimeout)
	}
}

// checkTiers checks the SSD tier, demotion, scrubbing and the eviction policy.
func (c Config) checkTiers(bad func(format string, a ...any)) {
	if c.SSDCapacity != 0 && c.SSDCapacity < 64<<20 {
		bad("ssd_capacity %s: 0 (no SSD tier) or at least 64MiB", units.FormatBytes(c.SSDCapacity))
	}
	if c.SSDCapacity > 0 && c.MaxValueSize > c.SSDCapacity {
		bad("max_value_size %s exceeds ssd_capacity %s", units.FormatBytes(c.MaxValueSize), units.FormatBytes(c.SSDCapacity))
	}
	if c.SSDMinFree < 0 {
		bad("ssd_min_free %s: must not be negative", units.FormatBytes(c.SSDMinFree))
	}
	if c.SSDValueLogMin < 0 {
		bad("ssd_value_log_min %s: must not be negative", units.FormatBytes(c.SSDValueLogMin))
	}
	if c.SSDPriority != ssd.PriorityLow && c.SSDPriority != ssd.PriorityNormal {
		bad("ssd_background_priority %q: low or normal", c.SSDPriority)
	}
	if c.DemotionQueue < c.MaxValueSize {
		bad("demotion_queue %s: at least max_value_size %s", units.FormatBytes(c.DemotionQueue), units.FormatBytes(c.MaxValueSize))
	}
	if c.ScrubRate < 0 {
		bad("scrub_rate %s: must not be negative", units.FormatBytes(c.ScrubRate))
	}
	if c.DemotionWait < 0 {
		bad("demotion_wait %s: must not be negative", c.DemotionWait)
	}
	if c.StopSpillTimeout < 0 {
		bad("stop_spill_timeout %s: must not be negative", c.StopSpillTimeout)
	}
	if _, ok := policies[c.EvictionPolicy]; !ok {
		bad("eviction_policy %q: prefix or lru", c.EvictionPolicy)
	}
}

// checkCluster checks placement, routing, hot replicas, and the cluster settings when clustered.
func (c Config) checkCluster(bad func(format string, a ...any)) {
	if c.Replicas < 1 || c.Replicas > 8 {
		bad("replicas %d: must be in [1, 8]", c.Replicas)
	}
	if c.RebalanceRate < 0 || c.RebalanceMaxBytes < 0 {
		bad("rebalance_rate %s, rebalance_max_bytes %s: must not be negative", units.FormatBytes(c.RebalanceRate), units.FormatBytes(c.RebalanceMaxBytes))
	}
	if fetch := proxy.DefaultRouteConfig().FetchTimeout; c.RemoteTimeout <= 0 || c.RemoteTimeout > fetch {
		bad("remote_timeout %s: must be in (0, %s] (a fetch's whole bound)", c.RemoteTimeout, fetch)
	}
	if c.PeerDownFor <= 0 {
		bad("peer_down_for %s: must be positive", c.PeerDownFor)
	}
	if c.RebalanceDelay <= 0 {
		bad("rebalance_delay %s: must be positive", c.RebalanceDelay)
	}
	switch c.Transport {
	case "auto", "tcp", "rdma":
	default:
		bad("transport %q: want auto, tcp or rdma", c.Transport)
	}
	if err := tcp.CheckCongestion(c.TCPCongestion); err != nil {
		bad("transfer_tcp_congestion: %v", err)
	}
	if c.RDMAGIDIndex < -1 {
		bad("rdma_gid_index %d: want -1 (automatic) or an index", c.RDMAGIDIndex)
	}
	if c.HotThreshold < 0 {
		bad("hot_threshold %d: must not be negative", c.HotThreshold)
	}
	if c.HotWindow <= 0 || c.HotTTL <= 0 {
		bad("hot_window %s, hot_ttl %s: must be positive", c.HotWindow, c.HotTTL)
	}
	if c.HotMaxReplicas < 1 || c.HotMaxBytes < 0 {
		bad("hot_max_replicas %d: must be positive; hot_max_bytes %s: must not be negative", c.HotMaxReplicas, units.FormatBytes(c.HotMaxBytes))
	}
	if c.clustered() {
		c.checkMembership(bad)
	}
}

// checkMembership checks a cluster member's addresses, name and credentials.
func (c Config) checkMembership(bad func(format string, a ...any)) {
	for name, a := range map[string]string{"gossip_addr": c.GossipAddr, "peer_addr": c.PeerAddr, "transfer_addr": c.TransferAddr} {
		if _, _, err := net.SplitHostPort(a); err != nil {
			bad("%s %q: want host:port (%v)", name, a, err)
		}
	}
	if c.NodeID == "" {
		bad("node_name: empty")
	}
	if c.AdvertiseAddr != "" {
		h, _, err := net.SplitHostPort(c.AdvertiseAddr)
		if err != nil {
			h = c.AdvertiseAddr
		}
		if net.ParseIP(h) == nil {
			bad("advertise_addr %q: want an IP address or IP:port", c.AdvertiseAddr)
		}
	}
	if !c.Insecure && (c.GossipKeyFile == "" || c.PeerSecretFile == "") {
		bad("cluster mode (join or gossip_addr) needs credentials: gossip_key_file %q and peer_secret_file %q must both be set "+
			"(see docs/security.md); to run an open cluster anyway set insecure_cluster: true", c.GossipKeyFile, c.PeerSecretFile)
	}
	if c.PeerEncrypt && c.PeerSecretFile == "" {
		bad("peer_encrypt needs peer_secret_file (the encryption keys derive from it)")
	}
	if c.PeerHandshakes < 1 || c.PeerHandshakesPerSource < 1 || c.PeerHandshakesPerSource > c.PeerHandshakes {
		bad("peer_max_handshakes %d, peer_max_handshakes_per_source %d: must be positive, the second at most the first",
			c.PeerHandshakes, c.PeerHandshakesPerSource)
	}
	if c.PeerMaxConns < 1 || c.PeerIdleTime <= 0 {
		bad("peer_max_conns %d, peer_idle_timeout %s: must be positive", c.PeerMaxConns, c.PeerIdleTime)
	}
}

// checkLogsAndEvents checks logging and the KV-event publisher.
func (c Config) checkLogsAndEvents(bad func(format string, a ...any)) {
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level %q: one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		bad("log_format %q: json or console", c.LogFormat)
	}
	if c.KVEventsEndpoint != "" {
		if err := c.kvEventsConfig().Validate(); err != nil {
			bad("kv_events: %v", err)
		}
	} else if c.KVEventsReplayEndpoint != "" {
		bad("kv_events_replay_endpoint needs kv_events_endpoint")
	}
	switch c.KVEventsBlockHash {
	case "int", "bytes":
	default:
		bad("kv_events_block_hash %q: int or bytes", c.KVEventsBlockHash)
	}
	if c.KVEventsQueue <= 0 {
		bad("kv_events_queue %d: must be positive", c.KVEventsQueue)
	}
}

// loadConfig builds the serve config from defaults, the YAML file
// (--config or TIDEPOOL_CONFIG), the environment and the flags, in rising
// precedence. fs must already be parsed with flags from bindFlags.
func loadConfig(fs *pflag.FlagSet, flagVals map[string]*string, configPath string, environ []string) (Config, error) {
	c := DefaultConfig()
	c.ArenaDir = ""    // derived from the final socket unless a source sets it
	c.HotMaxBytes = -1 // derived from the final dram_capacity unless a source sets it (sizes parse non-negative)
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	// Pod facts (the downward API) replace embedded defaults; every
	// source below still overrides them.
	if name := env["POD_NAME"]; name != "" {
		c.NodeID = name
	}
	if ip := env["POD_IP"]; ip != "" {
		c.MetricsAddr = net.JoinHostPort(ip, strconv.Itoa(defaultMetricsPort))
	}
	if configPath == "" {
		configPath = env["TIDEPOOL_CONFIG"]
	}
	var errs []error
	if configPath != "" {
		if err := applyYAML(&c, configPath); err != nil {
			return c, err
		}
	}
	for _, s := range settings {
		if v, ok := env[s.envName()]; ok {
			if err := s.set(&c, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.envName(), err))
			}
		}
	}
	fs.Visit(func(f *pflag.Flag) {
		for _, s := range settings {
			if s.flagName() == f.Name {
				if err := s.set(&c, *flagVals[s.key]); err != nil {
					errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
				}
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if c.ArenaDir == "" {
		c.ArenaDir = defaultArenaDir(c.Socket)
	}
	if c.HotMaxBytes < 0 {
		c.HotMaxBytes = c.DRAMCapacity / hotShare
	}
	c.deriveCluster(env["POD_IP"], nonLoopbackIP)
	return c, c.Validate()
}

// Well-known ports: the listeners' defaults in cluster mode, and metrics.
const (
	defaultGossipPort   = 7946 // cluster.DefaultPort, also the --join default
	defaultPeerPort     = 7947
	defaultTransferPort = 7948
	defaultMetricsPort  = 9464
)

// clustered reports whether c runs a cluster member: join or gossip_addr
// is set.
func (c Config) clustered() bool { return c.GossipAddr != "" || len(c.Join) > 0 }

// deriveCluster fills in the cluster addresses no source set, from one
// bind address and the pod's IP (podIP, "" outside a pod):
//   - bind_addr: the host of gossip_addr when that names one, else 0.0.0.0
//     in a pod (its network namespace is its own) and 127.0.0.1 outside one
//     (a laptop or a shared host: nothing listens on the network unasked);
//   - gossip_addr, peer_addr, transfer_addr: bind_addr with ports 7946,
//     7947, 7948;
//   - advertise_addr: podIP, else bind_addr when it is a specific address,
//     else firstIP() (the first non-loopback address of an interface that
//     is up), else empty (memberlist then picks a private address or fails
//     with a clear error).
//
// A single node (neither join nor gossip_addr) is left as it is.
func (c *Config) deriveCluster(podIP string, firstIP func() string) {
	if !c.clustered() {
		return
	}
	if c.BindAddr == "" {
		switch h, _, err := net.SplitHostPort(c.GossipAddr); {
		case err == nil && h != "":
			c.BindAddr = h
		case podIP != "":
			c.BindAddr = "0.0.0.0"
		default:
			c.BindAddr = "127.0.0.1"
		}
	}
	at := func(port int) string { return net.JoinHostPort(c.BindAddr, strconv.Itoa(port)) }
	if c.GossipAddr == "" {
		c.GossipAddr = at(defaultGossipPort)
	}
	if c.PeerAddr == "" {
		c.PeerAddr = at(defaultPeerPort)
	}
	if c.TransferAddr == "" {
		c.TransferAddr = at(defaultTransferPort)
	}
	if c.AdvertiseAddr == "" {
		if ip := net.ParseIP(c.BindAddr); podIP != "" {
			c.AdvertiseAddr = podIP
		} else if ip != nil && !ip.IsUnspecified() {
			c.AdvertiseAddr = c.BindAddr
		} else if firstIP != nil {
			c.AdvertiseAddr = firstIP()
		}
	}
}

// nonLoopbackIP is the first non-loopback unicast address of an interface
// that is up, IPv4 first; "" when there is none.
func nonLoopbackIP() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	var v6 string
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || !ipn.IP.IsGlobalUnicast() {
				continue
			}
			if ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
			if v6 == "" {
				v6 = ipn.IP.String()
			}
		}
	}
	return v6
}

// applyYAML reads a YAML mapping of setting keys to values. Unknown keys
// are errors, so a typo never goes unnoticed.
func applyYAML(c *Config, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var m map[string]yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&m); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	byKey := map[string]setting{}
	for _, s := range settings {
		byKey[s.key] = s
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		s, ok := byKey[k]
		if !ok {
			errs = append(errs, fmt.Errorf("config %s: unknown key %q (see docs/config.md)", path, k))
			continue
		}
		n := m[k]
		var v string
		switch n.Kind {
		case yaml.ScalarNode:
			v = n.Value
		case yaml.SequenceNode:
			var parts []string
			for _, e := range n.Content {
				parts = append(parts, e.Value)
			}
			v = strings.Join(parts, ",")
		default:
			errs = append(errs, fmt.Errorf("config %s: %s: want a value or a list", path, k))
			continue
		}
		if err := s.set(c, v); err != nil {
			errs = append(errs, fmt.Errorf("config %s: %s: %w", path, k, err))
		}
	}
	return errors.Join(errs...)
}

// bindFlags registers serve's flags on fs, generated from the settings
// table: one flag per setting (--key with '-' for '_'), showing the
// embedded default and the variable. A flag keeps the text it was given;
// loadConfig parses it with the setting, so flags, variables and YAML
// accept the same syntax and every bad value is reported at once.
func bindFlags(fs *pflag.FlagSet) map[string]*string {
	def := DefaultConfig()
	vals := map[string]*string{}
	for _, s := range settings {
		v := &settingValue{s: s, v: s.get(&def)}
		fs.Var(v, s.flagName(), fmt.Sprintf("%s (env %s)", s.usage, s.envName()))
		vals[s.key] = &v.v
	}
	return vals
}

// settingValue is the pflag.Value of one setting's flag: the raw text,
// with the setting's kind as its type name.
type settingValue struct {
	s setting
	v string
}

func (v *settingValue) String() string     { return v.v }
func (v *settingValue) Set(x string) error { v.v = x; return nil }
func (v *settingValue) Type() string       { return v.s.kind }

// policies are the eviction policies a config may name.
var policies = map[string]evict.Factory{
	"prefix": evict.NewPrefix,
	"lru":    evict.NewLRU,
}

// goVersion is reported by `tidepool version`.
var goVersion = runtime.Version()
