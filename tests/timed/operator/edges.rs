//! Promises at the edges, each as a user would break them:
//! - I1: a token is never issued twice when the operator's token record is deleted, damaged
//!   or left behind in another namespace, or the finalizer is stripped while it is down;
//!   hundreds of leases deleted at once all get their record, at once; the record is read
//!   when a lease is first seen, so a later damage of it does not hold up that lease;
//! - I10: lowering a held lease's duration does not cut the running term short;
//! - I5: a pod replaced under the same name inherits neither the hold nor the token;
//! - I7: another ServiceAccount with the same holder Role cannot renew or release a claim
//!   that is not its own, nor name a pod it does not run in.

use crate::common;

use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim, token_annotation_key};
use fenced_lease::holder::{AcquireOptions, acquire};
use fenced_lease_operator::reconcile::finalizer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Grants `l` to a fresh claim `name` and releases it; the token.
async fn grant_and_release(ns: &TestNamespace, name: &str) -> i64 {
    ns.create_claim(name, "l", None).await;
    let token = wait_for(&format!("{name} granted"), WAIT, || ns.granted_token(name)).await;
    ns.api::<FencedLeaseClaim>()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    token
}

/// Issues two tokens on lease `l`, deletes the lease; the last token.
async fn history(ns: &TestNamespace) -> i64 {
    ns.create_lease("l", 15);
    let first = grant_and_release(ns, "old-1").await;
    let last = grant_and_release(ns, "old-2").await;
    assert!(last > first);
    last
}

/// Deletes every token record the operator keeps in `state_ns`.
async fn delete_records(ns: &TestNamespace, state_ns: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), state_ns);
    for cm in cms.list(&ListParams::default()).await.unwrap() {
        let name = cm.metadata.name.unwrap_or_default();
        if name.starts_with("fenced-lease-tokens") {
            cms.delete(&name, &DeleteParams::default()).await.unwrap();
        }
    }
}

async fn recreated_token(ns: &TestNamespace) -> i64 {
    ns.create_lease("l", 15);
    ns.create_claim("new", "l", None).await;
    wait_for("the re-created lease granted", WAIT, || {
        ns.granted_token("new")
    })
    .await
}

#[tokio::test]
async fn i1_a_deleted_token_record_does_not_reissue_a_token() {
    let ns = TestNamespace::new("i1-deleted").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let last = history(&ns).await;
    ns.delete_lease("l").await;
    delete_records(&ns, &ns.name).await; // a GitOps prune of the operator's namespace
    let token = recreated_token(&ns).await;
    assert!(token > last, "token {token} issued again after {last}");
}

#[tokio::test]
async fn i1_a_finalizer_stripped_while_the_operator_is_down_does_not_reissue_a_token() {
    let ns = TestNamespace::new("i1-stripped").await;
    let mut op = OperatorProcess::start(&ns.name, &[]);
    let last = history(&ns).await;
    op.kill();
    // The usual fix for a namespace stuck Terminating: strip the finalizer.
    ns.api::<FencedLease>()
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    ns.delete_lease("l").await;
    op.restart();
    let token = recreated_token(&ns).await;
    assert!(token > last, "token {token} issued again after {last}");
}

#[tokio::test]
async fn i1_an_operator_reinstalled_in_another_namespace_does_not_reissue_a_token() {
    let ns = TestNamespace::new("i1-moved").await;
    let elsewhere = TestNamespace::new("i1-moved-op").await;
    let mut op = OperatorProcess::start(&ns.name, &[]);
    let last = history(&ns).await;
    ns.delete_lease("l").await;
    op.kill();
    // The records stay behind in the old namespace; the new install has none.
    let _op = OperatorProcess::start(&ns.name, &["--operator-namespace", &elsewhere.name]);
    let token = recreated_token(&ns).await;
    assert!(token > last, "token {token} issued again after {last}");
}

