//! The handles the reconcilers share: the API, what the watches fill, and where Events and
//! metrics go. Nothing here acts; each room takes the handles it needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Client;

use super::admission::Admission;
use super::events::Events;
use super::metrics::Metrics;
use super::state::{Failures, Memory, PendingRecords, RecordsAhead};

/// The API, and the deadline of each call to it: all a component that only reads and writes
/// objects needs.
#[derive(Clone)]
pub struct Kube {
    pub client: Client,
    /// Deadline of every single API call.
    pub timeout: Duration,
}

/// What every reconcile needs: handles, cheap to share.
pub struct Context {
    pub kube: Kube,
    /// The caches, indexes and clocks the watches fill.
    pub memory: Memory,
    /// Events are queued here and published in the background, never awaited.
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// The admission objects of the fence, as watched: whether a lease's fence is in force.
    pub admission: Admission,
    /// Consecutive failed reconciles per lease, for backoff and one Event per cause.
    pub failures: Failures,
    /// Token records waiting to be written, one write per ConfigMap at a time.
    pub records: PendingRecords,
    /// Token records read when a lease was first seen, for its first grant.
    pub records_ahead: RecordsAhead,
    /// Namespace of the operator's own state (the token records).
    pub state_namespace: String,
    /// Every lease is reconciled at least this often (± a quarter, so that thousands of
    /// leases do not all come due at once), as a safety net.
    pub resync: Duration,
    /// All caches have synced: until then no decision is taken (a pod missing from an
    /// unsynced cache is not a deleted pod).
    pub synced: AtomicBool,
}

impl Context {
    /// When to look at a lease again when nothing is due: the resync period, jittered.
    pub fn resync_after(&self) -> Duration {
        self.resync.mul_f64(0.75 + 0.5 * rand::random::<f64>())
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}
