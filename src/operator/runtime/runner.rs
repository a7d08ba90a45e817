//! Runs a reconcile per key sent on a channel: at most `concurrency` at once, one at a time
//! per key (a trigger for a key being reconciled runs it once more after), and a requeue the
//! reconcile asks for comes back through the same channel. For the claims of missing leases,
//! which kube-runtime's controller cannot run: it needs the full API type in its cache.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

/// Reconciles each key from `triggers` with `reconcile`, which says when to look again, if
/// at all (that key is then sent on `again`). Until `stop`; then waits for those running.
pub async fn run<K, F, Fut>(
    concurrency: usize,
    mut triggers: UnboundedReceiver<K>,
    again: UnboundedSender<K>,
    stop: CancellationToken,
    reconcile: F,
) where
    K: Clone + Eq + Hash + Send + 'static,
    F: Fn(K) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<Duration>> + Send,
{
    let slots = Arc::new(Semaphore::new(concurrency));
    // Keys queued or running, and whether a trigger came for them meanwhile.
    let busy: Arc<Mutex<HashMap<K, bool>>> = Default::default();
    loop {
        let key = tokio::select! {
            _ = stop.cancelled() => break,
            key = triggers.recv() => match key {
                Some(key) => key,
                None => break,
            },
        };
        {
            let mut busy = lock(&busy);
            if let Some(retrigger) = busy.get_mut(&key) {
                *retrigger = true;
                continue;
            }
            busy.insert(key.clone(), false);
        }
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (busy, again, reconcile) = (busy.clone(), again.clone(), reconcile.clone());
        tokio::spawn(async move {
            let later = loop {
                let later = reconcile(key.clone()).await;
                let mut busy = lock(&busy);
                match busy.get_mut(&key) {
                    Some(retrigger) if *retrigger => *retrigger = false,
                    _ => {
                        busy.remove(&key);
                        break later;
                    }
                }
            };
            drop(slot);
            if let Some(after) = later {
                tokio::time::sleep(after).await;
                let _ = again.send(key);
            }
        });
    }
    // Those running finish (each API call has its timeout).
    let _ = slots
        .acquire_many(u32::try_from(concurrency).unwrap_or(u32::MAX))
        .await;
}

/// Nothing panics while holding it; were it poisoned, its map is still whole.
fn lock<K>(busy: &Mutex<HashMap<K, bool>>) -> std::sync::MutexGuard<'_, HashMap<K, bool>> {
    busy.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

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
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_concurrency_at_once_and_a_key_never_twice_at_once() {
        let probe = Probe::default();
        let (tx, rx) = unbounded_channel();
        let stop = CancellationToken::new();
        let p = probe.clone();
        let runner = tokio::spawn(run(2, rx, tx.clone(), stop.clone(), move |k| {
            p.clone().reconcile(k, None)
        }));
        // Key 1 three times while it runs: once more after, not twice more, never at once.
        for key in [1, 1, 1, 2, 3, 4] {
            tx.send(key).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.cancel();
        runner.await.unwrap();
        let mut ran = probe.ran.lock().unwrap().clone();
        ran.sort();
        assert_eq!(ran, vec![1, 1, 2, 3, 4]);
        assert_eq!(probe.most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_back_after_its_delay() {
        let probe = Probe::default();
        let (tx, rx) = unbounded_channel();
        let stop = CancellationToken::new();
        let p = probe.clone();
        let runner = tokio::spawn(run(4, rx, tx.clone(), stop.clone(), move |k| {
            p.clone().reconcile(k, Some(Duration::from_secs(5)))
        }));
        tx.send(7).unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(probe.ran.lock().unwrap().len(), 1, "not before its delay");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(probe.ran.lock().unwrap().len(), 2, "again after it");
        stop.cancel();
        runner.await.unwrap();
    }
}
