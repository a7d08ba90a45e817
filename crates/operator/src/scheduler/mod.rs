//! One scheduler for the reconciles of a kind (the leases; the claims of missing leases): one
//! task owns the queue, the timers and the running reconciles, and is told what to do through
//! a [`Scheduler`] handle. Its rules ([`Config`], [`queue`]): at most so many reconciles at
//! once; one at a time per key (a trigger meanwhile runs the key once more after, not once per
//! trigger); priorities — a timer that is due (a holder's deadline) before a change, a change
//! before bulk work (a sweep of every key after a (re)list; a lease being deleted, which takes
//! several writes), bulk work in fewer slots than all, so a change always finds one free; each
//! namespace within its share, namespaces in turn. Nothing starts before the gate opens (the
//! caches have synced): what comes meanwhile waits in the queue.
//!
//! A trigger starts its reconcile at once when a slot is free: no delay queue stands between
//! a claim's event and its reconcile, on the path of every grant and hand-over.

pub mod queue;

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use self::queue::Queue;
use super::names::LeaseKey;

/// How a scheduler paces its reconciles.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Reconciles at once: bounds the API calls (and connections) in flight, so that an
    /// operator started over thousands of waiting claims works through them instead of
    /// opening thousands of connections at once.
    pub concurrency: usize,
    /// Bulk work starts only while fewer than this many reconciles run, so that
    /// `concurrency - bulk` slots stay free for changes: a new claim is granted at once while
    /// thousands of leases are swept or deleted.
    pub bulk: usize,
    /// Reconciles of one namespace at once at most, whatever their priority: beyond it a
    /// namespace's work waits, so a change in another namespace finds a slot while one
    /// namespace's thousands of claims are released, or its leases deleted.
    pub namespace_share: usize,
}

impl Config {
    /// The lease controller's.
    pub const LEASES: Config = Config {
        concurrency: 32,
        bulk: 24,
        namespace_share: 16,
    };
    /// The claims of missing leases' (only those do any work).
    pub const CLAIMS: Config = Config {
        concurrency: 8,
        bulk: 8,
        namespace_share: 8,
    };
}

/// What a reconcile is for, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// A sweep's, or a lease's being deleted: only in the bulk slots.
    Bulk = 0,
    /// A change: an event of the object, or of one it depends on.
    Change = 1,
    /// A timer that is due: a holder's deadline, a retry, the resync.
    Due = 2,
}

/// A key the scheduler keeps: a namespaced object.
pub trait Key: Clone + Eq + Hash + Send + Sync + 'static {
    fn namespace(&self) -> &str;
}

/// What a scheduler schedules.
pub trait Work<K>: Send + Sync + 'static {
    /// Every key, for a sweep.
    fn all(&self) -> Vec<K>;
    /// Whether every reconcile of `key` is bulk work, whatever triggered it.
    fn is_bulk(&self, key: &K) -> bool;
    /// Reconciles `key`; says when to look again at the latest, if at all.
    fn reconcile(&self, key: K) -> impl Future<Output = Option<Duration>> + Send + 'static;
}

/// How soon a key whose reconcile panicked is tried again.
const AFTER_PANIC: Duration = Duration::from_secs(5);

enum Command<K> {
    Trigger(K, Priority),
    Sweep,
}

/// Tells a scheduler what to reconcile (cheap to clone; sending never waits).
pub struct Scheduler<K> {
    commands: mpsc::UnboundedSender<Command<K>>,
}

impl<K> Clone for Scheduler<K> {
    fn clone(&self) -> Self {
        Scheduler {
            commands: self.commands.clone(),
        }
    }
}

/// The receiving end of a [`Scheduler`], for [`run`].
pub struct Commands<K>(mpsc::UnboundedReceiver<Command<K>>);

impl<K> Scheduler<K> {
    pub fn new() -> (Scheduler<K>, Commands<K>) {
        let (commands, receiver) = mpsc::unbounded_channel();
        (Scheduler { commands }, Commands(receiver))
    }

    /// Reconcile `key`: something it depends on changed.
    pub fn reconcile(&self, key: K) {
        let _ = self.commands.send(Command::Trigger(key, Priority::Change));
    }

    /// Reconcile every key, as bulk work (after a relist: one sweep asked for while another
    /// waits is the same sweep).
    pub fn sweep(&self) {
        let _ = self.commands.send(Command::Sweep);
    }
}

