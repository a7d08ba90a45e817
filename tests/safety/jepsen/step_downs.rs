//! The operator replicas' step-downs, and whether a fault of the run explains each.
//!
//! A replica that loses its leader lease exits (status 1) and is started again. The nemesis
//! causes that on purpose (it pauses or cuts off the operator, restarts the control plane); a
//! step-down that no fault explains means the test bed itself was too slow for the replica to
//! renew in time (a build competing for the cores, say). Such a step-down is not a violation:
//! the liveness bound stays what users rely on. It is reported beside the verdict, so that a
//! liveness violation it caused reads as what it is.

use crate::history::{Entry, Event, FaultKind};

/// How long after a fault ends a step-down is still put down to it: the leader lease (3 s)
/// and the operator's API deadline (5 s) with room for a restart's cache sync.
pub const GRACE: u64 = 10_000_000_000;

/// One replica that exited as a replica that lost its leader lease does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepDown {
    pub at: u64,
    pub process: String,
    /// The fault in force (or ended within [`GRACE`]) when it happened; `None`: the test bed.
    pub cause: Option<FaultKind>,
}

/// Can the fault make a replica miss its leader lease's renewal?
fn touches_the_operator(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::PauseOperator
            | FaultKind::PartitionOperator
            | FaultKind::KillOperatorMidGrant
            | FaultKind::KillLeader
            | FaultKind::RestartApiserver
            | FaultKind::RestartEtcd
    )
}

/// Every step-down of an operator replica (`op-*` exited with status 1), in time order, with
/// the fault that explains it.
pub fn step_downs(entries: &[&Entry]) -> Vec<StepDown> {
    // The windows of the faults that touch the operator: [start, end + GRACE].
    let mut windows: Vec<(FaultKind, u64, Option<u64>)> = Vec::new();
    for e in entries {
        match &e.ev {
            Event::FaultStart { kind, .. } if touches_the_operator(*kind) => {
                windows.push((*kind, e.t, None));
            }
            Event::FaultEnd { kind, .. } => {
                if let Some(open) = windows
                    .iter_mut()
                    .rev()
                    .find(|(k, _, end)| k == kind && end.is_none())
                {
                    open.2 = Some(e.t);
                }
            }
            _ => {}
        }
    }
    entries
        .iter()
        .filter_map(|e| match &e.ev {
            Event::Exited { process, status }
                if process.starts_with("op-") && status == "exit status: 1" =>
            {
                let cause = windows
                    .iter()
                    .find(|(_, start, end)| {
                        *start <= e.t && end.is_none_or(|end| e.t <= end.saturating_add(GRACE))
                    })
                    .map(|(kind, _, _)| *kind);
                Some(StepDown {
                    at: e.t,
                    process: process.clone(),
                    cause,
                })
            }
            _ => None,
        })
        .collect()
}
