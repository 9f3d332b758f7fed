// Package proxy is the sidecar core: it validates engine requests against
// the configured limits and namespaces, and serves them from the block
// store. It knows nothing of the wire: the Kitex handlers live in the
// engineapi sub-package, which converts Thrift structs to the calls here and
// maps the errors below to protocol codes.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// Errors for requests that break the limits. Tier errors (cache.Err*) pass
// through unchanged.
var (
	ErrInvalidArgument  = errors.New("proxy: invalid argument")
	ErrBatchTooLarge    = errors.New("proxy: batch too large")
	ErrUnknownNamespace = errors.New("proxy: unknown namespace")
	ErrClosed           = errors.New("proxy: closed")
)

// Scope says where a read looks for blocks.
type Scope uint8

const (
	// ScopeDefault is ScopeCluster on a clustered node, else ScopeLocal.
	ScopeDefault Scope = iota
	// ScopeLocal looks in this node's tiers only.
	ScopeLocal
	// ScopeCluster also asks the owners of keys missing locally.
	ScopeCluster
)

// MemberInfo describes one sidecar of the cluster for Members.
type MemberInfo struct {
	Name       string
	State      string // alive, suspect, left, failed
	GossipAddr string
	PeerAddr   string
	Zone       string
	Self       bool
}

// Config holds the limits the proxy enforces before touching the store. A
// zero field takes its default (DefaultConfig, applied once by New and
// Validate in withDefaults).
type Config struct {
	// NodeID names this sidecar in responses. Default: empty (serve sets
	// the node name).
	NodeID string
	// Limits bounds keys, values, namespace names and batches (see
	// cache.Limits for each field's range and default); requests beyond
	// them are refused before anything is allocated or stored.
	cache.Limits
	// Namespaces, when not empty, is the allow-list of namespaces; any other
	// is refused with ErrUnknownNamespace. Empty: namespaces are created on
	// first put.
	Namespaces []string
	// MaxNamespaces bounds how many distinct namespaces may hold data at
	// once (it bounds per-namespace metrics too). Default 64.
	MaxNamespaces int
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Limits:        cache.DefaultLimits(),
		MaxNamespaces: 64,
	}
}

// withDefaults fills the zero fields with their defaults.
func (c Config) withDefaults() Config {
	c.Limits = c.Limits.WithDefaults()
	if c.MaxNamespaces == 0 {
		c.MaxNamespaces = DefaultConfig().MaxNamespaces
	}
	return c
}

// Validate reports every problem with c (after defaults) at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxNamespaces <= 0 {
		errs = append(errs, fmt.Errorf("max namespaces %d: must be positive", c.MaxNamespaces))
	}
	for _, ns := range c.Namespaces {
		if err := checkNamespaceName(ns, c.MaxNamespaceBytes); err != nil {
			errs = append(errs, fmt.Errorf("namespaces: %q: %w", ns, err))
		}
	}
	if len(c.Namespaces) > c.MaxNamespaces && c.MaxNamespaces > 0 {
		errs = append(errs, fmt.Errorf("namespaces: %d listed but max namespaces is %d", len(c.Namespaces), c.MaxNamespaces))
	}
	return errors.Join(errs...)
}

// Proxy serves engine requests on one node.
type Proxy struct {
	cfg      Config
	store    Store
	zcs      ZeroCopyStore // nil: no shared arenas
	prefetch Prefetcher    // nil: Prefetch queues nothing
	scan     Scanner       // nil: no rebalancer
	gpu      GPU           // nil: no GPU end
	notes    BlockNotes    // nil: block descriptions are checked and dropped
	zc       *zcState      // the zero-copy handle tables (zerocopy.go)
	lg       *zap.Logger
	started  time.Time
	allowed  map[string]bool // nil: any namespace

	mu    sync.Mutex
	known map[string]bool // namespaces that have been written
	route *router         // nil on a single node (remote.go)
}

