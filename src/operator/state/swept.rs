//! Leases the sweep, or the pacing of deletions, has queued whose reconcile has not finished.

use std::collections::HashSet;
use std::sync::Mutex;

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::FencedLease;

/// Leases the sweep or the pacing of deletions has queued whose reconcile has not finished.
#[derive(Default)]
pub struct Swept {
    queued: Mutex<HashSet<ObjectRef<FencedLease>>>,
}

impl Swept {
    /// A reconcile of `lease` finished.
    pub fn finished(&self, lease: &ObjectRef<FencedLease>) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        if !queued.is_empty() {
            queued.remove(lease);
        }
    }

    pub fn contains(&self, lease: &ObjectRef<FencedLease>) -> bool {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(lease)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.queued.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn queue(&self, lease: ObjectRef<FencedLease>) -> bool {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease)
    }

    /// Stops waiting for leases the cache no longer has (deleted: never reconciled).
    pub fn prune(&self, store: &Store<FencedLease>) {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|lease| store.get(lease).is_some());
    }
}
