//! Leader election among operator replicas on a `coordination.k8s.io/v1` Lease: only the
//! leader reconciles. Every write carries the Lease's resourceVersion, and a leader that
//! cannot renew within `renew_deadline` (shorter than the lease) steps down before another
//! replica may take over: a timer enforces the deadline, whatever a slow API call is doing,
//! and the caller aborts its reconciles on [`Leadership::lost`]. A deposed leader's in-flight
//! lease-status writes fail on their own resourceVersion anyway, so two replicas never both
//! issue a token.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{Error, Result, timed};

/// Held leadership.
pub struct Leadership {
    /// Cancelled when leadership is lost (the renew deadline passed, or another replica
    /// holds the Lease): stop writing at once.
    pub lost: CancellationToken,
    /// Cancel once the controllers have stopped: the renewal task then hands the Lease back.
    pub release: CancellationToken,
    /// The renewal task. Await it after cancelling `release` before exiting, or a standby
    /// waits out the whole lease duration.
    pub renewal: tokio::task::JoinHandle<()>,
}

/// How this replica competes for leadership.
#[derive(Clone, Debug)]
pub struct Election {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long others wait, after last seeing a renewal, before taking over.
    pub lease_duration: Duration,
    /// The leader steps down when it has not renewed for this long.
    pub renew_deadline: Duration,
    /// Interval between attempts and renewals.
    pub retry_period: Duration,
    pub api_timeout: Duration,
}

impl Election {
    fn api(&self, client: &Client) -> Api<Lease> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// Waits until this replica leads (or `stop` is cancelled: `Ok(None)`). Renewal runs until
    /// leadership is lost or [`Leadership::release`] is cancelled, after which the Lease is
    /// released so a standby takes over at once.
    pub async fn lead(
        &self,
        client: &Client,
        stop: &CancellationToken,
    ) -> Result<Option<Leadership>> {
        let api = self.api(client);
        let mut seen: Option<(Option<String>, Option<MicroTime>, Instant)> = None;
        loop {
            if stop.is_cancelled() {
                return Ok(None);
            }
            match self.try_acquire(&api, &mut seen).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => warn!(error = %e, lease = %self.name, "leader election attempt failed"),
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(None),
                () = tokio::time::sleep(self.retry_period) => {}
            }
        }
        info!(identity = %self.identity, lease = %self.name, namespace = %self.namespace, "became leader");
        let lost = CancellationToken::new();
        let release = CancellationToken::new();
        let renewal = tokio::spawn(self.clone().renew(api, lost.clone(), release.clone()));
        Ok(Some(Leadership {
            lost,
            release,
            renewal,
        }))
    }

    /// One attempt: create the Lease, or take it when free, ours, or not renewed for a full
    /// lease duration as observed on our own clock.
    async fn try_acquire(
        &self,
        api: &Api<Lease>,
        seen: &mut Option<(Option<String>, Option<MicroTime>, Instant)>,
    ) -> Result<bool> {
        let now = Instant::now();
        let Some(current) = timed(
            "get leader lease",
            self.api_timeout,
            api.get_opt(&self.name),
        )
        .await?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None)),
            };
            return match timed(
                "create leader lease",
                self.api_timeout,
                api.create(&PostParams::default(), &lease),
            )
            .await
            {
                Ok(_) => Ok(true),
                Err(e) if e.is_conflict() => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let free = holder.is_none() || holder.as_deref() == Some(self.identity.as_str());
        let observation = (holder.clone(), spec.renew_time.clone());
        let changed_at = match seen {
            Some((h, r, at)) if (h.clone(), r.clone()) == observation => *at,
            _ => now,
        };
        *seen = Some((observation.0, observation.1, changed_at));
        if !free && now.duration_since(changed_at) < self.lease_duration {
            return Ok(false);
        }
        let mut next = current.clone();
        next.spec = Some(self.spec(Some(&spec)));
        match self.replace(api, "take leader lease", &next).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `next` over the Lease, on the resourceVersion it was read at.
    async fn replace(&self, api: &Api<Lease>, what: &'static str, next: &Lease) -> Result<Lease> {
        let params = PostParams::default();
        timed(
            what,
            self.api_timeout,
            api.replace(&self.name, &params, next),
        )
        .await
    }

    fn spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let ours =
            previous.and_then(|p| p.holder_identity.as_deref()) == Some(self.identity.as_str());
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    async fn renew(self, api: Api<Lease>, lost: CancellationToken, release: CancellationToken) {
        let mut last_renew_sent = Instant::now();
        loop {
            // The deadline is a timer of its own: a renewal stuck in a slow call cannot keep
            // this replica leading past it.
            let deadline = tokio::time::Instant::from_std(last_renew_sent + self.renew_deadline);
            tokio::select! {
                () = release.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => return self.step_down(&lost),
                () = tokio::time::sleep(self.retry_period) => {}
            }
            let sent = Instant::now();
            let renewed = tokio::select! {
                () = release.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => return self.step_down(&lost),
                r = self.renew_once(&api) => r,
            };
            match renewed {
                Ok(true) => last_renew_sent = sent,
                Ok(false) => {
                    warn!(identity = %self.identity, "another replica holds the leader lease; stepping down");
                    lost.cancel();
                    return;
                }
                Err(e) => warn!(error = %e, "leader lease renewal failed"),
            }
        }
        self.release(&api).await;
    }

    fn step_down(&self, lost: &CancellationToken) {
        warn!(identity = %self.identity, deadline = ?self.renew_deadline, "could not renew the leader lease in time; stepping down");
        lost.cancel();
    }

    async fn renew_once(&self, api: &Api<Lease>) -> Result<bool> {
        let current = timed("get leader lease", self.api_timeout, api.get(&self.name)).await?;
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        let mut next = current;
        next.spec = Some(self.spec(Some(&spec)));
        match self.replace(api, "renew leader lease", &next).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() => Err(Error::Contended(self.name.clone())),
            Err(e) => Err(e),
        }
    }

    /// Hands the Lease back on shutdown so a standby does not wait out the lease duration.
    async fn release(&self, api: &Api<Lease>) {
        let Ok(current) = timed("get leader lease", self.api_timeout, api.get(&self.name)).await
        else {
            return;
        };
        let mut spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        let mut next = current;
        next.spec = Some(spec);
        match self.replace(api, "release leader lease", &next).await {
            Ok(_) => info!(identity = %self.identity, "released the leader lease"),
            Err(e) => warn!(error = %e, "could not release the leader lease"),
        }
    }
}
