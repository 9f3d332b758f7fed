package auto

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/rdma/tcp"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied, but for verbs' fields whose zero is a value
// (GIDIndex, QPTimeout, QPRetry: see verbs.Config).
func TestZeroConfigIsDefault(t *testing.T) {
	want := DefaultConfig()
	want.Verbs.GIDIndex, want.Verbs.QPTimeout, want.Verbs.QPRetry = 0, 0, 0
	if got := (Config{}).withDefaults(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
	if got := DefaultConfig().withDefaults(); !reflect.DeepEqual(got, DefaultConfig()) {
		t.Fatalf("DefaultConfig with defaults changed: %+v", got)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("Config{}.Validate() = %v", err)
	}
	if d := DefaultConfig(); d.RetryAfter != 30*time.Second || d.Mode != ModeAuto {
		t.Fatalf("DefaultConfig() = %+v, want RetryAfter 30s and mode auto", d)
	}
}

// TestConfigValues: explicit values are kept; a negative RetryAfter, an
// unknown mode and a bad sub-config are errors (the verbs one only where
// verbs is used).
func TestConfigValues(t *testing.T) {
	c := Config{Mode: ModeTCP, RetryAfter: time.Second}
	if got := c.withDefaults(); got.RetryAfter != time.Second || got.Mode != ModeTCP {
		t.Fatalf("withDefaults changed explicit values: %+v", got)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"RetryAfter", Config{RetryAfter: -time.Second}, "RetryAfter -1s"},
		{"mode", Config{Mode: "infiniband"}, "infiniband"},
		{"tcp", Config{TCP: tcp.Config{ChunkSize: -1}}, "ChunkSize -1"},
		{"verbs", Config{Verbs: verbs.Config{GIDIndex: -2}}, "GIDIndex -2"},
		{"verbs unused in tcp mode", Config{Mode: ModeTCP, Verbs: verbs.Config{GIDIndex: -2}}, ""},
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
	if err := (Config{Mode: "infiniband"}).Validate(); !errors.Is(err, ErrMode) {
		t.Fatalf("unknown mode: %v, want ErrMode", err)
	}
}

// TestNewRefusesNegativeRetryAfter: New reports a negative RetryAfter (it
// used to become the 30 s default silently).
func TestNewRefusesNegativeRetryAfter(t *testing.T) {
	cfg := config(t, ModeTCP)
	cfg.RetryAfter = -time.Second
	if tr, err := New(cfg, nil); err == nil {
		_ = tr.Close()
		t.Fatal("New with RetryAfter -1s succeeded")
	} else if !strings.Contains(err.Error(), "RetryAfter") {
		t.Fatalf("New: %v, want a RetryAfter error", err)
	}
}
