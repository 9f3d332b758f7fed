package cache

import "hash/crc32"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of b, the checksum every tier stores with a
// block and verifies where bytes leave it.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateChecksum extends crc with b, for values checked in pieces.
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }
