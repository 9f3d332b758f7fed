package verbs

import "sort"

// preferNUMA orders device indices for memory on node: devices on that
// node first, then those whose node is unknown (-1: software devices,
// single-node machines), then the others; config order within each group.
// node < 0 keeps config order.
//
//lint:ignore U1000 used by the verbs build (transport.go, regions.go)
func preferNUMA(nodes []int, node int) []int {
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	if node < 0 {
		return order
	}
	rank := func(i int) int {
		switch nodes[i] {
		case node:
			return 0
		case -1:
			return 1
		default:
			return 2
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return rank(order[a]) < rank(order[b]) })
	return order
}
