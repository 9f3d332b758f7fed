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

// Where a call looks for blocks. DEFAULT is CLUSTER on a clustered node
// and LOCAL on a single node.
enum Scope {
    DEFAULT = 0,
    LOCAL = 1,
    CLUSTER = 2,
}

// One shared-memory arena file of the DRAM tier. A client on the same host
// maps path (read-only to read; writable only inside slots it reserved).
struct ArenaInfo {
    1: i32 id,
    2: string path,
    3: i64 size,
}

// A range of an arena: where a reserved or acquired block's bytes live.
struct Slot {
    1: i32 arena,
    2: i64 offset,
    3: i64 length,
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
    // Shared arenas for the zero-copy calls, and their layout version.
    6: list<ArenaInfo> arenas,
    7: i32 layout_version,
    // Optional behaviours of this server, by name, for clients to use only
    // when listed (an older server leaves the list empty):
    //   "acquire_release"  AcquireRequest.release_lease_ids is honoured.
    //   "gpu"              the GPU calls (GpuRegister, ...) work: a driver
    //                      and a device were found.
    8: list<string> features,
}

struct PutRequest {
    1: string ns,
    2: binary key,
    3: binary value,
    // Position of the block in its prefix chain (0 = first block). Eviction
    // prefers deeper blocks: a chain without its head is useless.
    4: i32 depth,
    // Write through to persistent storage (SSD, WAL synced) before
    // answering: the block survives a crash or restart of the sidecar. It
    // is still evicted like any block when the cache needs room (it is a
    // cache; docs/ssd.md "What --durable promises"). Default: best effort.
    5: bool durable,
    // Cluster: owners to wait for (0 = acknowledge after the local store and
    // push to the owners in the background).
    6: i32 sync_replicas,
    // Optional, for KV events (docs/events.md): the token ids this block
    // covers (exactly block_size of them), the key of the block before it
    // in its chain (absent for the first block) and the engine's block
    // size in tokens. Routers index a block by its tokens; the sidecar
    // keeps them for its events (and in the SSD tier's record of the
    // block, so that they outlive a restart). An older client leaves
    // them out.
    7: optional list<i32> token_ids,
    8: optional binary parent_key,
    9: optional i32 block_size,
}

struct PutResponse {
    // true when the key was already present; the put was then a no-op.
    1: bool existed,
}

struct PutItem {
    1: binary key,
    2: binary value,
    3: i32 depth,
    // As in PutRequest.
    4: optional list<i32> token_ids,
    5: optional binary parent_key,
    6: optional i32 block_size,
}

struct BatchPutRequest {
    1: string ns,
    2: list<PutItem> items,
    // As PutRequest.durable: written through, kept across restarts,
    // evictable.
    3: bool durable,
    4: i32 sync_replicas,
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
    3: Scope scope,
}

struct GetResponse {
    1: bool found,
    2: binary value,
    3: string tier,
}

struct BatchGetRequest {
    1: string ns,
    2: list<binary> keys,
    3: Scope scope,
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
    3: Scope scope,
}

struct ExistsResponse {
    1: bool present,
    // Where the block is: "dram", "ssd", ..., or "remote" (cluster scope:
    // held by another node).
    2: string tier,
    // The node that holds the block: this sidecar, or for "remote" the
    // owner that answered it holds it.
    3: string node_id,
}

struct BatchExistsRequest {
    1: string ns,
    2: list<binary> keys,
    3: Scope scope,
}

struct BatchExistsResponse {
    1: list<ExistsResponse> results,
}

struct LookupRequest {
    1: string ns,
    // Block keys of one request in chain order.
    2: list<binary> keys,
    3: Scope scope,
}

struct LookupResponse {
    // Number of leading keys that are present: the longest cached prefix.
    1: i32 matched,
}

struct DeleteRequest {
    1: string ns,
    2: binary key,
    // CLUSTER (the DEFAULT on a clustered node): every live member deletes
    // its copy, owners included. LOCAL: this sidecar's tiers only.
    3: Scope scope,
}

struct DeleteResponse {
    1: bool deleted,
}

