package verbs

import (
	"slices"
	"testing"
)

// TestPreferNUMA: devices on the memory's NUMA node come first, then
// unknown nodes, then the others, config order kept within each group.
func TestPreferNUMA(t *testing.T) {
	for _, c := range []struct {
		nodes []int
		node  int
		want  []int
	}{
		{[]int{0, 1}, 1, []int{1, 0}},
		{[]int{0, 1}, 0, []int{0, 1}},
		{[]int{1, 0, 1, 0}, 0, []int{1, 3, 0, 2}},
		{[]int{1, -1, 0}, 0, []int{2, 1, 0}},
		{[]int{-1, -1}, 0, []int{0, 1}},
		{[]int{1, 0}, -1, []int{0, 1}},
		{nil, 0, []int{}},
	} {
		if got := preferNUMA(c.nodes, c.node); !slices.Equal(got, c.want) {
			t.Errorf("preferNUMA(%v, %d) = %v, want %v", c.nodes, c.node, got, c.want)
		}
	}
}
