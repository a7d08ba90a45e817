//! What can go wrong for a holder, typed so that callers (and `kubectl fence`) can tell a
//! missing lease from a timeout, a lost lease, missing RBAC and an unreachable API.
//!
//! Each error's own message says what failed; the apiserver's answer or the connection error
//! is its [`source`](std::error::Error::source), never repeated in the message, so that an
//! error reporter that prints the chain prints each part once.

use std::fmt;
use std::time::Duration;

/// The apiserver's answer, or the client error, behind an [`Error`].
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the holder side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    #[error("FencedLease {lease} not acquired within {}", millis(.waited))]
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

    /// The apiserver refused a request with 403 Forbidden: the holder's account lacks the
    /// holder Role, or an admission policy refused it (a claim may be changed only by its
    /// creator). Waiting does not fix it.
    #[error(
        "{what}: forbidden (the holder needs the Role in deploy/rbac/holder-role.yaml, and may change only claims it created)"
    )]
    Forbidden {
        /// The refused request.
        what: String,
        /// The apiserver's answer.
        #[source]
        source: Source,
    },

    /// The Kubernetes API could not be reached or did not answer in time.
    #[error("Kubernetes API unavailable: {what}")]
    Unavailable {
        /// The request that failed (and, without a source, how).
        what: String,
        /// The connection error or the apiserver's answer (5xx, 429), if any.
        #[source]
        source: Option<Source>,
    },

    /// Any other API error.
    #[error("{what} failed")]
    Kube {
        /// The failed request.
        what: String,
        /// The apiserver's answer or the client error.
        #[source]
        source: Source,
    },

    /// The safety margin is not shorter than the lease duration: the local safe deadline
    /// would leave no time at all to act.
    #[error(
        "the safety margin ({}) must be shorter than the lease duration ({})",
        millis(.margin),
        millis(.duration)
    )]
    InvalidMargin {
        /// The margin asked for.
        margin: Duration,
        /// The lease (or term) duration.
        duration: Duration,
    },
}

/// A duration to the millisecond, e.g. `1s 500ms`.
fn millis(d: &Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// The part of a kube error worth showing: the apiserver's `Status` (its message and
/// reason) rather than kube's wrapper, which prints it twice.
fn source_of(err: kube::Error) -> Source {
    match err {
        kube::Error::Api(status) => status,
        other => Box::new(other),
    }
}

impl Error {
    /// Sorts a failed API request into the variants above; `what` names the request.
    pub fn from_kube(what: &str, err: kube::Error) -> Self {
        let what = what.to_string();
        match &err {
            kube::Error::Api(status) if status.code == 403 => Error::Forbidden {
                what,
                source: source_of(err),
            },
            kube::Error::Api(status) if matches!(status.code, 429 | 500 | 502 | 503 | 504) => {
                Error::Unavailable {
                    what,
                    source: Some(source_of(err)),
                }
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                Error::Unavailable {
                    what,
                    source: Some(source_of(err)),
                }
            }
            _ => Error::Kube {
                what,
                source: source_of(err),
            },
        }
    }

    /// A request that got no answer within its per-call timeout.
    pub fn timed_out(what: &str, after: Duration) -> Self {
        Error::Unavailable {
            what: format!("{what}: no answer within {}", millis(&after)),
            source: None,
        }
    }

    /// Worth trying again later (the API may come back); the others need a person.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Timeout { .. } => true,
            Error::Lost { reason, .. } => reason.is_stall(),
            Error::Kube { source, .. } => status_code(source.as_ref()) == Some(409),
            _ => false,
        }
    }

    /// How long the apiserver asked to wait before retrying (429 and some 5xx carry it).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        let Error::Unavailable {
            source: Some(source),
            ..
        } = self
        else {
            return None;
        };
        let status = source.downcast_ref::<kube::core::Status>()?;
        let seconds = status.details.as_ref()?.retry_after_seconds;
        (seconds > 0).then(|| Duration::from_secs(u64::from(seconds)))
    }
}

fn status_code(source: &(dyn std::error::Error + Send + Sync + 'static)) -> Option<u16> {
    source
        .downcast_ref::<kube::core::Status>()
        .map(|status| status.code)
}

/// The whole chain of an error, `outer: inner: innermost`, for people to read.
pub fn report(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

/// Why a guard no longer holds its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The local safe deadline passed without a successful renew (process paused, machine
    /// suspended, API unreachable): the operator may already have given the lease to
    /// someone else.
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
    /// The apiserver refused a heartbeat with 403 Forbidden (RBAC, or a policy that lets
    /// only a claim's creator change it): the claim can no longer be kept.
    Forbidden(String),
    /// The term's duration, fixed at grant, is not longer than the safety margin: the
    /// deadline leaves no time to act.
    MarginTooLarge {
        /// The term's duration.
        term: Duration,
        /// The margin.
        margin: Duration,
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
            LostReason::Forbidden(msg) => write!(f, "heartbeat forbidden: {msg}"),
            LostReason::MarginTooLarge { term, margin } => write!(
                f,
                "the term's duration ({}) is not longer than the safety margin ({})",
                millis(term),
                millis(margin)
            ),
            LostReason::Released => f.write_str("released"),
            LostReason::NotGranted => f.write_str("not granted (yet)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: format!("status {code}"),
            reason: "Reason".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn forbidden_is_typed_and_points_at_the_role() {
        let err = Error::from_kube("create FencedLeaseClaim", api_error(403));
        assert!(matches!(err, Error::Forbidden { .. }));
        assert!(err.to_string().contains("holder-role.yaml"));
        assert!(!err.is_transient());
        assert_eq!(
            report(&err),
            format!("{err}: status 403: Reason"),
            "the apiserver's message is shown once"
        );
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
    fn retry_after_is_read_from_the_status_details() {
        let status = kube::core::Status {
            code: 429,
            message: "too many requests".into(),
            details: Some(
                serde_json::from_value(serde_json::json!({"retryAfterSeconds": 3})).unwrap(),
            ),
            ..Default::default()
        };
        let err = Error::from_kube("renew", kube::Error::Api(Box::new(status)));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(
            Error::from_kube("renew", api_error(503)).retry_after(),
            None
        );
    }

    #[test]
    fn other_api_errors_stay_kube_errors_and_conflicts_are_transient() {
        assert!(matches!(
            Error::from_kube("get", api_error(422)),
            Error::Kube { .. }
        ));
        assert!(!Error::from_kube("get", api_error(422)).is_transient());
        assert!(Error::from_kube("get", api_error(409)).is_transient());
    }

    /// No error repeats its source in its own message: printing the chain shows each part
    /// once.
    #[test]
    fn errors_do_not_repeat_their_source() {
        let errors = [
            Error::from_kube("renew", api_error(403)),
            Error::from_kube("renew", api_error(503)),
            Error::from_kube("renew", api_error(422)),
        ];
        for err in errors {
            let source = err.source().expect("has a source").to_string();
            assert!(
                !err.to_string().contains(&source),
                "{err} repeats its source {source}"
            );
            assert!(!source.contains("ApiError"), "{source}");
        }
    }

    #[test]
    fn stalls_are_worth_queueing_again_but_revocation_is_not() {
        assert!(LostReason::Expired.is_stall());
        assert!(LostReason::DeadlinePassed.is_stall());
        assert!(!LostReason::Revoked("pod deleted".into()).is_stall());
        assert!(!LostReason::LeaseDeleted.is_stall());
        assert!(!LostReason::Forbidden("no".into()).is_stall());
    }
}