// New validates cfg and returns a Proxy over deps.Store, with the
// features whose dependencies deps provides (store.go).
func New(cfg Config, deps Deps, lg *zap.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy: invalid config: %w", err)
	}
	if deps.Store == nil {
		return nil, errors.New("proxy: nil store")
	}
	cfg = cfg.withDefaults()
	if lg == nil {
		lg = zap.NewNop()
	}
	p := &Proxy{cfg: cfg, store: deps.Store, zcs: deps.ZeroCopy, prefetch: deps.Prefetch, scan: deps.Scan, gpu: deps.GPU, notes: deps.Notes,
		zc: newZCState(), lg: lg, started: time.Now(), known: map[string]bool{}}
	var off []string
	if p.zcs == nil {
		off = append(off, "zero-copy calls and in-place reads (no shared arenas)")
	}
	if p.prefetch == nil {
		off = append(off, "prefetch")
	}
	if p.scan == nil {
		off = append(off, "rebalancer (no scan of the store)")
	}
	if len(off) > 0 {
		lg.Info("proxy features off: the store does not provide them", zap.Strings("off", off))
	}
	// Namespaces recovered by a persistent tier count against the limit.
	for _, s := range p.store.Stats().Namespaces {
		if s.Blocks > 0 {
			p.known[s.Namespace] = true
		}
	}
	if len(cfg.Namespaces) > 0 {
		p.allowed = map[string]bool{}
		for _, ns := range cfg.Namespaces {
			p.allowed[ns] = true
		}
	}
	return p, nil
}

// Config returns the proxy's configuration (limits for Hello).
func (p *Proxy) Config() Config { return p.cfg }

// Uptime returns how long the proxy has been running.
func (p *Proxy) Uptime() time.Duration { return time.Since(p.started) }

func checkNamespaceName(ns string, max int) error {
	switch {
	case ns == "":
		return errors.New("empty namespace")
	case len(ns) > max:
		return fmt.Errorf("namespace is %d bytes, limit %d", len(ns), max)
	case !utf8.ValidString(ns):
		return errors.New("namespace is not valid UTF-8")
	}
	for _, r := range ns {
		if r < 0x20 || r == 0x7f {
			return errors.New("namespace holds a control character")
		}
	}
	return nil
}

// checkNamespace validates ns for a read. Reads of a namespace never written
// are misses, not errors; only the allow-list refuses.
func (p *Proxy) checkNamespace(ns string) error {
	if err := checkNamespaceName(ns, p.cfg.MaxNamespaceBytes); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if p.allowed != nil && !p.allowed[ns] {
		return fmt.Errorf("%w: %q is not in the configured namespaces", ErrUnknownNamespace, ns)
	}
	return nil
}

// admitNamespace validates ns for a write and counts it against
// MaxNamespaces.
func (p *Proxy) admitNamespace(ns string) error {
	if err := p.checkNamespace(ns); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known[ns] {
		return nil
	}
	if len(p.known) >= p.cfg.MaxNamespaces {
		return fmt.Errorf("%w: %q would exceed the limit of %d namespaces", ErrUnknownNamespace, ns, p.cfg.MaxNamespaces)
	}
	p.known[ns] = true
	return nil
}

func (p *Proxy) checkKey(key []byte) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("%w: empty key", ErrInvalidArgument)
	case len(key) > p.cfg.MaxKeyBytes:
		return fmt.Errorf("%w: key is %d bytes, limit %d", ErrInvalidArgument, len(key), p.cfg.MaxKeyBytes)
	}
	return nil
}

// MaxBlockTokens is the most token ids one block's description may carry
// (cache.BlockMeta; engines use blocks of 16 to 256 tokens).
const MaxBlockTokens = 4096

// checkMeta checks a put's block description: a block size in
// (0, MaxBlockTokens], token ids (if any) exactly one block of them, a
// parent key no longer than a key.
func (p *Proxy) checkMeta(m *cache.BlockMeta) error {
	switch {
	case m == nil:
		return nil
	case m.BlockSize <= 0 && len(m.Tokens) > 0:
		return fmt.Errorf("%w: token_ids given without block_size", ErrInvalidArgument)
	case m.BlockSize < 0 || m.BlockSize > MaxBlockTokens:
		return fmt.Errorf("%w: block_size %d outside 1..%d", ErrInvalidArgument, m.BlockSize, MaxBlockTokens)
	case len(m.Tokens) > 0 && len(m.Tokens) != int(m.BlockSize):
		return fmt.Errorf("%w: %d token_ids for a block of %d tokens", ErrInvalidArgument, len(m.Tokens), m.BlockSize)
	case len(m.Parent) > p.cfg.MaxKeyBytes:
		return fmt.Errorf("%w: parent_key is %d bytes, limit %d", ErrInvalidArgument, len(m.Parent), p.cfg.MaxKeyBytes)
	}
	return nil
}

