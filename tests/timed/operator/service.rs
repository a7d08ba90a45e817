//! The operator as a service: health and metrics endpoints, graceful shutdown, and leader
//! election among replicas (only the leader grants).

use crate::common;

use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, http_get, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use k8s_openapi::api::coordination::v1::Lease;

const WAIT: Duration = Duration::from_secs(30);

async fn create(ns: &TestNamespace, lease: &str, claim: &str) {
    if ns
        .api::<FencedLease>()
        .get_opt(lease)
        .await
        .unwrap()
        .is_none()
    {
        ns.create_lease(lease, 15);
    }
    ns.create_claim(claim, lease, None).await;
}

/// The lease still carries the user's own label `team` and annotation `owner` after the
/// operator's status writes.
fn assert_users_metadata_kept(lease: FencedLease) {
    assert_eq!(
        lease
            .metadata
            .labels
            .unwrap_or_default()
            .get("team")
            .map(String::as_str),
        Some("payments"),
        "the lease's labels after two status writes"
    );
    assert_eq!(
        lease
            .metadata
            .annotations
            .unwrap_or_default()
            .get("owner")
            .map(String::as_str),
        Some("alice"),
        "the lease's annotations after two status writes"
    );
}

#[tokio::test]
async fn serves_health_and_metrics_and_stops_gracefully_on_sigterm() {
    let ns = TestNamespace::new("svc-http").await;
    let mut op = OperatorProcess::start(&ns.name, &[]);
    let port = op.http_port().await;
    assert_eq!(http_get(port, "/livez").await.map(|r| r.0), Some(200));
    wait_for("/readyz to answer 200", WAIT, || async {
        (http_get(port, "/readyz").await?.0 == 200).then_some(())
    })
    .await;

    // A lease with the user's own labels and annotations: the operator caches leases without
    // them, and its status writes must not take them away.
    let out = ns.kubectl_apply(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: l\n  labels:\n    team: payments\n  annotations:\n    owner: alice\nspec:\n  leaseDurationSeconds: 15\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    create(&ns, "l", "c").await;
    wait_for("the grant", WAIT, || ns.granted_token("c")).await;
    let granted = [
        format!(
            r#"fenced_lease_transitions_total{{namespace="{}",lease="l",transition="Granted"}} 1"#,
            ns.name
        ),
        format!(
            r#"fenced_lease_holders{{namespace="{}",lease="l"}} 1"#,
            ns.name
        ),
    ];
    let metrics = wait_for("the grant in /metrics", WAIT, || async {
        let (_, body) = http_get(port, "/metrics").await?;
        granted.iter().all(|m| body.contains(m)).then_some(body)
    })
    .await;
    assert!(
        metrics.contains("fenced_lease_reconcile_duration_seconds_count"),
        "{metrics}"
    );
    // A second claim waits: the gauge follows the lease's status.
    ns.create_claim("c2", "l", None).await;
    let waiting = format!(
        r#"fenced_lease_waiting_claims{{namespace="{}",lease="l"}} 1"#,
        ns.name
    );
    wait_for("the waiting claim in /metrics", WAIT, || async {
        let (_, body) = http_get(port, "/metrics").await?;
        body.contains(&waiting).then_some(())
    })
    .await;
    let lease = ns.api::<FencedLease>().get("l").await.unwrap();
    assert_eq!(lease.status.as_ref().map(|s| s.waiting), Some(1));
    assert_users_metadata_kept(lease);

    let status = op
        .terminate(Duration::from_secs(15))
        .expect("the operator did not stop within 15s of SIGTERM");
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

/// A replica named `identity`, electing a leader among replicas on a 3 s leader lease.
fn replica(ns: &TestNamespace, identity: &str) -> OperatorProcess {
    let election = [
        "--leader-election=true",
        "--leader-election-lease-seconds",
        "3",
    ];
    OperatorProcess::start(
        &ns.name,
        &[&election[..], &["--identity", identity]].concat(),
    )
}

/// Waits until `op`'s log holds `text`.
async fn wait_logged(op: &OperatorProcess, what: &str, text: &str) {
    wait_for(what, WAIT, || async {
        op.log_text().contains(text).then_some(())
    })
    .await;
}

/// The identity the replicas' leader Lease names.
async fn leader(ns: &TestNamespace) -> Option<String> {
    ns.api::<Lease>()
        .get("fenced-lease-operator")
        .await
        .ok()?
        .spec?
        .holder_identity
}

/// The leader `first` dies without a word: the standby `second` waits out the lease, then
/// takes over, and grants above `token_one`.
async fn the_standby_takes_over(
    ns: &TestNamespace,
    first: &mut OperatorProcess,
    second: &OperatorProcess,
    token_one: i64,
) {
    first.kill();
    let killed = Instant::now();
    wait_logged(second, "replica-b to lead", "became leader").await;
    let takeover = killed.elapsed();
    assert!(
        takeover >= Duration::from_secs(2),
        "took over after {takeover:?}, before the leader lease ran out"
    );
    assert_eq!(leader(ns).await.as_deref(), Some("replica-b"));
    wait_for("replica-b to report leading", WAIT, || async {
        (second.metric("fenced_lease_leader").await? == 1.0).then_some(())
    })
    .await;
    ns.api::<FencedLeaseClaim>()
        .delete("one", &Default::default())
        .await
        .unwrap();
    create(ns, "l", "two").await;
    let token_two = wait_for("the grant by the new leader", WAIT, || {
        ns.granted_token("two")
    })
    .await;
    assert!(token_two > token_one, "{token_two} after {token_one}");
}

/// A leader (`second`) that stops gracefully hands over at once, to `first` restarted.
async fn a_graceful_stop_hands_over_at_once(
    first: &mut OperatorProcess,
    second: &mut OperatorProcess,
) {
    first.restart();
    wait_for("replica-a to wait", WAIT, || async {
        first
            .log_text()
            .matches("waiting for leadership")
            .count()
            .ge(&1)
            .then_some(())
    })
    .await;
    let stopped = Instant::now();
    second
        .terminate(Duration::from_secs(15))
        .expect("replica-b stops on SIGTERM");
    wait_for("replica-a to lead again", WAIT, || async {
        (first.log_text().matches("became leader").count() >= 2).then_some(())
    })
    .await;
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "graceful hand-over took {:?}",
        stopped.elapsed()
    );
}

#[tokio::test]
async fn only_the_elected_replica_grants_and_a_standby_takes_over() {
    let ns = TestNamespace::new("svc-leader").await;
    let mut first = replica(&ns, "replica-a");
    wait_logged(&first, "replica-a to lead", "became leader").await;
    let mut second = replica(&ns, "replica-b");
    wait_logged(&second, "replica-b to wait", "waiting for leadership").await;

    create(&ns, "l", "one").await;
    let token_one = wait_for("the grant", WAIT, || ns.granted_token("one")).await;
    assert!(first.log_text().contains("granted"), "the leader granted");
    assert!(
        !second.log_text().contains("granted"),
        "the standby must not reconcile:\n{}",
        second.log_text()
    );
    assert_eq!(leader(&ns).await.as_deref(), Some("replica-a"));
    // fenced_lease_leader says which replica leads (the alert FencedLeaseNoLeader reads it).
    assert_eq!(first.metric("fenced_lease_leader").await, Some(1.0));
    assert_eq!(second.metric("fenced_lease_leader").await, Some(0.0));

    the_standby_takes_over(&ns, &mut first, &second, token_one).await;
    a_graceful_stop_hands_over_at_once(&mut first, &mut second).await;
}
