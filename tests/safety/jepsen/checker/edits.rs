//! invalid-fence-accepted: the nemesis's edits of `spec.fence` (I8, I12).

use super::{Kind, Report, Violation};
use crate::history::{Entry, Event};

/// invalid-fence-accepted, and the figures of [`FenceEdits`](super::report::FenceEdits).
pub(super) fn fence_edits(entries: &[&Entry], r: &mut Report) {
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
