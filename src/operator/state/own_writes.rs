//! The versions of objects this operator has itself written over, by UID, until its caches
//! catch up. A reconcile that finds the cache still at a version the operator has already
//! replaced knows the cache lags its own write: deciding on that copy would repeat the write
//! (a claim status applied twice, a lease status refused with 409 and read again). The watch
//! event of the write is on its way and triggers the next reconcile, so the stale one waits.
//! Never used for correctness: the lease status write keeps its `resourceVersion`
//! precondition; this only saves writes that would be refused or change nothing.

use std::collections::HashMap;
use std::sync::Mutex;

/// Versions written over, per object UID (a handful at most: one per write not yet seen).
#[derive(Default)]
pub struct OwnWrites {
    over: Mutex<HashMap<String, Vec<String>>>,
}

impl OwnWrites {
    /// Records that a write replaced version `before` of object `uid` with `after`. A write
    /// that changed nothing (the same version back) is not recorded: no event follows it.
    pub fn wrote(&self, uid: &str, before: Option<&str>, after: Option<&str>) {
        let (Some(before), Some(after)) = (before, after) else {
            return;
        };
        if before == after {
            return;
        }
        let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
        let versions = over.entry(uid.to_owned()).or_default();
        if !versions.iter().any(|v| v == before) {
            versions.push(before.to_owned());
        }
    }

    /// Is version `version` of object `uid` one this operator has already written over? A
    /// version it has not written over means the cache caught up: the record is dropped.
    pub fn is_superseded(&self, uid: Option<&str>, version: Option<&str>) -> bool {
        let (Some(uid), Some(version)) = (uid, version) else {
            return false;
        };
        let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
        match over.get(uid) {
            Some(versions) if versions.iter().any(|v| v == version) => true,
            Some(_) => {
                over.remove(uid);
                false
            }
            None => false,
        }
    }

    /// The cache now holds version `version` of object `uid` (a watch event): a version not
    /// written over means the cache caught up, and the record goes, read again or not.
    pub fn seen(&self, uid: Option<&str>, version: Option<&str>) {
        let (Some(uid), Some(version)) = (uid, version) else {
            return;
        };
        let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
        if over
            .get(uid)
            .is_some_and(|versions| !versions.iter().any(|v| v == version))
        {
            over.remove(uid);
        }
    }

    /// Forgets object `uid` (deleted).
    pub fn forget(&self, uid: &str) {
        self.over
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Objects with a write the caches have not shown yet.
    pub fn len(&self) -> usize {
        self.over.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_written_over_is_stale_until_the_cache_shows_another() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.wrote("a", Some("2"), Some("3"));
        assert!(w.is_superseded(Some("a"), Some("1")));
        assert!(w.is_superseded(Some("a"), Some("2")));
        assert!(
            !w.is_superseded(Some("a"), Some("3")),
            "the cache caught up"
        );
        assert!(w.is_empty(), "and the record is gone");
        assert!(
            !w.is_superseded(Some("a"), Some("1")),
            "an old copy after that is not ours to judge"
        );
    }

    #[test]
    fn a_write_that_changed_nothing_is_not_recorded() {
        let w = OwnWrites::default();
        w.wrote("a", Some("5"), Some("5"));
        assert!(!w.is_superseded(Some("a"), Some("5")));
        w.wrote("b", None, Some("5"));
        assert!(w.is_empty());
    }

    #[test]
    fn a_watch_event_of_a_newer_version_drops_the_record() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.seen(Some("a"), Some("1"));
        assert!(!w.is_empty(), "the event of the version written over");
        w.seen(Some("a"), Some("2"));
        assert!(w.is_empty());
    }

    #[test]
    fn forgotten_objects_are_not_stale() {
        let w = OwnWrites::default();
        w.wrote("a", Some("1"), Some("2"));
        w.forget("a");
        assert!(!w.is_superseded(Some("a"), Some("1")));
    }
}
