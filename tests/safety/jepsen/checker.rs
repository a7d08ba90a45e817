//! The checker: pure functions over a recorded history (no I/O), so that it is tested on
//! synthetic histories (`tests/offline/jepsen_checker.rs`) as well as run on real ones.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::history::{Entry, Event, FaultKind, LogEntry, Resource};
use crate::stale::{self, Identity};
use crate::step_downs::{StepDown, step_downs};

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

/// Counts of one resource's writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Writes {
    pub attempted: usize,
    pub accepted: usize,
    pub refused: usize,
    pub failed: usize,
}

/// What happened to the writes no lease fences (I12).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collateral {
    /// Answered (accepted or refused), by cluster-admin and by a pod.
    pub answered: usize,
    pub refused: usize,
    /// Refused with `failed to configure policy` within a control-plane restart's grace: not
    /// counted as violations.
    pub unconfigured: usize,
    /// Refused by the rules of a lease that was deleted within the identity allowance of the
    /// write (either side): the apiserver reads a lease from its informer, so for that window it
    /// may still see it, as I11's window (not counted as violations).
    pub lagging: usize,
    /// Refusals by cause ([`refusal_cause`]).
    pub causes: BTreeMap<&'static str, usize>,
}

/// The nemesis's edits of `spec.fence`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FenceEdits {
    pub invalid: usize,
    /// Refused by the apiserver (a 4xx answer), and not answered at all.
    pub invalid_refused: usize,
    pub invalid_unanswered: usize,
    pub valid: usize,
    pub valid_accepted: usize,
    /// Valid edits accepted, which the operator put in place within the nemesis's wait, and
    /// those it did not.
    pub in_force: usize,
    pub not_in_force: usize,
}

/// What the checker found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// First and last instant of the history.
    pub start: u64,
    pub end: u64,
    pub acquire_attempts: usize,
    /// Grants to the Rust library's holders, `kubectl fence`'s and the Go ones: through
    /// package lease (`go-`), through package lock and client-go's elector (`golock-`), and
    /// to client-go leaders of the Lease a FencedLease follows (`follow-`).
    pub acquired_library: usize,
    pub acquired_cli: usize,
    pub acquired_go: usize,
    pub acquired_go_lock: usize,
    pub acquired_follow: usize,
    pub releases: usize,
    pub losses: usize,
    pub token_ok: usize,
    pub token_err: usize,
    pub writes: BTreeMap<Resource, Writes>,
    /// Distinct (lease, token) grants, and how many of them the watch and the holders saw.
    pub grants: usize,
    pub grants_watched: usize,
    pub grants_held: usize,
    pub faults: BTreeMap<FaultKind, usize>,
    pub violations: Vec<Violation>,
    /// Writes to fenced objects the apiserver refused because it could not configure the
    /// lease policy (its CRD paramKind not resolved yet after a restart, kubernetes#124237):
    /// how many, and the longest time after the end of a control-plane restart one came (ns).
    pub policy_unconfigured: usize,
    pub policy_unconfigured_after_restart: Option<u64>,
    /// The restart window of each control-plane restart, in order: the longest time after its
    /// end (the apiserver ready again) that such a refusal came, before the next restart
    /// began; 0 when none came (ns).
    pub restart_windows: Vec<u64>,
    /// Such refusals while a restart was under way (the apiserver answering before it was
    /// ready): the restart's, not a window after it.
    pub policy_unconfigured_during_restart: usize,
    /// What the identity rule did with the writes of pods (I11), and its allowance (ns).
    pub identity: Identity,
    pub identity_allowance: u64,
    /// Holder kills whose re-grant was checked, and those skipped (no live waiter, or
    /// another fault or the end of the run inside the window).
    pub liveness_checked: usize,
    pub liveness_skipped: usize,
    /// Longest time from a kill to the next grant, beyond the term (ns).
    pub worst_regrant_over_term: Option<i64>,
    /// Smallest gap between a library holder's last Ok and the next (higher-token) holder's
    /// first Ok of the same lease, where the first did not let go (release, drop) before, its
    /// lease was not deleted under it: the margin expiry leaves
    /// (ns; negative would be an overlap).
    pub closest_handover: Option<i64>,
    /// The hand-overs it is the smallest of: (gap, the earlier holder's claim).
    handovers: Vec<(i64, String)>,
    pub collateral: Collateral,
    pub fence_edits: FenceEdits,
    /// The operator replicas' step-downs, with the fault that explains each.
    pub step_downs: Vec<StepDown>,
}

