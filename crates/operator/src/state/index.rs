//! Indexes over the caches, kept up to date from the watch events, so that no event or
//! reconcile scans every claim or every pod of the cluster: claims by the lease they ask for
//! and by the pod they name, pods by the leases whose token they carry.
//!
//! An index only narrows the search: every name it gives is looked up in the cache and checked
//! there, so an entry left behind (an object deleted while a watch was down) costs a lookup,
//! never a wrong answer; each relist rebuilds the index from the cache.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Mutex;

/// (namespace, key) -> names of the objects in that namespace with that key.
///
/// Each entry is one string in each of two sorted sets, `ns\0key\0name` and `ns\0name\0key`
/// (no Kubernetes name, namespace or annotation key holds a NUL): the names under a key, and
/// the keys of an object, are each a range of one of them (no maps of owned strings to sets).
#[derive(Debug, Default)]
pub struct Index {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// `ns\0key\0name`: the names under one key are a range.
    by_key: BTreeSet<Box<str>>,
    /// `ns\0name\0key`: the keys of one object are a range.
    keys_of: BTreeSet<Box<str>>,
}

fn entry(ns: &str, a: &str, b: &str) -> Box<str> {
    format!("{ns}\0{a}\0{b}").into_boxed_str()
}

/// The last parts of the entries of `set` that start with `ns\0a\0`.
fn under<'s>(set: &'s BTreeSet<Box<str>>, ns: &str, a: &str) -> impl Iterator<Item = &'s str> {
    let prefix = format!("{ns}\0{a}\0");
    set.range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
        .map_while(move |e| e.strip_prefix(prefix.as_str()))
}

impl Index {
    /// Indexes object `ns/name` under `keys` (replacing its previous keys).
    pub fn set(&self, ns: &str, name: &str, mut keys: Vec<String>) {
        keys.sort();
        keys.dedup();
        let mut inner = super::locked(&self.inner);
        if under(&inner.keys_of, ns, name).eq(keys.iter().map(String::as_str)) {
            return;
        }
        inner.remove(ns, name);
        for key in &keys {
            inner.by_key.insert(entry(ns, key, name));
            inner.keys_of.insert(entry(ns, name, key));
        }
    }

    /// Forgets object `ns/name`.
    pub fn remove(&self, ns: &str, name: &str) {
        super::locked(&self.inner).remove(ns, name);
    }

    /// Names of the objects of namespace `ns` indexed under `key`.
    pub fn get(&self, ns: &str, key: &str) -> Vec<String> {
        under(&super::locked(&self.inner).by_key, ns, key)
            .map(str::to_owned)
            .collect()
    }

    /// Replaces the whole index (after a relist), from `(namespace, name, keys)`.
    pub fn rebuild(&self, objects: impl IntoIterator<Item = (String, String, Vec<String>)>) {
        *super::locked(&self.inner) = Inner::default();
        for (ns, name, keys) in objects {
            self.set(&ns, &name, keys);
        }
    }
}

impl Inner {
    fn remove(&mut self, ns: &str, name: &str) {
        let keys: Vec<String> = under(&self.keys_of, ns, name).map(str::to_owned).collect();
        for key in keys {
            self.keys_of.remove(&*entry(ns, name, &key));
            self.by_key.remove(&*entry(ns, &key, name));
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
        assert_eq!(super::super::locked(&index.inner).keys_of.len(), 2);
        // A name that is a prefix of another is not confused with it.
        index.set("ns", "a-1", vec!["l2".into()]);
        index.remove("ns", "a");
        assert_eq!(index.get("ns", "l2"), ["a-1"]);
        assert!(index.get("n", "s").is_empty());
        // Several keys, in any order, and the same keys again change nothing.
        index.set("ns", "p", vec!["y".into(), "x".into(), "y".into()]);
        index.set("ns", "p", vec!["x".into(), "y".into()]);
        assert_eq!(
            (index.get("ns", "x"), index.get("ns", "y")),
            (vec!["p".to_string()], vec!["p".to_string()])
        );
        index.set("ns", "p", vec![]);
        assert!(index.get("ns", "x").is_empty());
        index.rebuild([("ns".to_string(), "z".to_string(), vec!["l9".to_string()])]);
        assert_eq!(index.get("ns", "l9"), ["z"]);
        assert!(index.get("ns", "l2").is_empty());
    }
}