// describe hands a put's block description to the publisher before the
// store sees the block; the returned func, called with the put's error,
// forgets it when the put failed.
func (p *Proxy) describe(ns string, key []byte, m *cache.BlockMeta) func(error) {
	if p.notes == nil || m == nil {
		return func(error) {}
	}
	p.notes.Describe(ns, key, m)
	return func(err error) {
		if err != nil {
			p.notes.Forget(ns, key)
		}
	}
}

// Description is the description the KV-event publisher knows of a block
// (nil: none, or no publisher), for a peer that fetches the block
// (proxy/peerapi): its copy there is then described too.
func (p *Proxy) Description(ns string, key []byte) *cache.BlockMeta {
	if p.notes == nil {
		return nil
	}
	return p.notes.Description(ns, key)
}

func (p *Proxy) checkValue(value []byte) error {
	if int64(len(value)) > p.cfg.MaxValueBytes {
		return fmt.Errorf("%w: value is %d bytes, limit %d", cache.ErrTooLarge, len(value), p.cfg.MaxValueBytes)
	}
	return nil
}

func (p *Proxy) checkBatch(n int) error {
	if n > p.cfg.MaxBatch {
		return fmt.Errorf("%w: %d items, limit %d", ErrBatchTooLarge, n, p.cfg.MaxBatch)
	}
	return nil
}

// Put stores one block. existed reports a no-op put of a present key.
func (p *Proxy) Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	if err := p.checkKey(key); err != nil {
		return false, err
	}
	if err := p.checkValue(value); err != nil {
		return false, err
	}
	if err := p.checkMeta(opts.Meta); err != nil {
		return false, err
	}
	if err := p.admitNamespace(ns); err != nil {
		return false, err
	}
	r := p.router()
	opts = r.localOpts(ns, key, opts)
	done := p.describe(ns, key, opts.Meta)
	existed, err = p.store.Put(ctx, ns, key, value, opts)
	done(err)
	if r != nil && opts.LowPriority && errors.Is(err, cache.ErrNoSpace) && p.parentHeld(ctx, ns, opts.Parent) {
		err = nil // no room here for a copy of a block owned elsewhere: its owner still gets it
	}
	if err != nil || r == nil {
		return existed, err
	}
	opts.Parent = nil // this tier's chain hint; the owner names its own
	return existed, r.push(ctx, ns, []PutItem{{Key: key, Value: value, Opts: opts}}, opts.SyncReplicas, false)
}

// parentHeld reports whether a put's chain hint is held here (none: true):
// a block refused with a hint that is not held would be an orphan, not
// merely without room.
func (p *Proxy) parentHeld(ctx context.Context, ns string, parent []byte) bool {
	if len(parent) == 0 {
		return true
	}
	_, ok := p.store.Stat(ctx, ns, parent)
	return ok
}

// PutLocal stores one block in this node's tiers only, as an owned block:
// what a peer's push (replication) lands as. It is never pushed on.
func (p *Proxy) PutLocal(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	if err := p.checkKey(key); err != nil {
		return false, err
	}
	if err := p.checkValue(value); err != nil {
		return false, err
	}
	if err := p.checkMeta(opts.Meta); err != nil {
		return false, err
	}
	if err := p.admitNamespace(ns); err != nil {
		return false, err
	}
	opts.LowPriority = false
	done := p.describe(ns, key, opts.Meta)
	existed, err = p.store.Put(ctx, ns, key, value, opts)
	done(err)
	return existed, err
}

// PutItem is one block of a BatchPut.
type PutItem struct {
	Key   []byte
	Value []byte
	Opts  cache.PutOptions
}

