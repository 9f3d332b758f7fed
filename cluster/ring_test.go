package cluster

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func names(n int) []string {
	ms := make([]string, n)
	for i := range ms {
		ms[i] = fmt.Sprintf("tidepool-%d.tidepool.default.svc", i)
	}
	return ms
}

func keys(n int, seed uint64) [][]byte {
	r := rand.New(rand.NewPCG(seed, 1))
	ks := make([][]byte, n)
	for i := range ks {
		k := make([]byte, 32)
		for j := 0; j < 32; j += 8 {
			binary.LittleEndian.PutUint64(k[j:], r.Uint64())
		}
		ks[i] = k
	}
	return ks
}

func mustRing(t testing.TB, ms []string, cfg RingConfig) *Ring {
	t.Helper()
	r, err := NewRing(ms, cfg)
	if err != nil {
		t.Fatalf("NewRing: %v", err)
	}
	return r
}

func TestRingConfigValidate(t *testing.T) {
	if err := DefaultRingConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	// Negative, not zero: a zero field is its default (TestZeroRingConfigIsDefault).
	err := RingConfig{Partitions: -1, LoadFactor: 0.5, Replicas: -1}.Validate()
	for _, w := range []string{"Partitions", "LoadFactor", "Replicas"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, want a problem with %s", err, w)
		}
	}
}

func TestRingBasics(t *testing.T) {
	empty := mustRing(t, nil, DefaultRingConfig())
	if o := empty.Owners([]byte("k"), 3); len(o) != 0 || empty.Owner([]byte("k")) != "" {
		t.Fatalf("empty ring owners %v", o)
	}
	if _, err := NewRing([]string{"a", ""}, DefaultRingConfig()); err == nil {
		t.Fatal("empty member name accepted")
	}
	cfg := DefaultRingConfig()
	cfg.Replicas = 2
	a := mustRing(t, []string{"c", "a", "b", "a"}, cfg)
	b := mustRing(t, []string{"b", "c", "a"}, cfg)
	if !slices.Equal(a.Members(), []string{"a", "b", "c"}) {
		t.Fatalf("members %v", a.Members())
	}
	for _, k := range keys(1000, 1) {
		oa, ob := a.Owners(k, 0), b.Owners(k, 0)
		if !slices.Equal(oa, ob) {
			t.Fatalf("placement depends on input order: %v vs %v", oa, ob)
		}
		if len(oa) != 2 || oa[0] == oa[1] || oa[0] != a.Owner(k) {
			t.Fatalf("owners %v (owner %s)", oa, a.Owner(k))
		}
		all := a.Owners(k, 10)
		if len(all) != 3 || !slices.Equal(all[:2], oa) {
			t.Fatalf("Owners(k, 10) = %v, want the 2 owners then the third member", all)
		}
		s := slices.Clone(all)
		slices.Sort(s)
		if !slices.Equal(s, []string{"a", "b", "c"}) {
			t.Fatalf("Owners(k, 10) = %v: not distinct members", all)
		}
	}
}

// Golden placement: hashing is part of the wire contract (every node must
// agree), so a change here must be deliberate.
func TestRingGolden(t *testing.T) {
	r := mustRing(t, names(5), DefaultRingConfig())
	got := fmt.Sprint(r.Partition([]byte("block-0")), r.Owners([]byte("block-0"), 3), r.Partition(nil))
	const want = "4711 [tidepool-2.tidepool.default.svc tidepool-4.tidepool.default.svc tidepool-1.tidepool.default.svc] 7674"
	if got != want {
		t.Fatalf("placement changed:\n got %s\nwant %s", got, want)
	}
}

func ownersOf(r *Ring, ks [][]byte) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = r.Owner(k)
	}
	return out
}

func moved(a, b []string) float64 {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return float64(n) / float64(len(a))
}

func TestRingMovement(t *testing.T) {
	ks := keys(100_000, 2)
	for _, n := range []int{3, 5, 10, 25, 64, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ms := names(n)
			base := ownersOf(mustRing(t, ms, DefaultRingConfig()), ks)
			// Join: N -> N+1; ideally 1/(N+1) of the keys move, all to the newcomer.
			joined := append(slices.Clone(ms), "newcomer")
			after := ownersOf(mustRing(t, joined, DefaultRingConfig()), ks)
			fj := moved(base, after)
			// Leave: N -> N-1; ideally the leaver's 1/N move, nothing else.
			leaver := ms[n/2]
			left := slices.Delete(slices.Clone(ms), n/2, n/2+1)
			afterLeave := ownersOf(mustRing(t, left, DefaultRingConfig()), ks)
			fl := moved(base, afterLeave)
			t.Logf("N=%d join moved %.4f (ideal %.4f), leave moved %.4f (ideal %.4f)", n, fj, 1/float64(n+1), fl, 1/float64(n))
			if limit := 1.5/float64(n) + 0.01; fj > limit || fl > limit {
				t.Errorf("moved join %.4f leave %.4f, want <= %.4f", fj, fl, limit)
			}
			// Keys of the leaver must all move; keys of others mostly stay.
			for i := range base {
				if base[i] == leaver && afterLeave[i] == leaver {
					t.Fatalf("a key stayed on the leaver")
				}
			}
		})
	}
}

func TestRingLoadBound(t *testing.T) {
	ks := keys(200_000, 3)
	for _, n := range []int{3, 4, 5, 7, 10, 16, 25, 50, 64, 100} {
		for _, replicas := range []int{1, 2} {
			t.Run(fmt.Sprintf("n=%d/r=%d", n, replicas), func(t *testing.T) {
				cfg := DefaultRingConfig()
				cfg.Replicas = replicas
				r := mustRing(t, names(n), cfg)
				load := map[string]int{}
				for _, k := range ks {
					for _, o := range r.Owners(k, replicas) {
						load[o]++
					}
				}
				mean := float64(len(ks)*min(replicas, n)) / float64(n)
				most := 0
				for _, l := range load {
					most = max(most, l)
				}
				ratio := float64(most) / mean
				t.Logf("N=%d R=%d max/mean %.3f", n, replicas, ratio)
				if len(load) != n {
					t.Errorf("%d of %d members own keys", len(load), n)
				}
				if ratio > 1.25 {
					t.Errorf("most loaded member holds %.3f x the mean, want <= 1.25", ratio)
				}
			})
		}
	}
}

func BenchmarkRingOwner(b *testing.B) {
	r := mustRing(b, names(64), DefaultRingConfig())
	ks := keys(1024, 4)
	var dst []string
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = r.AppendOwners(dst[:0], ks[i&1023], 1)
	}
}

// BenchmarkNewRing: a ring rebuild at fleet sizes up to 5,000 members
// (docs/scale.md). One rebuild scores every member for every partition.
func BenchmarkNewRing(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 5000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ms := names(n)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				mustRing(b, ms, DefaultRingConfig())
			}
		})
	}
}
