//! Leases the sweep, or the pacing of triggers, has queued whose reconcile has not finished.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::FencedLease;

/// Leases the sweep or the pacing of triggers has queued whose reconcile has not finished,
/// and how many of them each namespace has.
#[derive(Default)]
pub struct Swept {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    queued: HashSet<ObjectRef<FencedLease>>,
    by_namespace: HashMap<String, usize>,
}

impl Inner {
    fn remove(&mut self, lease: &ObjectRef<FencedLease>) {
        if !self.queued.remove(lease) {
            return;
        }
        let ns = lease.namespace.as_deref().unwrap_or_default();
        if let Some(count) = self.by_namespace.get_mut(ns) {
            *count -= 1;
            if *count == 0 {
                self.by_namespace.remove(ns);
            }
        }
    }
}

impl Swept {
    /// A reconcile of `lease` finished.
    pub fn finished(&self, lease: &ObjectRef<FencedLease>) {
        let mut inner = self.lock();
        if !inner.queued.is_empty() {
            inner.remove(lease);
        }
    }

    pub fn contains(&self, lease: &ObjectRef<FencedLease>) -> bool {
        self.lock().queued.contains(lease)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.lock().queued.len()
    }

    /// How many of namespace `ns`'s leases are queued or reconciling.
    pub fn in_namespace(&self, ns: &str) -> usize {
        self.lock().by_namespace.get(ns).copied().unwrap_or(0)
    }

    pub fn queue(&self, lease: ObjectRef<FencedLease>) -> bool {
        let mut inner = self.lock();
        let ns = lease.namespace.clone().unwrap_or_default();
        let new = inner.queued.insert(lease);
        if new {
            *inner.by_namespace.entry(ns).or_default() += 1;
        }
        new
    }

    /// Stops waiting for leases the cache no longer has (deleted: never reconciled).
    pub fn prune(&self, store: &Store<FencedLease>) {
        let mut inner = self.lock();
        let gone: Vec<_> = inner
            .queued
            .iter()
            .filter(|lease| store.get(lease).is_none())
            .cloned()
            .collect();
        for lease in gone {
            inner.remove(&lease);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        super::locked(&self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_counted_by_namespace_until_finished() {
        let swept = Swept::default();
        let (a, b, c) = (
            ObjectRef::<FencedLease>::new("a").within("one"),
            ObjectRef::<FencedLease>::new("b").within("one"),
            ObjectRef::<FencedLease>::new("c").within("two"),
        );
        for lease in [&a, &b, &c, &a] {
            swept.queue(lease.clone());
        }
        assert_eq!((swept.len(), swept.in_namespace("one")), (3, 2));
        swept.finished(&a);
        swept.finished(&a);
        assert_eq!(
            (swept.in_namespace("one"), swept.in_namespace("two")),
            (1, 1)
        );
        let (store, _writer) = kube::runtime::reflector::store::<FencedLease>();
        swept.prune(&store);
        assert_eq!((swept.len(), swept.in_namespace("one")), (0, 0));
    }
}
