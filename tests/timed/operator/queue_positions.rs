//! Queue positions are written off the hand-over's path (issue 21): a hand-over writes the
//! lease and the new holder's claim, and the waiters behind it show their new places shortly
//! after, once the queue is still. A position decided before a grant never overwrites it.

use crate::common;

use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLeaseClaim};
use kube::api::{Api, DeleteParams};

const WAIT: Duration = Duration::from_secs(30);

/// (phase, queue position) of claim `name`.
async fn place(claims: &Api<FencedLeaseClaim>, name: &str) -> (Option<ClaimPhase>, Option<i32>) {
    let status = claims
        .get(name)
        .await
        .expect("get claim")
        .status
        .unwrap_or_default();
    (status.phase, status.queue_position)
}

async fn wait_places(
    claims: &Api<FencedLeaseClaim>,
    what: &str,
    want: &[(&str, ClaimPhase, Option<i32>)],
) {
    wait_for(what, WAIT, || async {
        for (name, phase, position) in want {
            if place(claims, name).await != (Some(*phase), *position) {
                return None;
            }
        }
        Some(())
    })
    .await;
}

#[tokio::test]
async fn waiters_move_up_the_queue_after_each_hand_over_and_grants_stay_granted() {
    let ns = TestNamespace::new("queue-positions").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 60);
    let claims: Api<FencedLeaseClaim> = ns.api();

    ns.create_claim("h", "db", None).await;
    wait_places(
        &claims,
        "h to be granted",
        &[("h", ClaimPhase::Granted, None)],
    )
    .await;
    // FIFO goes by creation second, then by name: w1..w4 queue in that order.
    for w in ["w1", "w2", "w3", "w4"] {
        ns.create_claim(w, "db", None).await;
    }
    use ClaimPhase::{Granted, Pending};
    wait_places(
        &claims,
        "the waiters to be queued at 1..4",
        &[
            ("w1", Pending, Some(1)),
            ("w2", Pending, Some(2)),
            ("w3", Pending, Some(3)),
            ("w4", Pending, Some(4)),
        ],
    )
    .await;

    for (holder, next, behind) in [
        ("h", "w1", ["w2", "w3", "w4"].as_slice()),
        ("w1", "w2", &["w3", "w4"]),
    ] {
        let released = Instant::now();
        claims
            .delete(holder, &DeleteParams::default())
            .await
            .expect("release");
        wait_places(
            &claims,
            &format!("{next} to be granted"),
            &[(next, Granted, None)],
        )
        .await;
        let granted = released.elapsed();
        let moved: Vec<_> = behind
            .iter()
            .enumerate()
            .map(|(i, w)| (*w, Pending, Some(i as i32 + 1)))
            .collect();
        wait_places(
            &claims,
            &format!("the waiters behind {next} to move up"),
            &moved,
        )
        .await;
        eprintln!(
            "MEASURED {next} granted {granted:?} after the release; the {} behind it moved up {:?} after the release",
            behind.len(),
            released.elapsed()
        );
        // The positions written meanwhile (conditional on the claims' cached versions) left
        // the grant as it was.
        assert_eq!(place(&claims, next).await, (Some(Granted), None), "{next}");
    }
}
