//! Property tests of the grant logic over random histories, no cluster: claims come and go,
//! beat or fall silent, pods vanish, `minToken` is raised, the lease is deleted and
//! re-created, the operator restarts, and a stale replica tries to write what it decided on
//! an old read. The lease status write is modelled as the apiserver does it: accepted only
//! when it carries the current resourceVersion.
//!
//! I1: per lease name, issued tokens strictly increase; none is issued twice — also when the
//!     lease is re-created with every record of its past lost (tokens are never below the
//!     wall clock in ms, which has moved past them by then).
//! I2: at most one claim holds the lease at any time, and a claim holds it at most once.
//! I9: a holder is expired only when its heartbeat stopped for the term's duration, and the
//!     expiry is made final on the claim (no more heartbeats) before anyone else is granted.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fenced_lease::api::ClaimPhase;
use fenced_lease_operator::core::decide::{ClaimView, LeaseView, Plan, PodPresence, decide};
use proptest::prelude::*;

const DURATION: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
enum Step {
    NewClaim,
    DeleteClaim(usize),
    Heartbeat(usize),
    Advance(u64),
    PodGone(usize),
    RaiseMinToken(i64),
    RecreateLease,
    RecreateLeaseLosingRecords,
    RestartOperator,
    Reconcile,
    StaleReplicaWrites(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::NewClaim),
        2 => (0usize..8).prop_map(Step::DeleteClaim),
        3 => (0usize..8).prop_map(Step::Heartbeat),
        3 => (0u64..15_000).prop_map(Step::Advance),
        1 => (0usize..8).prop_map(Step::PodGone),
        1 => (0i64..200).prop_map(Step::RaiseMinToken),
        1 => Just(Step::RecreateLease),
        1 => Just(Step::RecreateLeaseLosingRecords),
        1 => Just(Step::RestartOperator),
        4 => Just(Step::Reconcile),
        2 => (1usize..6).prop_map(Step::StaleReplicaWrites),
    ]
}

/// The lease as stored by the apiserver, with its resourceVersion.
#[derive(Clone, Debug)]
struct Stored {
    rv: u64,
    view: LeaseView,
}

/// Wall clock (ms since the epoch) at the model's start.
const EPOCH_MS: i64 = 1_764_500_000_000;

struct World {
    start: Instant,
    now: Instant,
    lease: Stored,
    history: Vec<Stored>,
    claims: Vec<ClaimView>,
    next_claim: usize,
    issued: Vec<i64>,
    granted_claims: BTreeSet<String>,
}

impl World {
    fn new() -> Self {
        let view = LeaseView {
            holder_uid: None,
            last_token: 0,
            high_water_mark: 0,
            min_token: 0,
            deleting: false,
            unfenced: None,
            term: DURATION,
            duration: DURATION,
        };
        let now = Instant::now();
        Self {
            start: now,
            now,
            lease: Stored { rv: 1, view },
            history: vec![],
            claims: vec![],
            next_claim: 0,
            issued: vec![],
            granted_claims: BTreeSet::new(),
        }
    }

    fn now_ms(&self) -> i64 {
        EPOCH_MS + i64::try_from((self.now - self.start).as_millis()).unwrap()
    }

    /// Decides on `read` as the reconciler does: expiries the plan asks for are confirmed on
    /// the claims (the model's claims are the API's truth) and made final, then it decides
    /// again; returns the plan with nothing left to expire.
    fn decide(&mut self, read: &Stored) -> Plan {
        loop {
            let plan = decide(&read.view, &self.claims, self.now, self.now_ms());
            if plan.expire.is_empty() {
                return plan;
            }
            for uid in &plan.expire {
                let c = self.claims.iter_mut().find(|c| &c.uid == uid).unwrap();
                let term = if read.view.holder_uid.as_ref() == Some(uid) {
                    read.view.term
                } else {
                    read.view.duration
                };
                assert!(
                    self.now >= c.last_beat + term,
                    "I9: a beating claim was expired"
                );
                c.phase = Some(ClaimPhase::Expired);
            }
        }
    }

