//! Token records waiting to be written to their ConfigMap.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::locked;

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

/// Token records read ahead of a lease's first grant, by lease UID, until that grant takes
/// them. A record read at any time after a lease object was created stays true for as long
/// as that object exists: the record of its name is written only by the finalizer of a lease
/// of that name, and that lease was gone before this one could be created. So the read can
/// be made when the lease is first seen, off the path of its first claim.
#[derive(Debug, Default)]
pub struct RecordsAhead {
    by_uid: Mutex<HashMap<String, i64>>,
}

impl RecordsAhead {
    pub fn keep(&self, uid: &str, record: i64) {
        locked(&self.by_uid).insert(uid.to_string(), record);
    }

    /// The record read ahead for lease `uid`, if any.
    pub fn get(&self, uid: &str) -> Option<i64> {
        locked(&self.by_uid).get(uid).copied()
    }

    /// Forgets lease `uid`: it has issued a token (its status carries it on), or it is gone.
    pub fn forget(&self, uid: &str) {
        locked(&self.by_uid).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_read_ahead_is_kept_by_lease_uid_until_forgotten() {
        let ahead = RecordsAhead::default();
        assert_eq!(ahead.get("uid-a"), None);
        ahead.keep("uid-a", 41);
        ahead.keep("uid-b", 0);
        assert_eq!(ahead.get("uid-a"), Some(41));
        assert_eq!(ahead.get("uid-b"), Some(0));
        ahead.forget("uid-a");
        assert_eq!(ahead.get("uid-a"), None);
        assert_eq!(ahead.get("uid-b"), Some(0));
    }
}
