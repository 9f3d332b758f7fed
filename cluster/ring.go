package cluster

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
)

// RingConfig configures placement. A zero field means its default
// (DefaultRingConfig, applied per field by WithDefaults, which NewRing and
// Validate call); a negative value, or a value out of range, is an error.
type RingConfig struct {
	// Partitions cuts the key space into this many fixed slices, the
	// virtual nodes of the ring: a key belongs to one partition (by hash),
	// a partition to R members. Keep it at least ~50 times the largest
	// cluster size for an even spread. Default 8192. At most 1<<20.
	Partitions int
	// LoadFactor bounds load: no member is the i-th owner of more than
	// ceil(LoadFactor * Partitions / members) partitions, for each rank i.
	// 1.0 is perfectly even but moves more partitions on changes. Default
	// 1.1. Must be >= 1.
	LoadFactor float64
	// Replicas is the number of owners Owners returns when asked for r <= 0,
	// and the depth of the precomputed owner table. Default 1.
	Replicas int
}

// DefaultRingConfig returns the defaults documented on RingConfig.
func DefaultRingConfig() RingConfig {
	return RingConfig{Partitions: 8192, LoadFactor: 1.1, Replicas: 1}
}

// WithDefaults fills the zero fields with their defaults: the one place a
// zero RingConfig field becomes its default (exported for the configs that
// hold a RingConfig: clusterview.Config).
func (c RingConfig) WithDefaults() RingConfig {
	d := DefaultRingConfig()
	if c.Partitions == 0 {
		c.Partitions = d.Partitions
	}
	if c.LoadFactor == 0 {
		c.LoadFactor = d.LoadFactor
	}
	if c.Replicas == 0 {
		c.Replicas = d.Replicas
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c RingConfig) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Partitions <= 0 || c.Partitions > 1<<20 {
		errs = append(errs, fmt.Errorf("cluster: ring Partitions %d must be in [1, %d]", c.Partitions, 1<<20))
	}
	if !(c.LoadFactor >= 1) || math.IsInf(c.LoadFactor, 0) {
		errs = append(errs, fmt.Errorf("cluster: ring LoadFactor %v must be a finite number >= 1", c.LoadFactor))
	}
	if c.Replicas <= 0 || c.Replicas > 16 {
		errs = append(errs, fmt.Errorf("cluster: ring Replicas %d must be in [1, 16]", c.Replicas))
	}
	return errors.Join(errs...)
}

// Ring is an immutable placement of keys onto members: rendezvous (highest
// random weight) hashing of fixed partitions with a load bound, computed
// once per member set. It is a pure function of the member names and the
// config, so every node with the same view places keys alike. Safe for
// concurrent use; build a new Ring when membership changes.
//
// Placement of partition p: members are ranked by hash(member, p); the
// first owner is the best-ranked member still under the load bound for rank
// 0, the second the best-ranked other member under the bound for rank 1,
// and so on. Partitions are placed in index order, so the bound only
// diverts the partitions placed after a member filled up. When one of N
// members joins or leaves, about 1/N of the partitions change owner.
type Ring struct {
	cfg     RingConfig
	members []string // sorted, unique
	mhash   []uint64
	depth   int     // owners stored per partition: min(Replicas, len(members))
	owners  []int32 // partition p's owners: owners[p*depth : (p+1)*depth]
}

// NewRing places cfg.Partitions partitions (zero fields of cfg: their
// defaults) on members (names, e.g. node
// ids; order and duplicates do not matter; names must not be empty). An
// empty member list gives a ring whose Owners are always empty.
func NewRing(members []string, cfg RingConfig) (*Ring, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ms := slices.Clone(members)
	sort.Strings(ms)
	ms = slices.Compact(ms)
	if len(ms) > 0 && ms[0] == "" {
		return nil, errors.New("cluster: ring member with an empty name")
	}
	r := &Ring{cfg: cfg, members: ms, mhash: make([]uint64, len(ms)), depth: min(cfg.Replicas, len(ms))}
	for i, m := range ms {
		r.mhash[i] = hashString(m)
	}
	if len(ms) == 0 {
		return r, nil
	}
	n, p, d := len(ms), cfg.Partitions, r.depth
	limit := int(math.Ceil(cfg.LoadFactor * float64(p) / float64(n)))
	r.owners = make([]int32, p*d)
	load := make([]int, d*n) // load[rank*n + member]
	scores := make([]uint64, n)
	for part := 0; part < p; part++ {
		ph := partitionSeed(part)
		for i := range scores {
			scores[i] = mix64(r.mhash[i] ^ ph)
		}
		own := r.owners[part*d : (part+1)*d]
		for rank := 0; rank < d; rank++ {
			best := r.pick(scores, own[:rank], load[rank*n:(rank+1)*n], limit)
			if best < 0 { // every unchosen member is full: ignore the bound
				best = r.pick(scores, own[:rank], nil, 0)
			}
			own[rank] = int32(best)
			load[rank*n+best]++
		}
	}
	return r, nil
}

