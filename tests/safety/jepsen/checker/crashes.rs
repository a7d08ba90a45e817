//! process-crashed: a process that exited as a panic does.

use super::{Kind, Report, Violation, secs};
use crate::history::{Entry, Event};

/// process-crashed: an operator replica or a holder process that exited as a panic does.
pub(super) fn crashes(entries: &[&Entry], r: &mut Report) {
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
