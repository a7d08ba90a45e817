//! The operator's errors: each has a metric label and an Event reason.

use std::time::Duration;

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The apiserver answered with an error (or could not be reached).
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An API call did not answer within the per-call timeout.
    #[error("{what}: no answer from the Kubernetes API within {timeout:?}")]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
    /// Someone else changed the lease between our read and our write, too often in a row.
    #[error("lease {0} kept changing under us; will retry")]
    Contended(String),
    /// An object the operator needs is malformed (e.g. no namespace).
    #[error("unexpected object: {0}")]
    Unexpected(String),
    /// The operator's record of a deleted lease's last token cannot be read: no token is
    /// issued under that name until it is repaired (never read as zero).
    #[error(
        "token record {record} is damaged ({reason}); fix it to a decimal token, or delete the key and raise spec.minToken above every token this lease name ever issued"
    )]
    TokenRecord { record: String, reason: String },
    /// The admission objects that fence the lease could not be put in place: it grants no one
    /// until they are.
    #[error("the lease's fence is not in force, so no claim is granted: {0}")]
    Fence(Box<Error>),
    /// Why a lease's fence is not in force (always inside [`Error::Fence`]).
    #[error("{0}")]
    FenceGap(String),
}

impl Error {
    /// Label for `fenced_lease_reconcile_errors_total{error=...}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(e)) if e.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(e)) if e.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::Timeout { .. } => "timeout",
            Error::Contended(_) => "contended",
            Error::Unexpected(_) => "unexpected",
            Error::TokenRecord { .. } => "token_record",
            Error::Fence(_) | Error::FenceGap(_) => "fence",
        }
    }

    /// Event reason (PascalCase) for a warning Event about this error.
    pub fn event_reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(e)) if e.code == 403 => "Forbidden",
            Error::Kube(_) => "ApiError",
            Error::Timeout { .. } => "ApiTimeout",
            Error::Contended(_) => "Contended",
            Error::Unexpected(_) => "UnexpectedObject",
            Error::TokenRecord { .. } => "TokenRecordUnreadable",
            Error::Fence(_) | Error::FenceGap(_) => "FenceNotInForce",
        }
    }

    /// Is this a 409 Conflict (someone else wrote first)?
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(e)) => e.code == 409,
            Error::Fence(e) => e.is_conflict(),
            _ => false,
        }
    }

    /// Is this a 422 Invalid (a precondition or validation rule refused the write)?
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(e)) if e.code == 422)
    }

    /// Is this the refusal of a write whose `metadata.uid` precondition names another
    /// object than the one stored under that name (a replacement)?
    pub fn is_uid_mismatch(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(e))
            if (e.code == 422 && e.message.contains("metadata.uid"))
                || (e.code == 409 && e.message.contains("UID")))
    }

    /// Is this a 404 Not Found?
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(e)) if e.code == 404)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs one API call with a deadline.
pub async fn timed<T>(
    what: &'static str,
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(Error::Timeout { what, timeout }),
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary (Event notes are limited).
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("hello", 10), "hello");
    }

    #[test]
    fn labels_tell_timeouts_from_api_errors() {
        let e = Error::Timeout {
            what: "get lease",
            timeout: Duration::from_secs(1),
        };
        assert_eq!(
            (e.metric_label(), e.event_reason()),
            ("timeout", "ApiTimeout")
        );
    }
}