impl Report {
    /// Client operations: acquire attempts, writes attempted, releases.
    pub fn operations(&self) -> usize {
        self.acquire_attempts
            + self.releases
            + self.writes.values().map(|w| w.attempted).sum::<usize>()
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    /// Step-downs that no fault explains: the test bed was too slow for a replica to renew its
    /// leader lease (not a violation; printed beside the verdict).
    pub fn test_bed_step_downs(&self) -> impl Iterator<Item = &StepDown> {
        self.step_downs.iter().filter(|s| s.cause.is_none())
    }

    /// The earliest violation.
    pub fn first_violation(&self) -> Option<&Violation> {
        self.violations.iter().min_by_key(|v| v.at)
    }

    /// Seconds since the start of the history, for messages.
    pub fn secs(&self, t: u64) -> String {
        secs(self.start, t)
    }
}

pub(crate) fn secs(start: u64, t: u64) -> String {
    format!("{:.3}s", t.saturating_sub(start) as f64 / 1e9)
}

pub(crate) fn millis(ns: i64) -> String {
    format!("{:.0} ms", ns as f64 / 1e6)
}

/// One row of the report's table: a name and a right-aligned value.
fn row(f: &mut fmt::Formatter<'_>, name: &str, value: String) -> fmt::Result {
    writeln!(f, "  {name:<34} {value:>12}")
}

impl Report {
    /// The table: operations, writes per resource, grants, faults and violations, counted.
    fn fmt_table(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "operations {:>36}", self.operations())?;
        row(f, "acquire attempts", self.acquire_attempts.to_string())?;
        row(
            f,
            "granted (Rust / kubectl fence / Go)",
            format!(
                "{} / {} / {}",
                self.acquired_library,
                self.acquired_cli,
                self.acquired_go + self.acquired_go_lock + self.acquired_follow
            ),
        )?;
        row(
            f,
            "  Go: lease / lock / follow",
            format!(
                "{} / {} / {}",
                self.acquired_go, self.acquired_go_lock, self.acquired_follow
            ),
        )?;
        row(
            f,
            "released / lost",
            format!("{} / {}", self.releases, self.losses),
        )?;
        row(
            f,
            "token() Ok / Err",
            format!("{} / {}", self.token_ok, self.token_err),
        )?;
        for (resource, w) in &self.writes {
            row(
                f,
                &format!("writes to the {}", resource.describe()),
                w.attempted.to_string(),
            )?;
            row(
                f,
                "  accepted / refused / no answer",
                format!("{} / {} / {}", w.accepted, w.refused, w.failed),
            )?;
        }
        writeln!(f, "grants {:>40}", self.grants)?;
        row(
            f,
            "seen by the watch / by holders",
            format!("{} / {}", self.grants_watched, self.grants_held),
        )?;
        writeln!(f, "faults {:>40}", self.faults.values().sum::<usize>())?;
        for kind in FaultKind::ALL {
            row(
                f,
                kind.name(),
                self.faults.get(&kind).copied().unwrap_or(0).to_string(),
            )?;
        }
        writeln!(f, "violations {:>36}", self.violations.len())?;
        for kind in Kind::ALL {
            row(f, kind.name(), self.count(kind).to_string())?;
        }
        Ok(())
    }

    /// Fenced writes refused while the apiserver could not configure the lease policy, and
    /// the restart windows they give.
    fn fmt_restarts(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.policy_unconfigured > 0 {
            writeln!(
                f,
                "object writes refused while the apiserver could not configure the lease policy (kubernetes#124237): {} ({} while a restart was under way), the last {} after a control-plane restart ended",
                self.policy_unconfigured,
                self.policy_unconfigured_during_restart,
                self.policy_unconfigured_after_restart
                    .map_or("-".into(), |ns| format!("{:.1} s", ns as f64 / 1e9)),
            )?;
        }
        if !self.restart_windows.is_empty() {
            let mut sorted = self.restart_windows.clone();
            sorted.sort_unstable();
            let secs = |ns: u64| format!("{:.1} s", ns as f64 / 1e9);
            writeln!(
                f,
                "restart windows (fenced writes refused with `failed to configure policy` after a control-plane restart ended): {} restarts, median {}, worst {}, {} within 30 s; in order: [{}]",
                sorted.len(),
                secs(sorted[sorted.len() / 2]),
                secs(sorted[sorted.len() - 1]),
                sorted.iter().filter(|&&w| w <= 30_000_000_000).count(),
                self.restart_windows
                    .iter()
                    .map(|&w| secs(w))
                    .collect::<Vec<_>>()
                    .join(", "),
            )?;
        }
        Ok(())
    }

    /// What the identity fence (I11) did with the writes of pods.
    fn fmt_identity(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = &self.identity;
        writeln!(
            f,
            "identity fence (I11): {} answered writes of pods to what a lease fences ({} of a followed Lease's client-go leaders, {} of them stale and refused); sent after the writer's hold had ended: {} refused, {} accepted within the {} allowance (the latest sent {} after the lease had moved on); {} writes of holders refused (the cache behind a grant); {} in a lease's deletion, not judged; {} sent with a followed term's token by a pod the followed Lease named again, not judged; {} lease states whose holder named no pod",
            id.answered,
            id.follower_answered,
            id.follower_stale_refused,
            id.stale_refused,
            id.stale_accepted,
            millis(i64::try_from(self.identity_allowance).unwrap_or(i64::MAX)),
            id.latest_accepted.map_or("-".into(), |ns| millis(
                i64::try_from(ns).unwrap_or(i64::MAX)
            )),
            id.holder_refused,
            id.excused,
            id.renamed,
            id.holders_without_pod,
        )
    }

    /// Liveness, the closest hand-over, collateral refusals, the nemesis's fence edits and the
    /// operator's step-downs.
    fn fmt_notes(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "liveness: {} holders killed or cut off checked ({} skipped: no live waiter, or another fault in the window); worst re-grant {} after the term",
            self.liveness_checked,
            self.liveness_skipped,
            self.worst_regrant_over_term.map_or("-".into(), millis),
        )?;
        writeln!(
            f,
            "hand-over without a release: a library holder's first token() = Ok came at least {} after the previous holder's last",
            self.closest_handover.map_or("-".into(), millis),
        )?;
        let c = &self.collateral;
        writeln!(
            f,
            "collateral (I12): {} answered writes to objects no lease fences (cluster-admin, a pod that holds nothing), {} refused: {} violations, {} with `failed to configure policy` within {:.0} s of a control-plane restart (kubernetes#124237, not counted), {} by a lease deleted within {} of the write (the apiserver's cache of it, not counted); causes: {:?}",
            c.answered,
            c.refused,
            c.refused - c.unconfigured - c.lagging,
            c.unconfigured,
            RESTART_GRACE as f64 / 1e9,
            c.lagging,
            millis(i64::try_from(self.identity_allowance).unwrap_or(i64::MAX)),
            c.causes,
        )?;
        let e = &self.fence_edits;
        writeln!(
            f,
            "fence edits: {} invalid, {} of them refused at admission ({} not answered); {} valid, {} accepted, put in place by the operator {} (not within the nemesis's wait: {})",
            e.invalid,
            e.invalid_refused,
            e.invalid_unanswered,
            e.valid,
            e.valid_accepted,
            e.in_force,
            e.not_in_force,
        )?;
        let by_faults = self.step_downs.iter().filter(|s| s.cause.is_some()).count();
        let test_bed: Vec<String> = self
            .test_bed_step_downs()
            .map(|s| format!("{} at {}", s.process, self.secs(s.at)))
            .collect();
        writeln!(
            f,
            "operator step-downs (a replica that could not renew its leader lease): {} caused by faults, {} by nothing the run did (the test bed){}",
            by_faults,
            test_bed.len(),
            if test_bed.is_empty() {
                String::new()
            } else {
                format!(": {}", test_bed.join(", "))
            },
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "history: {:.1} s",
            self.end.saturating_sub(self.start) as f64 / 1e9
        )?;
        self.fmt_table(f)?;
        self.fmt_restarts(f)?;
        self.fmt_identity(f)?;
        self.fmt_notes(f)
    }
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

