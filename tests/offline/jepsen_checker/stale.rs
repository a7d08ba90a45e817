//! The identity rule (I11): pods writing while they hold, stale pods, writes while a lease is
//! deleted, a followed leader's writes across its own terms.

use super::*;

fn refused_by_identity(id: &str) -> Event {
    Event::WriteRefused {
        id: id.into(),
        highest: 0,
        not_holder: Some("Scale ns/jepsen-a (scale): pod holder-0.0 does not hold FencedLease ns/a (pod holder-1.0 holds it)".into()),
        refusal: None,
    }
}

/// Holder 0 (pod u0) holds token 100 until 1 000 ms and lets its claim expire; the lease
/// status shows holder 1 (pod u1, token 101) at 1 150 ms.
fn two_pods() -> History {
    let mut h = History::default();
    h.spawned(0, "holder-0.0", "u0")
        .spawned(0, "holder-1.0", "u1")
        .status(0, "a", 10, Some("a-1"), 100)
        .holds("holder-0.0", "a", "a-1", 100, 10, 1_000)
        .workload(500, "holder-0.0", "w0", 100, accepted("w0"))
        .status(1_150, "a", 12, Some("a-2"), 101)
        .holds("holder-1.0", "a", "a-2", 101, 1_200, 2_000)
        .workload(1_500, "holder-1.0", "w1", 101, accepted("w1"));
    h
}

#[test]
fn pods_writing_while_they_hold_pass_and_are_counted() {
    let report = two_pods().check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.identity.answered, 2);
    assert_eq!(
        report.identity.stale_accepted + report.identity.stale_refused,
        0
    );
    assert_eq!(report.writes[&Resource::Workload].accepted, 2);
    let table = report.to_string();
    assert!(table.contains("stale-writer"), "{table}");
    assert!(
        table.contains("identity fence (I11): 2 answered writes"),
        "{table}"
    );
}

/// Deliberate fault 4: the identity rule switched off. A stale pod's scale, a second after the
/// lease moved on, is accepted.
#[test]
fn a_stale_pod_whose_write_is_accepted_long_after_the_lease_moved_on_is_caught() {
    let mut h = two_pods();
    h.workload(2_150, "holder-0.0", "w2", 100, accepted("w2"));
    let message = only(&h.check(), Kind::StaleWriter);
    assert!(
        message.contains("deployments/jepsen-a/scale accepted write w2 of holder-0.0 (pod UID u0; it held token 100)")
            && message.contains("1000 ms after the lease had moved on")
            && message.contains("observer saw its status at resourceVersion 12"),
        "{message}"
    );

    // Refused, it is what the rule is for: counted, no violation.
    let mut h = two_pods();
    h.workload(2_150, "holder-0.0", "w2", 100, refused_by_identity("w2"));
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.identity.stale_refused, 1);

    // The labelled ConfigMap, stamped, is fenced by identity too.
    let mut h = two_pods();
    h.write(
        2_150,
        "holder-0.0",
        "w3",
        (Resource::Kube, "jepsen-a"),
        100,
        accepted("w3"),
    );
    only(&h.check(), Kind::StaleWriter);
}

/// Within the allowance after the first sign of the move, the apiserver's cache may still
/// show the old holder: measured, not a violation. The first sign may be the new holder's own
/// grant, before the watch shows it.
#[test]
fn a_stale_write_within_the_informer_allowance_is_measured_not_a_violation() {
    let mut h = two_pods();
    h.workload(1_250, "holder-0.0", "w2", 100, accepted("w2"));
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.identity.stale_accepted, 1);
    assert_eq!(report.identity.latest_accepted, Some(100 * MS));
    assert!(report.to_string().contains("the latest sent 100 ms after"));

    // Past the allowance after the new holder learned of its grant (1 200 ms), the watch
    // showing it later (1 400 ms): caught.
    let mut h = History::default();
    h.spawned(0, "holder-0.0", "u0")
        .status(0, "a", 10, Some("a-1"), 100)
        .holds("holder-0.0", "a", "a-1", 100, 10, 1_000)
        .holds("holder-1.0", "a", "a-2", 101, 1_200, 2_000)
        .status(1_400, "a", 12, Some("a-2"), 101)
        .workload(1_460, "holder-0.0", "w2", 100, accepted("w2"));
    let message = only(&h.check(), Kind::StaleWriter);
    assert!(
        message.contains("260 ms after the lease had moved on (holder-1.0 was granted token 101"),
        "{message}"
    );

    // The allowance is a setting.
    let mut h = two_pods();
    h.workload(1_250, "holder-0.0", "w2", 100, accepted("w2"));
    let config = Config {
        identity_allowance: 50 * MS,
        ..Config::default()
    };
    assert_eq!(check(&h.0, &config).count(Kind::StaleWriter), 1);
}

/// A hold also ends with no successor: the status shows no holder (an expiry with no one
/// waiting); the pod may not write after that either.
#[test]
fn a_stale_write_after_an_expiry_with_no_successor_is_caught() {
    let mut h = History::default();
    h.spawned(0, "holder-0.0", "u0")
        .status(0, "a", 10, Some("a-1"), 100)
        .holds("holder-0.0", "a", "a-1", 100, 10, 1_000)
        .status(1_100, "a", 11, None, 100)
        .workload(2_000, "holder-0.0", "w0", 100, accepted("w0"));
    let message = only(&h.check(), Kind::StaleWriter);
    assert!(message.contains("token 100, no holder"), "{message}");
}

