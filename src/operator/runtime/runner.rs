//! Runs a reconcile per key sent on a channel, for the leases and for the claims of missing
//! leases: at most `concurrency` at once, one at a time per key (a trigger for a key being
//! reconciled runs it once more after, not once per trigger), the keys waiting for a slot in
//! the order they came, and a requeue the reconcile asks for run after its delay unless a
//! trigger ran the key first.
//!
//! A trigger starts its reconcile at once when a slot is free: no delay queue stands between a
//! claim's event and its reconcile, on the path of every grant and hand-over (a queue whose
//! deadlines are whole milliseconds rounded up costs 1–3 ms there), and keys waiting for a
//! slot start in the order they came, not in hash order.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

/// How soon a key whose reconcile panicked is tried again.
const AFTER_PANIC: Duration = Duration::from_secs(5);

/// Reconciles each key from `triggers` with `reconcile`, which says when to look again, if
/// at all. Until `stop` or the end of `triggers`; then waits for those running.
pub async fn run<K, F, Fut>(
    concurrency: usize,
    mut triggers: UnboundedReceiver<K>,
    stop: CancellationToken,
    reconcile: F,
) where
    K: Clone + Eq + Hash + Send + 'static,
    F: Fn(K) -> Fut,
    Fut: Future<Output = Option<Duration>> + Send + 'static,
{
    let mut schedule = Schedule::<K>::new(concurrency);
    let mut later = Later::default();
    let mut running = FuturesUnordered::new();
    loop {
        while let Some(key) = schedule.start() {
            let task = tokio::spawn(reconcile(key.clone()));
            running.push(async move { (key, task.await) });
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            Some((key, result)) = running.next(), if !running.is_empty() => {
                let after = result.unwrap_or_else(|error| {
                    tracing::error!(%error, "a reconcile panicked; trying it again later");
                    Some(AFTER_PANIC)
                });
                if let (false, Some(after)) = (schedule.finished(&key), after) {
                    later.insert(key, after);
                }
            }
            key = triggers.recv() => match key {
                Some(key) => {
                    later.remove(&key);
                    schedule.trigger(key);
                }
                None => break,
            },
            Some(key) = later.next(), if !later.is_empty() => schedule.trigger(key),
        }
    }
    // Those running finish (each API call has its timeout).
    while running.next().await.is_some() {}
}

/// Which keys wait for a slot (in the order they came) and which run.
struct Schedule<K> {
    waiting: VecDeque<K>,
    /// Every key waiting or running; for a running key, whether it runs once more after.
    keys: HashMap<K, Run>,
    running: usize,
    concurrency: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    Waiting,
    Running { again: bool },
}

impl<K: Clone + Eq + Hash> Schedule<K> {
    fn new(concurrency: usize) -> Self {
        Schedule {
            waiting: VecDeque::new(),
            keys: HashMap::new(),
            running: 0,
            concurrency: concurrency.max(1),
        }
    }

    /// `key` was triggered: it waits at the back, unless it already waits (it keeps its
    /// place) or runs (it runs once more after).
    fn trigger(&mut self, key: K) {
        match self.keys.entry(key) {
            Entry::Occupied(mut run) => {
                if let Run::Running { again } = run.get_mut() {
                    *again = true;
                }
            }
            Entry::Vacant(entry) => {
                self.waiting.push_back(entry.key().clone());
                entry.insert(Run::Waiting);
            }
        }
    }

    /// The next key to run, if a slot is free.
    fn start(&mut self) -> Option<K> {
        if self.running >= self.concurrency {
            return None;
        }
        let key = self.waiting.pop_front()?;
        self.keys.insert(key.clone(), Run::Running { again: false });
        self.running += 1;
        Some(key)
    }

    /// `key`'s reconcile finished. Returns whether it runs once more (it was triggered while
    /// it ran): first of those waiting, since it was admitted before them.
    fn finished(&mut self, key: &K) -> bool {
        self.running = self.running.saturating_sub(1);
        match self.keys.get_mut(key) {
            Some(run @ Run::Running { again: true }) => {
                *run = Run::Waiting;
                self.waiting.push_front(key.clone());
                true
            }
            _ => {
                self.keys.remove(key);
                false
            }
        }
    }
}

/// Requeues waiting for their delay, one per key.
struct Later<K> {
    queue: DelayQueue<K>,
    keys: HashMap<K, delay_queue::Key>,
}

