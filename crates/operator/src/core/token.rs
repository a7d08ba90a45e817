//! Token arithmetic: the only place where a new fencing token is computed.
//!
//! A token is a hybrid logical clock: greater than every token this lease issued (its status
//! and the record its finalizer kept), greater than the lease's floor (`spec.minToken`), and
//! never lower than the wall-clock time of the grant in milliseconds since the Unix epoch.
//! The last rule is the one no deletion can lose: a lease re-created after every record of
//! its past is gone (the status, the finalizer's record, the operator's namespace) still
//! starts above every token it ever issued, because those were at most the wall-clock time
//! of their grant, unless the clock has since been stepped back past them.

use fenced_lease_api::MAX_TOKEN;

/// What the next token must exceed or reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenFloor {
    /// `status.fencingToken`: the last token issued by this lease object.
    pub last_issued: i64,
    /// The token recorded when a lease of this name was last deleted (0 if none).
    pub recorded: i64,
    /// `spec.minToken`.
    pub min_token: i64,
    /// Wall-clock time of the grant, milliseconds since the Unix epoch.
    pub now_ms: i64,
}

/// The token for the next grant: `max(last + 1, recorded + 1, minToken + 1, now_ms)`.
/// `None` when it would pass [`MAX_TOKEN`] (2^53 - 1, the largest every fence compares
/// exactly): grants stop rather than issue a token a fence would refuse or round.
pub fn next_token(floor: TokenFloor) -> Option<i64> {
    let above = floor
        .last_issued
        .max(floor.recorded)
        .max(floor.min_token)
        .max(0)
        .checked_add(1)?;
    Some(above.max(floor.now_ms)).filter(|token| *token <= MAX_TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_500_000_000;

    fn floor(last_issued: i64, min_token: i64, now_ms: i64) -> TokenFloor {
        TokenFloor {
            last_issued,
            recorded: 0,
            min_token,
            now_ms,
        }
    }

    #[test]
    fn first_token_is_the_wall_clock_in_milliseconds() {
        assert_eq!(next_token(floor(0, 0, NOW)), Some(NOW));
    }

    #[test]
    fn grows_past_the_last_token_even_when_the_clock_does_not() {
        assert_eq!(next_token(floor(NOW, 0, NOW)), Some(NOW + 1));
        assert_eq!(
            next_token(floor(NOW + 500, 0, NOW)),
            Some(NOW + 501),
            "clock stepped back"
        );
    }

    #[test]
    fn a_later_grant_takes_the_later_clock() {
        assert_eq!(next_token(floor(NOW, 0, NOW + 15)), Some(NOW + 15));
    }

    #[test]
    fn min_token_and_the_record_are_floors() {
        let big = NOW * 10;
        assert_eq!(next_token(floor(3, big, NOW)), Some(big + 1));
        let recorded = TokenFloor {
            recorded: NOW + 41,
            ..floor(0, 0, NOW)
        };
        assert_eq!(next_token(recorded), Some(NOW + 42));
    }

    #[test]
    fn a_lease_recreated_with_every_record_lost_starts_above_its_past() {
        // Issued at NOW and NOW + 10 ms; every record lost; re-created a second later.
        let old = [
            next_token(floor(0, 0, NOW)).unwrap(),
            next_token(floor(NOW, 0, NOW + 10)).unwrap(),
        ];
        let fresh = next_token(floor(0, 0, NOW + 1_000)).unwrap();
        assert!(old.iter().all(|t| fresh > *t), "{fresh} vs {old:?}");
    }

    #[test]
    fn stays_within_what_every_fence_compares_exactly() {
        assert_eq!(next_token(floor(MAX_TOKEN - 1, 0, NOW)), Some(MAX_TOKEN));
        assert_eq!(next_token(floor(MAX_TOKEN, 0, NOW)), None);
        assert_eq!(next_token(floor(0, MAX_TOKEN, NOW)), None);
        assert_eq!(
            next_token(floor(0, 0, MAX_TOKEN + 1)),
            None,
            "a clock past 2^53 ms"
        );
        // The largest floor a lease accepts still leaves 2^52 - 1 grants.
        let highest = fenced_lease_api::MAX_MIN_TOKEN;
        assert_eq!(next_token(floor(0, highest, NOW)), Some(highest + 1));
        assert_eq!(MAX_TOKEN - highest, (1 << 52) - 1);
        // Tokens above the bound never come back below it from a lower floor either.
        let recorded = TokenFloor {
            recorded: MAX_TOKEN,
            ..floor(0, 0, NOW)
        };
        assert_eq!(next_token(recorded), None);
    }

    #[test]
    fn never_wraps() {
        assert_eq!(next_token(floor(i64::MAX, 0, NOW)), None);
        assert_eq!(next_token(floor(0, i64::MAX, NOW)), None);
    }

    #[test]
    fn negative_inputs_do_not_produce_a_non_positive_token() {
        assert_eq!(next_token(floor(-5, -7, -3)), Some(1));
    }
}
