package porttest

import (
	"fmt"
	"net"
	"testing"
)

func TestFreeIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	lo := ephemeralStart()
	for range 20 {
		p := Free(t)
		if p < 1024 || p >= lo {
			t.Fatalf("port %d outside [1024, %d)", p, lo)
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		ln.Close()
	}
}

func TestFreeNeverHandsOutAPortTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		p := Free(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
