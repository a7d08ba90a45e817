//! The operator against a real control plane: grants, hand-overs, expiry, restarts, racing
//! replicas, re-created leases, pod annotations, garbage input. Each test is named after the
//! invariant of DESIGN.md it checks.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim, token_annotation_key};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

async fn create_pod(ns: &TestNamespace, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "example.invalid/holder:1"}]},
    }))
    .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

async fn heartbeat(ns: &TestNamespace, claim: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"spec": {"renewTime": now}});
    ns.api::<FencedLeaseClaim>()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("heartbeat");
}

/// (phase, token, queue position) of a claim, as `kubectl get fclaim` shows them.
async fn claim_state(
    ns: &TestNamespace,
    name: &str,
) -> (Option<ClaimPhase>, Option<i64>, Option<i32>) {
    let claim = ns
        .api::<FencedLeaseClaim>()
        .get(name)
        .await
        .expect("get claim");
    let status = claim.status.unwrap_or_default();
    (status.phase, status.fencing_token, status.queue_position)
}

async fn wait_granted(ns: &TestNamespace, claim: &str, timeout: Duration) -> i64 {
    wait_for(&format!("claim {claim} to be Granted"), timeout, || async {
        match claim_state(ns, claim).await {
            (Some(ClaimPhase::Granted), Some(token), _) => Some(token),
            _ => None,
        }
    })
    .await
}

async fn wait_phase(ns: &TestNamespace, claim: &str, phase: ClaimPhase) {
    wait_for(&format!("claim {claim} to be {phase:?}"), WAIT, || async {
        (claim_state(ns, claim).await.0 == Some(phase)).then_some(())
    })
    .await
}

async fn lease_token(ns: &TestNamespace, lease: &str) -> i64 {
    ns.api::<FencedLease>()
        .get(lease)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .fencing_token
}

/// `Granted` Events on leases: (lease, token) in the order they were issued,
/// once there are at least `expected` of them. The operator posts Events from a
/// queue after the grant is written, so they may trail the status by a moment.
async fn granted_events(ns: &TestNamespace, expected: usize) -> Vec<(String, i64)> {
    wait_for(&format!("{expected} Granted Events"), WAIT, || async {
        let grants = listed_grants(ns).await;
        (grants.len() >= expected).then_some(grants)
    })
    .await
}

async fn listed_grants(ns: &TestNamespace) -> Vec<(String, i64)> {
    let events: Api<Event> = ns.api();
    let mut grants: Vec<(String, i64, String)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Granted")
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("FencedLease")
        })
        .filter_map(|e| {
            let lease = e.regarding?.name?;
            let note = e.note?;
            let token = note
                .strip_prefix("granted token ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((lease, token, note))
        })
        .collect();
    grants.sort_by_key(|(lease, token, _)| (lease.clone(), *token));
    grants.into_iter().map(|(l, t, _)| (l, t)).collect()
}