/// Runs the reconciles `commands` and the timers ask for, as `config` says, once `gate`
/// opens (true; false: never), until `stop` or the last [`Scheduler`] is dropped; then
/// waits for those running (each API call has its timeout).
pub async fn run<K: Key, W: Work<K>>(
    config: Config,
    Commands(mut commands): Commands<K>,
    gate: impl Future<Output = bool>,
    work: W,
    stop: CancellationToken,
) {
    let mut queue = Queue::new(config);
    let mut timers = Timers::default();
    let mut running = FuturesUnordered::new();
    let (mut open, mut sweep) = (false, false);
    tokio::pin!(gate);
    loop {
        if open {
            if std::mem::take(&mut sweep) {
                let keys = work.all();
                tracing::debug!(keys = keys.len(), "every key queued as bulk work");
                for key in keys {
                    queue.trigger(key, Priority::Bulk);
                }
            }
            while let Some(key) = queue.start() {
                let task = tokio::spawn(work.reconcile(key.clone()));
                running.push(async move { (key, task.await) });
            }
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            opened = &mut gate, if !open => match opened {
                true => open = true,
                false => break,
            },
            Some((key, result)) = running.next(), if !running.is_empty() => {
                queue.finished(&key);
                let after = result.unwrap_or_else(|error| {
                    tracing::error!(%error, "a reconcile panicked; trying it again later");
                    Some(AFTER_PANIC)
                });
                if let Some(after) = after {
                    timers.at_latest(key, Instant::now() + after);
                }
            }
            // A due timer before the commands: thousands of triggers at once (a mass deletion)
            // must not hold up a holder's deadline.
            Some(key) = timers.next(), if !timers.is_empty() => {
                let priority = if work.is_bulk(&key) { Priority::Bulk } else { Priority::Due };
                queue.trigger(key, priority);
            }
            command = commands.recv() => match command {
                Some(Command::Trigger(key, priority)) => {
                    let priority = if work.is_bulk(&key) { Priority::Bulk } else { priority };
                    queue.trigger(key, priority);
                }
                Some(Command::Sweep) => sweep = true,
                None => break,
            },
        }
    }
    while running.next().await.is_some() {}
}

/// Each key's next reconcile at the latest: one timer per key, the soonest asked for.
struct Timers<K> {
    queue: DelayQueue<K>,
    keys: HashMap<K, (delay_queue::Key, Instant)>,
}

impl<K> Default for Timers<K> {
    fn default() -> Self {
        Timers {
            queue: DelayQueue::new(),
            keys: HashMap::new(),
        }
    }
}

impl<K: Key> Timers<K> {
    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// `key` is to be reconciled at `when` at the latest: a sooner timer stays, a later one
    /// moves to `when`. (One that comes too soon costs a reconcile that sets the next.)
    fn at_latest(&mut self, key: K, when: Instant) {
        match self.keys.get_mut(&key) {
            Some((_, at)) if *at <= when => {}
            Some((slot, at)) => {
                self.queue.reset_at(slot, when);
                *at = when;
            }
            None => {
                let slot = self.queue.insert_at(key.clone(), when);
                self.keys.insert(key, (slot, when));
            }
        }
    }

    /// The next key whose timer is due.
    async fn next(&mut self) -> Option<K> {
        let key = self.queue.next().await?.into_inner();
        self.keys.remove(&key);
        Some(key)
    }
}

impl Key for LeaseKey {
    fn namespace(&self) -> &str {
        LeaseKey::namespace(self)
    }
}

/// A namespaced object's namespace and name.
impl Key for (String, String) {
    fn namespace(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    impl Key for u32 {
        fn namespace(&self) -> &str {
            "ns"
        }
    }

    /// Reconciles that take 10 ms, recording which keys ran; key 0 is bulk work.
    #[derive(Clone, Default)]
    struct Probe {
        ran: Arc<Mutex<Vec<u32>>>,
        requeue: Option<Duration>,
    }

    impl Work<u32> for Probe {
        fn all(&self) -> Vec<u32> {
            vec![1, 2, 3]
        }
        fn is_bulk(&self, key: &u32) -> bool {
            *key == 0
        }
        fn reconcile(&self, key: u32) -> impl Future<Output = Option<Duration>> + Send + 'static {
            let (ran, requeue) = (self.ran.clone(), self.requeue);
            async move {
                ran.lock().unwrap().push(key);
                tokio::time::sleep(Duration::from_millis(10)).await;
                requeue.filter(|_| ran.lock().unwrap().len() < 3)
            }
        }
    }

    impl Probe {
        fn ran(&self) -> Vec<u32> {
            self.ran.lock().unwrap().clone()
        }
    }

    fn start(
        probe: &Probe,
        gate: tokio::sync::oneshot::Receiver<bool>,
    ) -> (
        Scheduler<u32>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (scheduler, commands) = Scheduler::new();
        let stop = CancellationToken::new();
        let gate = async move { gate.await.unwrap_or(false) };
        let task = tokio::spawn(run(
            Config::CLAIMS,
            commands,
            gate,
            probe.clone(),
            stop.clone(),
        ));
        (scheduler, stop, task)
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_gate_opens_and_a_sweep_runs_every_key_once() {
        let probe = Probe::default();
        let (gate, opened) = tokio::sync::oneshot::channel();
        let (scheduler, stop, task) = start(&probe, opened);
        scheduler.reconcile(2);
        scheduler.sweep();
        scheduler.sweep();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(probe.ran().is_empty(), "the gate is closed");
        gate.send(true).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            probe.ran(),
            vec![2, 1, 3],
            "the change first, then the sweep"
        );
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_back_after_its_delay() {
        let probe = Probe {
            requeue: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let (gate, opened) = tokio::sync::oneshot::channel();
        let (scheduler, stop, task) = start(&probe, opened);
        gate.send(true).unwrap();
        scheduler.reconcile(7);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(probe.ran(), vec![7], "not before its delay");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(probe.ran(), vec![7, 7], "again after it");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_later_timer_moves_an_earlier_one_only_sooner() {
        let mut timers = Timers::default();
        let now = Instant::now();
        timers.at_latest(1u32, now + Duration::from_millis(300));
        timers.at_latest(1, now + Duration::from_secs(60));
        timers.at_latest(2, now + Duration::from_secs(60));
        timers.at_latest(2, now + Duration::from_millis(100));
        assert_eq!(timers.next().await, Some(2));
        assert_eq!(timers.next().await, Some(1));
        assert!(timers.is_empty());
    }
}
