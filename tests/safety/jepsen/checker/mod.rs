//! The checker: pure functions over a recorded history (no I/O), so that it is tested on
//! synthetic histories (`tests/offline/jepsen_checker/`) as well as run on real ones.
//!
//! What it checks, each only where the history proves a violation (timestamps are taken on
//! the side that makes every comparison conservative: "still believed" is the instant a
//! `token()` call *started*, "already believed" the instant a call *returned*):
//! - **token-issued-twice**: one (lease, token) granted to two claims — by the lease status
//!   the watch saw, by library holders, or by `kubectl fence run` (I1);
//! - **grant-order**: per lease name, the grants the watch saw, in resourceVersion (etcd
//!   revision) order, carry strictly increasing tokens, across deletions of the lease (I1);
//! - **overlapping-holders**: a library holder got `token()` = Ok after another holder of a
//!   higher token of the same lease had already got Ok (I6 + I9);
//! - **token-after-loss**: `token()` = Ok after `lost()` had resolved for that claim (I6);
//! - **expired-while-renewing**: the operator expired a library holder's claim, or granted its
//!   lease on, before the holder's own safe deadline had passed (I9) — unless its lease was
//!   deleted meanwhile (an administrator's act, not a promise of I9);
//! - **fence-accepted-lower**: a resource accepted a token lower than one it accepted before,
//!   by its own order (PostgreSQL log, Redis list, resourceVersions) or by real time;
//! - **fence-refused-applied** / **accepted-write-missing**: a write reported refused shows up
//!   in the resource's log, or one reported accepted does not;
//! - **stale-writer**: the apiserver accepted a write to what a lease fences from a pod that
//!   no longer held the lease, sent at least [`Config::identity_allowance`] after the history
//!   shows the lease had moved on (I11; the rule in [`crate::stale`]); for the leaders of a
//!   followed Lease too, who write while client-go says they lead and ask nothing else;
//! - **liveness**: a holder killed (or cut off) while another process waited is followed by a
//!   grant of its lease within the term + [`Config::liveness_bound`] (I3), when no other fault
//!   overlaps;
//! - **collateral-refusal**: the apiserver refused a write to an object no existing lease
//!   fences ([`Resource::Unfenced`]: the collateral writer's, as cluster-admin and as a pod
//!   that holds nothing; and what a lease fenced, written while it was gone) (I12: nothing the
//!   operator leaves behind refuses a write no existing lease fences). The rule that tells a
//!   refusal from an apiserver that is not there is the writer's
//!   ([`crate::collateral::classify`]): a status the apiserver answers with is a refusal,
//!   except 404/409 (not applied) and 429/5xx whose message does not come from admission;
//!   no answer is no refusal. One refusal is not counted, only reported: `failed to configure
//!   policy` (the apiserver cannot resolve a policy's params kind yet, kubernetes#124237)
//!   from the start of a restart of the apiserver or etcd to [`RESTART_GRACE`] after its end;
//! - **invalid-fence-accepted**: the apiserver accepted an edit of a lease's `spec.fence` that
//!   the schema must refuse (I8, I12; the nemesis's `invalid-fence` fault);
//! - **process-crashed**: an operator replica or a holder process exited as a panic does
//!   (Rust: status 101; Go: 2), which the runner would otherwise just restart (`kubectl
//!   fence run` is not judged: it passes on its CMD's status).
//!
//! A module per check, in the order [`check`] runs them: `count` (the figures), `tokens`,
//! `holders`, `fences`, [`crate::stale`], `liveness`, `unfenced`, `edits`, `crashes`; the
//! report and its table in `report`.

use crate::history::Entry;
use crate::stale;
use crate::step_downs::step_downs;

mod count;
mod crashes;
mod edits;
mod fences;
mod holders;
mod liveness;
mod report;
mod tokens;
mod unfenced;

use count::count;
use crashes::crashes;
use edits::fence_edits;
use fences::fences;
use holders::holders;
use liveness::liveness;
pub use report::Report;
use tokens::tokens;
use unfenced::collateral;

/// Checker settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// A killed holder's lease must be granted again within its term plus this (ns).
    pub liveness_bound: u64,
    /// How far the apiserver's informer cache of a lease may lag the store (ns): a pod whose
    /// hold ended may still write for that long (the identity rule reads the cache), no
    /// longer. [`IDENTITY_ALLOWANCE`].
    pub identity_allowance: u64,
}

