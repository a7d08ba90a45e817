//! A clean history passes and is counted, a hand-over's margin is measured, and a history
//! survives its JSON lines.

use super::*;

#[test]
fn the_hand_over_margin_is_measured_on_expiries() {
    let mut h = clean();
    for e in &mut h.0 {
        if let Event::Released { how, .. } = &mut e.ev {
            *how = "detached".into(); // the claim was left to expire
        }
    }
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    // The second holder's first Ok (returned at 1 201 ms) came 241 ms after the first's last
    // call (960 ms).
    assert_eq!(report.closest_handover, Some(241 * MS as i64));
}

#[test]
fn a_clean_history_passes_and_is_counted() {
    let report = clean().check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.grants, 2);
    assert_eq!(report.grants_watched, 2);
    assert_eq!(report.grants_held, 2);
    assert_eq!(report.acquire_attempts, 2);
    assert_eq!(report.writes[&Resource::Postgres].accepted, 2);
    assert_eq!(report.operations(), 2 + 2 + 1);
    // Holder 0 released: the hand-over margin counts only hand-overs by expiry.
    assert_eq!(report.closest_handover, None);
    let table = report.to_string();
    for line in [
        "operations",
        "grants",
        "faults",
        "violations",
        "token-issued-twice",
        "kill-holder",
    ] {
        assert!(table.contains(line), "{line} missing from\n{table}");
    }
}

#[test]
fn grants_are_counted_by_kind_of_holder() {
    let mut h = History::default();
    h.holds("holder-0.0", "a", "a-1", 100, 10, 100)
        .holds("go-3.0", "a", "a-2", 101, 200, 300)
        .holds("golock-4.0", "a", "a-3", 102, 400, 500)
        .holds("golock-4.0", "a", "a-4", 103, 600, 700)
        .at(
            800,
            "follow-5.0",
            Event::Acquired {
                lease: "a".into(),
                claim: "follow-5.0@1".into(),
                token: 104,
            },
        );
    let report = h.check();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(
        (
            report.acquired_library,
            report.acquired_go,
            report.acquired_go_lock,
            report.acquired_follow
        ),
        (1, 1, 2, 1)
    );
    let table = report.to_string();
    assert!(table.contains("1 / 0 / 4"), "{table}");
    assert!(
        table.contains("Go: lease / lock / follow           1 / 2 / 1"),
        "{table}"
    );
}

#[test]
fn a_history_survives_a_round_trip_through_json_lines() {
    let h = clean();
    let dir = std::env::temp_dir().join(format!("jepsen-checker-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let rec = history::Recorder::create(&dir.join("x.jsonl"), "x");
    for e in &h.0 {
        rec.record_at(e.t, e.ev.clone());
    }
    std::fs::write(
        dir.join("cut.jsonl"),
        "{\"t\": 5, \"p\": \"y\", \"ev\": \"wai",
    )
    .unwrap();
    let (loaded, damaged) = history::load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(damaged, 1);
    assert_eq!(loaded.len(), h.0.len());
    assert!(check(&loaded, &Config::default()).violations.is_empty());
}