/// A lease deleted and created again takes its fence with it until the new lease's first
/// grant: writes in between are not judged, writes after it are.
#[test]
fn writes_while_the_lease_is_deleted_are_not_judged() {
    let fault = |ms, end| {
        (
            ms,
            if end {
                Event::FaultEnd {
                    kind: FaultKind::RecreateLease,
                    detail: String::new(),
                }
            } else {
                Event::FaultStart {
                    kind: FaultKind::RecreateLease,
                    detail: String::new(),
                    target: None,
                    lease: Some("a".into()),
                }
            },
        )
    };
    let deleted = || {
        let mut h = History::default();
        h.spawned(0, "holder-0.0", "u0")
            .status(0, "a", 10, Some("a-1"), 100)
            .holds("holder-0.0", "a", "a-1", 100, 10, 1_000);
        for (ms, ev) in [fault(1_050, false), fault(1_300, true)] {
            h.at(ms, "nemesis", ev);
        }
        // The operator revokes the holder as the lease goes (no fence from then on).
        h.status(1_100, "a", 11, None, 100)
            .status(1_400, "a", 20, Some("a-2"), 101);
        h
    };
    let mut h = deleted();
    h.workload(1_200, "holder-0.0", "w0", 100, accepted("w0"))
        .workload(1_500, "holder-0.0", "w1", 100, accepted("w1"));
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.identity.excused, 2);

    let mut h = deleted();
    h.workload(1_700, "holder-0.0", "w2", 100, accepted("w2"));
    let message = only(&h.check(), Kind::StaleWriter);
    assert!(
        message.contains("resourceVersion 20")
            && message.contains("the first grant since the lease was deleted and created again"),
        "{message}"
    );
}

// ---- collateral (I12) and fence edits ----

/// Two client-go leaders of the Lease lease `a` follows: P (pod u0, token 100), then Q (pod
/// u1, token 101) from 1 000 ms, who releases at 2 000 ms; P, paused meanwhile, takes the
/// Lease back without its elector stopping, and the status names it again at 2 300 ms
/// (token 102), which P learns at 2 320 ms.
fn a_leader_paused_across_terms() -> History {
    let mut h = History::default();
    h.spawned(0, "follow-0.0", "u0")
        .spawned(0, "follow-1.0", "u1")
        .followed(0, 10, Some(("follow-0.0", 1, "u0")), 100)
        .learns(20, "follow-0.0", "follow-0.0@1", 100)
        .workload(500, "follow-0.0", "w0", 100, accepted("w0"))
        .followed(1_000, 12, Some(("follow-1.0", 2, "u1")), 101)
        .learns(1_010, "follow-1.0", "follow-1.0@2", 101)
        .workload(1_100, "follow-1.0", "w1", 101, accepted("w1"))
        .followed(2_000, 14, None, 101)
        .followed(2_300, 16, Some(("follow-0.0", 3, "u0")), 102)
        .learns(2_320, "follow-0.0", "follow-0.0@3", 102);
    h
}

/// A followed Lease's leader writes the token it last learned, asking nothing: its write sent
/// with the old term's token just before the status named its pod again is its pod's write,
/// rightly accepted (counted, not judged). One sent after it learned the new token, or while
/// the other leader held, is a stale write.
#[test]
fn a_followed_leaders_write_across_its_own_terms_is_told_from_a_stale_one() {
    let mut h = a_leader_paused_across_terms();
    h.workload(2_290, "follow-0.0", "w2", 100, accepted("w2"));
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.identity.renamed, 1);
    assert_eq!(report.acquired_follow, 3);
    assert!(
        report.to_string().contains(
            "1 sent with a followed term's token by a pod the followed Lease named again"
        ),
        "{report}"
    );

    // Sent after its process had learned token 102: not excused.
    let mut h = a_leader_paused_across_terms();
    h.workload(2_400, "follow-0.0", "w2", 100, accepted("w2"));
    let message = only(&h.check(), Kind::StaleWriter);
    assert!(
        message.contains("accepted write w2 of follow-0.0 (pod UID u0; it held token 100)")
            && message.contains("holder follow-1.0@2"),
        "{message}"
    );

    // Sent before it learned of its new term, but after the other leader took the Lease
    // again: not excused.
    let mut h = a_leader_paused_across_terms();
    h.0.retain(|e| !(e.p == "follow-0.0" && matches!(e.ev, Event::Acquired { token: 102, .. })));
    h.followed(2_600, 18, Some(("follow-1.0", 4, "u1")), 103)
        .workload(3_000, "follow-0.0", "w2", 100, accepted("w2"));
    let message = only(&h.check(), Kind::StaleWriter);
    assert!(
        message.contains("accepted write w2 of follow-0.0"),
        "{message}"
    );

    // Accepted while the other leader held: the identity rule failed.
    let mut h = a_leader_paused_across_terms();
    h.workload(1_500, "follow-0.0", "w2", 100, accepted("w2"));
    only(&h.check(), Kind::StaleWriter);
    // Refused, as it must be: counted.
    let mut h = a_leader_paused_across_terms();
    h.workload(1_500, "follow-0.0", "w2", 100, refused_by_identity("w2"));
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.identity.stale_refused, 1);
    assert_eq!(
        (
            report.identity.follower_answered,
            report.identity.follower_stale_refused
        ),
        (3, 1)
    );
}