impl<K> Default for Later<K> {
    fn default() -> Self {
        Later {
            queue: DelayQueue::new(),
            keys: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Later<K> {
    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn insert(&mut self, key: K, after: Duration) {
        // A key that runs has none here (its trigger removed it), so this is its only one.
        self.remove(&key);
        let slot = self
            .queue
            .insert_at(key.clone(), tokio::time::Instant::now() + after);
        self.keys.insert(key, slot);
    }

    /// A trigger runs `key` now: its requeue is moot.
    fn remove(&mut self, key: &K) {
        if let Some(slot) = self.keys.remove(key) {
            self.queue.remove(&slot);
        }
    }

    /// The next key whose delay is over.
    async fn next(&mut self) -> Option<K> {
        let expired = self.queue.next().await?;
        let key = expired.into_inner();
        self.keys.remove(&key);
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::sync::mpsc::unbounded_channel;

    use super::*;

    /// A reconcile that takes 10 ms, records how many run at once and which keys ran.
    #[derive(Clone, Default)]
    struct Probe {
        running: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        ran: Arc<Mutex<Vec<u32>>>,
    }

    impl Probe {
        async fn reconcile(self, key: u32, requeue: Option<Duration>) -> Option<Duration> {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            self.ran.lock().unwrap().push(key);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            requeue.filter(|_| self.ran.lock().unwrap().len() < 3)
        }

        fn ran(&self) -> Vec<u32> {
            self.ran.lock().unwrap().clone()
        }
    }

    fn start(
        probe: &Probe,
        concurrency: usize,
        requeue: Option<Duration>,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<u32>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = unbounded_channel();
        let stop = CancellationToken::new();
        let p = probe.clone();
        let runner = tokio::spawn(run(concurrency, rx, stop.clone(), move |k| {
            p.clone().reconcile(k, requeue)
        }));
        (tx, stop, runner)
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_concurrency_at_once_and_a_key_never_twice_at_once() {
        let probe = Probe::default();
        let (tx, stop, runner) = start(&probe, 2, None);
        // Key 1 three times while it runs: once more after, not twice more, never at once.
        for key in [1, 1, 1, 2, 3, 4] {
            tx.send(key).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.cancel();
        runner.await.unwrap();
        let mut ran = probe.ran();
        ran.sort();
        assert_eq!(ran, vec![1, 1, 2, 3, 4]);
        assert_eq!(probe.most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_waiting_for_a_slot_start_in_the_order_they_came() {
        let probe = Probe::default();
        let (tx, stop, runner) = start(&probe, 1, None);
        for key in [9, 3, 7, 1, 8, 2] {
            tx.send(key).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.cancel();
        runner.await.unwrap();
        assert_eq!(probe.ran(), vec![9, 3, 7, 1, 8, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_back_after_its_delay() {
        let probe = Probe::default();
        let (tx, stop, runner) = start(&probe, 4, Some(Duration::from_secs(5)));
        tx.send(7).unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(probe.ran().len(), 1, "not before its delay");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(probe.ran().len(), 2, "again after it");
        stop.cancel();
        runner.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_before_the_delay_replaces_the_requeue() {
        let probe = Probe::default();
        let (tx, stop, runner) = start(&probe, 4, Some(Duration::from_secs(5)));
        tx.send(7).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        tx.send(7).unwrap(); // runs now; its own requeue is due at 6 s, the first one is moot
        tokio::time::sleep(Duration::from_millis(4_500)).await;
        assert_eq!(probe.ran(), vec![7, 7], "the first requeue was dropped");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(probe.ran(), vec![7, 7, 7], "the second one came");
        stop.cancel();
        runner.await.unwrap();
    }

    #[test]
    fn a_key_triggered_while_it_runs_goes_first_when_it_finishes() {
        let mut s = Schedule::new(1);
        s.trigger(1);
        assert_eq!(s.start(), Some(1));
        s.trigger(2);
        s.trigger(1);
        s.trigger(1);
        assert_eq!(s.start(), None, "one slot");
        assert!(s.finished(&1), "runs once more");
        assert_eq!(s.start(), Some(1));
        assert!(!s.finished(&1));
        assert_eq!(s.start(), Some(2));
        assert!(!s.finished(&2));
        assert_eq!(s.start(), None);
        assert!(s.keys.is_empty());
    }
}
