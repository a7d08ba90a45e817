//! Token arithmetic: the only place where a new fencing token is computed.

/// The token for the next grant: greater than the last one issued and than the lease's floor
/// (`spec.minToken`). `None` when the token space is exhausted, which must stop grants rather
/// than wrap around.
pub fn next_token(last_issued: i64, min_token: i64) -> Option<i64> {
    last_issued.max(min_token).max(0).checked_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_token_is_one() {
        assert_eq!(next_token(0, 0), Some(1));
    }

    #[test]
    fn grows_past_the_last_token() {
        assert_eq!(next_token(41, 0), Some(42));
        assert_eq!(next_token(41, 10), Some(42));
    }

    #[test]
    fn min_token_is_a_floor() {
        assert_eq!(next_token(3, 1000), Some(1001));
    }

    #[test]
    fn never_wraps() {
        assert_eq!(next_token(i64::MAX, 0), None);
        assert_eq!(next_token(0, i64::MAX), None);
    }

    #[test]
    fn negative_inputs_do_not_produce_a_non_positive_token() {
        assert_eq!(next_token(-5, -7), Some(1));
    }
}
