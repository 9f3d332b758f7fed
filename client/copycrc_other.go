//go:build !amd64

package client

// copyCRC copies src to dst (len(dst) ≥ len(src)) and returns the CRC-32C
// of the bytes.
func copyCRC(dst, src []byte) uint32 { return copyCRCChunked(0, dst[:len(src)], src) }
