// tidepool engine API: what an inference engine calls on its own sidecar over
// the Unix socket. Any standard Thrift client (binary protocol, buffered or
// framed transport) generated from this file can call it; Kitex clients may
// also use TTHeader.
//
// Conventions:
//   - Request-level failures (bad namespace, key too long, batch too large,
//     no space, ...) are raised as TidepoolError with a code.
//   - Per-item outcomes in batch calls are carried in the result list, in the
//     same order as the request, with a code per item.
//   - A miss is not an error: Get answers found=false, BatchGet NOT_FOUND.

namespace go tidepool
namespace py tidepool

// ErrorCode is the one error enum of the API. docs/errors.md describes each.
enum ErrorCode {
    OK = 0,
    NOT_FOUND = 1,
    EXISTS = 2,
    TOO_LARGE = 3,
    INVALID_ARGUMENT = 4,
    NO_SPACE = 5,
    LEASE_EXPIRED = 6,
    CHECKSUM_MISMATCH = 7,
    UNAVAILABLE = 8,
    INTERNAL = 9,
    UNKNOWN_NAMESPACE = 10,
    BATCH_TOO_LARGE = 11,
    VERSION_MISMATCH = 12,
}

exception TidepoolError {
    1: ErrorCode code,
    2: string message,
}

struct Limits {
    1: i32 max_key_bytes,
    2: i64 max_value_bytes,
    3: i32 max_batch,
    4: i32 max_namespace_bytes,
}

struct TierInfo {
    1: string name,
    2: i64 capacity_bytes,
    3: i64 used_bytes,
    4: i64 blocks,
}

struct HelloRequest {
    1: i32 client_version,
    2: string client_name,
}

struct HelloResponse {
    1: i32 server_version,
    2: string build,
    3: Limits limits,
    4: list<TierInfo> tiers,
    5: string node_id,
}

struct PutRequest {
    1: string ns,
    2: binary key,
    3: binary value,
    // Position of the block in its prefix chain (0 = first block). Eviction
    // prefers deeper blocks: a chain without its head is useless.
    4: i32 depth,
}

struct PutResponse {
    // true when the key was already present; the put was then a no-op.
    1: bool existed,
}

struct PutItem {
    1: binary key,
    2: binary value,
    3: i32 depth,
}

struct BatchPutRequest {
    1: string ns,
    2: list<PutItem> items,
}

struct ItemStatus {
    1: ErrorCode code,
    2: string message,
}

struct BatchPutResponse {
    1: list<ItemStatus> results,
}

struct GetRequest {
    1: string ns,
    2: binary key,
}

struct GetResponse {
    1: bool found,
    2: binary value,
    3: string tier,
}

struct BatchGetRequest {
    1: string ns,
    2: list<binary> keys,
}

struct GetItem {
    1: ErrorCode code,
    2: binary value,
    3: string tier,
}

struct BatchGetResponse {
    1: list<GetItem> results,
}

struct ExistsRequest {
    1: string ns,
    2: binary key,
}

struct ExistsResponse {
    1: bool present,
    2: string tier,
    3: string node_id,
}

struct BatchExistsRequest {
    1: string ns,
    2: list<binary> keys,
}

struct BatchExistsResponse {
    1: list<ExistsResponse> results,
}

struct LookupRequest {
    1: string ns,
    // Block keys of one request in chain order.
    2: list<binary> keys,
}

struct LookupResponse {
    // Number of leading keys that are present: the longest cached prefix.
    1: i32 matched,
}

struct DeleteRequest {
    1: string ns,
    2: binary key,
}

struct DeleteResponse {
    1: bool deleted,
}

struct ClearRequest {
    1: string ns,
}

struct ClearResponse {
    1: i64 removed,
}

struct StatsRequest {
    // Empty: all namespaces.
    1: string ns,
}

struct TierStats {
    1: string name,
    2: i64 capacity_bytes,
    3: i64 used_bytes,
    4: i64 blocks,
    5: i64 hits,
    6: i64 misses,
    7: i64 evictions,
    8: i64 bytes_in,
    9: i64 bytes_out,
}

struct NamespaceStats {
    1: string ns,
    2: i64 blocks,
    3: i64 bytes,
    4: i64 hits,
    5: i64 misses,
    6: i64 puts,
    7: i64 evictions,
}

struct StatsResponse {
    1: list<TierStats> tiers,
    2: list<NamespaceStats> namespaces,
    3: i64 uptime_ms,
    4: string node_id,
}

service Tidepool {
    HelloResponse Hello(1: HelloRequest req) throws (1: TidepoolError err),
    PutResponse Put(1: PutRequest req) throws (1: TidepoolError err),
    BatchPutResponse BatchPut(1: BatchPutRequest req) throws (1: TidepoolError err),
    GetResponse Get(1: GetRequest req) throws (1: TidepoolError err),
    BatchGetResponse BatchGet(1: BatchGetRequest req) throws (1: TidepoolError err),
    ExistsResponse Exists(1: ExistsRequest req) throws (1: TidepoolError err),
    BatchExistsResponse BatchExists(1: BatchExistsRequest req) throws (1: TidepoolError err),
    LookupResponse Lookup(1: LookupRequest req) throws (1: TidepoolError err),
    DeleteResponse Delete(1: DeleteRequest req) throws (1: TidepoolError err),
    ClearResponse Clear(1: ClearRequest req) throws (1: TidepoolError err),
    StatsResponse Stats(1: StatsRequest req) throws (1: TidepoolError err),
}