struct ClearRequest {
    1: string ns,
    // CLUSTER (the DEFAULT on a clustered node): every live member clears
    // the namespace. LOCAL: this sidecar's tiers only.
    2: Scope scope,
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

struct PrefetchRequest {
    1: string ns,
    2: list<binary> keys,
    3: Scope scope,
}

struct PrefetchResponse {
    // Keys queued to be brought into DRAM (those already there are not).
    1: i32 queued,
}

// Zero-copy put, phase one: reserve a slot, write the value into it through
// the shared arena, then Commit (or Abort). A reservation neither committed
// nor aborted by its deadline is reclaimed.
struct ReserveItem {
    1: binary key,
    2: i64 size,
    3: i32 depth,
    // The key is given at Commit (CommitItem.key) instead: key is empty. A
    // slot reserved ahead of the put that will fill it (servers whose
    // Hello lists "commit_next"; see CommitItem.next_size).
    4: bool unbound,
}

struct ReserveRequest {
    1: string ns,
    2: list<ReserveItem> items,
    // How long the reservation lives; 0 = the server's default.
    3: i32 ttl_ms,
    // As PutRequest.durable, for the committed blocks.
    4: bool durable,
}

struct Reservation {
    // OK, EXISTS (nothing to write), or the item's error.
    1: ErrorCode code,
    2: string message,
    3: Slot slot,
    4: i64 token,
    5: i64 deadline_unix_ms,
}

struct ReserveResponse {
    1: list<Reservation> results,
}

struct CommitItem {
    1: i64 token,
    // CRC-32C of the bytes written, checked when has_checksum; else the
    // server computes it.
    2: bool has_checksum,
    3: i32 checksum,
    // The key of an unbound reservation (ReserveItem.unbound) and its
    // depth; key must be empty for a reservation made with its key.
    4: binary key,
    5: i32 depth,
    // > 0: also reserve an unbound slot of this many bytes in the same
    // namespace, with the same ttl and durability, answered in
    // CommitResponse.next at this item's index, so that the writer's next
    // put of that size needs no Reserve round trip (servers whose Hello
    // lists "commit_next").
    6: i64 next_size,
    // As in PutRequest.
    7: optional list<i32> token_ids,
    8: optional binary parent_key,
    9: optional i32 block_size,
}

struct CommitRequest {
    1: list<CommitItem> items,
}

struct CommitResponse {
    1: list<ItemStatus> results,
    // One per item when any item asked for next_size: the unbound
    // reservation (code OK, token > 0), the reason there is none, or code
    // OK and token 0 for an item that did not ask.
    2: list<Reservation> next,
}

struct AbortRequest {
    1: list<i64> tokens,
}

struct AbortResponse {
    1: list<ItemStatus> results,
}

// Zero-copy get: pin blocks and learn where they are. Each pin is a lease
// that ends at Release or at its deadline, whichever is first.
struct AcquireRequest {
    1: string ns,
    2: list<binary> keys,
    // Lease length; 0 = the server's default.
    3: i32 lease_ms,
    4: Scope scope,
    // Leases to release before acquiring: a client's finished reads riding
    // along instead of a Release call of their own (servers whose Hello
    // lists the feature "acquire_release"; an older server ignores the
    // field, so the leases would stay pinned until their deadline). No
    // per-id outcome is answered: an id not held is ignored, and a client
    // that sends one here has checked its copy against the lease's
    // deadline itself. At most max_batch ids.
    5: list<i64> release_lease_ids,
}

struct Lease {
    // OK, NOT_FOUND, or the item's error.
    1: ErrorCode code,
    2: Slot slot,
    3: i64 lease_id,
    4: i32 checksum,
    5: string tier,
}

struct AcquireResponse {
    1: list<Lease> results,
    2: i64 deadline_unix_ms,
}

struct ReleaseRequest {
    1: list<i64> lease_ids,
}

struct ReleaseResponse {
    1: list<ItemStatus> results,
}

struct RenewRequest {
    1: list<i64> lease_ids,
    2: i32 lease_ms,
}

struct RenewResponse {
    1: list<ItemStatus> results,
    2: i64 deadline_unix_ms,
}

// The GPU end (servers whose Hello lists "gpu"): an engine hands the
// sidecar its KV-cache buffers as CUDA IPC memory handles, and then names
// GPU block slots to save into the store or to load from it; the sidecar
// copies between the engine's GPU memory and its arenas itself. A
// registration belongs to the connection that made it: it ends at
// GpuUnregister, when that connection closes, or when the sidecar stops.
//
// One buffer: the allocation a CUDA IPC memory handle names (for PyTorch,
// tensor.untyped_storage()._share_cuda_()), and the range of it used.
struct GpuBuffer {
    // The device: by UUID (16 bytes) when given, which does not depend on
    // CUDA_VISIBLE_DEVICES; else by the sidecar's ordinal.
    1: i32 device,
    2: binary device_uuid,
    // The CUipcMemHandle: 64 bytes.
    3: binary ipc_handle,
    // Bytes from the start of the allocation to the range, and its length.
    4: i64 offset,
    5: i64 size,
}

// One piece of every block: block slot s's piece lies at byte
// offset + s * stride of buffer, length bytes long.
struct GpuSegment {
    1: i32 buffer,
    2: i64 offset,
    3: i64 stride,
    4: i64 length,
}

struct GpuRegisterRequest {
    // All on one device.
    1: list<GpuBuffer> buffers,
    // A block's value is header followed by its segments, in order.
    2: list<GpuSegment> segments,
    // Slots are 0 .. num_blocks-1.
    3: i32 num_blocks,
    // At most 4096 bytes, written before the segments of every block saved
    // and checked on every block loaded (a layout's signature).
    4: binary header,
}

struct GpuRegisterResponse {
    1: i64 registration_id,
    // The value size of one block: header plus every segment's length.
    2: i64 block_bytes,
}

struct GpuUnregisterRequest {
    1: i64 registration_id,
}

struct GpuUnregisterResponse {}

struct GpuBlock {
    1: i32 slot,
    2: binary key,
    // Position in the prefix chain (saves).
    3: i32 depth,
}

// Save: copy each slot to a new block of its key (like Reserve, write,
// Commit); Load: copy each key's block into its slot (like Acquire, read,
// Release). The answer comes when every copy has completed or failed; a
// failed copy leaves no block (save) or its slot's bytes undefined (load).
struct GpuCopyRequest {
    1: i64 registration_id,
    2: string ns,
    3: list<GpuBlock> blocks,
    // Saves: write through to persistent storage. Loads: ignored.
    4: bool durable,
    // Loads: where to look for the blocks.
    5: Scope scope,
}

struct GpuCopyResponse {
    // Per block: OK; EXISTS (save: nothing copied); NOT_FOUND (load);
    // INTERNAL for a copy that failed; or the item's error.
    1: list<ItemStatus> results,
}

struct MembersRequest {}

struct Member {
    1: string name,
    2: string state,
    3: string gossip_addr,
    4: string peer_addr,
    5: string zone,
    6: bool is_self,
}

struct MembersResponse {
    1: list<Member> members,
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
    PrefetchResponse Prefetch(1: PrefetchRequest req) throws (1: TidepoolError err),
    ReserveResponse Reserve(1: ReserveRequest req) throws (1: TidepoolError err),
    CommitResponse Commit(1: CommitRequest req) throws (1: TidepoolError err),
    AbortResponse Abort(1: AbortRequest req) throws (1: TidepoolError err),
    AcquireResponse Acquire(1: AcquireRequest req) throws (1: TidepoolError err),
    ReleaseResponse Release(1: ReleaseRequest req) throws (1: TidepoolError err),
    RenewResponse Renew(1: RenewRequest req) throws (1: TidepoolError err),
    MembersResponse Members(1: MembersRequest req) throws (1: TidepoolError err),
    GpuRegisterResponse GpuRegister(1: GpuRegisterRequest req) throws (1: TidepoolError err),
    GpuUnregisterResponse GpuUnregister(1: GpuUnregisterRequest req) throws (1: TidepoolError err),
    GpuCopyResponse GpuSave(1: GpuCopyRequest req) throws (1: TidepoolError err),
    GpuCopyResponse GpuLoad(1: GpuCopyRequest req) throws (1: TidepoolError err),
}
