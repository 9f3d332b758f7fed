package cluster

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

// TestMembershipNeedsClusterSecret: with Config.Auth, a node holding the
// gossip key but not the cluster secret (another secret, or none) cannot
// join; one holding both can.
func TestMembershipNeedsClusterSecret(t *testing.T) {
	gossip := []byte("0123456789abcdef")
	mk := func(s string) *peerauth.Key {
		k, err := peerauth.NewKey([]byte(s), "")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	secret := mk("the-cluster-secret")
	a := startNode(t, "a", func(c *Config) { c.SecretKey = gossip; c.Auth = secret })
	for _, tc := range []struct {
		name string
		auth *peerauth.Key
	}{{"other-secret", mk("another-secret!!")}, {"no-secret", nil}} {
		refused := a.Stats().RefusedPeers
		b, err := tryStart(t, tc.name, func(c *Config) {
			c.SecretKey, c.Auth, c.JoinRetryInterval = gossip, tc.auth, 50*time.Millisecond
		}, a.Addr())
		if !errors.Is(err, ErrJoin) {
			t.Fatalf("%s: join with the gossip key only: %v, want ErrJoin", tc.name, err)
		}
		if got := LiveNames(a.Members()); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("%s: members of a: %v", tc.name, got)
		}
		if a.Stats().RefusedPeers == refused && b.Stats().RefusedPeers == 0 {
			t.Fatalf("%s: no refusal counted", tc.name)
		}
	}
	c := startNode(t, "c", func(c *Config) { c.SecretKey = gossip; c.Auth = secret }, a.Addr())
	poll.Until(t, 5*time.Second, "c in a's view", func() bool { return liveCount(a) == 2 && liveCount(c) == 2 })
	// Metadata updates stay signed.
	m := c.LocalMeta()
	m.Zone = "z1"
	if err := c.UpdateMeta(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "c's update in a's view", func() bool {
		mm, ok := a.Member("c")
		return ok && mm.Meta.Zone == "z1"
	})
}