fn count(entries: &[&Entry], r: &mut Report) {
    let mut resource_of: HashMap<&str, Resource> = HashMap::new();
    // The end of the last control-plane restart, or None while one is under way.
    let mut restarted: Option<u64> = None;
    let mut restarting = false;
    for e in entries {
        match &e.ev {
            Event::FaultStart {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => restarting = true,
            Event::FaultEnd {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => {
                restarting = false;
                restarted = Some(e.t);
                r.restart_windows.push(0);
            }
            Event::WriteFailed { error, .. } if unconfigured(error) => {
                r.policy_unconfigured += 1;
                if restarting {
                    r.policy_unconfigured_during_restart += 1;
                } else if let (Some(at), Some(window)) = (restarted, r.restart_windows.last_mut()) {
                    let after = e.t.saturating_sub(at);
                    *window = (*window).max(after);
                    r.policy_unconfigured_after_restart = Some(
                        r.policy_unconfigured_after_restart
                            .map_or(after, |a| a.max(after)),
                    );
                }
            }
            _ => {}
        }
        match &e.ev {
            Event::Waiting { .. } => r.acquire_attempts += 1,
            Event::Spawned { process, .. } if process.starts_with("cli-") => {
                r.acquire_attempts += 1
            }
            Event::Acquired { .. } if e.p.starts_with("go-") => r.acquired_go += 1,
            Event::Acquired { .. } if e.p.starts_with("golock-") => r.acquired_go_lock += 1,
            Event::Acquired { .. } if e.p.starts_with("follow-") => r.acquired_follow += 1,
            Event::Acquired { .. } => r.acquired_library += 1,
            Event::CmdStarted { .. } => r.acquired_cli += 1,
            Event::Released { .. } => r.releases += 1,
            Event::Lost { .. } | Event::CmdStopped { .. } => r.losses += 1,
            Event::TokenOk { .. } => r.token_ok += 1,
            Event::TokenErr { .. } => r.token_err += 1,
            Event::WriteAttempt { id, resource, .. } => {
                resource_of.insert(id, *resource);
                r.writes.entry(*resource).or_default().attempted += 1;
            }
            Event::WriteAccepted { id, .. } => {
                if let Some(res) = resource_of.get(id.as_str()) {
                    r.writes.entry(*res).or_default().accepted += 1;
                }
            }
            Event::WriteRefused { id, .. } => {
                if let Some(res) = resource_of.get(id.as_str()) {
                    r.writes.entry(*res).or_default().refused += 1;
                }
            }
            Event::WriteFailed { id, .. } => {
                if let Some(res) = resource_of.get(id.as_str()) {
                    r.writes.entry(*res).or_default().failed += 1;
                }
            }
            Event::FaultStart { kind, .. } => *r.faults.entry(*kind).or_default() += 1,
            _ => {}
        }
    }
}

/// Who was seen holding (lease, token), first sighting per claim.
struct Sighting<'a> {
    claim: &'a str,
    at: u64,
    how: String,
}

/// token-issued-twice and grant-order.
fn tokens(entries: &[&Entry], r: &mut Report) {
    issued_once(entries, r);
    grant_order(entries, r);
}

/// token-issued-twice: each (lease, token) seen held by one claim only; and the grants the
/// watch and the holders saw, counted.
fn issued_once(entries: &[&Entry], r: &mut Report) {
    let mut seen: BTreeMap<(&str, i64), Vec<Sighting<'_>>> = BTreeMap::new();
    let mut watched: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut held: BTreeSet<(&str, i64)> = BTreeSet::new();
    for e in entries {
        let (lease, claim, token, how) = match &e.ev {
            Event::Acquired {
                lease,
                claim,
                token,
            } => {
                held.insert((lease.as_str(), *token));
                (lease, claim, *token, format!("{} acquired it", e.p))
            }
            Event::CmdStarted {
                lease,
                claim,
                token,
                ..
            } => {
                held.insert((lease.as_str(), *token));
                (
                    lease,
                    claim,
                    *token,
                    format!("{} (kubectl fence run) started with it", e.p),
                )
            }
            Event::LeaseState {
                lease,
                holder: Some(holder),
                token,
                rv,
                ..
            } => {
                // Not a stale holder's own read of the lease.
                if e.p == "observer" {
                    watched.insert((lease.as_str(), *token));
                }
                (
                    lease,
                    holder,
                    *token,
                    format!("the lease status said so (resourceVersion {rv})"),
                )
            }
            _ => continue,
        };
        let sightings = seen.entry((lease.as_str(), token)).or_default();
        if sightings.iter().any(|s| s.claim == claim.as_str()) {
            continue;
        }
        if let Some(first) = sightings.first() {
            r.violations.push(Violation {
                claims: vec![],
                kind: Kind::TokenIssuedTwice,
                at: e.t,
                message: format!(
                    "lease {lease}: token {token} was issued twice: to claim {} at {} ({}), and to claim {claim} at {} ({how})",
                    first.claim,
                    secs(r.start, first.at),
                    first.how,
                    secs(r.start, e.t),
                ),
            });
        }
        sightings.push(Sighting {
            claim,
            at: e.t,
            how,
        });
    }
    let both: BTreeSet<_> = watched.union(&held).copied().collect();
    r.grants = both.len();
    r.grants_watched = watched.len();
    r.grants_held = held.len();
}

/// grant-order: grants in etcd revision order, per lease name (across deletions and
/// re-creations), carry strictly increasing tokens.
fn grant_order(entries: &[&Entry], r: &mut Report) {
    let mut states: BTreeMap<&str, Vec<(u64, u64, &str, i64)>> = BTreeMap::new();
    for e in entries {
        if let Event::LeaseState {
            lease,
            holder: Some(holder),
            token,
            rv,
            ..
        } = &e.ev
        {
            states
                .entry(lease)
                .or_default()
                .push((*rv, e.t, holder, *token));
        }
    }
    for (lease, mut list) in states {
        list.sort_by_key(|s| s.0);
        let mut last: Option<(&str, i64)> = None;
        let mut highest: Option<(u64, &str, i64)> = None;
        for (rv, t, holder, token) in list {
            if last == Some((holder, token)) {
                continue;
            }
            last = Some((holder, token));
            if let Some((hrv, hclaim, htoken)) = highest
                && token < htoken
            {
                r.violations.push(Violation {
                    claims: vec![],
                    kind: Kind::GrantOrder,
                    at: t,
                    message: format!(
                        "lease {lease}: granted token {token} to claim {holder} (resourceVersion {rv}) after token {htoken} to claim {hclaim} (resourceVersion {hrv}): tokens must increase in grant order"
                    ),
                });
                continue;
            }
            if highest.is_none_or(|h| token > h.2) {
                highest = Some((rv, holder, token));
            }
        }
    }
}

/// One library holder's claim: its token and the instants it believed it held.
#[derive(Clone, Debug)]
struct Belief<'a> {
    process: &'a str,
    claim: &'a str,
    token: i64,
    /// Return instant of its first `token()` = Ok: it believed by then.
    first_ok: u64,
    /// Call instant of its last `token()` = Ok: it still believed then.
    last_ok: u64,
}

