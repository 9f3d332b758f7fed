package tcp

// TCP congestion control of the transfer connections (Config.Congestion).
//
// A transfer is a burst: a named read answers 1 MiB or more at once on a
// connection that was idle a moment before. BBR, the default of some hosts
// (net.ipv4.tcp_congestion_control), paces every burst at the bandwidth it
// estimated from the earlier, themselves paced, bursts; without the fq
// qdisc the pacing runs on per-connection timers, sends from softirq
// context on whichever CPU the timer fires, reorders segments and sets off
// spurious retransmits. Measured on one host, loopback, one caller reading
// 1 MiB blocks from another sidecar: 2,284–2,799 MiB/s with BBR against
// 2,798–3,473 with cubic and 3,103–3,672 with reno (docs/PERFORMANCE.md,
// run 16). Loss-based algorithms send a burst as fast as the window
// allows, which is what a block transfer inside a cluster wants.

import (
	"fmt"
	"regexp"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// SystemCongestion in Config.Congestion keeps the system's default for the
// connections (and stops the list there).
const SystemCongestion = "system"

// congestionName is what the kernel takes as an algorithm's name
// (TCP_CA_NAME_MAX is 16 bytes with its NUL).
var congestionName = regexp.MustCompile(`^[a-z0-9_]{1,15}$`)

// CheckCongestion reports the first entry of names that cannot be an
// algorithm's name or SystemCongestion.
func CheckCongestion(names []string) error {
	for _, n := range names {
		if n != SystemCongestion && !congestionName.MatchString(n) {
			return fmt.Errorf("%q: want an algorithm's name (lower case letters, digits and _, at most 15 bytes) or %q", n, SystemCongestion)
		}
	}
	return nil
}

// setCongestion gives a socket the first algorithm of the configured list
// the kernel accepts, remembering which names it refused so that later
// sockets do not ask again: each dialed connection, before its handshake,
// and the listener, whose accepted connections inherit what was set on it
// (so an encrypting wrapper does not hide them). Anything that is not a
// socket (a test's pipe) is left alone. When the kernel refuses every name
// the socket keeps the system's default; that is logged once.
func (t *Transport) setCongestion(s any) {
	sc, ok := s.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	names := t.cfg.Congestion
	for {
		i := int(t.ccNext.Load())
		if i >= len(names) || names[i] == SystemCongestion {
			if i >= len(names) && t.ccWarned.CompareAndSwap(false, true) {
				t.lg.Warn("the kernel accepts none of the TCP congestion controls configured for transfer connections: "+
					"they keep the system's default (net.ipv4.tcp_congestion_control); "+
					"reno is accepted by every kernel, system keeps the default without this warning",
					zap.Strings("transfer_tcp_congestion", names))
			}
			return
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, names[i])
		}); err != nil {
			return // the socket is closed already
		}
		if serr == nil {
			if t.ccLogged.CompareAndSwap(false, true) {
				t.lg.Info("transfer connections use TCP congestion control "+names[i], zap.String("congestion", names[i]))
			}
			return
		}
		// Not built, or not allowed to this process
		// (net.ipv4.tcp_allowed_congestion_control, CAP_NET_ADMIN): the
		// next name, for this connection and every later one.
		if t.ccNext.CompareAndSwap(int32(i), int32(i+1)) {
			t.lg.Info("the kernel refused a TCP congestion control for transfer connections; trying the next",
				zap.String("congestion", names[i]), zap.Error(serr))
		}
	}
}

// CongestionOf reports the TCP congestion control of a socket (a
// connection or a listener).
func CongestionOf(s syscall.Conn) (string, error) {
	rc, err := s.SyscallConn()
	if err != nil {
		return "", err
	}
	var name string
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		name, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil {
		return "", err
	}
	return name, gerr
}
