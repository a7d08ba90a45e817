//! Token records waiting to be written to their ConfigMap.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Records queued for the ConfigMaps, by lease namespace. Every lease of a namespace is
/// recorded in one ConfigMap, so leases deleted together would race optimistic
/// read-modify-writes on it, most of them lost. Instead one write at a time per ConfigMap
/// takes every record queued for it (a group commit); the others wait their turn and find
/// their record written.
#[derive(Debug, Default)]
pub struct PendingRecords {
    by_namespace: Mutex<HashMap<String, Arc<Queue>>>,
}

#[derive(Debug, Default)]
/// The records of one namespace: queued, and written for another caller.
pub struct Queue {
    /// One writer at a time; an async lock, so a reconcile dropped while writing frees it.
    pub turn: tokio::sync::Mutex<()>,
    /// lease -> token, waiting for a write.
    pub queued: Mutex<BTreeMap<String, i64>>,
    /// lease -> token, written by someone else's turn, until its own caller collects it.
    pub written: Mutex<BTreeMap<String, i64>>,
}

/// Locks `m`, whether or not a holder panicked.
pub fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Raises `lease`'s entry to `token` (never lowers it).
pub fn raise(records: &mut BTreeMap<String, i64>, lease: &str, token: i64) {
    let slot = records.entry(lease.to_string()).or_insert(token);
    *slot = (*slot).max(token);
}

impl PendingRecords {
    pub fn queue(&self, ns: &str) -> Arc<Queue> {
        locked(&self.by_namespace)
            .entry(ns.to_string())
            .or_default()
            .clone()
    }
}
