//! The holder library and the queue, against the real operator: a waiter that dies (SIGKILL)
//! must not cost the live waiters behind it a lease duration; and a term's duration is the
//! one fixed at its grant (I10), whatever the lease said when the holder started waiting.

use crate::common;

use std::time::{Duration, Instant};

use common::cli::{fence, kill};
use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLeaseClaim};
use fenced_lease::holder::{AcquireOptions, acquire};
use kube::api::{Api, ListParams};

const WAIT: Duration = Duration::from_secs(60);

fn options(identity: &str) -> AcquireOptions {
    AcquireOptions::default().identity(identity).wait(WAIT)
}

/// The queue position of `identity`'s claim, once the operator has queued it.
async fn position(claims: &Api<FencedLeaseClaim>, identity: &str) -> Option<i32> {
    let list = claims.list(&ListParams::default()).await.ok()?;
    let claim = list
        .items
        .into_iter()
        .find(|c| c.spec.holder_identity == identity)?;
    let status = claim.status?;
    (status.phase == Some(ClaimPhase::Pending))
        .then_some(status.queue_position)
        .flatten()
}

fn set_duration(ns: &TestNamespace, lease: &str, seconds: i32) {
    let out = ns
        .kubectl()
        .args(["patch", "flease", lease, "--type=merge", "-p"])
        .arg(format!(
            r#"{{"spec":{{"leaseDurationSeconds":{seconds}}}}}"#
        ))
        .output()
        .expect("kubectl patch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A waiter first in the queue is SIGKILLed (no pod to garbage-collect its claim). Its
/// heartbeat stops; the next live waiter must be granted within one lease duration of the
/// holder's release, not after a whole term given to the dead one.
#[tokio::test]
async fn a_sigkilled_waiter_does_not_cost_the_next_one_a_lease_duration() {
    const LEASE: Duration = Duration::from_secs(4);
    let ns = TestNamespace::new("dead-waiter").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 4);
    let client = ns.holder_client().await;
    let claims: Api<FencedLeaseClaim> = ns.api();
    let holder = acquire(client.clone(), &ns.name, "db", options("holder"))
        .await
        .expect("holder acquires");

    let mut dead = fence(&ns)
        .args(["run", "db", "--identity", "dead", "--", "true"])
        .spawn()
        .expect("kubectl fence run");
    wait_for("the doomed waiter to queue first", WAIT, || async {
        (position(&claims, "dead").await == Some(1)).then_some(())
    })
    .await;
    // FIFO goes by creation time in whole seconds, then by claim name (random): a live claim
    // created in the same second could queue ahead of the dead one. Start it a second later.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let live = tokio::spawn({
        let ns = ns.name.clone();
        async move {
            let guard = acquire(client, &ns, "db", options("live")).await;
            (guard, Instant::now())
        }
    });
    wait_for("the live waiter to queue second", WAIT, || async {
        (position(&claims, "live").await == Some(2)).then_some(())
    })
    .await;

    kill(dead.id(), "KILL");
    let _ = dead.wait();
    // Its heartbeat has not changed for more than a lease duration.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let released_at = Instant::now();
    holder.release().await.expect("release");
    let (guard, granted_at) = tokio::time::timeout(WAIT, live)
        .await
        .expect("granted")
        .expect("join");
    let guard = guard.expect("the live waiter acquires");
    let after = granted_at - released_at;
    eprintln!(
        "MEASURED next live waiter granted {after:?} after the holder's release, behind a SIGKILLed waiter (lease {LEASE:?})"
    );
    assert!(
        after < LEASE,
        "{after:?}: the dead waiter cost a lease duration"
    );
    guard.release().await.ok();
}

/// I10: the lease is edited from 3600 s to 10 s while a claim waits; once granted, the holder
/// counts its time on the term's 10 s, not the hour it read when it started waiting (until
/// the operator says the term's duration, on the smallest duration it has seen); a later edit
/// back to an hour does not lengthen the running term.
#[tokio::test]
async fn i10_a_lease_shortened_while_waiting_gives_the_holder_the_shorter_term() {
    let ns = TestNamespace::new("holder-i10").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 3600);
    let client = ns.holder_client().await;
    let claims: Api<FencedLeaseClaim> = ns.api();
    let holder = acquire(client.clone(), &ns.name, "db", options("holder"))
        .await
        .expect("holder acquires");
    let waiter = tokio::spawn({
        let ns = ns.name.clone();
        async move { acquire(client, &ns, "db", options("waiter")).await }
    });
    wait_for("the waiter to queue", WAIT, || async {
        position(&claims, "waiter").await.map(|_| ())
    })
    .await;
    set_duration(&ns, "db", 10);
    holder.release().await.expect("release");
    let guard = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("granted")
        .expect("join")
        .expect("waiter acquires");
    wait_for(
        "the holder to count on the 10 s term",
        Duration::from_secs(10),
        || async { (guard.lease_duration() == Duration::from_secs(10)).then_some(()) },
    )
    .await;
    let left = guard.time_left();
    eprintln!("MEASURED time left right after the grant: {left:?} (term 10s)");
    assert!(left <= Duration::from_secs(10), "{left:?}");
    assert!(guard.token().is_ok());

    set_duration(&ns, "db", 3600);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(guard.lease_duration(), Duration::from_secs(10));
    assert!(guard.time_left() <= Duration::from_secs(10));
    guard.release().await.expect("release");
}

/// I10, the other way: the lease is lengthened from 10 s to 30 s while a claim waits; the
/// term granted is 30 s, and the holder uses it once the operator says so on the claim (or
/// the lease). Before that, it can only assume the shortest duration it has seen.
#[tokio::test]
async fn i10_a_lease_lengthened_while_waiting_gives_the_holder_the_term_granted() {
    let ns = TestNamespace::new("holder-i10-longer").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 10);
    let client = ns.holder_client().await;
    let claims: Api<FencedLeaseClaim> = ns.api();
    let holder = acquire(client.clone(), &ns.name, "db", options("holder"))
        .await
        .expect("holder acquires");
    let waiter = tokio::spawn({
        let ns = ns.name.clone();
        async move { acquire(client, &ns, "db", options("waiter")).await }
    });
    wait_for("the waiter to queue", WAIT, || async {
        position(&claims, "waiter").await.map(|_| ())
    })
    .await;
    set_duration(&ns, "db", 30);
    holder.release().await.expect("release");
    let guard = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("granted")
        .expect("join")
        .expect("waiter acquires");
    wait_for(
        "the holder to use the 30 s term",
        Duration::from_secs(10),
        || async { (guard.lease_duration() == Duration::from_secs(30)).then_some(()) },
    )
    .await;
    // The operator writes the lease first (the holder may learn the term there), then the
    // claim.
    wait_for("the claim to say the 30 s term", WAIT, || async {
        let claim = claims.get(guard.claim()).await.ok()?;
        (claim.status?.lease_duration_seconds == Some(30)).then_some(())
    })
    .await;
    guard.release().await.expect("release");
}
