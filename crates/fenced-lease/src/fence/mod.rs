//! The resource side: the protected resource checks each write's token atomically and
//! refuses any token lower than the highest it has accepted ([`accepts`]). A check done in
//! application code (read, compare, then write) would reintroduce the race the lease is
//! there to remove, so every guard here is one conditional write at the resource:
//!
//! - [`kube`]: Kubernetes objects, checked by the apiserver itself (ValidatingAdmissionPolicy,
//!   `deploy/admission/fence-policy.yaml`); helpers stamp the lease label and token annotation.
//! - `postgres` (feature `postgres`): SQL the database enforces for any client
//!   (`fence/postgres/`): tables bound to a scope, every write of them checked against the
//!   scope's mark ([`postgres::Scope`]); and per-row marks ([`postgres::FencedTable`]).
//! - `redis` (feature `redis`): a Redis Function library any client can `FCALL`
//!   (`fence/redis/`), comparing and writing in one step; a scope's keys share one fence key.
//!
//! Every guard reports a stale writer the same way: [`Error::Fenced`].

pub mod kube;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;

/// The fencing rule every guard implements atomically: a write carrying `token` is accepted
/// when it is at least the highest token accepted so far. Equal is accepted so that one
/// holder can write many times with the same token.
pub fn accepts(highest_accepted: i64, token: i64) -> bool {
    token >= highest_accepted
}

/// Why a guarded write did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The resource has accepted a higher token: the writer is stale (its lease was taken
    /// over) and must stop, not retry.
    #[error(
        "fenced out: token {presented} is lower than {highest}, the highest token {} has accepted",
        scope.as_deref().map_or("the resource".to_string(), |s| format!("scope {s}"))
    )]
    Fenced {
        /// The scope whose mark refused it, where the resource names one (a PostgreSQL
        /// scope; a Redis fence key).
        scope: Option<String>,
        /// The token this write carried.
        presented: i64,
        /// The token the resource holds (the highest it has accepted).
        highest: i64,
    },
    /// The resource refused a write that presented no token (a PostgreSQL table bound to a
    /// scope): a statement outside a fenced transaction, a bug in the caller.
    #[error("{0}")]
    NoToken(String),
    /// The apiserver refused the write because the writer's pod does not hold the lease that
    /// fences the object (the identity rule, I11): the writer is stale and must stop.
    #[error("fenced out: {0}")]
    NotHolder(String),
    /// Tokens are never negative nor above [`MAX_TOKEN`](crate::api::MAX_TOKEN) (2^53 - 1,
    /// the largest every guard compares exactly); another is a bug in the caller.
    #[error("invalid fencing token {0}: tokens are integers from 0 to 9007199254740991 (2^53 - 1)")]
    InvalidToken(i64),
    /// The row or object the write is guarded by does not exist.
    #[error("{0} does not exist")]
    Missing(String),
    /// A name the guard cannot use (a Redis key it cannot hash-tag, say).
    #[error("{0}")]
    InvalidName(String),
    /// The apiserver refused or failed the write for another reason.
    #[error("Kubernetes API: {0}")]
    Kube(#[source] ::kube::Error),
    /// PostgreSQL failed the statement (not a fencing refusal).
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL: {0}")]
    Postgres(#[source] tokio_postgres::Error),
    /// Redis failed the command (not a fencing refusal).
    #[cfg(feature = "redis")]
    #[error("Redis: {0}")]
    Redis(#[source] ::redis::RedisError),
}

impl Error {
    /// Was the write refused because a higher token was accepted before it, or because the
    /// writer no longer holds the lease?
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced { .. } | Error::NotHolder(_))
    }

    /// Was the write refused by a mark above `lease_token`, the lease's last issued token
    /// (its current holder's)? No holder of the lease ever had such a token: the mark is not a
    /// newer holder's but a lost one's (a database restored from a backup, a lease re-created
    /// with its token records lost, or a client that presented a token of its own making).
    /// Every write of the scope is refused until someone resets the mark deliberately
    /// (PostgreSQL: `fenced_lease.reset`), which retrying cannot fix.
    pub fn mark_ahead_of(&self, lease_token: i64) -> bool {
        matches!(self, Error::Fenced { highest, .. } if *highest > lease_token)
    }
}

/// The longest scope name a guard takes (PostgreSQL's bound; a Redis scope is a hash tag).
pub const MAX_SCOPE_LEN: usize = 512;

/// Refuses a scope name no guard takes: empty, or longer than [`MAX_SCOPE_LEN`] characters.
pub fn check_scope(name: &str) -> Result<(), Error> {
    let len = name.chars().count();
    if len == 0 || len > MAX_SCOPE_LEN {
        return Err(Error::InvalidName(format!(
            "invalid scope {:?}: a scope is a name of 1 to {MAX_SCOPE_LEN} characters",
            name.chars().take(40).collect::<String>()
        )));
    }
    Ok(())
}

/// Refuses tokens no lease issues (negative, or above 2^53 - 1, which Redis would compare
/// inexactly) before any I/O.
pub(crate) fn check_token(token: i64) -> Result<i64, Error> {
    if !(0..=crate::api::MAX_TOKEN).contains(&token) {
        return Err(Error::InvalidToken(token));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_outside_what_every_guard_compares_exactly_are_refused() {
        assert!(check_token(0).is_ok());
        assert!(check_token(crate::api::MAX_TOKEN).is_ok());
        assert!(matches!(
            check_token(crate::api::MAX_TOKEN + 1),
            Err(Error::InvalidToken(_))
        ));
        assert!(matches!(check_token(-1), Err(Error::InvalidToken(-1))));
    }

    #[test]
    fn same_holder_can_write_again() {
        assert!(accepts(7, 7));
    }

    #[test]
    fn newer_holder_is_accepted_and_older_is_refused() {
        assert!(accepts(7, 8));
        assert!(!accepts(8, 7));
    }

    #[test]
    fn fenced_error_names_both_tokens() {
        let e = Error::Fenced {
            scope: None,
            presented: 7,
            highest: 9,
        };
        assert!(e.is_fenced());
        assert_eq!(
            e.to_string(),
            "fenced out: token 7 is lower than 9, the highest token the resource has accepted"
        );
        let e = Error::Fenced {
            scope: Some("account-42".into()),
            presented: 7,
            highest: 9,
        };
        assert_eq!(
            e.to_string(),
            "fenced out: token 7 is lower than 9, the highest token scope account-42 has accepted"
        );
    }

    #[test]
    fn a_mark_above_the_leases_last_token_is_told_apart_from_a_newer_holder() {
        let refused = |highest| Error::Fenced {
            scope: None,
            presented: 7,
            highest,
        };
        assert!(!refused(8).mark_ahead_of(8), "a newer holder has token 8");
        assert!(refused(9).mark_ahead_of(8), "no holder of the lease had 9");
        assert!(!Error::NotHolder("x".into()).mark_ahead_of(0));
    }

    #[test]
    fn negative_tokens_are_refused() {
        assert!(matches!(check_token(-1), Err(Error::InvalidToken(-1))));
        assert_eq!(check_token(0).unwrap(), 0);
    }
}
