// tidepool peer API: what sidecars call on each other over TCP. Control
// messages only; block bytes move through the transfer layer (rdma/): the
// owner pins a block and names where it lies (a registered region of its
// DRAM arenas), and the requester pulls the bytes into its own arena.
//
// Every request carries the caller's cluster label and protocol version and,
// when the cluster is configured with one, the shared token; a mismatch is
// refused with UNAVAILABLE (PeerError.refused set) before anything else is
// done.
//
// Errors use the engine API's ErrorCode (tidepool.thrift): one vocabulary
// for both edges, mapped from and to domain errors by one table
// (proxy/wirecode). An enum is an i32 on the wire, so this IDL is
// wire-identical to its earlier form, which carried the same values in
// plain i32 fields.

include "tidepool.thrift"

namespace go peer

struct Auth {
    1: string node_id,
    2: string cluster_label,
    3: i32 protocol_version,
    4: string token,
}

// Where a pinned block lies on the owner: transport endpoint, registered
// region, offset and length inside it.
struct RemoteSlot {
    1: string transport_addr,
    2: i64 region_id,
    3: i64 region_len,
    4: i32 region_key,
    5: i64 region_addr,
    6: i64 offset,
    7: i64 length,
}

struct LookupRequest {
    1: Auth auth,
    2: string ns,
    3: list<binary> keys,
}

struct LookupResponse {
    // Per key: present in the owner's local tiers.
    1: list<bool> present,
}

struct AcquireRequest {
    1: Auth auth,
    2: string ns,
    3: list<binary> keys,
    4: i32 lease_ms,
    // Leases of earlier Acquires that the caller is done with, released
    // before this call pins anything (a Release riding along, to save a
    // round trip per fetch). Unknown or expired ids are ignored.
    5: optional list<i64> release,
    // The asking node wants each block's description (AcquireItem
    // token_ids, parent_key, block_size), for its KV events: a block it
    // fetches is then described there too. Peers that predate it ignore
    // it and send none.
    6: optional bool describe,
}

struct AcquireItem {
    // OK, or why this key is not served (NOT_FOUND, ...).
    1: tidepool.ErrorCode code,
    2: string message,
    3: RemoteSlot slot,
    4: i64 lease_id,
    5: i32 checksum,
    6: i32 depth,
    // With AcquireRequest.describe, the block's description where this
    // node knows one (as PutItem's). Absent: none known.
    7: optional list<i32> token_ids,
    8: optional binary parent_key,
    9: optional i32 block_size,
}

struct AcquireResponse {
    1: list<AcquireItem> items,
    // Set by a node that serves named reads on its transfer port (the
    // TCP transport's OpFetch, docs/transfer.md): the asking node may then
    // fetch from it in one exchange instead of Acquire and a read.
    2: optional bool fetch,
    // Set with fetch by a node that describes blocks in named reads when
    // asked (request version 2, proxy/peerapi/fetch.go): only then does
    // the asking node send such requests, which older nodes refuse.
    3: optional bool fetch_describe,
}

struct ReleaseRequest {
    1: Auth auth,
    2: list<i64> lease_ids,
}

struct ReleaseResponse {}

struct PutItem {
    1: binary key,
    2: binary value,
    3: i32 depth,
    4: i32 checksum,
    // The block's description as the engine put it (tidepool.PutRequest's
    // token_ids, parent_key, block_size), so that the owner's KV events
    // describe the block too (docs/events.md). Absent: none; peers that
    // predate them send none and ignore them.
    5: optional list<i32> token_ids,
    6: optional binary parent_key,
    7: optional i32 block_size,
}

struct PutRequest {
    1: Auth auth,
    2: string ns,
    3: list<PutItem> items,
}

struct PutResponse {
    // Per item: OK = stored or already present, else why not.
    1: list<tidepool.ErrorCode> codes,
}

// Delete and Clear act on the receiver's local tiers only (the caller
// asks every member itself: a cluster-wide Delete or Clear of the engine
// API).
struct DeleteRequest {
    1: Auth auth,
    2: string ns,
    3: list<binary> keys,
}

struct DeleteResponse {
    // Per key: it was there (and is gone now).
    1: list<bool> deleted,
}

struct ClearRequest {
    1: Auth auth,
    2: string ns,
}

struct ClearResponse {
    1: i64 removed,
}

exception PeerError {
    1: tidepool.ErrorCode code,
    2: string message,
    // The call's credentials were refused (cluster label, protocol version
    // or token); code is UNAVAILABLE. Absent from peers that predate it,
    // whose refusals decode as plain UNAVAILABLE.
    3: optional bool refused,
}

service TidepoolPeer {
    LookupResponse Lookup(1: LookupRequest req) throws (1: PeerError err),
    AcquireResponse Acquire(1: AcquireRequest req) throws (1: PeerError err),
    ReleaseResponse Release(1: ReleaseRequest req) throws (1: PeerError err),
    PutResponse Put(1: PutRequest req) throws (1: PeerError err),
    DeleteResponse Delete(1: DeleteRequest req) throws (1: PeerError err),
    ClearResponse Clear(1: ClearRequest req) throws (1: PeerError err),
}