#[tokio::test]
async fn i1_a_damaged_token_record_stops_grants_until_repaired() {
    let ns = TestNamespace::new("i1-damaged").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    // A record far above the wall clock in ms (the other floor of a token), with a stray
    // newline: it must not be read as 0, nor overwritten.
    const RECORDED: i64 = 1 << 50;
    ns.kubectl_apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fenced-lease-tokens.{}}}\ndata: {{l: \"{RECORDED}\\n\"}}\n",
        ns.name
    ));
    ns.create_lease("l", 15);
    ns.create_claim("c", "l", None).await;
    wait_for("a Degraded condition and a Warning Event", WAIT, || async {
        let lease = ns.api::<FencedLease>().get("l").await.ok()?;
        let degraded = lease.status?.conditions.into_iter().find(|c| {
            c.type_ == "Degraded" && c.status == "True" && c.reason == "TokenRecordUnreadable"
        })?;
        let events = ns.api::<Event>().list(&ListParams::default()).await.ok()?;
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("TokenRecordUnreadable"))
            .then_some(degraded)
    })
    .await;
    assert_eq!(
        ns.granted_token("c").await,
        None,
        "granted on a damaged record"
    );

    ns.kubectl_apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fenced-lease-tokens.{}}}\ndata: {{l: \"{RECORDED}\"}}\n",
        ns.name
    ));
    let token = wait_for("the grant once repaired", Duration::from_secs(90), || {
        ns.granted_token("c")
    })
    .await;
    assert_eq!(token, RECORDED + 1, "the repaired record is a floor");
}

/// The record is read when the operator first sees a lease (before it puts its finalizer on),
/// not on the first claim's path: while that lease object exists only it writes its key (its
/// finalizer, and a token above the clock recorded before its grant). So a record damaged
/// afterwards does not hold up this lease's grants, its value still carries the tokens on, and
/// the grant above the clock overwrites the damage with its token.
#[tokio::test]
async fn i1_the_token_record_is_read_when_the_lease_is_first_seen() {
    let ns = TestNamespace::new("i1-ahead").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    const RECORDED: i64 = 1 << 50;
    let record = |value: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fenced-lease-tokens.{}}}\ndata: {{l: \"{value}\"}}\n",
            ns.name
        )
    };
    ns.kubectl_apply(&record(&RECORDED.to_string()));
    ns.create_lease("l", 15);
    wait_for("the token finalizer", WAIT, || async {
        let lease = ns.api::<FencedLease>().get("l").await.ok()?;
        finalizer::has_finalizer(&lease).then_some(())
    })
    .await;
    ns.kubectl_apply(&record("damaged"));
    ns.create_claim("c", "l", None).await;
    let token = wait_for("the grant", WAIT, || ns.granted_token("c")).await;
    assert_eq!(token, RECORDED + 1, "the record read ahead is the floor");
    let records = ns.api::<ConfigMap>();
    let repaired = records
        .get(&format!("fenced-lease-tokens.{}", ns.name))
        .await
        .unwrap();
    assert_eq!(
        repaired
            .data
            .unwrap_or_default()
            .get("l")
            .map(String::as_str),
        Some((RECORDED + 1).to_string().as_str()),
        "the token above the clock, recorded over the damage before its grant"
    );
}

/// How many leases the mass deletion deletes.
const LEASES: usize = 300;
/// Their minimum tokens start here, above the wall clock in ms: only the record can carry it.
const BASE: i64 = 1 << 48;

/// Creates leases `l-<i>` with minimum token `BASE + i`, and waits until each carries the
/// operator's finalizer.
async fn leases_with_finalizers(leases: &Api<FencedLease>) {
    futures::stream::iter(0..LEASES)
        .for_each_concurrent(16, |i| {
            let leases = leases.clone();
            async move {
                let lease: FencedLease = serde_json::from_value(json!({
                    "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
                    "metadata": {"name": format!("l-{i}")},
                    "spec": {"leaseDurationSeconds": 15, "minToken": BASE + i as i64},
                }))
                .unwrap();
                leases.create(&PostParams::default(), &lease).await.unwrap();
            }
        })
        .await;
    wait_for("every lease to carry the finalizer", WAIT, || async {
        let list = leases.list(&ListParams::default()).await.ok()?;
        (list.items.len() == LEASES
            && list.items.iter().all(|l| {
                l.metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == fenced_lease_operator::reconcile::finalizer::FINALIZER)
            }))
        .then_some(())
    })
    .await;
}

