//go:build !verbs

package verbs

import (
	"errors"
	"testing"
)

// TestNotBuilt: without -tags verbs, New says so, and the caller falls back
// to TCP.
func TestNotBuilt(t *testing.T) {
	if _, err := New(DefaultConfig(), nil); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("New: %v, want ErrNotBuilt", err)
	}
	if _, err := Probe(DefaultConfig()); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Probe: %v, want ErrNotBuilt", err)
	}
	if Built {
		t.Fatal("Built set without the tag")
	}
}
