//! What the operator keeps in memory: caches of leases' claims and pods, indexes over them,
//! the heartbeat clock, and the marks of its own writes. Nothing here
//! calls the API; the watches in [`runtime`](super::runtime) fill it.
//!
//! - [`memory`]: all of it, as the reconcilers read it.
//! - [`cache`]: objects by namespace and name; [`claim`], [`pod`], [`followed`]: claims, pods
//!   and coordination Leases as cached (compact); [`index`]: claims by lease and by pod, pods
//!   by annotated lease, leases by the Lease they follow.
//! - [`heartbeat`]: when each claim's heartbeat was last seen to change (the expiry clock).
//! - [`own_writes`]: the operator's writes its caches have not shown yet; [`records`]: token
//!   records waiting to be written, and read ahead of a first grant; [`positions`]: queue
//!   positions waiting to be written; [`failures`]: failed reconciles in a row.

pub mod cache;
pub mod claim;
pub mod failures;
pub mod followed;
pub mod heartbeat;
pub mod index;
pub mod memory;
pub mod own_writes;
pub mod pod;
pub mod positions;
pub mod records;

pub use cache::{Cache, Keyed};
pub use claim::CachedClaim;
pub use failures::Failures;
pub use heartbeat::Heartbeats;
pub use index::Index;
pub use memory::{Memory, Writers};
pub use own_writes::OwnWrites;
pub use pod::CachedPod;
pub use positions::Positions;
pub use records::{PendingRecords, RecordsAhead};

/// Locks `m`, whether or not a holder panicked: nothing here panics while holding a lock in a
/// way that leaves its data inconsistent, so a poisoned lock's data is used as it is.
pub fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
