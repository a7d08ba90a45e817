//! The holder's view of its claim, as a pure state machine over plain data and an explicit
//! clock, so that the rules of I6 are unit-tested without a cluster:
//! - a heartbeat counts (moves the deadline to its send time + duration − margin) only when
//!   its answer arrives before the current deadline: after that instant the operator may
//!   already have expired the claim, and a late success must not revive it;
//! - once the deadline passes, or the claim or lease says otherwise, the hold is over for
//!   good: nothing brings a lost claim back.

use std::time::Instant;

use super::claim::{ClaimView, LeaseView};
use super::error::LostReason;
use super::options::Timing;
use super::safe_deadline;
use crate::api::ClaimPhase;

/// Where a claim stands, as its holder sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// Queued, not granted yet.
    Waiting {
        /// Place in the queue (1 = next), once the operator has said.
        queue_position: Option<i32>,
    },
    /// Granted with this token, and still inside the local safe deadline when last looked at.
    Holding {
        /// The fencing token: send it with every write to the protected resource.
        token: i64,
    },
    /// Over, for good.
    Lost {
        /// The token that was granted, if it was.
        token: Option<i64>,
        /// Why.
        reason: LostReason,
    },
}

/// A claim's hold state together with its local safe deadline.
#[derive(Clone, Debug)]
pub(crate) struct Tracker {
    pub state: HoldState,
    /// The claim may count itself live (waiting or holding) only before this instant.
    pub deadline: Instant,
    timing: Timing,
}

impl Tracker {
    /// A claim whose creation (its first heartbeat) was sent at `sent`.
    pub fn new(sent: Instant, timing: Timing) -> Self {
        Tracker {
            state: HoldState::Waiting {
                queue_position: None,
            },
            deadline: safe_deadline(sent, timing.duration, timing.margin),
            timing,
        }
    }

    /// Waiting or holding.
    pub fn is_live(&self) -> bool {
        !matches!(self.state, HoldState::Lost { .. })
    }

    fn granted_token(&self) -> Option<i64> {
        match self.state {
            HoldState::Holding { token } => Some(token),
            HoldState::Lost { token, .. } => token,
            HoldState::Waiting { .. } => None,
        }
    }

    /// Ends the hold (if still live). Returns whether anything changed.
    pub fn end(&mut self, reason: LostReason) -> bool {
        if !self.is_live() {
            return false;
        }
        self.state = HoldState::Lost {
            token: self.granted_token(),
            reason,
        };
        true
    }

    /// Ends the hold if the deadline has passed at `now`.
    pub fn check_deadline(&mut self, now: Instant) -> bool {
        if self.is_live() && now >= self.deadline {
            return self.end(LostReason::DeadlinePassed);
        }
        false
    }

    /// The token, if the lease is held at `now`.
    pub fn token_at(&self, now: Instant) -> Result<i64, LostReason> {
        match &self.state {
            HoldState::Holding { token } if now < self.deadline => Ok(*token),
            HoldState::Holding { .. } => Err(LostReason::DeadlinePassed),
            HoldState::Lost { reason, .. } => Err(reason.clone()),
            HoldState::Waiting { .. } => Err(LostReason::NotGranted),
        }
    }

    /// A heartbeat sent at `sent` was answered at `received` with `claim`.
    pub fn heartbeat_ok(&mut self, sent: Instant, received: Instant, claim: &ClaimView) -> bool {
        if self.check_deadline(received) || !self.is_live() {
            return true;
        }
        let extended = safe_deadline(sent, self.timing.duration, self.timing.margin);
        let moved = extended > self.deadline;
        if moved {
            self.deadline = extended;
        }
        self.observe_claim(claim, received) || moved
    }

