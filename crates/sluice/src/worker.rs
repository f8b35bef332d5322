//! Which worker the calling thread is: the one thread-local that says it, read by every
//! per-worker table (the pools' affinity, the metrics' and digests' shards, the capture's
//! buffers). A per-core worker enters its index once when it starts; threads of tokio's shared
//! multi-threaded runtime are worker 0 (their tasks move between them) with a shard each; any
//! other thread is worker 0, shard 0.

use std::cell::Cell;

/// Shards per sharded table; threads beyond this share shards.
pub const SHARDS: usize = 16;

/// The calling thread's place: its worker (0: none of the per-core ones) and its shard.
#[derive(Debug, Clone, Copy, Default)]
struct Place {
    worker: usize,
    shard: usize,
}

thread_local! {
    static PLACE: Cell<Place> = const { Cell::new(Place { worker: 0, shard: 0 }) };
}

/// Makes the calling thread per-core worker `i` (from 1), recording into shard `i`.
pub fn enter(i: usize) {
    PLACE.with(|p| p.set(Place { worker: i, shard: i % SHARDS }));
}

/// Makes the calling thread a thread of the shared runtime: worker 0, recording into shard `i`.
pub fn enter_shared(i: usize) {
    PLACE.with(|p| p.set(Place { worker: 0, shard: i % SHARDS }));
}

/// The per-core worker the calling thread drives (0: none).
#[inline]
pub fn index() -> usize {
    PLACE.with(|p| p.get().worker)
}

/// The shard the calling thread records into (below [`SHARDS`]).
#[inline]
pub fn shard() -> usize {
    PLACE.with(|p| p.get().shard)
}