/// A deletion of a lease by the nemesis: (lease, from, to); a holder may hear of one a little
/// after the nemesis is done with it.
type LeaseDeletion<'a> = (&'a str, u64, u64);

/// The nemesis's deletions of leases, each until [`DELETION_HEARD_WITHIN`] after its end.
fn lease_deletions<'a>(entries: &[&'a Entry]) -> Vec<LeaseDeletion<'a>> {
    let mut lease_faults: Vec<LeaseDeletion<'a>> = vec![];
    for e in entries {
        match &e.ev {
            Event::FaultStart {
                kind,
                lease: Some(lease),
                ..
            } if kind.deletes_lease() => lease_faults.push((lease, e.t, u64::MAX)),
            Event::FaultEnd { kind, .. } if kind.deletes_lease() => {
                if let Some(open) = lease_faults.last_mut().filter(|f| f.2 == u64::MAX) {
                    open.2 = e.t + DELETION_HEARD_WITHIN;
                }
            }
            _ => {}
        }
    }
    lease_faults
}

/// What the library holders believed, by (lease, claim), and when each claim was let go
/// (released, dropped: the next grant may follow at once).
struct Beliefs<'a> {
    beliefs: BTreeMap<(&'a str, &'a str), Belief<'a>>,
    let_go: HashMap<&'a str, u64>,
}

/// The library holders' beliefs, with the token-after-loss and expired-while-renewing
/// violations found on the way.
fn beliefs<'a>(
    entries: &[&'a Entry],
    lease_faults: &[LeaseDeletion<'a>],
    r: &mut Report,
) -> Beliefs<'a> {
    let mut beliefs: BTreeMap<(&str, &str), Belief<'_>> = BTreeMap::new();
    let mut lost_at: HashMap<&str, u64> = HashMap::new();
    let mut let_go: HashMap<&str, u64> = HashMap::new();
    let mut acquired_at: HashMap<&str, u64> = HashMap::new();
    for e in entries {
        match &e.ev {
            Event::TokenOk {
                lease,
                claim,
                token,
                called,
            } => {
                if let Some(&lost) = lost_at.get(claim.as_str())
                    && *called > lost
                {
                    r.violations.push(Violation {
                        claims: vec![],
                        kind: Kind::TokenAfterLoss,
                        at: *called,
                        message: format!(
                            "lease {lease}: {} got token() = Ok (token {token}) at {} although lost() had resolved for claim {claim} at {}",
                            e.p,
                            secs(r.start, *called),
                            secs(r.start, lost)
                        ),
                    });
                }
                let b = beliefs.entry((lease, claim)).or_insert(Belief {
                    process: &e.p,
                    claim,
                    token: *token,
                    first_ok: e.t,
                    last_ok: *called,
                });
                b.first_ok = b.first_ok.min(e.t);
                b.last_ok = b.last_ok.max(*called);
            }
            Event::Lost { claim, .. } => {
                lost_at.entry(claim).or_insert(e.t);
                let acquired = acquired_at.get(claim.as_str()).copied().unwrap_or(0);
                expired_while_renewing(e, acquired, lease_faults, r);
            }
            Event::Acquired { claim, .. } => {
                acquired_at.entry(claim).or_insert(e.t);
            }
            Event::Released { claim, how, .. }
                if how != "detached"
                    && how != "after-loss"
                    && !lost_at.contains_key(claim.as_str()) =>
            {
                let_go.entry(claim).or_insert(e.t);
            }
            _ => {}
        }
    }
    Beliefs { beliefs, let_go }
}