/// Deletes every lease at once, as deleting their namespace does (every finalizer records
/// into the one ConfigMap of the namespace): how long until they were all gone.
async fn delete_all_at_once(leases: &Api<FencedLease>) -> Duration {
    let deleted = Instant::now();
    leases
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    wait_for(
        "every lease to be gone",
        Duration::from_secs(60),
        || async {
            leases
                .list(&ListParams::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
        },
    )
    .await;
    deleted.elapsed()
}

#[tokio::test]
async fn i1_hundreds_of_leases_deleted_at_once_each_leave_their_record_without_contention() {
    let ns = TestNamespace::new("mass-delete").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    let leases: Api<FencedLease> = ns.api();
    leases_with_finalizers(&leases).await;
    let took = delete_all_at_once(&leases).await;

    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let records = cms
        .get(&format!("fenced-lease-tokens.{}", ns.name))
        .await
        .unwrap()
        .data
        .unwrap_or_default();
    for i in 0..LEASES {
        assert_eq!(
            records.get(&format!("l-{i}")),
            Some(&(BASE + i as i64).to_string()),
            "the record of l-{i}"
        );
    }
    let (_, metrics) = common::http_get(op.http_port().await, "/metrics")
        .await
        .unwrap();
    // Neither racing each other on the record, nor tripping over their own status write.
    let failed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("fenced_lease_reconcile_errors_total"))
        .collect();
    assert!(
        failed.is_empty(),
        "{LEASES} deletions failed reconciles (gone after {took:?}): {failed:?}"
    );
    assert!(
        took < Duration::from_secs(20),
        "{LEASES} leases took {took:?} to go"
    );
}

#[tokio::test]
async fn i10_lowering_the_duration_of_a_held_lease_keeps_the_running_term() {
    let ns = TestNamespace::new("i10").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 60);
    let options = || AcquireOptions::default().wait(Duration::from_secs(60));
    let a = acquire(
        ns.holder_client().await,
        &ns.name,
        "l",
        options().identity("a"),
    )
    .await
    .expect("a acquires");
    let b = tokio::spawn({
        let (client, ns) = (ns.holder_client().await, ns.name.clone());
        async move { acquire(client, &ns, "l", options().identity("b")).await }
    });
    wait_for("b to queue", WAIT, || async {
        (ns.api::<FencedLease>().get("l").await.ok()?.status?.waiting == 1).then_some(())
    })
    .await;

    ns.api::<FencedLease>()
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseDurationSeconds": 1}})),
        )
        .await
        .unwrap();
    // a heartbeats every 20 s (its term is 60 s): a 1 s term would have expired it by now.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let status = ns
            .api::<FencedLease>()
            .get("l")
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(
            status.holder.map(|h| h.claim).as_deref(),
            Some(a.claim()),
            "the running term was cut short:\n{}",
            op.log_text()
        );
        assert_eq!(
            status.lease_duration_seconds,
            Some(60),
            "the term's duration"
        );
        assert!(a.token().is_ok());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    a.release().await.unwrap();
    let b = b.await.unwrap().expect("b is granted at once");
    assert!(b.token().is_ok());
    let status = ns
        .api::<FencedLease>()
        .get("l")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        status.lease_duration_seconds,
        Some(1),
        "the next term takes the new duration"
    );
}

async fn create_pod(ns: &TestNamespace, name: &str) -> String {
    ns.create_pod_as(name, "default").await.uid
}

async fn annotation(ns: &TestNamespace, pod: &str) -> Option<(String, Option<String>)> {
    let pod = ns.api::<Pod>().get_opt(pod).await.ok()??;
    let value = pod
        .metadata
        .annotations
        .unwrap_or_default()
        .get(&token_annotation_key("l"))
        .cloned();
    Some((pod.metadata.uid?, value))
}

#[tokio::test]
async fn i5_a_pod_replaced_under_the_same_name_inherits_neither_hold_nor_token() {
    let ns = TestNamespace::new("i5-replaced").await;
    let op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 30);
    let old_uid = create_pod(&ns, "web-0").await;
    // A claim naming the pod, without an ownerReference: the grant records the pod's UID.
    ns.create_claim("c", "l", Some("web-0")).await;
    let token = wait_for("c granted", WAIT, || ns.granted_token("c")).await;
    wait_for("web-0 annotated", WAIT, || async {
        let (uid, value) = annotation(&ns, "web-0").await?;
        (uid == old_uid && value == Some(token.to_string())).then_some(())
    })
    .await;

    // A StatefulSet-style replacement after a force delete, while the operator is frozen, so
    // that it first sees the new pod of the same name.
    op.pause();
    ns.api::<Pod>()
        .delete("web-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let new_uid = create_pod(&ns, "web-0").await;
    assert_ne!(new_uid, old_uid);
    op.resume();

    wait_for("c revoked: its pod is gone", WAIT, || async {
        let claim = ns.api::<FencedLeaseClaim>().get("c").await.ok()?;
        (claim.status?.phase == Some(ClaimPhase::Revoked)).then_some(())
    })
    .await;
    let status = ns
        .api::<FencedLease>()
        .get("l")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.holder, None, "the replacement inherited the hold");
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let (uid, value) = annotation(&ns, "web-0").await.expect("the new pod");
        assert_eq!(uid, new_uid);
        assert_eq!(
            value, None,
            "the replacement pod carries the old pod's token"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn claim(name: &str, pod: Option<(&str, &str)>) -> FencedLeaseClaim {
    let mut value = json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": name},
        "spec": {"leaseName": "l", "holderIdentity": name},
    });
    if let Some((pod, uid)) = pod {
        value["spec"]["podName"] = json!(pod);
        value["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}]);
    }
    serde_json::from_value(value).unwrap()
}

