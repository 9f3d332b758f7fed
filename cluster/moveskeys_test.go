package cluster_test

import (
	"testing"

	"github.com/tidepool-kv/tidepool/cluster"
)

func TestEventMovesKeys(t *testing.T) {
	tests := []struct {
		kind  cluster.EventKind
		state cluster.State
		want  bool
	}{
		{cluster.EventJoin, cluster.StateAlive, true},
		{cluster.EventLeft, cluster.StateLeft, true},
		{cluster.EventFailed, cluster.StateFailed, true},
		{cluster.EventUpdate, cluster.StateLeaving, true},
		{cluster.EventUpdate, cluster.StateAlive, false}, // metadata only
		{cluster.EventUpdate, cluster.StateSuspect, false},
	}
	for _, tc := range tests {
		ev := cluster.Event{Kind: tc.kind, Member: cluster.Member{State: tc.state}}
		if got := ev.MovesKeys(); got != tc.want {
			t.Errorf("%v of a %v member: moves keys %v, want %v", tc.kind, tc.state, got, tc.want)
		}
	}
}
