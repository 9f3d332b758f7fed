package client

import (
	"strings"
	"testing"
	"time"
)

// TestZeroConfigIsDefault: a zero Config (with its socket) is
// DefaultConfig once the defaults are applied.
func TestZeroConfigIsDefault(t *testing.T) {
	const sock = "/run/tidepool/tidepool.sock"
	if got, want := (Config{Socket: sock}).withDefaults(), DefaultConfig(sock); got != want {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
	c := Config{Socket: sock, Timeout: time.Second, ConnectTimeout: time.Millisecond, MaxIdleConns: 1, MaxResponseBytes: 4096, ZeroCopyInFlight: 3, ReserveAhead: Off}
	if got := c.withDefaults(); got != c {
		t.Fatalf("withDefaults changed explicit values: %+v", got)
	}
}

// TestNewWithConfigRefusesNegative: a negative field is a clear error from
// NewWithConfig (it used to become the default silently); zero and
// positive values make a client.
func TestNewWithConfigRefusesNegative(t *testing.T) {
	const sock = "/nonexistent/tidepool.sock" // the client connects lazily
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"zero", Config{Socket: sock}, ""},
		{"explicit", Config{Socket: sock, Timeout: time.Second, MaxIdleConns: 2}, ""},
		{"relative socket", Config{Socket: "tidepool.sock"}, `socket path "tidepool.sock" must be absolute`},
		{"Timeout", Config{Socket: sock, Timeout: -time.Second}, "Timeout -1s"},
		{"ConnectTimeout", Config{Socket: sock, ConnectTimeout: -time.Second}, "ConnectTimeout -1s"},
		{"MaxIdleConns", Config{Socket: sock, MaxIdleConns: -1}, "MaxIdleConns -1"},
		{"MaxResponseBytes", Config{Socket: sock, MaxResponseBytes: -1}, "MaxResponseBytes -1"},
		{"ZeroCopyInFlight", Config{Socket: sock, ZeroCopyInFlight: -1}, "ZeroCopyInFlight -1"},
		{"ReserveAhead off", Config{Socket: sock, ReserveAhead: Off}, ""},
		{"ReserveAhead", Config{Socket: sock, ReserveAhead: -2}, "ReserveAhead -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewWithConfig(tc.cfg)
			if err == nil {
				_ = c.Close()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("NewWithConfig() = %v, want a client", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("NewWithConfig() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
