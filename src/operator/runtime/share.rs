//! Each namespace's share of the lease controller. The controller starts the reconciles that
//! wait for a free slot in the order they came, so work queued behind thousands waits for all
//! of them.
//! Bulk work of one namespace (the releases of thousands of claims deleted at once, the
//! grants after an outage) therefore goes to the controller only while that namespace has
//! fewer than [`NAMESPACE_SHARE`] leases queued or reconciling; the rest wait here, first
//! come first served within their namespace, and namespaces take turns. So a claim in another
//! namespace always finds a free slot.
//!
//! A trigger of a lease whose reconcile is already queued or running goes on at once: it
//! takes no slot more (the controller runs that lease once more after), and a hot lease's
//! hand-overs never wait here. A wake-up at a holder's deadline waits, if it must, at the
//! front of its namespace's queue: an expiry is due, the rest can follow it.

use std::collections::{BTreeMap, HashSet, VecDeque};

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::FencedLease;
use crate::operator::state::Swept;

/// Leases of one namespace queued or reconciling at most, of the controller's 32 slots.
pub const NAMESPACE_SHARE: usize = 16;

/// Where a trigger that must wait goes in its namespace's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// At the front (a wake-up that is due), moved there if it already waits.
    First,
    /// At the back (every other change).
    Last,
}

/// Triggers beyond their namespace's share, waiting for it.
#[derive(Default)]
pub struct Waiting {
    by_namespace: BTreeMap<String, VecDeque<ObjectRef<FencedLease>>>,
    held: HashSet<ObjectRef<FencedLease>>,
    /// The namespace served last: the next turn starts after it.
    last: Option<String>,
}

