package cluster

import (
	"context"
	"reflect"
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
