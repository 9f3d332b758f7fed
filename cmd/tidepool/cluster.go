package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/clusterview"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/auto"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// clusterNode is what a clustered sidecar runs beside its engine API: the
// transfer layer with the DRAM arenas registered, the peer API server and
// client, membership and the placement view. Built by startCluster, torn
// down by close in reverse order.
type clusterNode struct {
	lg       *zap.Logger
	p        *proxy.Proxy
	tr       *tcp.Transport  // the TCP side of xt (guard counters)
	xt       *auto.Transport // the transfer layer: tcp, and verbs where available
	regions  []rdma.RegionDesc
	psrv     *peerapi.Server
	pcli     *peerapi.Client
	c        *cluster.Cluster
	view     *clusterview.View
	unwatch  func() // stops feeding membership changes to the rebalancer
	unforget func() // stops closing connections to members that go
}

// readSecret reads a key or token file: raw bytes, or base64 text, with
// surrounding white space ignored.
func readSecret(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseSecret(raw), nil
}

// parseSecret is readSecret's reading of a file's contents.
func parseSecret(raw []byte) []byte {
	raw = bytes.TrimSpace(raw)
	if dec, err := base64.StdEncoding.DecodeString(string(raw)); err == nil && validKeyLen(len(dec)) {
		return dec
	}
	return raw
}

// readKey reads the gossip key file as readSecret does, but when the
// trimmed content is no key it takes the raw bytes whole, or without one
// final line ending, if that makes 16, 24 or 32 bytes: random raw bytes
// may begin or end with a byte that is white space (about one key in 20),
// which trimming would cut off.
func readKey(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key := parseSecret(raw)
	if validKeyLen(len(key)) {
		return key, nil
	}
	for _, cand := range [][]byte{raw, bytes.TrimSuffix(raw, []byte("\n")), bytes.TrimSuffix(raw, []byte("\r\n"))} {
		if validKeyLen(len(cand)) {
			return cand, nil
		}
	}
	return key, nil
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// hostFor picks the host peers should dial for a listener bound to bind:
// the bound host when it is concrete, else the host of the gossip address
// that memberlist advertises.
func hostFor(bind net.Addr, gossipAdvertised string) string {
	host, _, _ := net.SplitHostPort(bind.String())
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		return host
	}
	h, _, _ := net.SplitHostPort(gossipAdvertised)
	return h
}

func startCluster(ctx context.Context, cfg Config, store *tiered.Store, p *proxy.Proxy, lg *zap.Logger) (n *clusterNode, err error) {
	n = &clusterNode{lg: lg.Named("cluster"), p: p}
	defer func() {
		if err != nil {
			n.close(0)
			n = nil
		}
	}()
	key, creds, err := readCredentials(cfg, n.lg)
	if err != nil {
		return nil, err
	}
	if err := n.startTransfer(cfg, creds.Key, store, lg); err != nil {
		return nil, err
	}
	ccfg, err := memberConfig(cfg, key, creds.Key, lg)
	if err != nil {
		return nil, err
	}
	pln, err := n.startPeerAPI(ctx, cfg, creds, p, lg)
	if err != nil {
		return nil, err
	}
	if err := n.startMember(ctx, ccfg, pln, lg); err != nil {
		return nil, err
	}
	if err := n.startRouting(ctx, cfg, creds, p, lg); err != nil {
		return nil, err
	}
	meta := n.c.LocalMeta()
	n.lg.Info("cluster member started",
		zap.String("node_name", cfg.NodeID), zap.String("gossip", n.c.Addr()), zap.Strings("join", cfg.Join),
		zap.String("peer_api", meta.PeerAddr), zap.String("transfer", meta.TransferAddr),
		zap.Int("members", len(n.c.Members())), zap.Int("replicas", cfg.Replicas))
	return n, nil
}

// readCredentials reads the gossip key (nil: none) and the peer
// credentials from their files.
func readCredentials(cfg Config, lg *zap.Logger) (key []byte, creds peerapi.Credentials, err error) {
	key, err = readKey(cfg.GossipKeyFile)
	if err != nil {
		return nil, creds, fmt.Errorf("gossip_key_file: %w", err)
	}
	if key != nil && !validKeyLen(len(key)) {
		return nil, creds, fmt.Errorf("gossip_key_file: key is %d bytes; want 16, 24 or 32", len(key))
	}
	token, err := readSecret(cfg.PeerTokenFile)
	if err != nil {
		return nil, creds, fmt.Errorf("peer_token_file: %w", err)
	}
	secret, err := readSecret(cfg.PeerSecretFile)
	if err != nil {
		return nil, creds, fmt.Errorf("peer_secret_file: %w", err)
	}
	var akey *peerauth.Key
	if secret != nil {
		if akey, err = peerauth.NewKey(secret, cfg.ClusterLabel); err != nil {
			return nil, creds, fmt.Errorf("peer_secret_file: %w", err)
		}
		if cfg.PeerEncrypt {
			akey = akey.Encrypting()
		}
	}
	if key == nil || akey == nil {
		// Only reachable with insecure_cluster (Validate refuses otherwise).
		lg.Error("INSECURE CLUSTER: running without full credentials (insecure_cluster is set): "+
			"any host that reaches the gossip, peer API or transfer port can join, read every block and overwrite blocks "+
			"that other nodes then serve to their engines. Set gossip_key_file and peer_secret_file (docs/security.md).",
			zap.Bool("gossip_encrypted", key != nil), zap.Bool("peers_authenticated", akey != nil))
	}
	creds = peerapi.Credentials{NodeID: cfg.NodeID, Label: cfg.ClusterLabel, Token: string(token), Key: akey}
	return key, creds, nil
}

