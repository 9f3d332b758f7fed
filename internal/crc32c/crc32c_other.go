//go:build !amd64

package crc32c

const (
	useKernel = false
	useFold   = false
)

func updatePieces(crc uint32, b []byte) (uint32, []byte) { return crc, b }

func copyPieces(crc uint32, dst, src []byte) (uint32, []byte, []byte) { return crc, dst, src }

func copyFolded(crc uint32, dst, src []byte) (uint32, []byte, []byte) { return crc, dst, src }