    /// The claim's status as read at `now` (from the watch or a heartbeat answer). Only
    /// terminal phases end a hold, so an older event arriving late cannot end it by mistake.
    pub fn observe_claim(&mut self, claim: &ClaimView, now: Instant) -> bool {
        if self.check_deadline(now) || !self.is_live() {
            return true;
        }
        match (claim.phase, &self.state) {
            (Some(ClaimPhase::Expired), _) => self.end(LostReason::Expired),
            (Some(ClaimPhase::Revoked), _) => self.end(LostReason::Revoked(
                claim.message.clone().unwrap_or_default(),
            )),
            (Some(ClaimPhase::Granted), HoldState::Waiting { .. }) => match claim.token {
                Some(token) => self.grant(token),
                None => false,
            },
            (_, HoldState::Waiting { queue_position }) => {
                if claim.lease_found == Some(false) {
                    return self.end(LostReason::LeaseDeleted);
                }
                if *queue_position != claim.queue_position && claim.queue_position.is_some() {
                    self.state = HoldState::Waiting {
                        queue_position: claim.queue_position,
                    };
                    return true;
                }
                false
            }
            _ => false,
        }
    }

    /// The lease's status as read at `now`; `None` when the lease is gone. A grant shows here
    /// first (the operator writes the lease, then the claim). While holding, only a newer
    /// token or another holder at the same token ends the hold, so a late event from before
    /// the grant cannot.
    pub fn observe_lease(
        &mut self,
        lease: Option<&LeaseView>,
        my_claim: &str,
        now: Instant,
    ) -> bool {
        if self.check_deadline(now) || !self.is_live() {
            return true;
        }
        let Some(lease) = lease else {
            return self.end(LostReason::LeaseDeleted);
        };
        let names_me = lease.holder_claim.as_deref() == Some(my_claim);
        match self.state {
            HoldState::Waiting { .. } if names_me => self.grant(lease.token),
            HoldState::Holding { token }
                if lease.token > token || (lease.token == token && !names_me) =>
            {
                self.end(LostReason::Superseded {
                    holder_claim: lease.holder_claim.clone(),
                    token: lease.token,
                })
            }
            _ => false,
        }
    }

    fn grant(&mut self, token: i64) -> bool {
        self.state = HoldState::Holding { token };
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const D: Duration = Duration::from_secs(10);
    const M: Duration = Duration::from_secs(1);

    fn tracker(t0: Instant) -> Tracker {
        Tracker::new(t0, Timing::new(D, Some(M)))
    }

    fn granted(token: i64) -> ClaimView {
        ClaimView {
            phase: Some(ClaimPhase::Granted),
            token: Some(token),
            ..Default::default()
        }
    }

    fn pending(position: i32) -> ClaimView {
        ClaimView {
            phase: Some(ClaimPhase::Pending),
            queue_position: Some(position),
            ..Default::default()
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn grant_inside_the_deadline_holds_until_duration_minus_margin_after_the_last_send() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        assert!(t.observe_claim(&granted(7), t0 + secs(1.0)));
        assert_eq!(t.token_at(t0 + secs(8.999)), Ok(7));
        assert_eq!(t.token_at(t0 + secs(9.0)), Err(LostReason::DeadlinePassed));
    }

    #[test]
    fn a_counted_heartbeat_moves_the_deadline_from_its_send_time() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        t.observe_claim(&granted(3), t0);
        t.heartbeat_ok(t0 + secs(3.0), t0 + secs(3.5), &granted(3));
        assert_eq!(t.deadline, t0 + secs(12.0));
        assert_eq!(t.token_at(t0 + secs(11.9)), Ok(3));
    }

    #[test]
    fn a_heartbeat_answered_after_the_deadline_does_not_revive_the_hold() {
        // The process was paused (or the API stalled) across the deadline: the operator may
        // have expired the claim meanwhile, whatever the late answer says.
        let t0 = Instant::now();
        let mut t = tracker(t0);
        t.observe_claim(&granted(3), t0);
        t.heartbeat_ok(t0 + secs(8.5), t0 + secs(9.2), &granted(3));
        assert_eq!(
            t.state,
            HoldState::Lost {
                token: Some(3),
                reason: LostReason::DeadlinePassed
            }
        );
        assert!(t.token_at(t0 + secs(9.3)).is_err());
        // And no later success brings it back.
        t.heartbeat_ok(t0 + secs(9.4), t0 + secs(9.5), &granted(3));
        assert!(!t.is_live());
    }

    #[test]
    fn a_grant_seen_after_the_deadline_is_stale() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        t.observe_claim(&granted(5), t0 + secs(9.5));
        assert_eq!(
            t.state,
            HoldState::Lost {
                token: None,
                reason: LostReason::DeadlinePassed
            }
        );
    }

