//go:build !(linux && amd64)

package ssd

import "github.com/tidepool-kv/tidepool/cache"

// Elsewhere librocksdb keeps its own CRC-32C (see crc32c_amd64.go).

func rocksCRC() string { return "librocksdb" }

func rocksCRCCalls() uint64 { return 0 }

func rocksCRCExtend(crc uint32, p []byte) uint32 {
	return cache.UpdateChecksum(crc, p)
}
