package cache

import "github.com/tidepool-kv/tidepool/internal/crc32c"

// Checksum returns the CRC-32C of b, the checksum every tier stores with a
// block and verifies where bytes leave it. It is internal/crc32c's, which
// reads a buffer that is not in cache 2–3× faster than hash/crc32 (a
// committed slot, a block being scrubbed).
func Checksum(b []byte) uint32 { return crc32c.Checksum(b) }

// UpdateChecksum extends crc with b, for values checked in pieces.
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32c.Update(crc, b) }
