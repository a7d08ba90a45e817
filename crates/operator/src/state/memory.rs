//! Everything the watches fill and the reconcilers read: the caches, the indexes over them,
//! the heartbeat clock, the marks of the operator's own writes, the queue positions waiting.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kube::runtime::reflector::{self, Store};

use super::cache::Writer;
use super::followed::CachedLease;
use super::{Cache, CachedClaim, CachedPod, Heartbeats, Index, OwnWrites, Positions};
use fenced_lease_api::FencedLease;

/// What the watches fill and the reconcilers read (cheap to clone: handles).
#[derive(Clone)]
pub struct Memory {
    /// kube-runtime's store.
    pub leases: Store<FencedLease>,
    /// The leases have been listed (the lease cache is ready).
    pub leases_listed: Arc<AtomicBool>,
    pub claims: Cache<CachedClaim>,
    /// Pods as [`CachedPod`]: existence, UID and token annotations are all the operator reads.
    pub pods: Cache<CachedPod>,
    /// Coordination Leases, which leases with `spec.follow` follow: holder and transitions.
    pub followed: Cache<CachedLease>,
    /// Claims by the lease they ask for.
    pub claims_by_lease: Arc<Index>,
    pub claims_by_pod: Arc<Index>,
    /// Pods by the leases whose token annotation they carry.
    pub pods_by_lease: Arc<Index>,
    /// FencedLeases by the coordination Lease they follow.
    pub followers: Arc<Index>,
    /// Coordination Leases by the pod names their holder identity may stand for.
    pub followed_by_pod: Arc<Index>,
    pub heartbeats: Arc<Heartbeats>,
    /// Versions of leases and claims this operator wrote over that its caches still show.
    pub written: Arc<OwnWrites>,
    /// Queue positions waiting to be written, off the hand-over's path.
    pub positions: Arc<Positions>,
}

/// The writing ends of [`Memory`]'s caches, one per feed.
pub struct Writers {
    pub leases: reflector::store::Writer<FencedLease>,
    pub claims: Writer<CachedClaim>,
    pub pods: Writer<CachedPod>,
    pub followed: Writer<CachedLease>,
}

impl Memory {
    pub fn new() -> (Memory, Writers) {
        let (leases, lease_writer) = reflector::store();
        let (claims, claim_writer) = Cache::new();
        let (pods, pod_writer) = Cache::new();
        let (followed, followed_writer) = Cache::new();
        let memory = Memory {
            leases,
            leases_listed: Arc::default(),
            claims,
            pods,
            followed,
            claims_by_lease: Arc::default(),
            claims_by_pod: Arc::default(),
            pods_by_lease: Arc::default(),
            followers: Arc::default(),
            followed_by_pod: Arc::default(),
            heartbeats: Arc::default(),
            written: Arc::default(),
            positions: Arc::default(),
        };
        let writers = Writers {
            leases: lease_writer,
            claims: claim_writer,
            pods: pod_writer,
            followed: followed_writer,
        };
        (memory, writers)
    }
}