    /// Applies a plan decided on `read` — only if `read` is still the stored version.
    fn write(&mut self, read: &Stored, plan: &Plan) {
        if read.rv != self.lease.rv {
            return; // 409 Conflict
        }
        if plan.ended.is_none() && plan.grant.is_none() {
            return;
        }
        let mut next = read.view.clone();
        if let Some(ended) = &plan.ended {
            next.holder_uid = None;
            if let Some(c) = self.claims.iter_mut().find(|c| c.uid == ended.uid) {
                c.phase = Some(ended.reason.claim_phase());
            }
        }
        if let Some(grant) = &plan.grant {
            if let Some(last) = self.issued.last() {
                assert!(
                    grant.token > *last,
                    "I1: token {} issued after {last}",
                    grant.token
                );
            }
            assert!(
                self.granted_claims.insert(grant.uid.clone()),
                "I2: claim {} granted twice",
                grant.uid
            );
            self.issued.push(grant.token);
            next.holder_uid = Some(grant.uid.clone());
            next.last_token = grant.token;
            if let Some(holder) = &read.view.holder_uid
                && plan.ended.is_some()
                && let Some(c) = self.claims.iter().find(|c| &c.uid == holder)
            {
                assert!(
                    c.phase != Some(ClaimPhase::Granted)
                        || c.deleting
                        || c.pod == PodPresence::Missing,
                    "I9: granted while the previous holder's claim was not final"
                );
            }
            if let Some(c) = self.claims.iter_mut().find(|c| c.uid == grant.uid) {
                c.phase = Some(ClaimPhase::Granted);
            }
        }
        self.history.push(self.lease.clone());
        self.lease = Stored {
            rv: self.lease.rv + 1,
            view: next,
        };
    }

    fn recreate(&mut self, high_water_mark: i64) {
        let view = LeaseView {
            holder_uid: None,
            last_token: 0,
            high_water_mark,
            min_token: 0,
            deleting: false,
            unfenced: None,
            term: DURATION,
            duration: DURATION,
        };
        self.history.push(self.lease.clone());
        self.lease = Stored {
            rv: self.lease.rv + 1,
            view,
        };
    }

    fn new_claim(&mut self) {
        let n = self.next_claim;
        self.next_claim += 1;
        self.claims.push(ClaimView {
            name: format!("c{n}"),
            uid: format!("uid-{n}"),
            created: i64::try_from(n / 3).unwrap(), // several per second: ties happen
            deleting: false,
            pod: if n.is_multiple_of(4) {
                PodPresence::Present
            } else {
                PodPresence::NotNamed
            },
            phase: None,
            last_beat: self.now,
        });
    }

    /// The holder's claim, once its lease object is gone.
    fn revoke_holder(&mut self) {
        for c in &mut self.claims {
            if Some(&c.uid) == self.lease.view.holder_uid.as_ref() {
                c.phase = Some(ClaimPhase::Revoked);
            }
        }
    }

    fn raise_min_token(&mut self, v: i64) {
        let mut next = self.lease.view.clone();
        next.min_token = next.min_token.max(v);
        self.history.push(self.lease.clone());
        self.lease = Stored {
            rv: self.lease.rv + 1,
            view: next,
        };
    }

    /// The lease deleted and created again, its record deleted too. What I1 then relies on:
    /// the wall clock has moved past the last token (tokens run ahead of it only by grants
    /// within one ms; deleting and re-creating a lease takes longer than that).
    fn recreate_losing_records(&mut self) {
        let lead = self.issued.last().map_or(0, |t| t - self.now_ms());
        if lead >= 0 {
            self.now += Duration::from_millis(u64::try_from(lead + 1).unwrap());
        }
        self.revoke_holder();
        self.recreate(0);
    }

