// Package porttest picks loopback ports for tests that start real
// processes listening on them.
package porttest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// given holds the ports Free handed out in this process: each port is
// closed again once checked, so without it two calls (the gossip and the
// peer address of one test node) could draw the same one, and the second
// process told to use it fails with "address already in use" (a CI run's
// TestHungOwnerFailsFast).
var given struct {
	sync.Mutex
	ports map[int]bool
}

// Free returns a loopback port that was free a moment ago for both TCP and
// UDP (memberlist gossips over both), drawn below the kernel's ephemeral
// range. A port from that range (what a listen on port 0 hands out) can be
// taken by any outgoing connection between this check and the bind of the
// process told to use it; that failed a CI run with "address already in
// use". A port is handed out once per process.
func Free(t testing.TB) int {
	t.Helper()
	lo := ephemeralStart()
	base := max(1024, lo-16384)
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	for range 200 {
		p := base + rand.IntN(lo-base)
		if given.ports[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
		ln.Close()
		if err != nil {
			continue
		}
		pc.Close()
		given.ports[p] = true
		return p
	}
	t.Fatalf("porttest: no free loopback port in [%d, %d)", base, lo)
	return 0
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (Linux's default where /proc does not say).
func ephemeralStart() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 2048 {
				return v
			}
		}
	}
	return 32768
}