// BatchPut stores several blocks of one namespace. A request-level problem
// (namespace, batch size) is returned as err; per-item outcomes are in
// results, in order: nil, cache.ErrExists for a no-op put, or the item's
// error. Items are stored in order, and an item one level deeper than the
// item before it names that item as its parent (cache.PutOptions.Parent):
// the DRAM tier's chain rule then refuses it (cache.ErrNoSpace) rather than
// evict its parent for it, or when its parent is not held, so a chain put
// head first keeps a contiguous head when space runs out, whatever other
// clients store meanwhile.
//
// In a cluster the chain is the cluster's: an item names its parent only
// when this node owns the parent too, a copy of a block owned elsewhere
// that finds no room here still goes to its owner (its result is nil),
// and once a block is refused here by its owner or is invalid, the deeper
// blocks of its chain are neither stored nor pushed (cache.ErrNoSpace):
// no lookup could reach them.
func (p *Proxy) BatchPut(ctx context.Context, ns string, items []PutItem) (results []error, err error) {
	if err := p.checkBatch(len(items)); err != nil {
		return nil, err
	}
	if err := p.admitNamespace(ns); err != nil {
		return nil, err
	}
	results = make([]error, len(items))
	r := p.router()
	var stored []PutItem
	syncN := 0 // the most owners any item asks to wait for (cache.PutOptions.SyncReplicas)
	// cut (cluster only): a block of the chain being put was refused
	// here, its owner, or not stored at all: the deeper blocks would be
	// orphans everywhere, so they are neither stored nor pushed.
	cut := false
	for i, it := range items {
		if err := p.checkItem(it); err != nil {
			results[i], cut = err, r != nil
			continue
		}
		follows := i > 0 && it.Opts.Depth > 0 && it.Opts.Depth == items[i-1].Opts.Depth+1
		cut = cut && follows
		if cut {
			results[i] = fmt.Errorf("%w: its parent was not stored", cache.ErrNoSpace)
			continue
		}
		if follows {
			// The tier refuses the block rather than evict its parent for
			// it, or when the parent is not held (on a single node, also
			// an invalid parent); localOpts drops a parent owned elsewhere.
			it.Opts.Parent = items[i-1].Key
		}
		it.Opts = r.localOpts(ns, it.Key, it.Opts)
		done := p.describe(ns, it.Key, it.Opts.Meta)
		existed, err := p.store.Put(ctx, ns, it.Key, it.Value, it.Opts)
		done(err)
		if r != nil && it.Opts.LowPriority && errors.Is(err, cache.ErrNoSpace) && p.parentHeld(ctx, ns, it.Opts.Parent) {
			err = nil // no room here for a copy of a block owned elsewhere: its owner still gets it
		}
		it.Opts.Parent = nil // this tier's chain hint; the owner names its own
		switch {
		case err != nil:
			results[i] = err
			cut = r != nil
		case existed:
			results[i] = cache.ErrExists
		}
		if err == nil && r != nil {
			stored = append(stored, it)
			syncN = max(syncN, it.Opts.SyncReplicas)
		}
	}
	if r != nil && len(stored) > 0 {
		if err := r.push(ctx, ns, stored, syncN, false); err != nil {
			return results, err
		}
	}
	return results, nil
}

func (p *Proxy) checkItem(it PutItem) error {
	if err := p.checkKey(it.Key); err != nil {
		return err
	}
	if err := p.checkValue(it.Value); err != nil {
		return err
	}
	return p.checkMeta(it.Opts.Meta)
}

// Get returns a copy of one block's bytes, verified against its checksum.
// A miss returns cache.ErrNotFound.
func (p *Proxy) Get(ctx context.Context, ns string, key []byte, scope Scope) ([]byte, cache.Info, error) {
	return p.GetPinned(ctx, ns, key, scope, nil)
}

// GetResult is one block of a BatchGet: Err is nil, cache.ErrNotFound or
// another per-item error.
type GetResult struct {
	Value []byte
	Info  cache.Info
	Err   error
}

// BatchGet returns several blocks of one namespace, in order.
func (p *Proxy) BatchGet(ctx context.Context, ns string, keys [][]byte, scope Scope) ([]GetResult, error) {
	return p.BatchGetPinned(ctx, ns, keys, scope, nil)
}

