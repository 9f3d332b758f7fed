package client

import "github.com/cloudwego/gopkg/protocol/thrift"

// Decode binary fields with one copy instead of two (see
// proxy/engineapi/codec.go). Small fields (keys) share 1 MiB spans: a caller
// that keeps many small results alive for long keeps their spans alive.
func init() { thrift.SetSpanCache(true) }
