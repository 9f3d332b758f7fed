package main

import (
	"context"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cluster"
)

// -dilate multiplies every memberlist timer and nothing else.
func TestDilateConfig(t *testing.T) {
	c := cluster.DefaultConfig()
	d := c
	dilateConfig(&d, 3)
	for _, p := range []struct {
		name      string
		got, base time.Duration
	}{
		{"probe interval", d.ProbeInterval, c.ProbeInterval}, {"probe timeout", d.ProbeTimeout, c.ProbeTimeout},
		{"gossip interval", d.GossipInterval, c.GossipInterval}, {"push/pull interval", d.PushPullInterval, c.PushPullInterval},
		{"TCP timeout", d.TCPTimeout, c.TCPTimeout},
	} {
		if p.got != 3*p.base {
			t.Errorf("%s: %v, want 3 × %v", p.name, p.got, p.base)
		}
	}
	if d.SuspicionMult != c.SuspicionMult || d.SuspicionMaxTimeoutMult != c.SuspicionMaxTimeoutMult || d.GossipNodes != c.GossipNodes {
		t.Errorf("dilation changed a multiplier: %+v", d)
	}
	same := c
	dilateConfig(&same, 1)
	if same.ProbeInterval != c.ProbeInterval || same.TCPTimeout != c.TCPTimeout {
		t.Errorf("-dilate 1 changed the timings")
	}
}

// The fleet scenarios end to end on a small fleet of real members (real
// memberlist over loopback, the tests' timings): a cold start, a join,
// the gossip window and a kill.
func TestSmallFleet(t *testing.T) {
	o := options{nodes: 6, parallel: 2, kills: 1, window: time.Second, roll: 0.1, prof: profLocal}
	want := map[string]bool{"converge": true, "gossip": true, "detect": true}
	if err := runFleet(context.Background(), o, want, &reporter{}); err != nil {
		t.Fatal(err)
	}
}
