package engineapi

import "github.com/cloudwego/gopkg/protocol/thrift"

// The Thrift decoder copies every binary field twice by default
// ([]byte(string(b)): a CPU profile of a 1 MiB Put or Get showed the two
// copies as 23% of all CPU). The span allocator copies once, without
// zeroing; values above 128 KiB get their own allocation, smaller ones
// (keys) share 1 MiB spans, which the sidecar does not retain: the tiers
// copy keys and values into their own memory.
func init() { thrift.SetSpanCache(true) }
