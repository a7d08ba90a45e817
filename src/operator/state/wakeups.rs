//! When each lease is to be reconciled again at the latest: its holder's deadline, a waiter's,
//! or the jittered resync. One timer per lease, kept here rather than as a controller requeue:
//! the controller's delay queue holds two copies of each request (a delay-queue slot and a
//! map key, each with its own name and namespace strings); this keeps one shared name per
//! lease.
//! A due lease goes to the same trigger channel as every other reconcile request.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::FencedLease;
use crate::operator::names::{joined_name, split_name};

/// The next wake-up of every lease that has one.
#[derive(Debug, Default)]
pub struct Wakeups {
    inner: Mutex<Inner>,
    /// A wake-up earlier than the one the timer task sleeps for was set.
    sooner: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// `(when, joined name)` ([`joined_name`]), soonest first.
    due: BTreeSet<(Instant, Arc<str>)>,
    /// The wake-up of each lease, by joined name.
    at: HashMap<Arc<str>, Instant>,
}

impl Wakeups {
    /// Lease `ns/name` is to be reconciled at `when`: this replaces its earlier wake-up (each
    /// reconcile decides the next one from what it has just seen).
    pub fn set(&self, ns: &str, name: &str, when: std::time::Instant) {
        let when = Instant::from_std(when);
        let key = joined_name(ns, name);
        let mut inner = self.lock();
        let soonest = inner.due.first().map(|(t, _)| *t);
        let shared: Arc<str> = match inner.at.get_key_value(key.as_str()) {
            Some((_, &old)) if old == when => return,
            Some((shared, &old)) => {
                let shared = shared.clone();
                inner.due.remove(&(old, shared.clone()));
                shared
            }
            None => Arc::from(key),
        };
        inner.due.insert((when, shared.clone()));
        inner.at.insert(shared, when);
        drop(inner);
        if soonest.is_none_or(|t| when < t) {
            self.sooner.notify_one();
        }
    }

    /// Lease `ns/name` is gone: no more wake-ups.
    pub fn forget(&self, ns: &str, name: &str) {
        let mut inner = self.lock();
        if let Some((shared, when)) = inner.at.remove_entry(joined_name(ns, name).as_str()) {
            inner.due.remove(&(when, shared));
        }
    }

    /// Leases with a wake-up.
    pub fn len(&self) -> usize {
        self.lock().at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the leases due at `now`, and tells when the next one is.
    fn take_due(&self, now: Instant) -> (Vec<ObjectRef<FencedLease>>, Option<Instant>) {
        let mut inner = self.lock();
        let mut due = vec![];
        while let Some((when, _)) = inner.due.first()
            && *when <= now
        {
            let Some((_, key)) = inner.due.pop_first() else {
                break;
            };
            inner.at.remove(&key);
            if let Some((ns, name)) = split_name(&key) {
                due.push(ObjectRef::new(name).within(ns));
            }
        }
        (due, inner.due.first().map(|(t, _)| *t))
    }

    /// Sends each lease to `triggers` when it is due, until `stop`.
    pub async fn run(
        self: Arc<Self>,
        triggers: mpsc::UnboundedSender<ObjectRef<FencedLease>>,
        stop: CancellationToken,
    ) {
        // With nothing due, look again now and then anyway (a missed notification costs this).
        const IDLE: Duration = Duration::from_secs(60);
        loop {
            let (due, next) = self.take_due(Instant::now());
            for lease in due {
                if triggers.send(lease).is_err() {
                    return;
                }
            }
            let until = next.unwrap_or_else(|| Instant::now() + IDLE);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(until) => {}
                () = self.sooner.notified() => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        super::locked(&self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_has_one_wake_up_the_last_set() {
        let w = Wakeups::default();
        let t0 = std::time::Instant::now();
        let base = Instant::from_std(t0);
        w.set("ns", "a", t0 + Duration::from_secs(10));
        w.set("ns", "b", t0 + Duration::from_secs(5));
        w.set("ns", "a", t0 + Duration::from_secs(3));
        assert_eq!(w.len(), 2);
        let (due, next) = w.take_due(base + Duration::from_secs(4));
        assert_eq!(due, vec![ObjectRef::new("a").within("ns")]);
        assert_eq!(next, Some(base + Duration::from_secs(5)));
        // A later wake-up replaces an earlier one too.
        w.set("ns", "b", t0 + Duration::from_secs(20));
        let (due, next) = w.take_due(base + Duration::from_secs(6));
        assert!(due.is_empty());
        assert_eq!(next, Some(base + Duration::from_secs(20)));
        w.forget("ns", "b");
        assert!(w.is_empty());
        assert_eq!(w.take_due(base + Duration::from_secs(30)), (vec![], None));
    }

    #[tokio::test(start_paused = true)]
    async fn due_leases_are_triggered_at_their_time_and_not_before() {
        let w = Arc::new(Wakeups::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(w.clone().run(tx, stop.clone()));
        let start = Instant::now();
        w.set("ns", "late", (start + Duration::from_secs(30)).into_std());
        tokio::task::yield_now().await;
        // Set while the task sleeps for a later one: it wakes for this one.
        w.set("ns", "soon", (start + Duration::from_secs(2)).into_std());
        assert_eq!(rx.recv().await, Some(ObjectRef::new("soon").within("ns")));
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        assert_eq!(rx.recv().await, Some(ObjectRef::new("late").within("ns")));
        assert_eq!(Instant::now() - start, Duration::from_secs(30));
        stop.cancel();
        task.await.unwrap();
    }
}