// startTransfer starts the transfer layer (TCP, and verbs where
// available) with every DRAM arena registered.
func (n *clusterNode) startTransfer(cfg Config, akey *peerauth.Key, store *tiered.Store, lg *zap.Logger) (err error) {
	tcfg := tcp.DefaultConfig()
	tcfg.ListenAddr = cfg.TransferAddr
	tcfg.Key = akey
	tcfg.MaxConns = cfg.PeerMaxConns
	tcfg.MaxHandshakes, tcfg.MaxHandshakesPerSource = cfg.PeerHandshakes, cfg.PeerHandshakesPerSource
	tcfg.IdleTimeout = cfg.PeerIdleTime
	tcfg.Congestion = cfg.TCPCongestion
	// Components that name their own logger (rdma/tcp, cluster, the cache
	// tiers) get lg as it is; naming it here too doubled the name
	// ("rdma.rdma.tcp", "cluster.cluster").
	acfg := auto.Config{Mode: cfg.Transport, TCP: tcfg, Verbs: verbs.DefaultConfig()}
	acfg.Verbs.GIDIndex = cfg.RDMAGIDIndex
	for _, d := range strings.Split(cfg.RDMADevice, ",") {
		if d = strings.TrimSpace(d); d != "" {
			acfg.Verbs.Devices = append(acfg.Verbs.Devices, d)
		}
	}
	// The transports name their own loggers ("rdma.tcp", "rdma.verbs").
	if n.xt, err = auto.New(acfg, lg); err != nil {
		return fmt.Errorf("transfer_addr: %w", err)
	}
	n.tr = n.xt.TCP()
	n.regions, err = registerArenas(n.xt, tierArenaMems(store.DRAM()))
	return err
}

// memberConfig is the membership's config: addresses, join, credentials.
func memberConfig(cfg Config, key []byte, akey *peerauth.Key, lg *zap.Logger) (cluster.Config, error) {
	host, portStr, err := net.SplitHostPort(cfg.GossipAddr)
	if err != nil {
		return cluster.Config{}, fmt.Errorf("gossip_addr: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return cluster.Config{}, fmt.Errorf("gossip_addr: port %q: %w", portStr, err)
	}
	ccfg := cluster.DefaultConfig()
	ccfg.NodeName = cfg.NodeID
	if host == "" {
		host = "0.0.0.0"
	}
	ccfg.BindAddr, ccfg.BindPort = host, port
	if cfg.AdvertiseAddr != "" {
		ah, ap, err := net.SplitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			ah, ap = cfg.AdvertiseAddr, ""
		}
		ccfg.AdvertiseAddr = ah
		if ap != "" {
			ccfg.AdvertisePort, _ = strconv.Atoi(ap)
		}
	}
	ccfg.Join = cfg.Join
	// Pods start in any order: the first finds nobody and must still come
	// up (and become ready) alone; joining goes on in the background.
	ccfg.BackgroundJoin = true
	ccfg.SecretKey = key
	ccfg.Label = cfg.ClusterLabel
	ccfg.Auth = akey
	ccfg.LogOutput = zapWriter{lg: lg.Named("memberlist")}
	ccfg.Meta = cluster.Meta{NodeID: cfg.NodeID, Protocol: cluster.ProtocolVersion}
	return ccfg, nil
}

// startPeerAPI starts the peer API's server and returns its listener.
func (n *clusterNode) startPeerAPI(ctx context.Context, cfg Config, creds peerapi.Credentials, p *proxy.Proxy, lg *zap.Logger) (net.Listener, error) {
	pln, err := net.Listen("tcp", cfg.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("peer_addr: %w", err)
	}
	scfg := peerapi.DefaultServerConfig()
	scfg.Credentials = creds
	scfg.Transport = n.xt
	scfg.Regions = n.regions
	scfg.MaxRequestBytes = int(cfg.MaxRequestSize)
	scfg.DrainTimeout = cfg.DrainTimeout
	scfg.MaxConns = cfg.PeerMaxConns
	scfg.MaxHandshakes, scfg.MaxHandshakesPerSource = cfg.PeerHandshakes, cfg.PeerHandshakesPerSource
	scfg.IdleTimeout = cfg.PeerIdleTime
	if cfg.PeerNamedReads {
		scfg.Fetch = n.xt
	}
	if n.psrv, err = peerapi.NewServer(scfg, p, pln, lg.Named("peerapi")); err != nil {
		pln.Close()
		return nil, err
	}
	if err := n.psrv.Start(ctx); err != nil {
		return nil, err
	}
	return pln, nil
}

