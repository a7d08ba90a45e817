//! Which key runs next: pure bookkeeping, no I/O and no clock. Each key is idle, queued (once,
//! at its highest priority asked) or running (once; a trigger meanwhile runs it once more
//! after, first of its priority). A key starts when a slot is free, from the highest priority
//! that has one ready: bulk work only while fewer than [`Config::bulk`] run, no namespace
//! beyond [`Config::namespace_share`], namespaces in turn within a priority, first come first
//! served within a namespace.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;

use super::{Config, Key, Priority};

/// The keys waiting and running, and the slots they take.
pub struct Queue<K> {
    config: Config,
    keys: HashMap<K, State>,
    /// One lane per priority, lowest first: keys in the order they came, by namespace. An entry
    /// whose key has since been queued again elsewhere (a higher priority) is skipped.
    lanes: [Lane<K>; 3],
    running: usize,
    running_by_namespace: HashMap<String, usize>,
    /// Numbers each queuing of a key, so a lane tells its live entry from one left behind.
    next_entry: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued { priority: Priority, entry: u64 },
    Running { again: Option<Priority> },
}

impl<K: Key> Queue<K> {
    pub fn new(config: Config) -> Self {
        Queue {
            config,
            keys: HashMap::new(),
            lanes: Default::default(),
            running: 0,
            running_by_namespace: HashMap::new(),
            next_entry: 0,
        }
    }

    /// `key` is to be reconciled with `priority`: queued at the back of its lane, unless it
    /// already waits at this priority or a higher one (it keeps its place) or runs (it runs
    /// once more after, at the highest priority asked meanwhile).
    pub fn trigger(&mut self, key: K, priority: Priority) {
        match self.keys.get_mut(&key) {
            Some(State::Running { again }) => *again = (*again).max(Some(priority)),
            Some(State::Queued {
                priority: queued, ..
            }) if *queued >= priority => {}
            _ => self.enqueue(key, priority, false),
        }
    }

    /// The next key to run, if a slot is free and a key may take it; it counts as running
    /// until [`finished`](Self::finished).
    pub fn start(&mut self) -> Option<K> {
        if self.running >= self.config.concurrency {
            return None;
        }
        for priority in [Priority::Due, Priority::Change, Priority::Bulk] {
            if priority == Priority::Bulk && self.running >= self.config.bulk {
                continue;
            }
            let (keys, share) = (&self.keys, self.config.namespace_share);
            let running = &self.running_by_namespace;
            let has_room = |ns: &str| running.get(ns).copied().unwrap_or(0) < share;
            let live =
                |key: &K, entry: u64| keys.get(key) == Some(&State::Queued { priority, entry });
            if let Some(key) = self.lanes[priority as usize].pop(has_room, live) {
                self.keys
                    .insert(key.clone(), State::Running { again: None });
                self.running += 1;
                *self
                    .running_by_namespace
                    .entry(key.namespace().to_owned())
                    .or_default() += 1;
                return Some(key);
            }
        }
        None
    }

    /// `key`'s reconcile finished. If it was triggered while it ran, it is queued again, at
    /// the front of its lane: it came before those behind it.
    pub fn finished(&mut self, key: &K) {
        self.running = self.running.saturating_sub(1);
        if let Entry::Occupied(mut count) = self.running_by_namespace.entry(key.namespace().into())
        {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
        if let Some(State::Running { again }) = self.keys.remove(key)
            && let Some(priority) = again
        {
            self.enqueue(key.clone(), priority, true);
        }
    }

    fn enqueue(&mut self, key: K, priority: Priority, front: bool) {
        self.next_entry += 1;
        let entry = self.next_entry;
        self.keys
            .insert(key.clone(), State::Queued { priority, entry });
        self.lanes[priority as usize].push(key, entry, front);
    }
}

/// The keys queued at one priority, by namespace, each namespace first come first served.
struct Lane<K> {
    by_namespace: BTreeMap<String, VecDeque<(K, u64)>>,
    /// The namespace served last: the next turn starts after it.
    last: Option<String>,
}

impl<K> Default for Lane<K> {
    fn default() -> Self {
        Lane {
            by_namespace: BTreeMap::new(),
            last: None,
        }
    }
}

impl<K: Key> Lane<K> {
    fn push(&mut self, key: K, entry: u64, front: bool) {
        let queue = self
            .by_namespace
            .entry(key.namespace().to_owned())
            .or_default();
        if front {
            queue.push_front((key, entry));
        } else {
            queue.push_back((key, entry));
        }
    }

