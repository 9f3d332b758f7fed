//go:build !(linux && amd64)

package pkey

import "fmt"

// Alloc reports ErrUnsupported: protection keys are used on linux/amd64 only.
func Alloc() (Key, error) { return 0, fmt.Errorf("%w on this platform", ErrUnsupported) }

// Protect is not reached without a key.
func (k Key) Protect(mem []byte, prot int) error { return ErrUnsupported }

// Free is not reached without a key.
func (k Key) Free() error { return ErrUnsupported }

func rdpkru() uint32 { return 0 }
func wrpkru(uint32)  {}