// startMember joins the membership and announces where the peer API and
// the transfer layer are reachable. When they are bound to concrete hosts
// the first announcement carries them; otherwise the host is known only
// once gossip has picked the address it advertises, and an update follows.
func (n *clusterNode) startMember(ctx context.Context, ccfg cluster.Config, pln net.Listener, lg *zap.Logger) (err error) {
	_, pport, _ := net.SplitHostPort(pln.Addr().String())
	_, tport, _ := net.SplitHostPort(n.xt.Addr())
	announce := func(gossip string) (string, string) {
		return net.JoinHostPort(hostFor(pln.Addr(), gossip), pport), net.JoinHostPort(hostFor(mustAddr(n.xt.Addr()), gossip), tport)
	}
	if ph, th := hostFor(pln.Addr(), ""), hostFor(mustAddr(n.xt.Addr()), ""); ph != "" && th != "" {
		ccfg.Meta.PeerAddr, ccfg.Meta.TransferAddr = announce("")
	}
	if n.c, err = cluster.New(ccfg, lg); err != nil {
		return err
	}
	if err := n.c.Start(ctx); err != nil {
		return err
	}
	gossip := n.c.Addr()
	meta := n.c.LocalMeta()
	if pa, ta := announce(gossip); meta.PeerAddr != pa || meta.TransferAddr != ta {
		meta.PeerAddr, meta.TransferAddr = pa, ta
		if err := n.c.UpdateMeta(ctx, meta); err != nil {
			return fmt.Errorf("announcing addresses: %w", err)
		}
	}
	return nil
}

// startRouting starts the cluster view and the peer API's client and
// attaches both to the proxy.
func (n *clusterNode) startRouting(ctx context.Context, cfg Config, creds peerapi.Credentials, p *proxy.Proxy, lg *zap.Logger) (err error) {
	vcfg := clusterview.DefaultConfig()
	vcfg.Ring.Replicas = cfg.Replicas
	if n.view, err = clusterview.New(n.c, vcfg, lg.Named("clusterview")); err != nil {
		return err
	}
	if err := n.view.Start(ctx); err != nil {
		return err
	}
	ccl := peerapi.DefaultClientConfig()
	ccl.Credentials = creds
	ccl.Resolve = n.view.Addrs
	ccl.Transport = n.xt
	ccl.Fetch = n.xt // named reads to peers that serve them
	ccl.Regions = n.regions
	ccl.MaxMessageBytes = int(cfg.MaxRequestSize) // what the peers' servers accept (scfg above)
	if n.pcli, err = peerapi.NewClient(ccl, lg.Named("peerapi.client")); err != nil {
		return err
	}
	if err := p.AttachCluster(n.view, n.pcli, cfg.routeConfig()); err != nil {
		return err
	}
	n.unwatch = n.c.OnMembershipChange(p.MembershipChanged)
	n.unforget = forgetGone(n.c, n.pcli)
	return nil
}

// forgetGone closes the pooled peer API connections to every member that
// is leaving, left or failed: a leaving node's peer API drains as soon as
// no call is in flight instead of waiting out drain_timeout for idle
// connections from its peers. It returns a stop function.
func forgetGone(c *cluster.Cluster, pcli *peerapi.Client) (stop func()) {
	events, cancel := c.Subscribe()
	go func() {
		for ev := range events {
			if m := ev.Member; !m.Local && !m.State.Live() && m.Meta.PeerAddr != "" {
				pcli.Forget(m.Meta.PeerAddr)
			}
		}
	}()
	return cancel
}

func mustAddr(hostport string) net.Addr {
	a, err := net.ResolveTCPAddr("tcp", hostport)
	if err != nil {
		return &net.TCPAddr{}
	}
	return a
}

// leave announces a graceful leave so that peers stop routing here; the
// node keeps serving its peers until close.
func (n *clusterNode) leave(timeout time.Duration) {
	if n == nil || n.c == nil {
		return
	}
	if err := n.c.Leave(timeout); err != nil && !errors.Is(err, cluster.ErrClosed) {
		n.lg.Warn("leaving the cluster", zap.Error(err))
	}
}

// close stops routing, then the peer API, membership and the transfer
// layer (deregistering the arenas before the store closes them). Safe on a
// partly built node.
func (n *clusterNode) close(pushDrain time.Duration) {
	if n == nil {
		return
	}
	if n.unwatch != nil {
		n.unwatch()
	}
	if n.unforget != nil {
		n.unforget()
	}
	if n.p != nil {
		n.p.DetachCluster(pushDrain)
	}
	if n.psrv != nil {
		n.psrv.Close()
	}
	if n.view != nil {
		n.view.Close()
	}
	if n.c != nil {
		n.c.Close()
	}
	if n.pcli != nil {
		n.pcli.Close()
	}
	if n.xt != nil {
		if len(n.regions) > 0 {
			deregisterArenas(n.xt, n.regions)
		}
		n.xt.Close()
	}
}