/// The holder Role, bound to ServiceAccounts alice and bob of `ns`.
fn alice_and_bob_are_holders(ns: &TestNamespace) {
    ns.kubectl_apply(
        &std::fs::read_to_string(common::repo_root().join("deploy/rbac/holder-role.yaml")).unwrap(),
    );
    ns.kubectl()
        .args([
            "create",
            "rolebinding",
            "holders",
            "--role=fenced-lease-holder",
        ])
        .args([
            format!("--serviceaccount={}:alice", ns.name),
            format!("--serviceaccount={}:bob", ns.name),
        ])
        .output()
        .unwrap();
}

/// alice claims with her own pod alice-0 (`alice_uid`; RBAC bindings reach the authorizer
/// with a delay), is granted and her pod annotated: her token.
async fn alice_holds(ns: &TestNamespace, as_alice: &Api<FencedLeaseClaim>, alice_uid: &str) -> i64 {
    wait_for("alice's claim created", WAIT, || async {
        as_alice
            .create(
                &PostParams::default(),
                &claim("alice", Some(("alice-0", alice_uid))),
            )
            .await
            .ok()
    })
    .await;
    let token = wait_for("alice granted", WAIT, || ns.granted_token("alice")).await;
    wait_for("alice-0 annotated", WAIT, || async {
        (annotation(ns, "alice-0").await?.1? == token.to_string()).then_some(())
    })
    .await;
    token
}

/// bob can neither renew (with `beat`) nor release alice's claim, claim alice's pod, nor forge
/// the claim's creator: each refused by the claim ownership policy.
async fn bob_is_refused_alices_claim(
    as_bob: &Api<FencedLeaseClaim>,
    alice_uid: &str,
    beat: &serde_json::Value,
) {
    let refused = [
        (
            "renew",
            as_bob
                .patch("alice", &PatchParams::default(), &Patch::Merge(beat))
                .await
                .map(drop),
        ),
        ("release", as_bob.delete("alice", &DeleteParams::default()).await.map(drop)),
        (
            "claim alice's pod",
            as_bob
                .create(&PostParams::default(), &claim("bob", Some(("alice-0", alice_uid))))
                .await
                .map(drop),
        ),
        (
            "forge the creator",
            as_bob
                .patch(
                    "alice",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"fencing.dev/created-by": "system:serviceaccount:x:bob"}}})),
                )
                .await
                .map(drop),
        ),
    ];
    for (what, result) in refused {
        let (code, message) = common::api_error_message(result);
        assert_eq!(code, 403, "bob could {what}: {message}");
        assert!(
            message.contains("fenced-lease-claim-ownership"),
            "{what}: {message}"
        );
    }
}

#[tokio::test]
async fn i7_a_holder_cannot_touch_another_holders_claim_nor_name_its_pod() {
    let ns = TestNamespace::new("i7-claims").await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("l", 30);
    alice_and_bob_are_holders(&ns);
    let alice_pod = ns.create_pod_as("alice-0", "alice").await;
    let alice_uid = alice_pod.uid.clone();
    let alice = ns.client_as_pod(&alice_pod).await;
    let bob = ns.client_as("bob", None).await;
    let as_alice: Api<FencedLeaseClaim> = Api::namespaced(alice, &ns.name);
    let as_bob: Api<FencedLeaseClaim> = Api::namespaced(bob, &ns.name);
    let token = alice_holds(&ns, &as_alice, &alice_uid).await;

    let beat = json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}});
    bob_is_refused_alices_claim(&as_bob, &alice_uid, &beat).await;
    as_alice
        .patch("alice", &PatchParams::default(), &Patch::Merge(&beat))
        .await
        .expect("alice renews her own claim");
    assert_eq!(
        ns.granted_token("alice").await,
        Some(token),
        "bob changed nothing"
    );
    as_alice
        .delete("alice", &DeleteParams::default())
        .await
        .expect("alice releases her own claim");
}
