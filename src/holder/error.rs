//! What can go wrong for a holder, typed so that callers (and `kubectl fence`) can tell a
//! missing lease from a timeout, a lost lease, missing RBAC and an unreachable API.

use std::fmt;
use std::time::Duration;

/// Errors of the holder side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `FencedLease` does not exist (claims for it would never be granted).
    #[error("FencedLease {namespace}/{lease} not found")]
    LeaseNotFound {
        /// Namespace looked in.
        namespace: String,
        /// Lease name.
        lease: String,
    },

    /// The wait timeout passed before the claim was granted; the claim was withdrawn.
    #[error("timed out after {} waiting for FencedLease {lease}", humantime::format_duration(Duration::from_millis(u64::try_from(.waited.as_millis()).unwrap_or(u64::MAX))))]
    Timeout {
        /// Lease name.
        lease: String,
        /// How long it waited.
        waited: Duration,
    },

    /// The caller cancelled the wait; the claim was withdrawn.
    #[error("cancelled while waiting for FencedLease {lease}")]
    Cancelled {
        /// Lease name.
        lease: String,
    },

    /// The lease is not (or no longer) held: the holder must stop acting on it.
    #[error("FencedLease {lease} is not held: {reason}")]
    Lost {
        /// Lease name.
        lease: String,
        /// The token that was granted, if any.
        token: Option<i64>,
        /// Why the lease is not held.
        reason: LostReason,
    },

    /// RBAC refused a request: the holder's ServiceAccount lacks the holder Role.
    #[error("forbidden: {message} (the holder needs the Role in deploy/rbac/holder-role.yaml)")]
    Forbidden {
        /// The apiserver's message.
        message: String,
        /// The refused request.
        #[source]
        source: kube::Error,
    },

    /// The Kubernetes API could not be reached or did not answer in time.
    #[error("Kubernetes API unavailable: {what}")]
    Unavailable {
        /// The request that failed, and how.
        what: String,
        /// The underlying error, if the request did not simply time out.
        #[source]
        source: Option<kube::Error>,
    },

    /// Any other API error.
    #[error("Kubernetes API error: {0}")]
    Kube(#[source] kube::Error),
}

impl Error {
    /// Sorts a failed API request into the variants above; `what` names the request.
    pub(crate) fn from_kube(what: &str, err: kube::Error) -> Self {
        match &err {
            kube::Error::Api(status) if status.code == 403 => Error::Forbidden {
                message: status.message.clone(),
                source: err,
            },
            kube::Error::Api(status) if matches!(status.code, 429 | 500 | 502 | 503 | 504) => {
                Error::Unavailable {
                    what: format!("{what}: {}", status.message),
                    source: Some(err),
                }
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                Error::Unavailable {
                    what: format!("{what}: {err}"),
                    source: Some(err),
                }
            }
            _ => Error::Kube(err),
        }
    }

    /// A request that got no answer within its per-call timeout.
    pub(crate) fn timed_out(what: &str, after: Duration) -> Self {
        Error::Unavailable {
            what: format!(
                "{what}: no answer within {}",
                humantime::format_duration(after)
            ),
            source: None,
        }
    }

    /// Worth trying again later (the API may come back); the others need a person.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Timeout { .. } => true,
            Error::Lost { reason, .. } => reason.is_stall(),
            Error::Kube(kube::Error::Api(s)) => s.code == 409,
            _ => false,
        }
    }
}

/// Why a guard no longer holds its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The local safe deadline passed without a successful renew (process paused, API
    /// unreachable): the operator may already have given the lease to someone else.
    DeadlinePassed,
    /// The operator expired the claim: its heartbeat stopped for the lease duration.
    Expired,
    /// The operator revoked the claim (its pod was deleted, or the lease status was reset).
    Revoked(String),
    /// Someone deleted the claim.
    ClaimDeleted,
    /// The `FencedLease` was deleted.
    LeaseDeleted,
    /// The lease status names another holder, or a newer token.
    Superseded {
        /// The claim that holds it now, if any.
        holder_claim: Option<String>,
        /// The lease's current token.
        token: i64,
    },
    /// The holder released the lease itself.
    Released,
    /// The claim is still waiting: the lease was never granted to it.
    NotGranted,
}

impl LostReason {
    /// The holder stalled (or its heartbeats were not seen) and was expired: queueing
    /// again is the right response.
    pub fn is_stall(&self) -> bool {
        matches!(self, LostReason::DeadlinePassed | LostReason::Expired)
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::DeadlinePassed => {
                f.write_str("local safe deadline passed without a successful renew")
            }
            LostReason::Expired => f.write_str("expired by the operator (heartbeat stopped)"),
            LostReason::Revoked(msg) if msg.is_empty() => f.write_str("revoked by the operator"),
            LostReason::Revoked(msg) => write!(f, "revoked by the operator: {msg}"),
            LostReason::ClaimDeleted => f.write_str("the claim was deleted"),
            LostReason::LeaseDeleted => f.write_str("the FencedLease was deleted"),
            LostReason::Superseded {
                holder_claim: Some(claim),
                token,
            } => write!(f, "now held by claim {claim} with token {token}"),
            LostReason::Superseded {
                holder_claim: None,
                token,
            } => write!(f, "no longer the holder (lease token {token})"),
            LostReason::Released => f.write_str("released"),
            LostReason::NotGranted => f.write_str("not granted (yet)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: format!("status {code}"),
            ..Default::default()
        }))
    }

    #[test]
    fn forbidden_is_typed_and_points_at_the_role() {
        let err = Error::from_kube("create claim", api_error(403));
        assert!(matches!(err, Error::Forbidden { .. }));
        assert!(err.to_string().contains("holder-role.yaml"));
        assert!(!err.is_transient());
    }

    #[test]
    fn overload_and_server_errors_are_unavailable() {
        for code in [429, 500, 503, 504] {
            let err = Error::from_kube("renew", api_error(code));
            assert!(matches!(err, Error::Unavailable { .. }), "{code}: {err:?}");
            assert!(err.is_transient());
        }
    }

    #[test]
    fn other_api_errors_stay_kube_errors() {
        assert!(matches!(
            Error::from_kube("get", api_error(422)),
            Error::Kube(_)
        ));
    }

    #[test]
    fn stalls_are_worth_queueing_again_but_revocation_is_not() {
        assert!(LostReason::Expired.is_stall());
        assert!(LostReason::DeadlinePassed.is_stall());
        assert!(!LostReason::Revoked("pod deleted".into()).is_stall());
        assert!(!LostReason::LeaseDeleted.is_stall());
    }
}
