package cluster

import (
	"context"
	"reflect"
	"slices"
	"testing"
)

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied (BindPort aside: 0 keeps its meaning, a free port).
func TestZeroConfigIsDefault(t *testing.T) {
	got, want := (Config{}).withDefaults(), DefaultConfig()
	want.BindPort = 0
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
}

// TestExplicitOff: negative ReconnectInterval, JoinRefreshInterval and
// IndirectChecks are valid and turn those off; a node runs with them.
func TestExplicitOff(t *testing.T) {
	cfg := DefaultLocalConfig("off")
	cfg.ReconnectInterval, cfg.JoinRefreshInterval, cfg.IndirectChecks = -1, -1, -1
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := c.ml.Load().LocalNode().Name; got != "off" {
		t.Fatalf("local node %q", got)
	}
	if c.cfg.ReconnectInterval != -1 || c.cfg.IndirectChecks != -1 {
		t.Fatalf("off values replaced by defaults: %+v", c.cfg)
	}
}

// TestZeroRingConfigIsDefault: each zero RingConfig field takes its
// default, field by field (a partly set config keeps the fields it sets),
// and a ring built from a zero config is the default ring.
func TestZeroRingConfigIsDefault(t *testing.T) {
	if got, want := (RingConfig{}).WithDefaults(), DefaultRingConfig(); got != want {
		t.Fatalf("RingConfig{} with defaults = %+v, want %+v", got, want)
	}
	d := DefaultRingConfig()
	for _, tc := range []struct {
		name      string
		cfg, want RingConfig
	}{
		{"Replicas only", RingConfig{Replicas: 2}, RingConfig{Partitions: d.Partitions, LoadFactor: d.LoadFactor, Replicas: 2}},
		{"Partitions only", RingConfig{Partitions: 64}, RingConfig{Partitions: 64, LoadFactor: d.LoadFactor, Replicas: d.Replicas}},
		{"LoadFactor only", RingConfig{LoadFactor: 1.5}, RingConfig{Partitions: d.Partitions, LoadFactor: 1.5, Replicas: d.Replicas}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			r, err := NewRing([]string{"a", "b", "c"}, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Config(); got != tc.want {
				t.Fatalf("ring config %+v, want %+v", got, tc.want)
			}
		})
	}
	r0, err := NewRing([]string{"a", "b", "c"}, RingConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := NewRing([]string{"a", "b", "c"}, d)
	if err != nil {
		t.Fatal(err)
	}
	for p := range d.Partitions {
		if !slices.Equal(r0.PartitionOwners(p, 0), rd.PartitionOwners(p, 0)) {
			t.Fatalf("partition %d: zero-config ring owners %v, default ring %v", p, r0.PartitionOwners(p, 0), rd.PartitionOwners(p, 0))
		}
	}
}
