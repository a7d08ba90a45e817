//! Grants as a watch on the claims sees them: when each claim was first seen `Granted`; and,
//! when a claim was not granted in time, the report of everything worth knowing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::operator::Operator;
use crate::{Res, fail};

#[derive(Default)]
struct GrantState {
    /// Current phase by "namespace/name" (`None`: no status yet).
    phase: HashMap<String, Option<ClaimPhase>>,
    /// When each claim was first seen Granted.
    granted_at: HashMap<String, Instant>,
    /// When each claim was first seen at all.
    seen_at: HashMap<String, Instant>,
    synced: bool,
}

/// Records, by a watch on claims, when each is first seen `Granted`.
#[derive(Clone, Default)]
pub struct Grants {
    state: Arc<Mutex<GrantState>>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl Grants {
    /// Watches the claims of `namespace` (all namespaces when `None`).
    pub fn watch(client: &Client, namespace: Option<&str>) -> Self {
        let grants = Grants::default();
        let api: Api<FencedLeaseClaim> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let state = grants.state.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let mut s = state.lock().unwrap();
                match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        let k = key(&c.namespace().unwrap_or_default(), &c.name_any());
                        let phase = c.status.as_ref().and_then(|s| s.phase);
                        if phase == Some(ClaimPhase::Granted) {
                            s.granted_at.entry(k.clone()).or_insert(now);
                        }
                        s.seen_at.entry(k.clone()).or_insert(now);
                        s.phase.insert(k, phase);
                    }
                    Ok(watcher::Event::Delete(c)) => {
                        s.phase
                            .remove(&key(&c.namespace().unwrap_or_default(), &c.name_any()));
                    }
                    Ok(watcher::Event::InitDone) => s.synced = true,
                    Ok(watcher::Event::Init) | Err(_) => {}
                }
            }
        });
        grants
    }

    pub async fn synced(&self) {
        while !self.state.lock().unwrap().synced {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn granted_at(&self, ns: &str, name: &str) -> Option<Instant> {
        self.state
            .lock()
            .unwrap()
            .granted_at
            .get(&key(ns, name))
            .copied()
    }

    /// Waits until claim `ns/name` is seen Granted; fails after `timeout`.
    pub async fn wait(&self, ns: &str, name: &str, timeout: Duration) -> Res<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.granted_at(ns, name) {
                return Ok(at);
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "claim {ns}/{name} was not granted within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Claims of `ns` whose name starts with `prefix` that the watch sees with a status.
    pub fn answered(&self, ns: &str, prefix: &str) -> usize {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/{prefix}");
        s.phase
            .iter()
            .filter(|(k, p)| k.starts_with(&prefix) && p.is_some())
            .count()
    }

    /// Waits until `count` claims of `ns` named `prefix...` have a status; fails after `timeout`.
    pub async fn wait_answered(
        &self,
        ns: &str,
        prefix: &str,
        count: usize,
        timeout: Duration,
    ) -> Res<Duration> {
        let started = Instant::now();
        loop {
            let answered = self.answered(ns, prefix);
            if answered >= count {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                return fail(format!(
                    "{answered} of {count} claims {ns}/{prefix}* had a status after {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Claims of namespace `ns` ever seen Granted, and the instants of the first and last grant.
    pub fn granted_in(&self, ns: &str) -> (usize, Option<Instant>, Option<Instant>) {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/");
        let times: Vec<Instant> = s
            .granted_at
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, t)| *t)
            .collect();
        (
            times.len(),
            times.iter().min().copied(),
            times.iter().max().copied(),
        )
    }

    /// Every grant time in namespace `ns`.
    pub fn grant_times(&self, ns: &str) -> Vec<Instant> {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/");
        s.granted_at
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, t)| *t)
            .collect()
    }

    /// How many claims of `ns` the watch sees in each phase now.
    pub fn phases(&self, ns: &str) -> BTreeMap<String, usize> {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/");
        let mut counts = BTreeMap::new();
        for (_, phase) in s.phase.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            let name = phase.map_or("no status".to_string(), |p| format!("{p:?}"));
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }
}

/// Every object `api` lists, 1,000 a page; `None` when a page cannot be listed.
async fn list_all<K>(api: &Api<K>) -> Option<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut all = vec![];
    let mut continue_token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(1000);
        if let Some(c) = &continue_token {
            lp = lp.continue_token(c);
        }
        let page = api.list(&lp).await.ok()?;
        all.extend(page.items);
        continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
        if continue_token.is_none() {
            return Some(all);
        }
    }
}

/// The state of namespace `ns` as the API has it: claims by phase, leases held or not.
async fn api_state(client: &Client, ns: &str) -> String {
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let Some(claims) = list_all(&claims).await else {
        return "cannot list claims".into();
    };
    for c in &claims {
        let phase = c
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or("no status".into(), |p| format!("{p:?}"));
        *phases.entry(phase).or_insert(0) += 1;
    }
    let Some(leases) = list_all(&leases).await else {
        return "cannot list leases".into();
    };
    let (mut held, mut free, mut no_finalizer, mut no_status) = (0, 0, 0, 0);
    for l in &leases {
        match l.status.as_ref() {
            None => no_status += 1,
            Some(s) if s.holder.is_some() => held += 1,
            Some(_) => free += 1,
        }
        if l.finalizers().is_empty() {
            no_finalizer += 1;
        }
    }
    format!(
        "namespace {ns} (from the API): claims {phases:?}; leases: {held} held, {free} free, {no_status} without status, {no_finalizer} without the finalizer"
    )
}

/// Everything worth knowing when a claim was not granted in time.
pub async fn failure_report(
    client: &Client,
    operator: &Operator,
    namespaces: &[&str],
    grants: &Grants,
) -> String {
    let mut out = vec![
        "---- operator state at the failure ----".to_string(),
        operator.proc_line(),
    ];
    for ns in namespaces {
        out.push(format!(
            "namespace {ns} (as the bench's watch sees it): claims {:?}",
            grants.phases(ns)
        ));
        out.push(api_state(client, ns).await);
    }
    out.push(format!("operator metrics:\n{}", operator.metrics()));
    out.push(operator.log_summary());
    out.join("\n")
}
