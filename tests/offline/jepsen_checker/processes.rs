//! The processes: a holder that panicked, the operator replicas' step-downs, each
//! control-plane restart's window.

use super::*;

/// A holder that panics is restarted by the runner as if it had left: the checker says so.
#[test]
fn a_process_that_panicked_is_caught() {
    let exited = |h: &mut History, process: &str, status: &str| {
        h.at(
            900,
            "runner",
            Event::Exited {
                process: process.into(),
                status: status.into(),
            },
        );
    };
    let mut h = clean();
    exited(&mut h, "follow-15.0", "exit status: 2");
    let message = only(&h.check(), Kind::ProcessCrashed);
    assert!(message.contains("follow-15.0 exited at"), "{message}");
    let mut h = clean();
    exited(&mut h, "op-1.3", "exit status: 101");
    only(&h.check(), Kind::ProcessCrashed);

    // Leaving, being killed, and `kubectl fence run` passing its CMD's status on are not.
    let mut h = clean();
    exited(&mut h, "golock-4.1", "exit status: 1");
    exited(&mut h, "holder-0.1", "signal: 9 (SIGKILL)");
    exited(&mut h, "cli-2.0", "exit status: 2");
    exited(&mut h, "op-0.0", "exit status: 1");
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

// ---- operator step-downs (jepsen/step_downs.rs) ----

fn step_entry(t: u64, ev: Event) -> Entry {
    Entry {
        t: t * 1_000_000_000,
        p: "x".into(),
        ev,
    }
}

fn step_exit(t: u64, process: &str, status: &str) -> Entry {
    step_entry(
        t,
        Event::Exited {
            process: process.into(),
            status: status.into(),
        },
    )
}

fn step_fault(t: u64, kind: FaultKind, start: bool) -> Entry {
    let detail = String::new();
    step_entry(
        t,
        if start {
            Event::FaultStart {
                kind,
                detail,
                target: None,
                lease: None,
            }
        } else {
            Event::FaultEnd { kind, detail }
        },
    )
}

#[test]
fn a_step_down_inside_or_just_after_an_operator_fault_is_the_faults() {
    let entries = [
        step_fault(10, FaultKind::PauseOperator, true),
        step_fault(15, FaultKind::PauseOperator, false),
        step_exit(16, "op-0.0", "exit status: 1"),
        step_fault(30, FaultKind::PauseHolder, true),
        step_exit(31, "op-1.0", "exit status: 1"),
        step_fault(40, FaultKind::PauseHolder, false),
        step_exit(50, "op-0.1", "signal: 9 (SIGKILL)"),
        step_exit(60, "holder-1", "exit status: 1"),
    ];
    let entries: Vec<&Entry> = entries.iter().collect();
    let found = step_downs::step_downs(&entries);
    let causes: Vec<_> = found
        .iter()
        .map(|s| (s.process.as_str(), s.cause))
        .collect();
    assert_eq!(
        causes,
        [("op-0.0", Some(FaultKind::PauseOperator)), ("op-1.0", None),],
        "a pause of a holder does not explain a replica's step-down; a kill is no step-down"
    );
}

#[test]
fn a_step_down_long_after_the_fault_is_the_test_beds() {
    let entries = [
        step_fault(10, FaultKind::RestartApiserver, true),
        step_fault(12, FaultKind::RestartApiserver, false),
        step_exit(21, "op-0.0", "exit status: 1"),
        step_exit(23, "op-0.1", "exit status: 1"),
    ];
    let entries: Vec<&Entry> = entries.iter().collect();
    let causes: Vec<_> = step_downs::step_downs(&entries)
        .into_iter()
        .map(|s| s.cause)
        .collect();
    assert_eq!(causes, [Some(FaultKind::RestartApiserver), None]);
}

/// Issue 55, item 4: the report gives each control-plane restart its window, the longest
/// time after its end that a fenced write was refused with `failed to configure policy`; a
/// refusal while the next restart is under way belongs to that restart, not to the window of
/// the one before (which the report used to measure it from: 45-150 s "after a restart").
#[test]
fn each_restart_gets_its_window() {
    let mut h = clean();
    let failed = |id: &str| Event::WriteFailed {
        id: id.into(),
        error: UNCONFIGURED.into(),
    };
    h.fault(100, 200, FaultKind::RestartApiserver)
        .unfenced(3_200, "w#0", failed("w#0"))
        .unfenced(12_200, "w#1", failed("w#1"))
        .fault(40_000, 41_000, FaultKind::RestartEtcd)
        .fault(60_000, 61_000, FaultKind::RestartApiserver)
        // Answered while the third restart is under way (the apiserver serves before it is
        // ready): the restart's own, not 60 s of the second's window.
        .unfenced(60_500, "w#3", failed("w#3"))
        .unfenced(61_495, "w#2", failed("w#2"));
    let report = h.check();
    assert_eq!(
        report.restart_windows,
        vec![12_005 * MS, 0, 500 * MS],
        "{report}"
    );
    assert_eq!(report.policy_unconfigured_during_restart, 1);
    let text = report.to_string();
    assert!(
        text.contains("3 restarts, median 0.5 s, worst 12.0 s, 3 within 30 s"),
        "{text}"
    );
}