fn kubectl_table(ns: &TestNamespace, what: &str) -> String {
    let out = ns.kubectl().args(["get", what]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn i1_i4_first_claim_is_granted_second_waits_and_is_handed_the_lease_on_release() {
    let ns = TestNamespace::new("op-fifo").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 60);

    ns.create_claim("first", "db", None).await;
    let first = wait_granted(&ns, "first", WAIT).await;
    assert!(first > 0);
    ns.create_claim("second", "db", None).await;
    wait_for("second to wait at position 1", WAIT, || async {
        (claim_state(&ns, "second").await == (Some(ClaimPhase::Pending), None, Some(1)))
            .then_some(())
    })
    .await;

    let leases = kubectl_table(&ns, "flease");
    let row: Vec<&str> = leases.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..4],
        ["db", "first", &first.to_string(), "1"],
        "kubectl get flease:\n{leases}"
    );

    let released = Instant::now();
    ns.api::<FencedLeaseClaim>()
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    let token = wait_granted(&ns, "second", WAIT).await;
    let handover = released.elapsed();
    assert!(token > first, "token {token} after {first}");
    assert!(
        handover < Duration::from_secs(1),
        "handed over after {handover:?}, not at once"
    );

    let grants = granted_events(&ns, 2).await;
    assert_eq!(
        grants,
        [("db".to_string(), first), ("db".to_string(), token)]
    );
    let describe = String::from_utf8(
        ns.kubectl()
            .args(["describe", "flease", "db"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        describe.contains("Released")
            && describe.contains(&format!("granted token {token} to second")),
        "{describe}"
    );
}

#[tokio::test]
async fn i3_silent_holder_expires_after_the_lease_duration_and_not_before() {
    let ns = TestNamespace::new("op-expire").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    const DURATION: Duration = Duration::from_secs(3);
    ns.create_lease("job", 3);

    // A holder that keeps beating keeps the lease past several durations.
    ns.create_claim("beating", "job", None).await;
    let first = wait_granted(&ns, "beating", WAIT).await;
    ns.create_claim("next", "job", None).await;
    let _next_beats = ns.keep_beating("next", Duration::from_millis(500));
    let until = Instant::now() + DURATION * 3;
    while Instant::now() < until {
        heartbeat(&ns, "beating").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        claim_state(&ns, "beating").await.0,
        Some(ClaimPhase::Granted),
        "a beating holder lost the lease"
    );

    // Once it falls silent it is expired a lease duration after its last beat.
    heartbeat(&ns, "beating").await;
    let last_beat = Instant::now();
    let token = wait_granted(&ns, "next", DURATION * 4).await;
    let silent_for = last_beat.elapsed();
    assert!(token > first);
    assert!(
        silent_for >= DURATION - Duration::from_millis(100),
        "expired after {silent_for:?}, before the lease duration"
    );
    assert!(
        silent_for < DURATION + Duration::from_millis(1500),
        "expired after {silent_for:?}, long after the lease duration"
    );
    wait_phase(&ns, "beating", ClaimPhase::Expired).await;
    assert_eq!(
        claim_state(&ns, "beating").await.1,
        Some(first),
        "an expired claim keeps the token it held"
    );
    // The operator's own figure of how late it was: one expiry, within the bound above.
    assert_eq!(
        op.metric("fenced_lease_expiry_delay_seconds_count").await,
        Some(1.0),
        "expiries counted by fenced_lease_expiry_delay_seconds"
    );
    let delay = op
        .metric("fenced_lease_expiry_delay_seconds_sum")
        .await
        .unwrap_or(f64::NAN);
    assert!((0.0..1.5).contains(&delay), "expiry delay {delay} s");
}

#[tokio::test]
async fn i1_operator_killed_after_a_grant_issues_no_token_twice_and_expires_no_one_early() {
    let ns = TestNamespace::new("op-restart").await;
    let mut op = OperatorProcess::start(&ns.name, &[]);
    const DURATION: Duration = Duration::from_secs(4);
    ns.create_lease("l", 4);
    ns.create_claim("a", "l", None).await;
    ns.create_claim("b", "l", None).await;
    let _b_beats = ns.keep_beating("b", Duration::from_millis(500));
    let first = wait_granted(&ns, "a", WAIT).await;
    // Killed once the grant is announced: an Event still queued would die with
    // the process, and the Events are how this test counts issues.
    assert_eq!(granted_events(&ns, 1).await, [("l".to_string(), first)]);
    op.kill();
    op.restart();
    let restarted = Instant::now();

    // The fresh operator gives the holder a full term before expiring it.
    while restarted.elapsed() < DURATION * 7 / 10 {
        assert_eq!(
            claim_state(&ns, "a").await.0,
            Some(ClaimPhase::Granted),
            "expired early after a restart"
        );
        assert_eq!(lease_token(&ns, "l").await, first);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = wait_granted(&ns, "b", WAIT).await;
    assert!(second > first);
    let grants = granted_events(&ns, 2).await;
    assert_eq!(
        grants,
        [("l".to_string(), first), ("l".to_string(), second)],
        "each token issued once"
    );
}

/// How many rounds of claims the two racing operators grant, two claims per lease a round.
const ROUNDS: i64 = 20;

/// Every lease status the apiserver stores, as a watch saw it: (lease, token, holder's claim
/// UID).
type Statuses = Vec<(String, i64, Option<String>)>;

/// Watches every lease status of `ns` until `stop`: what it saw.
fn record_lease_statuses(
    ns: &TestNamespace,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Statuses> {
    let api = ns.api::<FencedLease>();
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut seen: Statuses = vec![];
        let stream =
            kube::runtime::watcher(api, Default::default()).take_until(stop.cancelled_owned());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(
                kube::runtime::watcher::Event::Apply(l)
                | kube::runtime::watcher::Event::InitApply(l),
            ) = event
            {
                let status = l.status.clone().unwrap_or_default();
                seen.push((
                    l.metadata.name.clone().unwrap(),
                    status.fencing_token,
                    status.holder.map(|h| h.claim_uid),
                ));
            }
        }
        seen
    })
}