    /// I2: at most one Granted claim is the lease's holder.
    fn assert_one_live_holder(&self) {
        let holders: Vec<&ClaimView> = self
            .claims
            .iter()
            .filter(|c| c.phase == Some(ClaimPhase::Granted))
            .collect();
        let live: Vec<&&ClaimView> = holders
            .iter()
            .filter(|c| Some(&c.uid) == self.lease.view.holder_uid.as_ref())
            .collect();
        assert!(live.len() <= 1, "I2: two live holders");
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::NewClaim => self.new_claim(),
            Step::DeleteClaim(i) if !self.claims.is_empty() => {
                let i = i % self.claims.len();
                self.claims.remove(i);
            }
            Step::Heartbeat(i) if !self.claims.is_empty() => {
                let i = i % self.claims.len();
                // The CRD refuses a heartbeat on an Expired or Revoked claim.
                if !matches!(
                    self.claims[i].phase,
                    Some(ClaimPhase::Expired | ClaimPhase::Revoked)
                ) {
                    self.claims[i].last_beat = self.now;
                }
            }
            Step::Advance(ms) => self.now += Duration::from_millis(ms),
            Step::PodGone(i) if !self.claims.is_empty() => {
                let i = i % self.claims.len();
                if self.claims[i].pod == PodPresence::Present {
                    self.claims[i].pod = PodPresence::Missing;
                }
            }
            Step::RaiseMinToken(v) => self.raise_min_token(v),
            Step::RecreateLease => {
                // The finalizer records the last token; the new object starts empty.
                let high_water_mark = self
                    .lease
                    .view
                    .last_token
                    .max(self.lease.view.high_water_mark);
                self.revoke_holder();
                self.recreate(high_water_mark);
            }
            Step::RecreateLeaseLosingRecords => self.recreate_losing_records(),
            Step::RestartOperator => {
                for c in &mut self.claims {
                    c.last_beat = self.now; // first sighting: a full term
                }
            }
            Step::Reconcile => {
                let read = self.lease.clone();
                let plan = self.decide(&read);
                self.write(&read, &plan);
            }
            Step::StaleReplicaWrites(age) => {
                if let Some(read) = self.history.iter().rev().nth(age - 1).cloned() {
                    let plan = self.decide(&read);
                    self.write(&read, &plan);
                }
            }
            _ => {}
        }
        self.assert_one_live_holder();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn i1_i2_tokens_only_grow_and_one_holder_at_a_time(steps in proptest::collection::vec(step(), 1..120)) {
        let mut world = World::new();
        for step in &steps {
            world.apply(step);
        }
        let distinct: BTreeSet<i64> = world.issued.iter().copied().collect();
        prop_assert_eq!(distinct.len(), world.issued.len(), "I1: a token was issued twice: {:?}", world.issued);
    }

    #[test]
    fn i4_a_free_lease_is_granted_to_the_oldest_waiting_claim(n in 1usize..8) {
        let mut world = World::new();
        for _ in 0..n {
            world.apply(&Step::NewClaim);
        }
        world.apply(&Step::Reconcile);
        let holder = world.lease.view.holder_uid.clone();
        let mut order: Vec<&ClaimView> = world.claims.iter().collect();
        order.sort_by_key(|c| (c.created, c.name.clone()));
        prop_assert_eq!(holder, Some(order[0].uid.clone()));
    }
}

#[test]
fn stale_replica_cannot_reissue_a_token() {
    let mut world = World::new();
    for step in [
        Step::NewClaim,
        Step::NewClaim,
        Step::Reconcile,
        Step::DeleteClaim(0),
    ] {
        world.apply(&step);
    }
    // A replica that read the lease before the first grant decides to grant the first token
    // again (same millisecond).
    let first = world.issued.clone();
    let stale = world.history[0].clone();
    let plan = world.decide(&stale);
    assert_eq!(
        plan.grant.as_ref().map(|g| g.token),
        first.first().copied(),
        "the stale read would re-issue the first token"
    );
    world.write(&stale, &plan);
    assert_eq!(world.issued, first, "the resourceVersion check refused it");
    world.apply(&Step::Reconcile);
    assert_eq!(world.issued.len(), 2);
    assert!(world.issued[1] > world.issued[0]);
}
