//! Creating a holder's claim: under a fresh name, stamped with its creator (I7), a create whose
//! answer was lost retried under the same name and adopted if it had succeeded, withdrawn when
//! the wait gives up.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use tokio::time::timeout;

use super::budget::Budget;
use super::claim::{claim_name, creator_annotations, new_claim};
use super::clock::BootInstant;
use super::error::{Error, report};
use super::options::PodRef;
use crate::api::{ClaimPhase, FencedLeaseClaim};

/// Creating this holder's claim.
pub(super) struct ClaimRequest<'a> {
    pub(super) api: &'a Api<FencedLeaseClaim>,
    pub(super) lease: &'a str,
    pub(super) identity: &'a str,
    pub(super) pod: Option<&'a PodRef>,
    /// Where this holder learns who the apiserver takes it for (`SelfSubjectReview`).
    pub(super) reviews: Api<SelfSubjectReview>,
    /// Its creator annotations, learned once per acquire and stamped on every claim it makes.
    pub(super) creator: tokio::sync::OnceCell<BTreeMap<String, String>>,
    pub(super) call_timeout: Duration,
}

impl ClaimRequest<'_> {
    /// Creates a claim under a fresh name; returns it and the send time of the first attempt
    /// that may have created it. A create whose answer was lost (timeout, connection reset,
    /// 5xx) is tried again under the same name: 409 then means an earlier attempt created it,
    /// and that claim is adopted (it keeps its place). Giving up, the claim is deleted by name
    /// in case it exists.
    pub(super) async fn create(
        &self,
        budget: &Budget,
    ) -> Result<(FencedLeaseClaim, BootInstant), Error> {
        let creator = self.creator(budget).await?;
        let mut name = claim_name(self.lease);
        let mut first_sent: Option<BootInstant> = None;
        let mut attempt = 0;
        let outcome = loop {
            let sent = BootInstant::now();
            let claim = new_claim(
                &name,
                self.lease,
                self.identity,
                self.pod,
                creator,
                Timestamp::now(),
            );
            let params = PostParams::default();
            let result = match budget
                .call(
                    "create FencedLeaseClaim",
                    self.call_timeout,
                    self.api.create(&params, &claim),
                )
                .await
            {
                Ok(result) => result,
                Err(cancelled) => {
                    // The request may have reached the apiserver.
                    first_sent.get_or_insert(sent);
                    break Err(cancelled);
                }
            };
            let error = match result {
                Ok(created) => return Ok((created, first_sent.unwrap_or(sent))),
                Err(error) => error,
            };
            if is_conflict(&error) {
                if first_sent.is_some() {
                    match self.adopt(&name, budget).await {
                        Ok(Some(existing)) => {
                            tracing::info!(claim = %name, "an earlier create had succeeded; keeping that claim");
                            return Ok((existing, first_sent.unwrap_or(sent)));
                        }
                        Ok(None) => {}
                        Err(error) => break Err(error),
                    }
                }
                // Not ours, or over: another name.
                name = claim_name(self.lease);
                first_sent = None;
                continue;
            }
            if error.is_transient() {
                first_sent.get_or_insert(sent);
            }
            attempt += 1;
            if let Err(error) = budget.pause(attempt, error).await {
                break Err(error);
            }
        };
        if first_sent.is_some() {
            self.withdraw(&name).await;
        }
        outcome
    }

    /// The creator annotations of this holder's claims (I7): its username and, from a pod,
    /// the pod's name and UID, as the apiserver authenticates it — a `SelfSubjectReview`,
    /// which every authenticated user may create. The claim-ownership policy refuses a claim
    /// whose annotations are not those of its creator's request.
    pub(super) async fn creator(
        &self,
        budget: &Budget,
    ) -> Result<&BTreeMap<String, String>, Error> {
        self.creator
            .get_or_try_init(|| async {
                let (params, ask) = (PostParams::default(), SelfSubjectReview::default());
                let review = budget
                    .retry("create SelfSubjectReview", self.call_timeout, || {
                        self.reviews.create(&params, &ask)
                    })
                    .await?;
                Ok(creator_annotations(&review))
            })
            .await
    }

    /// The claim `name` that an earlier attempt may have created, if it is this holder's
    /// and not over; a claim of ours that is over is deleted.
    pub(super) async fn adopt(
        &self,
        name: &str,
        budget: &Budget,
    ) -> Result<Option<FencedLeaseClaim>, Error> {
        let found = budget
            .retry("get FencedLeaseClaim", self.call_timeout, || {
                self.api.get_opt(name)
            })
            .await?;
        let Some(found) = found else {
            return Ok(None);
        };
        if found.spec.lease_name != self.lease || found.spec.holder_identity != self.identity {
            return Ok(None);
        }
        let phase = found.status.as_ref().and_then(|s| s.phase);
        if matches!(phase, Some(ClaimPhase::Expired | ClaimPhase::Revoked)) {
            self.withdraw(name).await;
            return Ok(None);
        }
        Ok(Some(found))
    }

    /// Deletes claim `name` if it exists (best effort: a claim nobody heartbeats is expired
    /// by the operator).
    pub(super) async fn withdraw(&self, name: &str) {
        let deleted = timeout(
            self.call_timeout,
            self.api.delete(name, &DeleteParams::default()),
        )
        .await;
        match deleted {
            Ok(Ok(_)) => {
                tracing::info!(claim = %name, "withdrew a claim whose create was uncertain")
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
            Ok(Err(e)) => {
                tracing::warn!(claim = %name, error = %report(&e), "could not withdraw a claim whose create was uncertain")
            }
            Err(_) => {
                tracing::warn!(claim = %name, "could not withdraw a claim whose create was uncertain: no answer")
            }
        }
    }
}

fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Kube { source, .. }
        if source.downcast_ref::<kube::core::Status>().is_some_and(|s| s.code == 409))
}
