//! The resource side: the protected resource checks each write's token atomically and
//! refuses any token lower than the highest it has accepted. Guards for Kubernetes objects
//! (admission policy), PostgreSQL and Redis build on the rule in [`accepts`].

/// The fencing rule every guard implements atomically: a write carrying `token` is accepted
/// when it is at least the highest token accepted so far. Equal is accepted so that one
/// holder can write many times with the same token.
pub fn accepts(highest_accepted: i64, token: i64) -> bool {
    token >= highest_accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_holder_can_write_again() {
        assert!(accepts(7, 7));
    }

    #[test]
    fn newer_holder_is_accepted_and_older_is_refused() {
        assert!(accepts(7, 8));
        assert!(!accepts(8, 7));
    }
}