/// expired-while-renewing, for a `Lost` entry of a claim acquired at `acquired`: the operator
/// ended the term while the holder's own deadline was ahead, and its lease was not deleted
/// meanwhile.
fn expired_while_renewing(
    e: &Entry,
    acquired: u64,
    lease_faults: &[LeaseDeletion<'_>],
    r: &mut Report,
) {
    let Event::Lost {
        lease,
        claim,
        reason,
        by_operator,
        deadline_in,
    } = &e.ev
    else {
        return;
    };
    let lease_deleted = lease_faults
        .iter()
        .any(|(l, from, to)| *l == lease.as_str() && *from <= e.t && *to >= acquired);
    if *by_operator && *deadline_in > 0 && !lease_deleted {
        r.violations.push(Violation {
            claims: vec![claim.clone()],
            kind: Kind::ExpiredWhileRenewing,
            at: e.t,
            message: format!(
                "lease {lease}: {} (claim {claim}) lost it at {} ({reason}) while its own safe deadline was still {} away: the operator ended the term before the holder's deadline (I9)",
                e.p,
                secs(r.start, e.t),
                millis(*deadline_in),
            ),
        });
    }
}

/// overlapping-holders, token-after-loss and expired-while-renewing.
fn holders(entries: &[&Entry], r: &mut Report) {
    let lease_faults = lease_deletions(entries);
    let Beliefs { beliefs, let_go } = beliefs(entries, &lease_faults, r);
    let mut by_lease: BTreeMap<&str, Vec<Belief<'_>>> = BTreeMap::new();
    for ((lease, _), b) in beliefs {
        by_lease.entry(lease).or_default().push(b);
    }
    for (lease, list) in by_lease {
        overlapping_holders(lease, list, &lease_faults, &let_go, r);
    }
}

/// overlapping-holders, among the holders of `lease` (`list`): each holder's first Ok against
/// the latest "still believed" instant of the holders of strictly lower tokens; and the
/// hand-overs where the earlier holder did not let go and the lease was not deleted under it.
fn overlapping_holders(
    lease: &str,
    mut list: Vec<Belief<'_>>,
    lease_faults: &[LeaseDeletion<'_>],
    let_go: &HashMap<&str, u64>,
    r: &mut Report,
) {
    list.sort_by_key(|b| (b.token, b.first_ok));
    // The latest "still believed" instant among the holders of strictly lower tokens.
    let mut latest: Option<Belief<'_>> = None;
    let mut i = 0;
    while i < list.len() {
        let token = list[i].token;
        let same: Vec<Belief<'_>> = list[i..]
            .iter()
            .take_while(|b| b.token == token)
            .cloned()
            .collect();
        for y in &same {
            if let Some(x) = &latest {
                let gap = i64::try_from(y.first_ok).unwrap_or(i64::MAX)
                    - i64::try_from(x.last_ok).unwrap_or(0);
                let deleted_under = lease_faults
                    .iter()
                    .any(|(l, from, to)| *l == lease && *from <= y.first_ok && *to >= x.first_ok);
                if let_go.get(x.claim).is_none_or(|&t| t > y.first_ok) && !deleted_under {
                    r.handovers.push((gap, x.claim.to_string()));
                }
                if gap < 0 {
                    r.violations.push(Violation {
                        claims: vec![x.claim.to_string(), y.claim.to_string()],
                        kind: Kind::OverlappingHolders,
                        at: y.first_ok,
                        message: format!(
                            "lease {lease}: two holders believed they held it at once (I6 + I9): {} (claim {}, token {}) still got token() = Ok at {}, after {} (claim {}, token {}) had got token() = Ok at {} ({} earlier)",
                            x.process,
                            x.claim,
                            x.token,
                            secs(r.start, x.last_ok),
                            y.process,
                            y.claim,
                            y.token,
                            secs(r.start, y.first_ok),
                            millis(-gap),
                        ),
                    });
                }
            }
        }
        for y in same {
            i += 1;
            if latest.as_ref().is_none_or(|x| y.last_ok > x.last_ok) {
                latest = Some(y);
            }
        }
    }
}

/// A write as its writer recorded it.
struct Write<'a> {
    process: &'a str,
    resource: Resource,
    key: &'a str,
    token: i64,
    attempted: u64,
    outcome: Outcome,
}

#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Unknown,
    Accepted { at: u64, seq: Option<u64> },
    Refused,
}

/// Each resource key's accepted writes, by their position in its order.
type Logs<'a> = BTreeMap<(Resource, &'a str), BTreeMap<u64, LogEntry>>;

/// fence-accepted-lower, fence-refused-applied, accepted-write-missing.
fn fences(entries: &[&Entry], r: &mut Report) {
    let writes = writes_to_fences(entries);
    let (logs, complete) = accepted_orders(entries, &writes);
    let reported = check_orders(&logs, &complete, &writes, r);
    check_real_time(&writes, &reported, r);
}

/// The writes to resources that check tokens, by write id, with their outcomes.
fn writes_to_fences<'a>(entries: &[&'a Entry]) -> BTreeMap<&'a str, Write<'a>> {
    let mut writes: BTreeMap<&str, Write<'_>> = BTreeMap::new();
    for e in entries {
        match &e.ev {
            Event::WriteAttempt {
                id,
                resource,
                key,
                token,
                ..
            } if resource.checks_tokens() => {
                writes.insert(
                    id,
                    Write {
                        process: &e.p,
                        resource: *resource,
                        key,
                        token: *token,
                        attempted: e.t,
                        outcome: Outcome::Unknown,
                    },
                );
            }
            Event::WriteAccepted { id, seq } => {
                if let Some(w) = writes.get_mut(id.as_str()) {
                    w.outcome = Outcome::Accepted { at: e.t, seq: *seq };
                }
            }
            Event::WriteRefused { id, .. } => {
                if let Some(w) = writes.get_mut(id.as_str()) {
                    w.outcome = Outcome::Refused;
                }
            }
            _ => {}
        }
    }
    writes
}

