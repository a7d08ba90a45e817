//! What the checker found ([`Report`]), and its table.

use std::collections::BTreeMap;
use std::fmt;

use super::{Kind, RESTART_GRACE, Violation, millis, secs};
use crate::history::{FaultKind, Resource};
use crate::stale::Identity;
use crate::step_downs::StepDown;

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
    /// Refusals by cause ([`refusal_cause`](super::unfenced::refusal_cause)).
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
    pub(super) handovers: Vec<(i64, String)>,
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