// Exists reports whether a block is present, and where: a block held by
// another node (cluster scope) has Tier "remote" and Node naming the node
// that answered it holds the block.
func (p *Proxy) Exists(ctx context.Context, ns string, key []byte, scope Scope) (cache.Info, bool, error) {
	if err := p.checkNamespace(ns); err != nil {
		return cache.Info{}, false, err
	}
	if err := p.checkKey(key); err != nil {
		return cache.Info{}, false, err
	}
	info, ok := p.store.Stat(ctx, ns, key)
	if r := p.clusterRouter(scope); r != nil && !ok {
		present := []bool{false}
		holders := r.lookupRemote(ctx, ns, [][]byte{key}, present)
		if present[0] {
			return cache.Info{Tier: "remote", Node: holders[0]}, true, nil
		}
	}
	return info, ok, nil
}

// ExistsResult is one key of a BatchExists.
type ExistsResult struct {
	Info    cache.Info
	Present bool
	Err     error
}

// BatchExists reports presence for several keys, in order.
func (p *Proxy) BatchExists(ctx context.Context, ns string, keys [][]byte, scope Scope) ([]ExistsResult, error) {
	if err := p.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	if err := p.checkNamespace(ns); err != nil {
		return nil, err
	}
	out := make([]ExistsResult, len(keys))
	present := make([]bool, len(keys))
	for i, k := range keys {
		if err := p.checkKey(k); err != nil {
			out[i].Err = err
			present[i] = true // do not ask anyone about an invalid key
			continue
		}
		out[i].Info, out[i].Present = p.store.Stat(ctx, ns, k)
		present[i] = out[i].Present
	}
	if r := p.clusterRouter(scope); r != nil {
		holders := r.lookupRemote(ctx, ns, keys, present)
		for i := range out {
			if present[i] && !out[i].Present && out[i].Err == nil {
				out[i].Present, out[i].Info = true, cache.Info{Tier: "remote", Node: holders[i]}
			}
		}
	}
	return out, nil
}

// checkAllKeys validates a batch whose keys must all be valid (Lookup,
// Prefetch): its size, the namespace, then every key.
func (p *Proxy) checkAllKeys(ns string, keys [][]byte) error {
	if err := p.checkBatch(len(keys)); err != nil {
		return err
	}
	if err := p.checkNamespace(ns); err != nil {
		return err
	}
	for i, k := range keys {
		if err := p.checkKey(k); err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
	}
	return nil
}

// Lookup returns the number of leading keys that are present: the longest
// cached prefix of a chain. Every key is validated before any is looked up.
func (p *Proxy) Lookup(ctx context.Context, ns string, keys [][]byte, scope Scope) (int, error) {
	if err := p.checkAllKeys(ns, keys); err != nil {
		return 0, err
	}
	local := p.store.Present(ctx, ns, keys, nil)
	r := p.clusterRouter(scope)
	if r == nil || local == len(keys) {
		return local, nil
	}
	return local + p.lookupPast(ctx, r, ns, keys[local:]), nil
}

// lookupPast is the cluster part of Lookup: the length of the prefix of
// keys present in the cluster, keys[0] being absent here (the local prefix
// ended there). Blocks held here past it count too; the others are asked
// of their other owners, in one call per owner, but only up to the first
// key absent here that no other node owns: the prefix cannot pass it.
func (p *Proxy) lookupPast(ctx context.Context, r *router, ns string, keys [][]byte) int {
	present := make([]bool, len(keys))
	p.store.Present(ctx, ns, keys[1:], present[1:])
	owners := make([][]string, len(keys))
	end := len(keys)
	for i, k := range keys {
		if present[i] {
			continue
		}
		if owners[i] = r.remoteOwners(ns, k); len(owners[i]) == 0 {
			end = i
			break
		}
	}
	r.askOwners(ctx, ns, keys[:end], owners[:end], present[:end])
	for i, ok := range present[:end] {
		if !ok {
			return i
		}
	}
	return end
}