/// Each resource key's order of accepted writes: its own log (complete) where there is one,
/// else what the watch and the writers saw (by resourceVersion); and the keys whose log is
/// complete.
fn accepted_orders<'a>(
    entries: &[&'a Entry],
    writes: &BTreeMap<&'a str, Write<'a>>,
) -> (Logs<'a>, BTreeSet<(Resource, &'a str)>) {
    let mut logs: Logs<'a> = BTreeMap::new();
    let mut complete: BTreeSet<(Resource, &str)> = BTreeSet::new();
    for e in entries {
        match &e.ev {
            Event::ResourceLog {
                resource,
                key,
                entries,
            } => {
                complete.insert((*resource, key));
                let log = logs.entry((*resource, key)).or_default();
                for entry in entries {
                    log.insert(entry.seq, entry.clone());
                }
            }
            Event::ObjectState {
                key,
                rv,
                token: Some(token),
                write,
            } => {
                logs.entry((Resource::Kube, key))
                    .or_default()
                    .entry(*rv)
                    .or_insert(LogEntry {
                        seq: *rv,
                        token: *token,
                        write: write.clone().unwrap_or_default(),
                    });
            }
            _ => {}
        }
    }
    for (id, w) in writes {
        if let Outcome::Accepted { seq: Some(seq), .. } = w.outcome
            && !complete.contains(&(w.resource, w.key))
        {
            logs.entry((w.resource, w.key))
                .or_default()
                .entry(seq)
                .or_insert(LogEntry {
                    seq,
                    token: w.token,
                    write: id.to_string(),
                });
        }
    }
    (logs, complete)
}

/// By each resource's own order: a token accepted below one accepted before it
/// (fence-accepted-lower), a write reported refused that the log has (fence-refused-applied),
/// one reported accepted that a complete log lacks (accepted-write-missing). The writes
/// already reported as accepted lower.
fn check_orders(
    logs: &Logs<'_>,
    complete: &BTreeSet<(Resource, &str)>,
    writes: &BTreeMap<&str, Write<'_>>,
    r: &mut Report,
) -> BTreeSet<String> {
    let when = |write: &str| writes.get(write).map_or(r.end, |w| w.attempted);
    let mut reported: BTreeSet<String> = BTreeSet::new();
    for ((resource, key), log) in logs {
        let mut highest: Option<&LogEntry> = None;
        for entry in log.values() {
            if let Some(h) = highest
                && entry.token < h.token
            {
                reported.insert(entry.write.clone());
                r.violations.push(Violation {
                    claims: vec![],
                    kind: Kind::FenceAcceptedLower,
                    at: when(&entry.write),
                    message: format!(
                        "{} {key} accepted token {} (write {}, position {}) after token {} (write {}, position {}): a fence must refuse a token lower than one it accepted",
                        resource.describe(),
                        entry.token,
                        entry.write,
                        entry.seq,
                        h.token,
                        h.write,
                        h.seq,
                    ),
                });
            }
            if highest.is_none_or(|h| entry.token > h.token) {
                highest = Some(entry);
            }
        }
        let in_log: HashMap<&str, &LogEntry> =
            log.values().map(|e| (e.write.as_str(), e)).collect();
        let log_complete = complete.contains(&(*resource, *key));
        for (id, w) in writes
            .iter()
            .filter(|(_, w)| w.resource == *resource && w.key == *key)
        {
            if let Some(v) = logged_as_answered(id, w, in_log.contains_key(id), log_complete) {
                r.violations.push(v);
            }
        }
    }
    reported
}

/// fence-refused-applied or accepted-write-missing, for write `id` (`w`), which the
/// resource's log has or not (`in_log`), that log complete or not.
fn logged_as_answered(id: &str, w: &Write<'_>, in_log: bool, complete: bool) -> Option<Violation> {
    let (resource, key) = (w.resource, w.key);
    match w.outcome {
        Outcome::Refused if in_log => Some(Violation {
            claims: vec![],
            kind: Kind::FenceRefusedApplied,
            at: w.attempted,
            message: format!(
                "{} {key}: write {id} of {} (token {}) was reported refused, yet the resource applied it",
                resource.describe(),
                w.process,
                w.token
            ),
        }),
        Outcome::Accepted { at, .. } if complete && !in_log => Some(Violation {
            claims: vec![],
            kind: Kind::AcceptedWriteMissing,
            at,
            message: format!(
                "{} {key}: write {id} of {} (token {}) was reported accepted, but the resource's log does not have it",
                resource.describe(),
                w.process,
                w.token
            ),
        }),
        _ => None,
    }
}

