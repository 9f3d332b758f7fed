package cache

import (
	"errors"
	"fmt"
)

// Defaults and hard bounds of Limits: the one place each is written. The
// proxy, the tiers and `tidepool serve` take them from here.
const (
	DefaultMaxKeyBytes       = 128
	DefaultMaxValueBytes     = 64 << 20
	DefaultMaxNamespaceBytes = 256
	DefaultMaxBatch          = 1024

	// MaxKeyBytesBound is the largest MaxKeyBytes accepted.
	MaxKeyBytesBound = 4096
	// MaxValueBytesBound is the largest MaxValueBytes accepted (2 GiB).
	MaxValueBytesBound = 2 << 30
	// MaxBatchBound is the largest MaxBatch accepted: the longest list the
	// Thrift decoders accept, so a batch the limit allows is never refused
	// by the codec first.
	MaxBatchBound = 1 << 20
)

// Limits bounds what one request may carry. They are checked at the edge,
// by the proxy, before anything is allocated or stored; `tidepool serve`
// builds them once from its configuration (max_key_size, max_value_size,
// max_batch) and hands the same values to the tiers, which keep the key and
// value bounds as invariants of their own.
//
// A zero field is not a valid limit in itself: a Config that embeds Limits
// reads zero as "the default" and fills it with WithDefaults before
// validating, as every config of tidepool does.
type Limits struct {
	// MaxKeyBytes is the longest block key accepted, in [1, 4096].
	// Default 128.
	MaxKeyBytes int
	// MaxValueBytes is the largest block value accepted, in [1, 2 GiB].
	// Default 64 MiB.
	MaxValueBytes int64
	// MaxNamespaceBytes is the longest namespace name accepted; positive.
	// Default 256.
	MaxNamespaceBytes int
	// MaxBatch is the most items in one batch call (and keys in one
	// Lookup), in [1, 1048576]. Default 1024.
	MaxBatch int
}

// DefaultLimits returns the defaults documented on Limits.
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:       DefaultMaxKeyBytes,
		MaxValueBytes:     DefaultMaxValueBytes,
		MaxNamespaceBytes: DefaultMaxNamespaceBytes,
		MaxBatch:          DefaultMaxBatch,
	}
}

// WithDefaults returns l with every zero field set to its default: the
// one place a zero limit becomes the default.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.MaxKeyBytes == 0 {
		l.MaxKeyBytes = d.MaxKeyBytes
	}
	if l.MaxValueBytes == 0 {
		l.MaxValueBytes = d.MaxValueBytes
	}
	if l.MaxNamespaceBytes == 0 {
		l.MaxNamespaceBytes = d.MaxNamespaceBytes
	}
	if l.MaxBatch == 0 {
		l.MaxBatch = d.MaxBatch
	}
	return l
}

// Validate reports every limit out of its range at once (as given: a zero
// field is out of range; call WithDefaults first to read zero as the
// default).
func (l Limits) Validate() error {
	var errs []error
	if l.MaxKeyBytes < 1 || l.MaxKeyBytes > MaxKeyBytesBound {
		errs = append(errs, fmt.Errorf("max key bytes %d: must be in [1, %d]", l.MaxKeyBytes, MaxKeyBytesBound))
	}
	if l.MaxValueBytes < 1 || l.MaxValueBytes > MaxValueBytesBound {
		errs = append(errs, fmt.Errorf("max value bytes %d: must be in [1, 2GiB]", l.MaxValueBytes))
	}
	if l.MaxNamespaceBytes < 1 {
		errs = append(errs, fmt.Errorf("max namespace bytes %d: must be positive", l.MaxNamespaceBytes))
	}
	if l.MaxBatch < 1 || l.MaxBatch > MaxBatchBound {
		errs = append(errs, fmt.Errorf("max batch %d: must be in [1, %d]", l.MaxBatch, MaxBatchBound))
	}
	return errors.Join(errs...)
}
