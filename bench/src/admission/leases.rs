//! The run's leases as a watch sees them: when each was first seen held by each claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_lease::api::FencedLease;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::RUN_LABEL;
use crate::operator::Operator;
use crate::{Res, fail};

/// By "namespace/name": the holding claim and when the watch first saw it hold.
type Held = HashMap<String, (String, Instant)>;
/// Leases seen, by "namespace/name" (without status too).
type Seen = HashMap<String, ()>;

#[derive(Default)]
struct LeaseState {
    held: Held,
    seen: Seen,
    /// A relist in progress: what it has listed so far.
    relist: Option<(Held, Seen)>,
    synced: bool,
}

/// Records, by a watch on the run's leases, when each is first seen held by each claim.
#[derive(Clone, Default)]
pub(super) struct Leases {
    state: Arc<Mutex<LeaseState>>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl Leases {
    pub(super) fn watch(client: &Client, run: &str) -> Self {
        let leases = Leases::default();
        let api: Api<FencedLease> = Api::all(client.clone());
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
        let state = leases.state.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api, config).boxed();
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let mut guard = state.lock().unwrap();
                let s = &mut *guard;
                match event {
                    Ok(watcher::Event::Init) => s.relist = Some(Default::default()),
                    Ok(watcher::Event::InitApply(l)) => {
                        let k = key(&l.namespace().unwrap_or_default(), &l.name_any());
                        let before = s.held.get(&k).cloned();
                        if let Some((held, seen)) = s.relist.as_mut() {
                            record(held, seen, before, k, &l, now);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some((held, seen)) = s.relist.take() {
                            (s.held, s.seen) = (held, seen);
                        }
                        s.synced = true;
                    }
                    Ok(watcher::Event::Apply(l)) => {
                        let k = key(&l.namespace().unwrap_or_default(), &l.name_any());
                        let before = s.held.get(&k).cloned();
                        record(&mut s.held, &mut s.seen, before, k, &l, now);
                    }
                    Ok(watcher::Event::Delete(l)) => {
                        let k = key(&l.namespace().unwrap_or_default(), &l.name_any());
                        s.held.remove(&k);
                        s.seen.remove(&k);
                    }
                    Err(_) => {}
                }
            }
        });
        leases
    }

    pub(super) async fn synced(&self, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        while !self.state.lock().unwrap().synced {
            if Instant::now() > deadline {
                return fail(format!("the lease watch did not sync within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// When lease `ns/name` was first seen held by `claim`, if it is now.
    pub(super) fn held_by(&self, ns: &str, name: &str, claim: &str) -> Option<Instant> {
        let s = self.state.lock().unwrap();
        s.held
            .get(&key(ns, name))
            .filter(|(c, _)| c == claim)
            .map(|(_, at)| *at)
    }

    /// Leases whose name starts with `prefix` seen, and of them held, and the last time one
    /// was first seen held.
    pub(super) fn tally(&self, prefix: &str) -> (usize, usize, Option<Instant>) {
        let s = self.state.lock().unwrap();
        let matches = |k: &String| {
            k.split_once('/')
                .is_some_and(|(_, n)| n.starts_with(prefix))
        };
        let seen = s.seen.keys().filter(|k| matches(k)).count();
        let held: Vec<Instant> = s
            .held
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, (_, at))| *at)
            .collect();
        (seen, held.len(), held.iter().max().copied())
    }

    /// Waits until lease `ns/name` is held by `claim`; fails after `timeout` or when the
    /// operator exits.
    pub(super) async fn wait_held(
        &self,
        operator: &mut Operator,
        ns: &str,
        name: &str,
        claim: &str,
        timeout: Duration,
    ) -> Res<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.held_by(ns, name, claim) {
                return Ok(at);
            }
            if !operator.alive() {
                return fail("the operator exited");
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "lease {ns}/{name} was not held by claim {claim} within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn record(
    held: &mut Held,
    seen: &mut Seen,
    before: Option<(String, Instant)>,
    k: String,
    lease: &FencedLease,
    now: Instant,
) {
    seen.insert(k.clone(), ());
    let holder = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .map(|h| h.claim.clone());
    match holder {
        Some(claim) => {
            let at = match before {
                Some((c, at)) if c == claim => at,
                _ => now,
            };
            held.insert(k, (claim, at));
        }
        None => {
            held.remove(&k);
        }
    }
}