    #[test]
    fn terminal_phases_end_the_hold_for_good() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        t.observe_claim(&granted(2), t0);
        let expired = ClaimView {
            phase: Some(ClaimPhase::Expired),
            token: Some(2),
            ..Default::default()
        };
        t.observe_claim(&expired, t0 + secs(1.0));
        assert_eq!(t.token_at(t0 + secs(1.0)), Err(LostReason::Expired));
        t.observe_claim(&granted(2), t0 + secs(1.1));
        assert_eq!(t.token_at(t0 + secs(1.2)), Err(LostReason::Expired));

        let mut t = tracker(t0);
        let revoked = ClaimView {
            phase: Some(ClaimPhase::Revoked),
            message: Some("pod web-0 deleted".into()),
            ..Default::default()
        };
        t.observe_claim(&revoked, t0);
        assert_eq!(
            t.token_at(t0),
            Err(LostReason::Revoked("pod web-0 deleted".into()))
        );
    }

    #[test]
    fn a_late_pending_event_does_not_end_a_hold() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        t.observe_claim(&granted(4), t0);
        t.observe_claim(&pending(1), t0 + secs(0.1));
        assert_eq!(t.token_at(t0 + secs(0.2)), Ok(4));
    }

    #[test]
    fn waiting_tracks_the_queue_position() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        assert!(t.observe_claim(&pending(3), t0));
        assert_eq!(
            t.state,
            HoldState::Waiting {
                queue_position: Some(3)
            }
        );
        assert!(!t.observe_claim(&pending(3), t0));
    }

    #[test]
    fn the_lease_status_grants_first_and_ends_the_hold_on_a_newer_token() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        let me = "db-abcde";
        let before = LeaseView {
            holder_claim: Some("db-other".into()),
            token: 6,
        };
        assert!(!t.observe_lease(Some(&before), me, t0));
        let mine = LeaseView {
            holder_claim: Some(me.into()),
            token: 7,
        };
        t.observe_lease(Some(&mine), me, t0);
        assert_eq!(t.token_at(t0), Ok(7));
        // An event from before the grant, arriving late, changes nothing.
        t.observe_lease(Some(&before), me, t0);
        assert_eq!(t.token_at(t0), Ok(7));
        // Released by the operator at our token: over.
        let freed = LeaseView {
            holder_claim: None,
            token: 7,
        };
        t.observe_lease(Some(&freed), me, t0);
        assert_eq!(
            t.token_at(t0),
            Err(LostReason::Superseded {
                holder_claim: None,
                token: 7
            })
        );
    }

    #[test]
    fn a_newer_holder_or_a_deleted_lease_ends_the_hold() {
        let t0 = Instant::now();
        let me = "db-abcde";
        let mut t = tracker(t0);
        t.observe_claim(&granted(7), t0);
        let next = LeaseView {
            holder_claim: Some("db-next".into()),
            token: 8,
        };
        t.observe_lease(Some(&next), me, t0);
        assert!(matches!(
            t.token_at(t0),
            Err(LostReason::Superseded { token: 8, .. })
        ));

        let mut t = tracker(t0);
        t.observe_claim(&granted(7), t0);
        t.observe_lease(None, me, t0);
        assert_eq!(t.token_at(t0), Err(LostReason::LeaseDeleted));
    }

    #[test]
    fn a_missing_lease_reported_on_the_claim_ends_the_wait() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        let view = ClaimView {
            lease_found: Some(false),
            ..Default::default()
        };
        t.observe_claim(&view, t0);
        assert_eq!(t.token_at(t0), Err(LostReason::LeaseDeleted));
    }

    #[test]
    fn release_is_final() {
        let t0 = Instant::now();
        let mut t = tracker(t0);
        t.observe_claim(&granted(1), t0);
        assert!(t.end(LostReason::Released));
        assert!(!t.end(LostReason::Expired));
        assert_eq!(t.token_at(t0), Err(LostReason::Released));
    }
}
