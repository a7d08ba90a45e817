//! The holder's view of its claim, as a pure state machine over plain data and an explicit
//! clock, so that the rules of I6 and I10 are unit-tested without a cluster:
//! - the local safe deadline is the send time of the last heartbeat the apiserver accepted,
//!   plus the term's duration, minus the margin. The operator cannot expire the claim before
//!   it has seen that heartbeat, nor (I9) after it made the expiry final, since then the
//!   apiserver refuses heartbeats;
//! - the duration is the term's, fixed at grant (I10), as the claim or lease status says;
//!   until it says, the smallest `spec.leaseDurationSeconds` seen since acquire, never a
//!   larger one;
//! - while holding, a heartbeat counts only when its answer arrives before the deadline: after
//!   that instant the operator may already have expired the claim, and a late success must not
//!   revive the hold. Once the deadline passes, or the claim or lease says otherwise, the hold
//!   is over for good;
//! - while waiting, the deadline passing ends nothing (nothing is held): the claim keeps its
//!   place in the queue and heartbeats on. A grant is believed only inside the deadline; one
//!   seen outside it waits for the next accepted heartbeat.

use std::time::Duration;

use super::claim::{ClaimView, LeaseView};
use super::clock::BootInstant;
use super::error::LostReason;
use super::options::Timing;
use crate::api::ClaimPhase;

/// Where a claim stands, as its holder sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldState {
    /// Queued, not granted yet.
    Waiting {
        /// Place in the queue (1 = next), once the operator has said.
        queue_position: Option<i32>,
    },
    /// Granted with this token, and inside the local safe deadline.
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

/// A claim's hold state together with what its local safe deadline is made of.
#[derive(Clone, Debug)]
pub(crate) struct Tracker {
    pub state: HoldState,
    /// This claim's name.
    claim: String,
    /// Send time of the last heartbeat (or the create) the apiserver accepted in time.
    last_renew: BootInstant,
    /// The smallest `spec.leaseDurationSeconds` seen since acquire.
    spec_duration: Duration,
    /// The term's duration, once the operator has said (I10).
    term_duration: Option<Duration>,
    /// The margin asked for; `None`: [`Timing::default_margin`] of the duration.
    margin: Option<Duration>,
    /// Per-request timeout asked for.
    call_timeout: Option<Duration>,
    /// The lease as last seen: a grant older than it is refused.
    lease: Option<LeaseView>,
    /// A grant seen outside the deadline, waiting for an accepted heartbeat to confirm it.
    offered: Option<i64>,
}

impl Tracker {
    /// Claim `claim`, whose creation (its first heartbeat) was sent at `sent`, on a lease
    /// whose `spec.leaseDurationSeconds` was `spec_duration` when read.
    pub fn new(
        claim: &str,
        sent: BootInstant,
        spec_duration: Duration,
        margin: Option<Duration>,
        call_timeout: Option<Duration>,
    ) -> Self {
        Tracker {
            state: HoldState::Waiting {
                queue_position: None,
            },
            claim: claim.into(),
            last_renew: sent,
            spec_duration,
            term_duration: None,
            margin,
            call_timeout,
            lease: None,
            offered: None,
        }
    }

    /// The duration in force: the term's if known, else the smallest spec seen.
    pub fn duration(&self) -> Duration {
        self.term_duration.unwrap_or(self.spec_duration)
    }

    /// Pacing and margin for the duration in force.
    pub fn timing(&self) -> Timing {
        Timing::new(self.duration(), self.margin).with_call_timeout(self.call_timeout)
    }

    /// The local safe deadline: not held from this instant on, unless a heartbeat moves it.
    pub fn deadline(&self) -> BootInstant {
        let timing = self.timing();
        self.last_renew + timing.duration.saturating_sub(timing.margin)
    }

    /// Waiting or holding.
    pub fn is_live(&self) -> bool {
        !matches!(self.state, HoldState::Lost { .. })
    }

    /// Holding (as last updated; see [`token_at`](Self::token_at)).
    pub fn is_holding(&self) -> bool {
        matches!(self.state, HoldState::Holding { .. })
    }

