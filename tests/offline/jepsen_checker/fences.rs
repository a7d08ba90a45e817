//! The fenced resources: a lower token accepted, a refused write applied.

use super::*;

/// Deliberate fault 3: a fence that accepts a lower token.
#[test]
fn a_fence_accepting_a_lower_token_is_caught() {
    let mut h = clean();
    // Holder 0, paused past its lease, wakes and writes its old token; the row takes it.
    h.write(
        2_500,
        "holder-0.0",
        "holder-0.0#1",
        (Resource::Postgres, "a"),
        100,
        accepted("holder-0.0#1"),
    )
    .log(
        3_001,
        Resource::Postgres,
        "a",
        &[
            (100, "holder-0.0#0"),
            (101, "holder-1.0#0"),
            (100, "holder-0.0#1"),
        ],
    );
    let report = h.check();
    let message = only(&report, Kind::FenceAcceptedLower);
    assert!(
        message.contains(
            "PostgreSQL row a accepted token 100 (write holder-0.0#1, position 3) after token 101"
        ),
        "{message}"
    );

    // The same for a Kubernetes object, whose order is the resourceVersions the writers got.
    let mut h = clean();
    let kube = |rv| Event::WriteAccepted {
        id: format!("w{rv}"),
        seq: Some(rv),
    };
    h.write(
        100,
        "holder-0.0",
        "w5",
        (Resource::Kube, "jepsen-a"),
        100,
        kube(5),
    )
    .write(
        1_300,
        "holder-1.0",
        "w7",
        (Resource::Kube, "jepsen-a"),
        101,
        kube(7),
    )
    .write(
        2_500,
        "holder-0.0",
        "w9",
        (Resource::Kube, "jepsen-a"),
        100,
        kube(9),
    );
    let report = h.check();
    assert!(
        report.count(Kind::FenceAcceptedLower) >= 1,
        "{:#?}",
        report.violations
    );
    assert!(
        report
            .first_violation()
            .unwrap()
            .message
            .contains("Kubernetes object jepsen-a accepted token 100")
    );
}

#[test]
fn a_refused_write_that_was_applied_is_caught() {
    let mut h = clean();
    h.write(
        2_500,
        "holder-0.0",
        "holder-0.0#1",
        (Resource::Redis, "ns:{a}"),
        100,
        Event::WriteRefused {
            id: "holder-0.0#1".into(),
            highest: 101,
            not_holder: None,
            refusal: None,
        },
    )
    .log(3_001, Resource::Redis, "ns:{a}", &[(100, "holder-0.0#1")]);
    only(&h.check(), Kind::FenceRefusedApplied);
}
