//! Writes no lease fences refused (I12), told apart from an apiserver restarting, and the
//! nemesis's invalid fence edits.

use super::*;

fn refused_with(id: &str, refusal: &str) -> Event {
    Event::WriteRefused {
        id: id.into(),
        highest: 0,
        not_holder: None,
        refusal: Some(refusal.into()),
    }
}

/// Deliberate fault: a binding a deleted lease left behind refuses cluster-admin's write to an
/// object no lease fences (issue 38, item 5).
#[test]
fn a_refused_write_that_no_lease_fences_is_caught() {
    let mut h = clean();
    h.unfenced(400, "collateral#0", accepted("collateral#0"))
        .unfenced(
            600,
            "collateral#1",
            refused_with("collateral#1", LEFT_BEHIND),
        );
    let report = h.check();
    let message = only(&report, Kind::Collateral);
    assert!(message.contains("configmaps/jepsen-free-0"), "{message}");
    assert!(
        message.contains("parameterNotFoundAction: Deny"),
        "{message}"
    );
    assert_eq!(report.collateral.answered, 2);
    assert_eq!(report.collateral.refused, 1);
    assert_eq!(report.writes[&Resource::Unfenced].refused, 1);
    assert!(report.to_string().contains("collateral-refusal"));
}

/// The apiserver not there (no answer, 503) is no refusal; `failed to configure policy` is
/// put down to a restart within its grace, and counted as a violation outside it.
#[test]
fn collateral_writes_during_a_control_plane_restart_are_told_apart() {
    let mut h = clean();
    h.fault(100, 200, FaultKind::RestartApiserver)
        .unfenced(
            150,
            "collateral#0",
            Event::WriteFailed {
                id: "collateral#0".into(),
                error:
                    "503 ServiceUnavailable: the server is currently unable to handle the request"
                        .into(),
            },
        )
        .unfenced(
            250,
            "collateral#1",
            refused_with("collateral#1", UNCONFIGURED),
        );
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.collateral.unconfigured, 1);
    assert_eq!(report.writes[&Resource::Unfenced].failed, 1);

    let grace = checker::RESTART_GRACE / MS;
    h.unfenced(
        200 + grace + 1_000,
        "collateral#2",
        refused_with("collateral#2", UNCONFIGURED),
    );
    let message = only(&h.check(), Kind::Collateral);
    assert!(message.contains("cannot configure"), "{message}");
}

/// After a restart the apiserver's informer of FencedLeases lists them anew: a refusal that
/// says so within the grace is the restart's, one outside it a violation (the CI run of
/// 2026-12-04 met one 65 s in, from a policy created while no other needed the informer).
#[test]
fn an_informer_not_yet_synced_is_excused_only_within_a_restart() {
    const UNSYNCED: &str = "422 Invalid: secrets \"jepsen-free-1\" is forbidden: ValidatingAdmissionPolicy 'fenced-lease-kinds-00' with binding 'fenced-lease-kinds-00' denied request: failed to configure binding: paramKind kind `&ParamKind{APIVersion:fencing.dev/v1alpha1,Kind:FencedLease,}` not yet synced to use for admission";
    let mut h = clean();
    h.fault(100, 200, FaultKind::RestartApiserver).unfenced(
        250,
        "collateral#0",
        refused_with("collateral#0", UNSYNCED),
    );
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.collateral.unconfigured, 1);
    let grace = checker::RESTART_GRACE / MS;
    h.unfenced(
        200 + grace + 1_000,
        "collateral#1",
        refused_with("collateral#1", UNSYNCED),
    );
    let message = only(&h.check(), Kind::Collateral);
    assert!(message.contains("not yet synced"), "{message}");
}

/// Deliberate fault: the apiserver accepts a fence edit the schema must refuse (issue 38,
/// item 6); refused ones and a valid one accepted pass.
#[test]
fn an_invalid_fence_accepted_is_caught() {
    let edit = |invalid: bool, accepted: bool| Event::FenceEdit {
        lease: "a".into(),
        edit: "spec.fence: selector operator \"in\" (for In)".into(),
        invalid,
        accepted,
        answer: if accepted {
            "accepted (resourceVersion 7)".into()
        } else {
            "422 Invalid: spec.fence.selector.matchExpressions[0].operator: Unsupported value"
                .into()
        },
        in_force: (!invalid && accepted).then_some(true),
    };
    let mut h = clean();
    h.at(500, "nemesis", edit(true, false))
        .at(600, "nemesis", edit(false, true));
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.fence_edits.invalid_refused, 1);
    assert_eq!(report.fence_edits.in_force, 1);

    h.at(700, "nemesis", edit(true, true));
    let message = only(&h.check(), Kind::InvalidFenceAccepted);
    assert!(message.contains("operator \"in\""), "{message}");
}