impl Waiting {
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether a trigger of `lease` may go to the controller now (it is then counted in
    /// `swept`); otherwise it waits here, once however often it is triggered.
    pub fn admit(
        &mut self,
        lease: ObjectRef<FencedLease>,
        turn: Turn,
        swept: &Swept,
        store: &Store<FencedLease>,
        share: usize,
    ) -> Option<ObjectRef<FencedLease>> {
        if self.held.contains(&lease) {
            if turn == Turn::First {
                let ns = lease.namespace.as_deref().unwrap_or_default();
                if let Some(queue) = self.by_namespace.get_mut(ns) {
                    queue.retain(|l| *l != lease);
                    queue.push_front(lease);
                }
            }
            return None;
        }
        // A lease the cache lacks is not reconciled (the controller reports it): no slot.
        if swept.contains(&lease) || store.get(&lease).is_none() {
            return Some(lease);
        }
        let ns = lease.namespace.clone().unwrap_or_default();
        let queue_empty = self.by_namespace.get(&ns).is_none_or(VecDeque::is_empty);
        if (queue_empty || turn == Turn::First) && swept.in_namespace(&ns) < share {
            swept.queue(lease.clone());
            return Some(lease);
        }
        self.held.insert(lease.clone());
        let queue = self.by_namespace.entry(ns).or_default();
        match turn {
            Turn::First => queue.push_front(lease),
            Turn::Last => queue.push_back(lease),
        }
        None
    }

    /// The waiting leases whose namespace has room now, each counted in `swept`: one per
    /// namespace in turn, oldest first within it. Those the cache no longer has are dropped.
    pub fn release(
        &mut self,
        swept: &Swept,
        store: &Store<FencedLease>,
        share: usize,
    ) -> Vec<ObjectRef<FencedLease>> {
        let mut released = Vec::new();
        loop {
            let order: Vec<String> = match &self.last {
                Some(last) => self
                    .by_namespace
                    .range::<String, _>((
                        std::ops::Bound::Excluded(last.clone()),
                        std::ops::Bound::Unbounded,
                    ))
                    .chain(self.by_namespace.range::<String, _>(..=last.clone()))
                    .map(|(ns, _)| ns.clone())
                    .collect(),
                None => self.by_namespace.keys().cloned().collect(),
            };
            let mut moved = false;
            for ns in order {
                if let Some(lease) = self.take(&ns, swept, store, share) {
                    released.push(lease);
                    self.last = Some(ns);
                    moved = true;
                }
            }
            if !moved {
                return released;
            }
        }
    }

    /// The oldest waiting lease of `ns`, if that namespace has room.
    fn take(
        &mut self,
        ns: &str,
        swept: &Swept,
        store: &Store<FencedLease>,
        share: usize,
    ) -> Option<ObjectRef<FencedLease>> {
        let queue = self.by_namespace.get_mut(ns)?;
        let taken = loop {
            let Some(lease) = queue.front() else {
                break None;
            };
            if store.get(lease).is_none() {
                let lease = queue.pop_front()?;
                self.held.remove(&lease);
                continue;
            }
            if swept.contains(lease) || swept.in_namespace(ns) < share {
                let lease = queue.pop_front()?;
                self.held.remove(&lease);
                swept.queue(lease.clone());
                break Some(lease);
            }
            break None;
        };
        if queue.is_empty() {
            self.by_namespace.remove(ns);
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_of(leases: &[(&str, &str)]) -> Store<FencedLease> {
        let (store, mut writer) = kube::runtime::reflector::store::<FencedLease>();
        for (ns, name) in leases {
            let lease: FencedLease = serde_json::from_value(serde_json::json!({
                "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"leaseDurationSeconds": 10},
            }))
            .expect("lease");
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(lease));
        }
        store
    }

    fn lease(ns: &str, name: &str) -> ObjectRef<FencedLease> {
        ObjectRef::new(name).within(ns)
    }

    #[test]
    fn a_namespace_over_its_share_waits_and_another_goes_at_once() {
        let store = store_of(&[("bulk", "a"), ("bulk", "b"), ("bulk", "c"), ("other", "x")]);
        let (swept, mut waiting) = (Swept::default(), Waiting::default());
        let admitted = |w: &mut Waiting, l| w.admit(l, Turn::Last, &swept, &store, 2);
        assert!(admitted(&mut waiting, lease("bulk", "a")).is_some());
        assert!(admitted(&mut waiting, lease("bulk", "b")).is_some());
        assert!(
            admitted(&mut waiting, lease("bulk", "c")).is_none(),
            "over its share"
        );
        assert!(
            admitted(&mut waiting, lease("bulk", "c")).is_none(),
            "held once"
        );
        assert!(
            admitted(&mut waiting, lease("bulk", "a")).is_some(),
            "a lease already reconciling takes no slot more"
        );
        assert!(admitted(&mut waiting, lease("other", "x")).is_some());
        assert!(
            admitted(&mut waiting, lease("nowhere", "gone")).is_some(),
            "the controller reports a missing lease"
        );
        assert_eq!(swept.in_namespace("bulk"), 2);
        assert!(waiting.release(&swept, &store, 2).is_empty(), "no room yet");
        swept.finished(&lease("bulk", "a"));
        assert_eq!(waiting.release(&swept, &store, 2), vec![lease("bulk", "c")]);
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_due_wake_up_goes_first_in_its_namespace() {
        let store = store_of(&[("ns", "busy"), ("ns", "a"), ("ns", "b"), ("ns", "due")]);
        let (swept, mut waiting) = (Swept::default(), Waiting::default());
        assert!(
            waiting
                .admit(lease("ns", "busy"), Turn::Last, &swept, &store, 1)
                .is_some()
        );
        for name in ["a", "due", "b"] {
            assert!(
                waiting
                    .admit(lease("ns", name), Turn::Last, &swept, &store, 1)
                    .is_none()
            );
        }
        // Its wake-up comes while it waits behind a: it moves to the front.
        assert!(
            waiting
                .admit(lease("ns", "due"), Turn::First, &swept, &store, 1)
                .is_none()
        );
        swept.finished(&lease("ns", "busy"));
        assert_eq!(waiting.release(&swept, &store, 1), vec![lease("ns", "due")]);
        swept.finished(&lease("ns", "due"));
        assert_eq!(waiting.release(&swept, &store, 1), vec![lease("ns", "a")]);
    }

    #[test]
    fn namespaces_take_turns_and_gone_leases_are_dropped() {
        let store = store_of(&[
            ("n1", "a"),
            ("n1", "b"),
            ("n1", "c"),
            ("n2", "d"),
            ("n2", "e"),
        ]);
        let (swept, mut waiting) = (Swept::default(), Waiting::default());
        for l in [
            lease("n1", "a"),
            lease("n1", "b"),
            lease("n1", "gone"),
            lease("n1", "c"),
            lease("n2", "d"),
            lease("n2", "e"),
        ] {
            waiting.admit(l, Turn::Last, &swept, &store, 0);
        }
        // The missing one went on at once; with a share of one, each namespace in turn.
        assert_eq!(
            waiting.release(&swept, &store, 1),
            vec![lease("n1", "a"), lease("n2", "d")]
        );
        swept.finished(&lease("n1", "a"));
        swept.finished(&lease("n2", "d"));
        assert_eq!(
            waiting.release(&swept, &store, 1),
            vec![lease("n1", "b"), lease("n2", "e")],
            "the turn goes on after the namespace served last (n2), round to n1"
        );
    }
}
