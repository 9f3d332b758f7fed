package proxy

import (
	"reflect"
	"testing"

	"github.com/tidepool-kv/tidepool/internal/clock"
)

// TestZeroConfigIsDefault: a zero Config and a zero RouteConfig are their
// DefaultConfig once the defaults are applied: zero means "the default"
// for every field.
func TestZeroConfigIsDefault(t *testing.T) {
	if got, want := (Config{}).withDefaults(), DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("Config{}.Validate: %v", err)
	}
	got, want := RouteConfig{}.withDefaults(), DefaultRouteConfig()
	// The two the defaults fill beyond DefaultRouteConfig: the derived
	// HotMaxBytes and the real clock.
	want.HotMaxBytes, want.Clock = got.HotMaxBytes, clock.Real{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RouteConfig{} with defaults\n got %+v\nwant %+v", got, want)
	}
}

// TestRouteOff: Off turns the rebalancer and hot replication off and
// lifts the rebalance bound; zero turns them on with their defaults.
func TestRouteOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  RouteConfig
		on   bool
	}{
		{"zero takes the defaults", RouteConfig{}, true},
		{"off", RouteConfig{RebalanceRate: Off, RebalanceMaxBytes: Off, HotThreshold: Off}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRouteProxy(t) // routing needs arenas: fetched blocks land there
			if err := p.AttachCluster(&fakeCluster{self: "a", nodes: []string{"a"}}, &fakePeers{self: "a", nodes: map[string]*Proxy{"a": p}}, tc.cfg); err != nil {
				t.Fatal(err)
			}
			defer p.DetachCluster(0)
			r := p.router()
			c := r.cfg
			if on := c.RebalanceRate > 0 && c.RebalanceMaxBytes > 0 && c.HotThreshold > 0; on != tc.on {
				t.Fatalf("rebalance rate %d, bound %d, hot threshold %d: on %v, want %v",
					c.RebalanceRate, c.RebalanceMaxBytes, c.HotThreshold, on, tc.on)
			}
			if !tc.on && (r.hot != nil || r.rebal != nil) {
				t.Fatalf("off, yet hot replication %v, rebalancer %v", r.hot != nil, r.rebal != nil)
			}
		})
	}
}
