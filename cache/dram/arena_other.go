//go:build !linux

package dram

import (
	"errors"
	"os"
)

// The DRAM tier needs Linux (fallocate, MAP_SHARED tmpfs arenas); elsewhere
// New fails with errUnsupported so that the rest of tidepool still builds.
var errUnsupported = errors.New("dram: arenas need Linux")

type arena struct {
	path string
	mem  []byte
}

func prepareDir(dir string) error { return os.MkdirAll(dir, 0o700) }

func checkFree(string, int64) error { return nil }

func openArena(string, int64, bool) (*arena, error) { return nil, errUnsupported }

func (a *arena) close() error { return nil }

type slotIndex struct{ path string }

func openSlotIndex(string, int64, int64) (*slotIndex, error) { return nil, errUnsupported }

func (s *slotIndex) add(*block)    {}
func (s *slotIndex) remove(*block) {}
func (s *slotIndex) close() error  { return nil }

// SlotIndexStats is a snapshot of the slot index's counters.
type SlotIndexStats struct{ Capacity, Entries, Unindexed int64 }

// SlotIndexStats returns zeros: no slot index off Linux.
func (t *Tier) SlotIndexStats() SlotIndexStats { return SlotIndexStats{} }
