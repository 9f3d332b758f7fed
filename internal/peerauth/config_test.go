package peerauth

import (
	"strings"
	"testing"
	"time"
)

// TestZeroConfigIsDefault: a zero ListenerConfig is DefaultListenerConfig
// once the defaults are applied, and that default IdleTimeout
// (NoIdleTimeout) caps no read deadline, as a zero one always did.
func TestZeroConfigIsDefault(t *testing.T) {
	got, want := (ListenerConfig{}).withDefaults(), DefaultListenerConfig()
	if got != want {
		t.Fatalf("ListenerConfig{} with defaults\n got %+v\nwant %+v", got, want)
	}
	if want.IdleTimeout != NoIdleTimeout || NoIdleTimeout >= 0 {
		t.Fatalf("default IdleTimeout %v, want NoIdleTimeout (negative)", want.IdleTimeout)
	}
	if err := (ListenerConfig{}).Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	far := time.Now().Add(time.Hour)
	c := &Conn{idle: got.IdleTimeout}
	if d := c.capped(time.Time{}); !d.IsZero() {
		t.Fatalf("no-cap conn: no deadline became %v", d)
	}
	if d := c.capped(far); !d.Equal(far) {
		t.Fatalf("no-cap conn: deadline %v became %v", far, d)
	}
	c = &Conn{idle: time.Minute}
	if d := c.capped(far); !d.Before(far) {
		t.Fatalf("1 min cap: deadline %v kept", d)
	}
}

// TestListenerConfigValues: explicit values are kept; a negative MaxConns
// or HandshakeTimeout is an error (it used to become the default); a
// negative IdleTimeout is valid (no cap).
func TestListenerConfigValues(t *testing.T) {
	c := ListenerConfig{MaxConns: 2, MaxHandshakes: 3, MaxHandshakesPerSource: 1, HandshakeTimeout: time.Second, IdleTimeout: time.Minute}
	if got := c.withDefaults(); got != c {
		t.Fatalf("withDefaults changed explicit values: %+v", got)
	}
	for _, tc := range []struct {
		name string
		cfg  ListenerConfig
		want string // "" = valid
	}{
		{"no idle cap", ListenerConfig{IdleTimeout: NoIdleTimeout}, ""},
		{"MaxConns", ListenerConfig{MaxConns: -1}, "MaxConns -1"},
		{"HandshakeTimeout", ListenerConfig{HandshakeTimeout: -time.Second}, "HandshakeTimeout -1s"},
		{"MaxHandshakes", ListenerConfig{MaxHandshakes: -1}, "MaxHandshakes -1"},
		{"MaxHandshakesPerSource", ListenerConfig{MaxHandshakesPerSource: -1}, "MaxHandshakesPerSource -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