/// How far behind the store the checker lets the apiserver's cache of a lease be (I11): a
/// pod's write sent this long after the history shows its hold ended must have been refused.
/// Well above the window runs show (their summary prints the latest stale write let through),
/// well inside a term (the holders' margin, I6, is counted in terms): a pod writing a second
/// after losing its lease is caught.
pub const IDENTITY_ALLOWANCE: u64 = 250_000_000;

impl Default for Config {
    fn default() -> Self {
        Config {
            liveness_bound: 5_000_000_000,
            identity_allowance: IDENTITY_ALLOWANCE,
        }
    }
}

/// How long after the nemesis re-created a lease its old holders may still learn that it was
/// deleted (ns).
const DELETION_HEARD_WITHIN: u64 = 5_000_000_000;

/// How long after a restart of the apiserver (or etcd) ends a collateral write refused with
/// `failed to configure policy` is put down to the apiserver not having discovered the
/// FencedLease CRD yet (kubernetes#124237; up to 30 s, README) and not counted (ns).
pub const RESTART_GRACE: u64 = 45_000_000_000;

/// The kinds of violation, in the order the table lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    TokenIssuedTwice,
    GrantOrder,
    OverlappingHolders,
    TokenAfterLoss,
    ExpiredWhileRenewing,
    FenceAcceptedLower,
    FenceRefusedApplied,
    AcceptedWriteMissing,
    StaleWriter,
    Liveness,
    Collateral,
    InvalidFenceAccepted,
    ProcessCrashed,
}

impl Kind {
    pub const ALL: [Kind; 13] = [
        Kind::TokenIssuedTwice,
        Kind::GrantOrder,
        Kind::OverlappingHolders,
        Kind::TokenAfterLoss,
        Kind::ExpiredWhileRenewing,
        Kind::FenceAcceptedLower,
        Kind::FenceRefusedApplied,
        Kind::AcceptedWriteMissing,
        Kind::StaleWriter,
        Kind::Liveness,
        Kind::Collateral,
        Kind::InvalidFenceAccepted,
        Kind::ProcessCrashed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenIssuedTwice => "token-issued-twice",
            Kind::GrantOrder => "grant-order",
            Kind::OverlappingHolders => "overlapping-holders",
            Kind::TokenAfterLoss => "token-after-loss",
            Kind::ExpiredWhileRenewing => "expired-while-renewing",
            Kind::FenceAcceptedLower => "fence-accepted-lower",
            Kind::FenceRefusedApplied => "fence-refused-applied",
            Kind::AcceptedWriteMissing => "accepted-write-missing",
            Kind::StaleWriter => "stale-writer",
            Kind::Liveness => "liveness",
            Kind::Collateral => "collateral-refusal",
            Kind::InvalidFenceAccepted => "invalid-fence-accepted",
            Kind::ProcessCrashed => "process-crashed",
        }
    }
}

/// One violation: its kind, when (CLOCK_MONOTONIC ns) and what, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    pub at: u64,
    pub message: String,
    /// The library holders' claims it is about.
    pub claims: Vec<String>,
}

pub(crate) fn secs(start: u64, t: u64) -> String {
    format!("{:.3}s", t.saturating_sub(start) as f64 / 1e9)
}

pub(crate) fn millis(ns: i64) -> String {
    format!("{:.0} ms", ns as f64 / 1e6)
}

/// Checks a history (entries in any order).
pub fn check(entries: &[Entry], config: &Config) -> Report {
    let mut entries: Vec<&Entry> = entries.iter().collect();
    entries.sort_by_key(|e| e.t);
    let mut report = Report {
        start: entries.first().map_or(0, |e| e.t),
        end: entries.last().map_or(0, |e| e.t),
        identity_allowance: config.identity_allowance,
        ..Report::default()
    };
    count(&entries, &mut report);
    tokens(&entries, &mut report);
    holders(&entries, &mut report);
    fences(&entries, &mut report);
    stale::check(&entries, config, &mut report);
    liveness(&entries, config, &mut report);
    collateral(&entries, &mut report);
    fence_edits(&entries, &mut report);
    crashes(&entries, &mut report);
    report.step_downs = step_downs(&entries);
    report.violations.sort_by_key(|v| v.at);
    // The margin expiry leaves.
    report.closest_handover = report.handovers.iter().map(|(gap, _)| *gap).min();
    report
}