/// Churn: claims come, are granted, and release, on all `leases` at once, for [`ROUNDS`]
/// rounds. The token each claim was granted, by claim name.
async fn churn(ns: &TestNamespace, leases: [&str; 3]) -> BTreeMap<String, i64> {
    let mut claim_tokens: BTreeMap<String, i64> = BTreeMap::new();
    for round in 0..ROUNDS {
        for lease in leases {
            for i in 0..2 {
                ns.create_claim(&format!("{lease}-{round}-{i}"), lease, None)
                    .await;
            }
        }
        for lease in leases {
            for i in 0..2 {
                let name = format!("{lease}-{round}-{i}");
                let token = wait_granted(ns, &name, WAIT).await;
                claim_tokens.insert(name.clone(), token);
                ns.api::<FencedLeaseClaim>()
                    .delete(&name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
    }
    claim_tokens
}

/// In the statuses the apiserver stored, a lease's token never went down, and no two
/// distinct holders were ever recorded with the same token.
fn assert_tokens_only_go_up_each_held_once(seen: &Statuses, leases: [&str; 3]) {
    for lease in leases {
        let history: Vec<&(String, i64, Option<String>)> =
            seen.iter().filter(|(l, _, _)| l == lease).collect();
        assert!(
            history.len() >= usize::try_from(2 * ROUNDS).unwrap(),
            "lease {lease}: the watch saw only {} statuses",
            history.len()
        );
        assert!(
            history.windows(2).all(|w| w[0].1 <= w[1].1),
            "lease {lease}: the token went down: {history:?}"
        );
        let mut holder_of: BTreeMap<i64, &str> = BTreeMap::new();
        for (_, token, holder) in &history {
            if let Some(uid) = holder {
                let first = holder_of.entry(*token).or_insert(uid.as_str());
                assert_eq!(
                    *first,
                    uid.as_str(),
                    "lease {lease}: token {token} held by two claims"
                );
            }
        }
    }
}

/// Each lease granted each of its claims a token of its own, and its Granted Events name
/// exactly those tokens.
async fn assert_each_token_granted_once(
    ns: &TestNamespace,
    claim_tokens: &BTreeMap<String, i64>,
    leases: [&str; 3],
) {
    let mut claim_sets: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for lease in leases {
        let tokens: Vec<i64> = claim_tokens
            .iter()
            .filter(|(n, _)| n.starts_with(&format!("{lease}-")))
            .map(|(_, t)| *t)
            .collect();
        let distinct: BTreeSet<i64> = tokens.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            tokens.len(),
            "lease {lease}: a token was granted to two claims: {tokens:?}"
        );
        assert_eq!(
            distinct.len(),
            usize::try_from(2 * ROUNDS).unwrap(),
            "lease {lease}: {} grants",
            2 * ROUNDS
        );
        claim_sets.insert(lease.to_string(), distinct);
    }
    let grants = granted_events(ns, leases.len() * 2 * usize::try_from(ROUNDS).unwrap()).await;
    for lease in leases {
        let tokens: Vec<i64> = grants
            .iter()
            .filter(|(l, _)| l == lease)
            .map(|(_, t)| *t)
            .collect();
        assert_eq!(
            tokens,
            claim_sets[lease].iter().copied().collect::<Vec<_>>(),
            "lease {lease}: every token granted exactly once"
        );
    }
}

#[tokio::test]
async fn i1_i2_two_operators_at_once_issue_every_token_exactly_once() {
    let ns = TestNamespace::new("op-race").await;
    // Every grant's Event is counted below: no Normal-Event budget (the default lets ~50 out
    // of a quick burst of 120 through).
    let every_event = ["--events-per-second", "10000"];
    let a = OperatorProcess::start(&ns.name, &every_event);
    let b = OperatorProcess::start(&ns.name, &every_event);
    let leases = ["x", "y", "z"];
    for lease in leases {
        ns.create_lease(lease, 30);
    }

    let stop_watching = tokio_util::sync::CancellationToken::new();
    let recorder = record_lease_statuses(&ns, stop_watching.clone());
    let claim_tokens = churn(&ns, leases).await;
    stop_watching.cancel();
    let seen = recorder.await.unwrap();
    assert_tokens_only_go_up_each_held_once(&seen, leases);
    assert_each_token_granted_once(&ns, &claim_tokens, leases).await;

    // The two really raced: some of their status writes were refused on resourceVersion.
    let mut conflicts = 0;
    for op in [&a, &b] {
        conflicts += op
            .metric("fenced_lease_status_conflicts_total")
            .await
            .expect("the conflicts counter") as u64;
    }
    assert!(
        conflicts > 0,
        "the two operators never collided, so the race was not exercised"
    );
}

#[tokio::test]
async fn i1_recreated_lease_and_raised_min_token_only_go_up() {
    // Far above the wall clock in ms, which is the other floor of a token.
    const MIN_TOKEN: i64 = 1 << 51;
    let ns = TestNamespace::new("op-recreate").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 30);
    let mut last = 0;
    for i in 0..3 {
        let name = format!("c{i}");
        ns.create_claim(&name, "l", None).await;
        let token = wait_granted(&ns, &name, WAIT).await;
        assert!(token > last, "token {token} after {last}");
        last = token;
        ns.api::<FencedLeaseClaim>()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }

    ns.delete_lease("l").await;
    ns.create_lease("l", 30);
    ns.create_claim("after", "l", None).await;
    let after = wait_granted(&ns, "after", WAIT).await;
    assert!(
        after > last,
        "a re-created lease continues above its last token: {after} after {last}"
    );

    ns.api::<FencedLeaseClaim>()
        .delete("after", &DeleteParams::default())
        .await
        .unwrap();
    ns.api::<FencedLease>()
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minToken": MIN_TOKEN}})),
        )
        .await
        .unwrap();
    ns.create_claim("restored", "l", None).await;
    assert_eq!(
        wait_granted(&ns, "restored", WAIT).await,
        MIN_TOKEN + 1,
        "minToken is a floor"
    );
}

