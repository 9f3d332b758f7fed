package verbs

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied, but for the fields whose zero is a value of its
// own (GIDIndex 0 is GID index 0; QPTimeout 0 and QPRetry 0 are valid RC
// parameters), which keep it.
func TestZeroConfigIsDefault(t *testing.T) {
	want := DefaultConfig()
	want.GIDIndex, want.QPTimeout, want.QPRetry = 0, 0, 0
	if got := (Config{}).withDefaults(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("Config{}.Validate() = %v", err)
	}
	if got := DefaultConfig().withDefaults(); !reflect.DeepEqual(got, DefaultConfig()) {
		t.Fatalf("DefaultConfig with defaults changed: %+v", got)
	}
}

// TestConfigExplicitValues: explicit values survive withDefaults, and the
// zero-valued exceptions stay zero.
func TestConfigExplicitValues(t *testing.T) {
	c := Config{Port: 2, GIDIndex: 3, ListenAddr: "127.0.0.1:0", MaxQPsPerPeer: 1, MaxQPsServed: 2,
		QueueDepth: 4, SliceSize: 4096, MaxTransfer: 1 << 20, DialTimeout: time.Second,
		IOTimeout: 2 * time.Second, QPTimeout: 0, QPRetry: 0, StatsInterval: time.Millisecond}
	if got := c.withDefaults(); !reflect.DeepEqual(got, c) {
		t.Fatalf("withDefaults changed explicit values:\n got %+v\nwant %+v", got, c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
}

// TestConfigNegativeIsError: a negative value is an error, never silently
// the default; GIDIndex -1 (auto) is the one negative allowed.
func TestConfigNegativeIsError(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"GIDIndex auto", func(c *Config) { c.GIDIndex = -1 }, ""},
		{"GIDIndex", func(c *Config) { c.GIDIndex = -2 }, "GIDIndex -2"},
		{"Port", func(c *Config) { c.Port = -1 }, "Port -1"},
		{"MaxQPsPerPeer", func(c *Config) { c.MaxQPsPerPeer = -1 }, "MaxQPsPerPeer -1"},
		{"MaxQPsServed", func(c *Config) { c.MaxQPsServed = -1 }, "MaxQPsServed -1"},
		{"QueueDepth", func(c *Config) { c.QueueDepth = -1 }, "QueueDepth -1"},
		{"SliceSize", func(c *Config) { c.SliceSize = -1 }, "SliceSize -1"},
		{"DialTimeout", func(c *Config) { c.DialTimeout = -time.Second }, "DialTimeout -1s"},
		{"IOTimeout", func(c *Config) { c.IOTimeout = -time.Second }, "IOTimeout -1s"},
		{"StatsInterval", func(c *Config) { c.StatsInterval = -time.Second }, "StatsInterval -1s"},
		{"QPTimeout", func(c *Config) { c.QPTimeout = -1 }, "QPTimeout -1"},
		{"QPRetry", func(c *Config) { c.QPRetry = -1 }, "QPRetry -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{}
			tc.mod(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