// Held reports, per key, whether this node holds the block, in any tier:
// what a peer's Lookup asks. An invalid key is not held.
func (p *Proxy) Held(ctx context.Context, ns string, keys [][]byte) ([]bool, error) {
	if err := p.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	if err := p.checkNamespace(ns); err != nil {
		return nil, err
	}
	held := make([]bool, len(keys))
	p.store.Present(ctx, ns, keys, held)
	for i, k := range keys {
		if held[i] && p.checkKey(k) != nil {
			held[i] = false
		}
	}
	return held, nil
}

// Delete removes one block; deleted is false when it was absent. In
// cluster scope (the default on a clustered node) every other live member
// is asked to delete it too: its owners, and any node that keeps a copy.
// deleted is then true when any node held it, and the error wraps
// cache.ErrUnavailable when a member could not be reached (it may still
// serve the block; Delete is idempotent: retry).
func (p *Proxy) Delete(ctx context.Context, ns string, key []byte, scope Scope) (bool, error) {
	if err := p.checkNamespace(ns); err != nil {
		return false, err
	}
	if err := p.checkKey(key); err != nil {
		return false, err
	}
	ok, err := p.store.Delete(ctx, ns, key)
	if err != nil {
		return ok, err
	}
	if r := p.clusterRouter(scope); r != nil {
		var any atomic.Bool // fn runs on one goroutine per member
		err = r.everywhere(ctx, func(ctx context.Context, node string) error {
			res, err := r.deleter.Delete(ctx, node, ns, [][]byte{key})
			if err == nil && len(res) == 1 && res[0] {
				any.Store(true)
			}
			return err
		})
		ok = ok || any.Load()
	}
	return ok, err
}

// Clear removes every block of a namespace and forgets the namespace. In
// cluster scope (the default on a clustered node) every other live member
// clears it too; removed then counts the blocks of all nodes, and the
// error wraps cache.ErrUnavailable when a member could not be reached (its
// blocks stay; Clear is idempotent: retry).
func (p *Proxy) Clear(ctx context.Context, ns string, scope Scope) (int64, error) {
	if err := p.checkNamespace(ns); err != nil {
		return 0, err
	}
	n, err := p.store.Clear(ctx, ns)
	if err != nil {
		return n, err
	}
	p.mu.Lock()
	delete(p.known, ns)
	p.mu.Unlock()
	if r := p.clusterRouter(scope); r != nil {
		var total atomic.Int64
		err = r.everywhere(ctx, func(ctx context.Context, node string) error {
			m, err := r.deleter.Clear(ctx, node, ns)
			total.Add(m)
			return err
		})
		n += total.Load()
	}
	return n, err
}

// Stats returns the store's statistics; with ns set, only that namespace's.
func (p *Proxy) Stats(ctx context.Context, ns string) (cache.Stats, error) {
	if ns != "" {
		if err := p.checkNamespace(ns); err != nil {
			return cache.Stats{}, err
		}
	}
	st := p.store.Stats()
	if ns != "" {
		var keep []cache.NamespaceStats
		for _, s := range st.Namespaces {
			if s.Namespace == ns {
				keep = append(keep, s)
			}
		}
		st.Namespaces = keep
	}
	sort.Slice(st.Namespaces, func(i, j int) bool { return st.Namespaces[i].Namespace < st.Namespaces[j].Namespace })
	return st, nil
}

// Prefetch asks the store to bring keys into its fastest tier in the
// background and returns how many it queued; keys already there, and a
// proxy without a Prefetcher (a store with a single tier), queue nothing.
func (p *Proxy) Prefetch(ctx context.Context, ns string, keys [][]byte, scope Scope) (int, error) {
	if err := p.checkAllKeys(ns, keys); err != nil {
		return 0, err
	}
	if p.prefetch == nil {
		return 0, nil
	}
	return p.prefetch.Prefetch(ctx, ns, keys), nil
}

// Members returns the cluster view; a single node lists itself.
func (p *Proxy) Members(ctx context.Context) []MemberInfo {
	if r := p.router(); r != nil {
		return r.c.Members()
	}
	return []MemberInfo{{Name: p.cfg.NodeID, State: "alive", Self: true}}
}