/// fence-accepted-lower by real time: a write accepted before another was even sent, with a
/// higher token (a write already `reported` aside).
fn check_real_time(
    writes: &BTreeMap<&str, Write<'_>>,
    reported: &BTreeSet<String>,
    r: &mut Report,
) {
    let mut per_key: BTreeMap<(Resource, &str), Vec<(&str, &Write<'_>)>> = BTreeMap::new();
    for (id, w) in writes {
        if matches!(w.outcome, Outcome::Accepted { .. }) {
            per_key
                .entry((w.resource, w.key))
                .or_default()
                .push((id, w));
        }
    }
    for ((resource, key), list) in per_key {
        if let Some(v) = accepted_lower_in_time(resource, key, &list, reported, r.start) {
            r.violations.push(v);
        }
    }
}

/// The first write of `list` (the accepted writes of one resource key) sent after the resource
/// had accepted a higher token, as a violation.
fn accepted_lower_in_time(
    resource: Resource,
    key: &str,
    list: &[(&str, &Write<'_>)],
    reported: &BTreeSet<String>,
    start: u64,
) -> Option<Violation> {
    // Sweep: completions and starts in time order; a start below the highest completed
    // token is a regression the resource cannot have ordered otherwise.
    let mut points: Vec<(u64, bool, usize)> = vec![];
    for (i, (_, w)) in list.iter().enumerate() {
        if let Outcome::Accepted { at, .. } = w.outcome {
            points.push((at, true, i));
        }
        points.push((w.attempted, false, i));
    }
    points.sort_by_key(|p| (p.0, !p.1));
    let mut highest: Option<usize> = None;
    for (_, done, i) in points {
        let (id, w) = list[i];
        if done {
            if highest.is_none_or(|h| w.token > list[h].1.token) {
                highest = Some(i);
            }
        } else if let Some(h) = highest
            && w.token < list[h].1.token
            && !reported.contains(id)
        {
            let (hid, hw) = list[h];
            let message = format!(
                "{} {key} accepted token {} (write {id} of {}, sent at {}) after it had accepted token {} (write {hid} of {}, answered at {}): a fence must refuse a token lower than one it accepted",
                resource.describe(),
                w.token,
                w.process,
                secs(start, w.attempted),
                hw.token,
                hw.process,
                secs(
                    start,
                    match hw.outcome {
                        Outcome::Accepted { at, .. } => at,
                        _ => 0,
                    }
                ),
            );
            // One per regressing write is enough.
            return Some(Violation {
                claims: vec![],
                kind: Kind::FenceAcceptedLower,
                at: w.attempted,
                message,
            });
        }
    }
    None
}

/// liveness: a killed holder's lease is granted again within the term + the bound.
fn liveness(entries: &[&Entry], config: &Config, r: &mut Report) {
    let fault_starts: Vec<u64> = entries
        .iter()
        .filter(|e| matches!(e.ev, Event::FaultStart { .. }))
        .map(|e| e.t)
        .collect();
    let run_end = entries
        .iter()
        .find(|e| matches!(e.ev, Event::RunEnd {}))
        .map_or(u64::MAX, |e| e.t);
    for kill in entries {
        let Event::FaultStart {
            kind: FaultKind::KillHolder | FaultKind::PartitionHolder,
            target: Some(target),
            ..
        } = &kill.ev
        else {
            continue;
        };
        let t_k = kill.t;
        let term = u64::try_from(target.term.max(1)).unwrap_or(1) * 1_000_000_000;
        let deadline = t_k + term + config.liveness_bound;
        let next = entries.iter().filter(|e| e.t > t_k).find(|e| match &e.ev {
            Event::LeaseState {
                lease,
                holder: Some(_),
                token,
                ..
            }
            | Event::Acquired { lease, token, .. }
            | Event::CmdStarted { lease, token, .. } => {
                *lease == target.lease && *token > target.token
            }
            _ => false,
        });
        // Another fault, or the end of the run, before the grant (or the deadline) excuses it.
        let until = next.map_or(deadline, |g| g.t.min(deadline));
        let disturbed = fault_starts.iter().any(|&t| t > t_k && t <= until) || run_end <= until;
        if disturbed || !live_waiter(entries, &target.lease, &target.process, t_k) {
            r.liveness_skipped += 1;
            continue;
        }
        r.liveness_checked += 1;
        match next {
            Some(g) if g.t <= deadline => {
                let over = i64::try_from(g.t - t_k).unwrap_or(i64::MAX) - i64::try_from(term).unwrap_or(0);
                r.worst_regrant_over_term = Some(r.worst_regrant_over_term.map_or(over, |w| w.max(over)));
            }
            other => r.violations.push(Violation {
                claims: vec![],
                kind: Kind::Liveness,
                at: deadline,
                message: format!(
                    "lease {}: its holder {} (claim {}, token {}, term {} s) was killed at {} while another process waited, and the lease was not granted again by {} (term + {}); next grant: {}",
                    target.lease,
                    target.process,
                    target.claim,
                    target.token,
                    target.term,
                    secs(r.start, t_k),
                    secs(r.start, deadline),
                    millis(i64::try_from(config.liveness_bound).unwrap_or(i64::MAX)),
                    other.map_or("none".into(), |g| secs(r.start, g.t)),
                ),
            }),
        }
    }
}

/// Was a process other than `killed` waiting for `lease` at `t`: a library holder between
/// `Waiting` and its outcome, or `kubectl fence run` started and its CMD not yet?
fn live_waiter(entries: &[&Entry], lease: &str, killed: &str, t: u64) -> bool {
    let mut waiting: BTreeSet<&str> = BTreeSet::new();
    for e in entries.iter().take_while(|e| e.t <= t) {
        if e.p == killed {
            continue;
        }
        match &e.ev {
            Event::Waiting { lease: l } if l == lease => {
                waiting.insert(&e.p);
            }
            Event::Spawned {
                process, lease: l, ..
            } if l == lease && process.starts_with("cli-") => {
                waiting.insert(process);
            }
            Event::Acquired { .. } | Event::AcquireFailed { .. } | Event::CmdStarted { .. } => {
                waiting.remove(e.p.as_str());
            }
            Event::Exited { process, .. } => {
                waiting.remove(process.as_str());
            }
            _ => {}
        }
    }
    !waiting.is_empty()
}

/// A refusal of the apiserver that cannot read FencedLeases yet (after it starts): it has not
/// discovered the CRD (`failed to configure policy`, kubernetes#124237), or its informer of
/// them has not listed them yet (`not yet synced`).
fn unconfigured(refusal: &str) -> bool {
    refusal.contains("failed to configure policy")
        || refusal.contains("not yet synced to use for admission")
}

/// What refused a write no lease fences, in a few words (from the apiserver's message).
pub fn refusal_cause(refusal: &str) -> &'static str {
    if refusal.contains("no params found") {
        "a binding whose lease is gone (parameterNotFoundAction: Deny)"
    } else if refusal.contains("not yet synced to use for admission") {
        "the apiserver's informer of FencedLeases, not yet synced"
    } else if refusal.contains("failed to configure policy") {
        "a policy the apiserver cannot configure (its params kind)"
    } else if refusal.contains("resulted in error") {
        "an expression of a policy that fails to evaluate"
    } else if refusal.contains("does not hold") {
        "the identity rule (does not hold)"
    } else if refusal.contains("fencing.dev/token") {
        "the token rule"
    } else if refusal.contains("denied request") || refusal.contains("ValidatingAdmissionPolicy") {
        "another admission policy"
    } else {
        "other (not admission)"
    }
}

/// collateral-refusal: every refusal of a write no lease fences, but `failed to configure
/// policy` from the start of a control-plane restart to [`RESTART_GRACE`] after its end.
/// The lease a refusal by the lease rules names (`... FencedLease <namespace>/<lease> (...`).
fn refusing_lease(refusal: &str) -> Option<&str> {
    let rest = refusal.split("FencedLease ").nth(1)?;
    let qualified = rest.split(' ').next()?;
    qualified.split('/').nth(1)
}

fn collateral(entries: &[&Entry], r: &mut Report) {
    let mut restarts: Vec<(u64, u64)> = vec![];
    for e in entries {
        match &e.ev {
            Event::FaultStart {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => restarts.push((e.t, u64::MAX)),
            Event::FaultEnd {
                kind: FaultKind::RestartApiserver | FaultKind::RestartEtcd,
                ..
            } => {
                if let Some(open) = restarts.last_mut().filter(|w| w.1 == u64::MAX) {
                    open.1 = e.t.saturating_add(RESTART_GRACE);
                }
            }
            _ => {}
        }
    }
    let mut gone: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in entries {
        if let Event::LeaseGone { lease, .. } = &e.ev {
            gone.entry(lease.as_str()).or_default().push(e.t);
        }
    }
    let allowance = r.identity_allowance;
    let mut sent: HashMap<&str, (&str, &str, Option<&str>, u64)> = HashMap::new();
    for e in entries {
        match &e.ev {
            Event::WriteAttempt {
                id,
                resource: Resource::Unfenced,
                key,
                how,
                ..
            } => {
                sent.insert(id, (&e.p, key, how.as_deref(), e.t));
            }
            Event::WriteAccepted { id, .. } if sent.contains_key(id.as_str()) => {
                r.collateral.answered += 1;
            }
            Event::WriteRefused { id, refusal, .. } => {
                let Some(&(process, key, how, at)) = sent.get(id.as_str()) else {
                    continue;
                };
                let refusal = refusal.as_deref().unwrap_or("(no message recorded)");
                r.collateral.answered += 1;
                r.collateral.refused += 1;
                let cause = refusal_cause(refusal);
                *r.collateral.causes.entry(cause).or_default() += 1;
                let restarting = restarts.iter().any(|&(from, to)| at >= from && at <= to);
                if restarting && unconfigured(refusal) {
                    r.collateral.unconfigured += 1;
                    continue;
                }
                let by_lease = refusing_lease(refusal).and_then(|l| gone.get(l));
                if by_lease.is_some_and(|ts| ts.iter().any(|&t| at.abs_diff(t) <= allowance)) {
                    r.collateral.lagging += 1;
                    continue;
                }
                r.violations.push(Violation {
                    claims: vec![],
                    kind: Kind::Collateral,
                    at,
                    message: format!(
                        "{key}: write {id} of {process} ({}), which no existing lease fences, sent at {} and refused at {}: {refusal} (I12: nothing the operator leaves behind may refuse a write no existing lease fences; cause: {cause})",
                        how.unwrap_or("-"),
                        secs(r.start, at),
                        secs(r.start, e.t),
                    ),
                });
            }
            _ => {}
        }
    }
}

/// invalid-fence-accepted, and the figures of [`FenceEdits`].
fn fence_edits(entries: &[&Entry], r: &mut Report) {
    for e in entries {
        let Event::FenceEdit {
            lease,
            edit,
            invalid,
            accepted,
            answer,
            in_force,
        } = &e.ev
        else {
            continue;
        };
        let counts = &mut r.fence_edits;
        if *invalid {
            counts.invalid += 1;
            if !accepted {
                if answer.starts_with('4') {
                    counts.invalid_refused += 1;
                } else {
                    counts.invalid_unanswered += 1;
                }
                continue;
            }
            r.violations.push(Violation {
                claims: vec![],
                kind: Kind::InvalidFenceAccepted,
                at: e.t,
                message: format!(
                    "lease {lease}: the apiserver accepted {edit} ({answer}): a fence spec the schema must refuse (I8: bad input is refused at admission; I12: a fence that cannot be in force)"
                ),
            });
        } else {
            counts.valid += 1;
            counts.valid_accepted += usize::from(*accepted);
            match in_force {
                Some(true) => counts.in_force += 1,
                Some(false) => counts.not_in_force += 1,
                None => {}
            }
        }
    }
}

/// process-crashed: an operator replica or a holder process that exited as a panic does.
fn crashes(entries: &[&Entry], r: &mut Report) {
    for e in entries {
        let Event::Exited { process, status } = &e.ev else {
            continue;
        };
        if process.starts_with("cli-") {
            continue;
        }
        let panicked = match status.as_str() {
            "exit status: 101" => "a Rust panic",
            "exit status: 2"
                if process.starts_with("go-")
                    || process.starts_with("golock-")
                    || process.starts_with("follow-") =>
            {
                "a Go panic"
            }
            _ => continue,
        };
        r.violations.push(Violation {
            claims: vec![],
            kind: Kind::ProcessCrashed,
            at: e.t,
            message: format!(
                "{process} exited at {} with {status}, as {panicked} does (its log is in the run's directory)",
                secs(r.start, e.t)
            ),
        });
    }
}