    /// The first live key of the first namespace with room, in turn after the one served
    /// last. Entries no longer live are dropped on the way, and namespaces left empty.
    fn pop(
        &mut self,
        has_room: impl Fn(&str) -> bool,
        live: impl Fn(&K, u64) -> bool,
    ) -> Option<K> {
        let mut cursor = self.last.clone();
        for _ in 0..self.by_namespace.len() {
            let ns = self.after(cursor.as_deref())?;
            let queue = self.by_namespace.get_mut(&ns)?;
            while queue.front().is_some_and(|(key, entry)| !live(key, *entry)) {
                queue.pop_front();
            }
            if queue.is_empty() {
                self.by_namespace.remove(&ns);
            } else if has_room(&ns) {
                let (key, _) = queue.pop_front()?;
                if queue.is_empty() {
                    self.by_namespace.remove(&ns);
                }
                self.last = Some(ns);
                return Some(key);
            }
            cursor = Some(ns);
        }
        None
    }

    /// The namespace after `ns` in turn (round to the first).
    fn after(&self, ns: Option<&str>) -> Option<String> {
        let next = match ns {
            Some(ns) => self
                .by_namespace
                .range::<str, _>((Bound::Excluded(ns), Bound::Unbounded))
                .next(),
            None => None,
        };
        next.or_else(|| self.by_namespace.iter().next())
            .map(|(ns, _)| ns.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Key for (&'static str, u32) {
        fn namespace(&self) -> &str {
            self.0
        }
    }

    type K = (&'static str, u32);

    fn queue(concurrency: usize, bulk: usize, namespace_share: usize) -> Queue<K> {
        Queue::new(Config {
            concurrency,
            bulk,
            namespace_share,
        })
    }

    fn started(q: &mut Queue<K>) -> Vec<K> {
        std::iter::from_fn(|| q.start()).collect()
    }

    #[test]
    fn a_key_runs_once_at_a_time_and_once_more_if_triggered_meanwhile() {
        let mut q = queue(1, 1, 1);
        q.trigger(("a", 1), Priority::Change);
        q.trigger(("a", 2), Priority::Change);
        assert_eq!(q.start(), Some(("a", 1)));
        for _ in 0..3 {
            q.trigger(("a", 1), Priority::Change);
        }
        assert_eq!(q.start(), None, "one slot");
        q.finished(&("a", 1));
        assert_eq!(
            q.start(),
            Some(("a", 1)),
            "once more, before the one behind it"
        );
        q.finished(&("a", 1));
        assert_eq!(q.start(), Some(("a", 2)));
        q.finished(&("a", 2));
        assert_eq!((q.start(), q.running, q.keys.len()), (None, 0, 0));
    }

    #[test]
    fn higher_priorities_go_first_and_a_key_keeps_its_highest() {
        let mut q = queue(1, 1, 1);
        q.trigger(("a", 0), Priority::Change);
        assert_eq!(q.start(), Some(("a", 0)));
        q.trigger(("a", 1), Priority::Bulk);
        q.trigger(("a", 2), Priority::Change);
        q.trigger(("a", 3), Priority::Bulk);
        q.trigger(("a", 3), Priority::Due);
        q.trigger(("a", 2), Priority::Bulk);
        q.finished(&("a", 0));
        let mut order = vec![];
        while let Some(key) = q.start() {
            order.push(key);
            q.finished(&key);
        }
        assert_eq!(order, vec![("a", 3), ("a", 2), ("a", 1)]);
        assert_eq!(
            q.keys.len(),
            0,
            "the entry left behind in the bulk lane ran once"
        );
    }

    #[test]
    fn bulk_work_leaves_slots_free_for_changes() {
        let mut q = queue(4, 2, 4);
        for n in 0..10 {
            q.trigger(("bulk", n), Priority::Bulk);
        }
        assert_eq!(started(&mut q).len(), 2, "two bulk slots of four");
        q.trigger(("bulk", 20), Priority::Change);
        q.trigger(("other", 1), Priority::Change);
        assert_eq!(started(&mut q), vec![("bulk", 20), ("other", 1)]);
        q.finished(&("bulk", 0));
        assert_eq!(started(&mut q), vec![], "four run: no bulk until two do");
        q.finished(&("bulk", 20));
        q.finished(&("other", 1));
        assert_eq!(started(&mut q), vec![("bulk", 2)]);
    }

    #[test]
    fn a_namespace_beyond_its_share_waits_and_namespaces_take_turns() {
        let mut q = queue(10, 10, 2);
        for n in 0..5 {
            q.trigger(("n1", n), Priority::Change);
        }
        for n in 0..2 {
            q.trigger(("n2", n), Priority::Change);
        }
        assert_eq!(
            started(&mut q),
            vec![("n1", 0), ("n2", 0), ("n1", 1), ("n2", 1)],
            "in turn, two each"
        );
        q.trigger(("n3", 0), Priority::Change);
        assert_eq!(
            started(&mut q),
            vec![("n3", 0)],
            "another namespace goes at once"
        );
        q.finished(&("n1", 0));
        assert_eq!(started(&mut q), vec![("n1", 2)]);
        q.trigger(("n1", 9), Priority::Due);
        q.finished(&("n1", 1));
        assert_eq!(
            started(&mut q),
            vec![("n1", 9)],
            "a due key first in its namespace"
        );
    }
}