    /// Whether the operator has answered this claim: granted it or queued it. (Not the
    /// lease's holder: right after a release the lease may still name the holder that is
    /// going, and this claim is next.)
    pub fn answered(&self) -> bool {
        match &self.state {
            HoldState::Waiting { queue_position } => queue_position.is_some(),
            _ => true,
        }
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

    /// Ends a hold whose deadline has passed at `now`. A waiting claim holds nothing, so its
    /// deadline ends nothing.
    pub fn check_deadline(&mut self, now: BootInstant) -> bool {
        if self.is_holding() && now >= self.deadline() {
            return self.end(LostReason::DeadlinePassed);
        }
        false
    }

    /// The token, if the lease is held at `now`.
    pub fn token_at(&self, now: BootInstant) -> Result<i64, LostReason> {
        match &self.state {
            HoldState::Holding { token } if now < self.deadline() => Ok(*token),
            HoldState::Holding { .. } => Err(LostReason::DeadlinePassed),
            HoldState::Lost { reason, .. } => Err(reason.clone()),
            HoldState::Waiting { .. } => Err(LostReason::NotGranted),
        }
    }

    /// A heartbeat sent at `sent` was answered at `received` with `claim`.
    pub fn heartbeat_ok(
        &mut self,
        sent: BootInstant,
        received: BootInstant,
        claim: &ClaimView,
    ) -> bool {
        if self.check_deadline(received) || !self.is_live() {
            return true;
        }
        let moved = sent > self.last_renew;
        if moved {
            self.last_renew = sent;
        }
        let mut changed = self.observe_claim(claim, received) || moved;
        if let (HoldState::Waiting { .. }, Some(token)) = (&self.state, self.offered) {
            changed |= self.try_grant(token, received);
        }
        changed
    }

    /// The claim's status as read at `now` (from the watch or a heartbeat answer). Only
    /// terminal phases end a hold, so an older event arriving late cannot end it by mistake.
    pub fn observe_claim(&mut self, claim: &ClaimView, now: BootInstant) -> bool {
        if self.check_deadline(now) || !self.is_live() {
            return true;
        }
        let mut changed = false;
        let term = claim
            .term_duration
            .filter(|_| claim.phase == Some(ClaimPhase::Granted));
        if term.is_some() && self.term_duration != term {
            self.term_duration = term;
            changed = true;
            if self.check_deadline(now) {
                return true;
            }
        }
        match (claim.phase, &self.state) {
            (Some(ClaimPhase::Expired), _) => self.end(LostReason::Expired),
            (Some(ClaimPhase::Revoked), _) => self.end(LostReason::Revoked(
                claim.message.clone().unwrap_or_default(),
            )),
            (Some(ClaimPhase::Granted), HoldState::Waiting { .. }) => match claim.token {
                Some(token) => self.try_grant(token, now) || changed,
                None => changed,
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
                changed
            }
            _ => changed,
        }
    }

    /// The lease as read at `now`; `None` when the lease is gone. A grant shows here first
    /// (the operator writes the lease, then the claim). While holding, only a newer token or
    /// another holder at the same token ends the hold, so a late event from before the grant
    /// cannot.
    pub fn observe_lease(&mut self, lease: Option<&LeaseView>, now: BootInstant) -> bool {
        if self.check_deadline(now) || !self.is_live() {
            return true;
        }
        let Some(lease) = lease else {
            return self.end(LostReason::LeaseDeleted);
        };
        let names_me = lease.holder_claim.as_deref() == Some(self.claim.as_str());
        let mut changed = false;
        // Until the term's duration is known, never trust a larger spec than seen before.
        if self.term_duration.is_none() && lease.spec_duration < self.spec_duration {
            self.spec_duration = lease.spec_duration;
            changed = true;
        }
        let term = lease.term_duration.filter(|_| names_me);
        if term.is_some() && self.term_duration != term {
            self.term_duration = term;
            changed = true;
        }
        self.lease = Some(lease.clone());
        if self.check_deadline(now) {
            return true;
        }
        match self.state {
            HoldState::Waiting { .. } if names_me => self.try_grant(lease.token, now) || changed,
            HoldState::Holding { token } if self.superseded(token) => {
                self.end(LostReason::Superseded {
                    holder_claim: lease.holder_claim.clone(),
                    token: lease.token,
                })
            }
            _ => changed,
        }
    }

    /// Whether the lease as last seen shows that `token` is no longer this claim's: a newer
    /// token was issued, or the lease names someone else (or no one) at this token.
    fn superseded(&self, token: i64) -> bool {
        self.lease.as_ref().is_some_and(|l| {
            l.token > token
                || (l.token == token && l.holder_claim.as_deref() != Some(self.claim.as_str()))
        })
    }

    /// The operator granted `token` to this claim, as seen at `now`.
    fn try_grant(&mut self, token: i64, now: BootInstant) -> bool {
        if self.superseded(token) {
            let lease = self.lease.clone().unwrap_or_default();
            return self.end(LostReason::Superseded {
                holder_claim: lease.holder_claim,
                token: lease.token,
            });
        }
        let duration = self.duration();
        if let Some(margin) = self.margin.filter(|m| *m >= duration) {
            return self.end(LostReason::MarginTooLarge {
                term: duration,
                margin,
            });
        }
        if now >= self.deadline() {
            // Granted while its heartbeats were not getting through: the term may have run
            // out already. Believe it once a heartbeat is accepted again.
            let changed = self.offered != Some(token);
            self.offered = Some(token);
            return changed;
        }
        self.offered = None;
        self.state = HoldState::Holding { token };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(10);
    const M: Duration = Duration::from_secs(1);
    const ME: &str = "db-abcde";

    fn t0() -> BootInstant {
        BootInstant::now()
    }

    fn tracker(t0: BootInstant) -> Tracker {
        Tracker::new(ME, t0, D, Some(M), None)
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

    fn lease(holder: Option<&str>, token: i64) -> LeaseView {
        LeaseView {
            holder_claim: holder.map(str::to_string),
            token,
            spec_duration: D,
            ..Default::default()
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn grant_inside_the_deadline_holds_until_duration_minus_margin_after_the_last_send() {
        let t0 = t0();
        let mut t = tracker(t0);
        assert!(t.observe_claim(&granted(7), t0 + secs(1.0)));
        assert_eq!(t.token_at(t0 + secs(8.999)), Ok(7));
        assert_eq!(t.token_at(t0 + secs(9.0)), Err(LostReason::DeadlinePassed));
    }

    #[test]
    fn a_counted_heartbeat_moves_the_deadline_from_its_send_time() {
        let t0 = t0();
        let mut t = tracker(t0);
        t.observe_claim(&granted(3), t0);
        t.heartbeat_ok(t0 + secs(3.0), t0 + secs(3.5), &granted(3));
        assert_eq!(t.deadline(), t0 + secs(12.0));
        assert_eq!(t.token_at(t0 + secs(11.9)), Ok(3));
    }

    #[test]
    fn a_heartbeat_answered_after_the_deadline_does_not_revive_the_hold() {
        // The process was paused (or the API stalled) across the deadline: the operator may
        // have expired the claim meanwhile, whatever the late answer says.
        let t0 = t0();
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
    fn a_waiting_claim_keeps_its_place_past_its_deadline_and_a_late_grant_waits_for_a_heartbeat() {
        // The API was away longer than the deadline while the claim waited: nothing was held,
        // so the claim stays queued; a grant seen then is believed only once a heartbeat is
        // accepted again, and the deadline runs from that heartbeat.
        let t0 = t0();
        let mut t = tracker(t0);
        t.observe_claim(&pending(2), t0 + secs(1.0));
        assert!(!t.check_deadline(t0 + secs(30.0)));
        assert_eq!(
            t.state,
            HoldState::Waiting {
                queue_position: Some(2)
            }
        );
        t.observe_lease(Some(&lease(Some(ME), 5)), t0 + secs(31.0));
        assert!(
            matches!(t.state, HoldState::Waiting { .. }),
            "{:?}",
            t.state
        );
        assert!(t.token_at(t0 + secs(31.0)).is_err());
        // The heartbeat answer still says Pending (the claim status lags the lease): the
        // grant seen on the lease is confirmed by the accepted heartbeat.
        t.heartbeat_ok(t0 + secs(32.0), t0 + secs(32.1), &pending(1));
        assert_eq!(t.token_at(t0 + secs(32.2)), Ok(5));
        assert_eq!(t.deadline(), t0 + secs(41.0));
    }

    #[test]
    fn a_grant_older_than_the_lease_seen_is_refused() {
        // Granted token 5, but the lease already shows token 6 for someone else: the grant was
        // expired while this claim could not see it.
        let t0 = t0();
        let mut t = tracker(t0);
        t.observe_lease(Some(&lease(Some("db-other"), 6)), t0);
        t.heartbeat_ok(t0 + secs(1.0), t0 + secs(1.1), &granted(5));
        assert!(
            matches!(
                t.state,
                HoldState::Lost {
                    reason: LostReason::Superseded { token: 6, .. },
                    ..
                }
            ),
            "{:?}",
            t.state
        );
    }

    #[test]
    fn terminal_phases_end_the_hold_for_good() {
        let t0 = t0();
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
        let t0 = t0();
        let mut t = tracker(t0);
        t.observe_claim(&granted(4), t0);
        t.observe_claim(&pending(1), t0 + secs(0.1));
        assert_eq!(t.token_at(t0 + secs(0.2)), Ok(4));
    }

    #[test]
    fn waiting_tracks_the_queue_position_and_knows_when_the_operator_answered() {
        let t0 = t0();
        let mut t = tracker(t0);
        assert!(!t.answered());
        assert!(t.observe_claim(&pending(3), t0));
        assert_eq!(
            t.state,
            HoldState::Waiting {
                queue_position: Some(3)
            }
        );
        assert!(t.answered());
        assert!(!t.observe_claim(&pending(3), t0));

        // The lease naming another holder is no answer: it may be on its way out.
        let mut t = tracker(t0);
        t.observe_lease(Some(&lease(Some("db-other"), 4)), t0);
        assert!(!t.answered());
        t.observe_lease(Some(&lease(Some(ME), 5)), t0);
        assert!(t.answered());
    }

    #[test]
    fn the_lease_status_grants_first_and_ends_the_hold_on_a_newer_token() {
        let t0 = t0();
        let mut t = tracker(t0);
        let before = lease(Some("db-other"), 6);
        assert!(!t.observe_lease(Some(&before), t0));
        t.observe_lease(Some(&lease(Some(ME), 7)), t0);
        assert_eq!(t.token_at(t0), Ok(7));
        // An event from before the grant, arriving late, changes nothing.
        t.observe_lease(Some(&before), t0);
        assert_eq!(t.token_at(t0), Ok(7));
        // Released by the operator at our token: over.
        t.observe_lease(Some(&lease(None, 7)), t0);
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
        let t0 = t0();
        let mut t = tracker(t0);
        t.observe_claim(&granted(7), t0);
        t.observe_lease(Some(&lease(Some("db-next"), 8)), t0);
        assert!(matches!(
            t.token_at(t0),
            Err(LostReason::Superseded { token: 8, .. })
        ));

        let mut t = tracker(t0);
        t.observe_claim(&granted(7), t0);
        t.observe_lease(None, t0);
        assert_eq!(t.token_at(t0), Err(LostReason::LeaseDeleted));
    }

    #[test]
    fn a_missing_lease_reported_on_the_claim_ends_the_wait() {
        let t0 = t0();
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
        let t0 = t0();
        let mut t = tracker(t0);
        t.observe_claim(&granted(1), t0);
        assert!(t.end(LostReason::Released));
        assert!(!t.end(LostReason::Expired));
        assert_eq!(t.token_at(t0), Err(LostReason::Released));
    }

    /// I10: a lease edited from 3600 s to 10 s while the claim waits, then granted: the holder
    /// believes it holds for the term's 10 s, not the hour it read at acquire.
    #[test]
    fn i10_the_deadline_follows_the_terms_duration_not_the_spec_read_at_acquire() {
        let hour = Duration::from_secs(3600);
        let t0 = t0();
        let granted_for = |seconds: u64| ClaimView {
            term_duration: Some(Duration::from_secs(seconds)),
            ..granted(4)
        };

        // The operator says the term's duration on the claim.
        let mut t = Tracker::new(ME, t0, hour, Some(M), None);
        t.observe_claim(&granted_for(10), t0 + secs(0.5));
        assert_eq!(t.token_at(t0 + secs(8.9)), Ok(4));
        assert_eq!(t.token_at(t0 + secs(9.0)), Err(LostReason::DeadlinePassed));

        // ... or on the lease, for the claim it names.
        let mut t = Tracker::new(ME, t0, hour, Some(M), None);
        let mine = LeaseView {
            term_duration: Some(D),
            spec_duration: hour,
            ..lease(Some(ME), 4)
        };
        t.observe_lease(Some(&mine), t0);
        assert_eq!(t.deadline(), t0 + secs(9.0));

        // A term longer than the spec read at acquire is the term: it was fixed at grant.
        let mut t = Tracker::new(ME, t0, D, Some(M), None);
        t.observe_claim(&granted_for(60), t0);
        assert_eq!(t.deadline(), t0 + secs(59.0));
        // Later edits of the spec do not change a running term.
        t.observe_lease(
            Some(&LeaseView {
                spec_duration: Duration::from_secs(5),
                ..lease(Some(ME), 4)
            }),
            t0,
        );
        assert_eq!(t.deadline(), t0 + secs(59.0));

        // Without the status fields (an operator before I10): the smallest spec seen, never
        // a larger one.
        let mut t = Tracker::new(ME, t0, hour, Some(M), None);
        let spec = |seconds| LeaseView {
            spec_duration: Duration::from_secs(seconds),
            ..lease(Some("db-other"), 3)
        };
        t.observe_lease(Some(&spec(10)), t0);
        t.observe_lease(Some(&spec(3600)), t0);
        t.observe_claim(&granted(4), t0);
        assert_eq!(t.deadline(), t0 + secs(9.0));
        assert_eq!(t.timing().renew_every, secs(10.0 / 3.0));
    }

    #[test]
    fn a_term_not_longer_than_the_margin_is_refused() {
        let t0 = t0();
        let mut t = Tracker::new(ME, t0, D, Some(Duration::from_secs(5)), None);
        let view = ClaimView {
            term_duration: Some(Duration::from_secs(5)),
            ..granted(4)
        };
        t.observe_claim(&view, t0);
        assert_eq!(
            t.token_at(t0),
            Err(LostReason::MarginTooLarge {
                term: Duration::from_secs(5),
                margin: Duration::from_secs(5)
            })
        );
    }
}
