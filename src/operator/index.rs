//! Indexes over the caches, kept up to date from the watch events, so that no event or
//! reconcile scans every claim or every pod of the cluster: claims by the lease they ask for
//! and by the pod they name, pods by the leases whose token they carry.
//!
//! An index only narrows the search: every name it gives is looked up in the cache and checked
//! there, so an entry left behind (an object deleted while a watch was down) costs a lookup,
//! never a wrong answer; each relist rebuilds the index from the cache.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// (namespace, key) -> names of the objects in that namespace with that key.
#[derive(Debug, Default)]
pub struct Index {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_key: HashMap<(String, String), HashSet<String>>,
    /// (namespace, name) -> the keys it was indexed under.
    keys_of: HashMap<(String, String), Vec<String>>,
}

impl Index {
    /// Indexes object `ns/name` under `keys` (replacing its previous keys).
    pub fn set(&self, ns: &str, name: &str, keys: Vec<String>) {
        let mut inner = self.lock();
        let id = (ns.to_string(), name.to_string());
        if inner.keys_of.get(&id) == Some(&keys) {
            return;
        }
        inner.remove(&id);
        for key in &keys {
            inner
                .by_key
                .entry((ns.to_string(), key.clone()))
                .or_default()
                .insert(name.to_string());
        }
        if !keys.is_empty() {
            inner.keys_of.insert(id, keys);
        }
    }

    /// Forgets object `ns/name`.
    pub fn remove(&self, ns: &str, name: &str) {
        self.lock().remove(&(ns.to_string(), name.to_string()));
    }

    /// Names of the objects of namespace `ns` indexed under `key`.
    pub fn get(&self, ns: &str, key: &str) -> Vec<String> {
        self.lock()
            .by_key
            .get(&(ns.to_string(), key.to_string()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Replaces the whole index (after a relist), from `(namespace, name, keys)`.
    pub fn rebuild(&self, objects: impl IntoIterator<Item = (String, String, Vec<String>)>) {
        *self.lock() = Inner::default();
        for (ns, name, keys) in objects {
            self.set(&ns, &name, keys);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().keys_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, id: &(String, String)) {
        let Some(keys) = self.keys_of.remove(id) else {
            return;
        };
        for key in keys {
            let slot = (id.0.clone(), key);
            if let Some(names) = self.by_key.get_mut(&slot) {
                names.remove(&id.1);
                if names.is_empty() {
                    self.by_key.remove(&slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_move_between_keys_and_go() {
        let index = Index::default();
        index.set("ns", "a", vec!["l1".into()]);
        index.set("ns", "b", vec!["l1".into()]);
        index.set("other", "c", vec!["l1".into()]);
        let mut l1 = index.get("ns", "l1");
        l1.sort();
        assert_eq!(l1, ["a", "b"]);
        index.set("ns", "a", vec!["l2".into()]);
        assert_eq!(index.get("ns", "l1"), ["b"]);
        assert_eq!(index.get("ns", "l2"), ["a"]);
        index.remove("ns", "b");
        assert!(index.get("ns", "l1").is_empty());
        assert_eq!(index.len(), 2);
        index.rebuild([("ns".to_string(), "z".to_string(), vec!["l9".to_string()])]);
        assert_eq!(index.get("ns", "l9"), ["z"]);
        assert!(index.get("ns", "l2").is_empty());
    }
}