#[tokio::test]
async fn i5_holder_pod_carries_the_token_until_it_stops_holding_and_its_deletion_releases() {
    let ns = TestNamespace::new("op-pods").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 30);
    create_pod(&ns, "holder-a").await;
    create_pod(&ns, "holder-b").await;
    let key = token_annotation_key("l");
    let annotation = |pod: &'static str| {
        let api = ns.api::<Pod>();
        let key = key.clone();
        async move {
            api.get(pod)
                .await
                .unwrap()
                .metadata
                .annotations
                .unwrap_or_default()
                .get(&key)
                .cloned()
        }
    };

    ns.create_claim("a", "l", Some("holder-a")).await;
    ns.create_claim("b", "l", Some("holder-b")).await;
    let first = wait_granted(&ns, "a", WAIT).await.to_string();
    wait_for("holder-a annotated with its token", WAIT, || async {
        (annotation("holder-a").await.as_deref() == Some(first.as_str())).then_some(())
    })
    .await;
    assert_eq!(
        annotation("holder-b").await,
        None,
        "a waiting pod carries no token"
    );

    // Deleting the holder's pod releases the lease (no garbage collector needed).
    ns.api::<Pod>()
        .delete("holder-a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let second = wait_granted(&ns, "b", WAIT).await.to_string();
    wait_for("holder-b annotated with its token", WAIT, || async {
        (annotation("holder-b").await.as_deref() == Some(second.as_str())).then_some(())
    })
    .await;
    wait_phase(&ns, "a", ClaimPhase::Revoked).await;

    // Release: the annotation goes with the lease.
    ns.api::<FencedLeaseClaim>()
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("holder-b's annotation removed", WAIT, || async {
        annotation("holder-b").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn i8_garbage_input_gives_conditions_and_events_and_the_operator_keeps_working() {
    let ns = TestNamespace::new("op-garbage").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("real", 30);

    // A claim for a lease that does not exist.
    ns.create_claim("lost", "no-such-lease", None).await;
    wait_for("LeaseFound=False on the claim", WAIT, || async {
        let claim = ns.api::<FencedLeaseClaim>().get("lost").await.ok()?;
        let status = claim.status?;
        status
            .conditions
            .iter()
            .any(|c| {
                c.type_ == "LeaseFound"
                    && c.status == "False"
                    && c.message.contains("no-such-lease")
            })
            .then_some(())
    })
    .await;
    // A claim naming a pod that does not exist waits and says why.
    ns.create_claim("ghost", "real", Some("no-such-pod")).await;
    ns.create_claim("ok", "real", None).await;
    assert!(
        wait_granted(&ns, "ok", WAIT).await > 0,
        "the unknown pod's claim, though older, is skipped"
    );
    let ghost = ns
        .api::<FencedLeaseClaim>()
        .get("ghost")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(ghost.phase, Some(ClaimPhase::Pending));
    assert!(
        ghost
            .conditions
            .iter()
            .any(|c| c.type_ == "PodFound" && c.status == "False"),
        "{ghost:?}"
    );

    // A hand-edited status naming a claim that does not exist is repaired: the lease goes
    // to a real claim, with a new token.
    const FORGED: i64 = 1 << 49; // above the wall clock in ms, the other floor of a token
    let forged = json!({"status": {"holder": {"claim": "nobody", "claimUid": "0000", "identity": "nobody"}, "fencingToken": FORGED}});
    ns.api::<FencedLease>()
        .patch_status("real", &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap();
    wait_phase(&ns, "ok", ClaimPhase::Revoked).await;
    ns.create_claim("fresh", "real", None).await;
    assert_eq!(wait_granted(&ns, "fresh", WAIT).await, FORGED + 1);

    // Events are posted from a queue, so they may trail what they report.
    wait_for("LeaseNotFound and PodNotFound Events", WAIT, || async {
        let reasons: Vec<String> = ns
            .api::<Event>()
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        (reasons.iter().any(|r| r == "LeaseNotFound") && reasons.iter().any(|r| r == "PodNotFound"))
            .then_some(())
    })
    .await;
    assert!(
        !op.log_text().contains("panicked"),
        "the operator panicked:\n{}",
        op.log_text()
    );
}

#[tokio::test]
async fn i7_holder_role_can_claim_renew_and_release_but_never_write_a_status() {
    let ns = TestNamespace::new("op-rbac").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 30);
    let kubeconfig = ns.holder_service_account_kubeconfig("worker", true).await;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), &ns.name);
    let leases: Api<FencedLease> = Api::namespaced(client, &ns.name);

    // RBAC changes reach the authorizer through an informer: the first create may race it.
    let claim: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim", "metadata": {"name": "mine"},
        "spec": {"leaseName": "l", "holderIdentity": "worker"},
        "status": {"phase": "Granted", "fencingToken": 999},
    }))
    .unwrap();
    wait_for("the holder Role to take effect", WAIT, || async {
        claims.create(&PostParams::default(), &claim).await.ok()
    })
    .await;
    let token = wait_granted(&ns, "mine", WAIT).await;
    assert_ne!(
        token, 999,
        "a status sent with the create is ignored; the operator issues the token"
    );

    let beat = json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}});
    claims
        .patch("mine", &PatchParams::default(), &Patch::Merge(&beat))
        .await
        .expect("a holder renews its claim");

    let forged = json!({"status": {"fencingToken": 5000}});
    for result in [
        claims
            .patch_status("mine", &PatchParams::default(), &Patch::Merge(&forged))
            .await
            .map(drop),
        leases
            .patch_status("l", &PatchParams::default(), &Patch::Merge(&forged))
            .await
            .map(drop),
        leases
            .patch(
                "l",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"minToken": 5000}})),
            )
            .await
            .map(drop),
    ] {
        let (code, message) = common::api_error_message(result);
        assert_eq!(code, 403, "{message}");
    }
    assert_eq!(lease_token(&ns, "l").await, token);

    claims
        .delete("mine", &DeleteParams::default())
        .await
        .expect("a holder releases its claim");
}