// pick returns the best-scored member not in chosen whose load is under
// limit (load nil: any), or -1.
func (r *Ring) pick(scores []uint64, chosen []int32, load []int, limit int) int {
	best := -1
	for i, s := range scores {
		if load != nil && load[i] >= limit {
			continue
		}
		if best >= 0 && s <= scores[best] {
			continue // ties keep the lower index: names are sorted
		}
		if slices.Contains(chosen, int32(i)) {
			continue
		}
		best = i
	}
	return best
}

// Members returns the ring's members, sorted.
func (r *Ring) Members() []string { return slices.Clone(r.members) }

// Len returns the number of members.
func (r *Ring) Len() int { return len(r.members) }

// Config returns the ring's config, defaults applied.
func (r *Ring) Config() RingConfig { return r.cfg }

// Partition returns the partition key belongs to.
func (r *Ring) Partition(key []byte) int {
	hi, _ := bits.Mul64(hashBytes(key), uint64(r.cfg.Partitions))
	return int(hi)
}

// Owner returns the first owner of key, or "" when the ring is empty.
func (r *Ring) Owner(key []byte) string {
	if len(r.members) == 0 {
		return ""
	}
	return r.members[r.owners[r.Partition(key)*r.depth]]
}

// Owners returns the n distinct owners of key, first owner first (n <= 0
// means RingConfig.Replicas; n is capped at the member count). Owners past
// the configured Replicas follow rendezvous order without a load bound.
func (r *Ring) Owners(key []byte, n int) []string {
	return r.AppendOwners(nil, key, n)
}

// AppendOwners is Owners appending to dst, to avoid an allocation.
func (r *Ring) AppendOwners(dst []string, key []byte, n int) []string {
	return r.AppendPartitionOwners(dst, r.Partition(key), n)
}

// PartitionOwners returns the n owners of partition p (see Owners).
func (r *Ring) PartitionOwners(p, n int) []string {
	return r.AppendPartitionOwners(nil, p, n)
}

// AppendPartitionOwners is PartitionOwners appending to dst.
func (r *Ring) AppendPartitionOwners(dst []string, p, n int) []string {
	if n <= 0 {
		n = r.cfg.Replicas
	}
	n = min(n, len(r.members))
	if n == 0 || p < 0 || p >= r.cfg.Partitions {
		return dst
	}
	own := r.owners[p*r.depth : (p+1)*r.depth]
	for _, i := range own[:min(n, len(own))] {
		dst = append(dst, r.members[i])
	}
	if n <= len(own) {
		return dst
	}
	// Beyond the table: the remaining members by rendezvous score.
	ph := partitionSeed(p)
	rest := make([]int, 0, len(r.members)-len(own))
	for i := range r.members {
		if !slices.Contains(own, int32(i)) {
			rest = append(rest, i)
		}
	}
	sort.Slice(rest, func(a, b int) bool {
		sa, sb := mix64(r.mhash[rest[a]]^ph), mix64(r.mhash[rest[b]]^ph)
		if sa != sb {
			return sa > sb
		}
		return rest[a] < rest[b]
	})
	for _, i := range rest[:n-len(own)] {
		dst = append(dst, r.members[i])
	}
	return dst
}

// Load returns how many partitions each member owns as first owner.
func (r *Ring) Load() map[string]int {
	m := make(map[string]int, len(r.members))
	for _, name := range r.members {
		m[name] = 0
	}
	for p := 0; p < r.cfg.Partitions && len(r.members) > 0; p++ {
		m[r.members[r.owners[p*r.depth]]]++
	}
	return m
}

// Hashes: FNV-1a 64 finished with the murmur3 64-bit mixer. Fixed forever:
// every node must compute the same placement.

func hashBytes(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix64(h)
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix64(h)
}

func partitionSeed(p int) uint64 { return mix64(uint64(p)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019) }

func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
