//! The core scenario, through whatever operator serves a namespace (the chart's, with the
//! chart's permissions): grant, annotate, release, expire, revoke on pod deletion, a claim for
//! a missing lease, a pod write refused (a Warning Event, repeated), a followed Lease, lease
//! deletions through the finalizer and a lease re-created; and its short form for the
//! namespaces a release serves. A missing permission shows as a wait that times out.

use std::time::Duration;

use fenced_lease::api::{ClaimPhase, FencedLeaseClaim, token_annotation_key};
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::WAIT;
use crate::common::{self, Beating, TestNamespace, wait_for};
use crate::helm::run_ok;

/// How often the scenario's waiting claims heartbeat.
const BEAT: Duration = Duration::from_millis(500);

/// Creates FencedLease `name` that asks for its objects to be fenced, labelled ones
/// (`spec.fenceObjects`) and a kind (`spec.fence`), so that whatever the operator does for that
/// (per-lease admission policy bindings, and a policy for the kind) needs the chart's
/// permissions too.
pub fn create_fenced_lease(ns: &TestNamespace, name: &str, duration_seconds: i32) {
    let out = ns.kubectl_apply(&format!(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: {name}\nspec:\n  leaseDurationSeconds: {duration_seconds}\n  fenceObjects: true\n  fence:\n    resources: [{{group: apps, resource: statefulsets}}]\n"
    ));
    assert!(
        out.status.success(),
        "create lease: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates a pod that never runs (there is no kubelet), for annotations and pod deletion.
async fn create_pod(ns: &TestNamespace, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/x:1"}]}
    }))
    .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

async fn phase(ns: &TestNamespace, claim: &str) -> Option<ClaimPhase> {
    let claim: FencedLeaseClaim = ns.api().get(claim).await.ok()?;
    claim.status?.phase
}

async fn wait_phase(ns: &TestNamespace, claim: &str, want: ClaimPhase) {
    wait_for(&format!("claim {claim} {want:?}"), WAIT, || async {
        (phase(ns, claim).await? == want).then_some(())
    })
    .await;
}

async fn annotation(ns: &TestNamespace, pod: &str, lease: &str) -> Option<String> {
    let pod = ns.api::<Pod>().get(pod).await.expect("get pod");
    pod.metadata
        .annotations?
        .get(&token_annotation_key(lease))
        .cloned()
}

/// Waits until pod `pod` carries `token` as its annotation for `lease`.
async fn wait_annotated(ns: &TestNamespace, what: &str, pod: &str, lease: &str, token: i64) {
    wait_for(what, WAIT, || async {
        (annotation(ns, pod, lease).await? == token.to_string()).then_some(())
    })
    .await;
}

async fn delete<K>(ns: &TestNamespace, name: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    ns.api::<K>()
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete");
}

/// A policy that refuses every write to pod `name` of namespace `ns`, in force once this
/// returns: the operator's annotation of that pod keeps failing.
fn refuse_writes_to_pod(ns: &TestNamespace, prefix: &str, name: &str) {
    let policy = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: {prefix}-locked-pod\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules:\n      - apiGroups: [\"\"]\n        apiVersions: [v1]\n        operations: [UPDATE]\n        resources: [pods]\n  validations:\n    - expression: \"object.metadata.name != '{name}'\"\n      message: pod {name} takes no writes (test)\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata:\n  name: {prefix}-locked-pod\nspec:\n  policyName: {prefix}-locked-pod\n  validationActions: [Deny]\n  matchResources:\n    namespaceSelector:\n      matchLabels:\n        kubernetes.io/metadata.name: {ns}\n",
        ns = ns.name
    );
    let out = ns.kubectl_apply(&policy);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let out = ns
            .kubectl()
            .args([
                "annotate",
                "pod",
                name,
                "probe=1",
                "--dry-run=server",
                "--overwrite",
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the policy never took effect"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn delete_policy(prefix: &str) {
    for kind in [
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicy",
    ] {
        let _ = common::control_plane()
            .kubectl_cmd()
            .args([
                "delete",
                kind,
                &format!("{prefix}-locked-pod"),
                "--ignore-not-found",
            ])
            .output();
    }
}

/// The core scenario, through whatever operator serves `ns`: grant, annotate, release,
/// expire, revoke on pod deletion, a claim for a missing lease, a pod write refused (a Warning
/// Event, repeated), lease deletions through the finalizer and a lease re-created.
pub async fn core_scenario(ns: &TestNamespace, policy_prefix: &str) {
    create_pod(ns, "p").await;
    create_pod(ns, "q").await;
    create_fenced_lease(ns, "l", 2);
    ns.create_claim("a", "l", Some("p")).await;
    ns.create_claim("b", "l", None).await;
    ns.create_claim("c", "l", Some("q")).await;
    // They wait like live candidates: a waiter silent for a lease duration is skipped, and a
    // lease that fences objects is granted only once its binding is in force (2 s).
    let _a_beats = ns.keep_beating("a", BEAT);
    let b_beats = ns.keep_beating("b", BEAT);
    let _c_beats = ns.keep_beating("c", BEAT);
    let a = wait_for("a granted", WAIT, || ns.granted_token("a")).await;
    wait_annotated(ns, "pod p annotated with a's token", "p", "l", a).await;

    a_kinds_slot_edited_by_hand_is_put_back(ns).await;
    let b = a_release_hands_over_at_once(ns, a, b_beats).await;
    let c = an_expiry_hands_over_after_the_duration(ns, b).await;

    // Revocation: c's pod goes.
    delete::<Pod>(ns, "q").await;
    wait_phase(ns, "c", ClaimPhase::Revoked).await;

    a_claim_for_a_missing_lease_waits_and_says_so(ns).await;
    a_refused_annotation_is_retried_and_reported(ns, policy_prefix).await;
    a_followed_lease_annotates_the_pod_its_holder_names(ns).await;
    a_recreated_lease_continues_above_its_last_token(ns, c).await;
}

/// The kinds slot that lists the namespace, edited by hand, is put back.
async fn a_kinds_slot_edited_by_hand_is_put_back(ns: &TestNamespace) {
    let slot = wait_for("a kinds slot listing the namespace", WAIT, || async {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(ns.client.clone());
        for name in shipped::slot_names() {
            let policy = policies.get(&name).await.ok()?;
            if let Ok(Some(a)) = shipped::assignment(&policy)
                && a.namespaces.contains(&ns.name)
            {
                return Some(name);
            }
        }
        None
    })
    .await;
    let read = || {
        let out = common::control_plane()
            .kubectl_cmd()
            .args(["get", "validatingadmissionpolicy", &slot])
            .args(["-o", "jsonpath={.spec.failurePolicy}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(read(), "Fail");
    run_ok(common::control_plane().kubectl_cmd().args([
        "patch",
        "validatingadmissionpolicy",
        &slot,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"failurePolicy":"Ignore"}}"#,
    ]));
    wait_for(&format!("{slot} put back"), WAIT, || async {
        (read() == "Fail").then_some(())
    })
    .await;
}

/// Release: b is next, at once; b stops heartbeating once granted. Returns b's token.
async fn a_release_hands_over_at_once(ns: &TestNamespace, a: i64, b_beats: Beating) -> i64 {
    delete::<FencedLeaseClaim>(ns, "a").await;
    let b = wait_for("b granted", WAIT, || ns.granted_token("b")).await;
    drop(b_beats);
    assert!(b > a, "tokens grow: {a} then {b}");
    wait_for("p's annotation removed", WAIT, || async {
        annotation(ns, "p", "l").await.is_none().then_some(())
    })
    .await;
    b
}

/// Expiry: b no longer heartbeats, so c is granted after the lease duration. Returns c's token.
async fn an_expiry_hands_over_after_the_duration(ns: &TestNamespace, b: i64) -> i64 {
    wait_phase(ns, "b", ClaimPhase::Expired).await;
    let c = wait_for("c granted", WAIT, || ns.granted_token("c")).await;
    assert!(c > b, "tokens grow: {b} then {c}");
    wait_annotated(ns, "pod q annotated with c's token", "q", "l", c).await;
    c
}

/// A claim for a lease that does not exist waits, and says so.
async fn a_claim_for_a_missing_lease_waits_and_says_so(ns: &TestNamespace) {
    ns.create_claim("orphan", "missing", None).await;
    wait_for("orphan told the lease is missing", WAIT, || async {
        let claim: FencedLeaseClaim = ns.api().get("orphan").await.ok()?;
        claim
            .status?
            .conditions
            .iter()
            .any(|c| c.type_ == "LeaseFound" && c.status == "False")
            .then_some(())
    })
    .await;
}

/// A pod the operator may not write: the grant stands, the annotation fails and is
/// retried, with a Warning Event that repeats (an Event series).
async fn a_refused_annotation_is_retried_and_reported(ns: &TestNamespace, policy_prefix: &str) {
    create_pod(ns, "locked").await;
    refuse_writes_to_pod(ns, policy_prefix, "locked");
    ns.create_lease("m", 30);
    ns.create_claim("d", "m", Some("locked")).await;
    let d = wait_for("d granted", WAIT, || ns.granted_token("d")).await;
    wait_for("the refusal reported in an Event series", WAIT, || async {
        let out = ns
            .kubectl()
            .args(["get", "events.events.k8s.io", "-o", "json"])
            .output()
            .ok()?;
        let events: Value = serde_json::from_slice(&out.stdout).ok()?;
        events["items"]
            .as_array()?
            .iter()
            .any(|e| e["type"] == "Warning" && e["series"]["count"].as_i64() >= Some(2))
            .then_some(())
    })
    .await;
    delete_policy(policy_prefix);
    let what = "pod locked annotated once writes are allowed again";
    wait_annotated(ns, what, "locked", "m", d).await;
}

/// A lease that follows a coordination Lease: the pod its holder identity names holds it
/// (the operator watches and reads Leases).
async fn a_followed_lease_annotates_the_pod_its_holder_names(ns: &TestNamespace) {
    let out = ns.kubectl_apply(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: ctrl}\nspec: {holderIdentity: p_0b1a4c8e}\n---\napiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {name: f}\nspec: {follow: {lease: ctrl}}\n",
    );
    assert!(out.status.success(), "{}", common::cli::both(&out));
    wait_for("pod p annotated with f's token", WAIT, || async {
        annotation(ns, "p", "f").await.map(|_| ())
    })
    .await;
    ns.delete_lease("f").await;
}

/// Deleting leases goes through the finalizer, which records their last tokens (the
/// operator's own records, in its namespace): a lease re-created under the same name
/// continues above them (above `c`, l's last token).
async fn a_recreated_lease_continues_above_its_last_token(ns: &TestNamespace, c: i64) {
    ns.delete_lease("l").await;
    ns.delete_lease("m").await;
    create_fenced_lease(ns, "l", 2);
    ns.create_claim("e", "l", None).await;
    let _e_beats = ns.keep_beating("e", BEAT);
    let e = wait_for("e granted", WAIT, || ns.granted_token("e")).await;
    assert!(e > c, "the re-created lease continues above {c}: {e}");
    ns.delete_lease("l").await;
}

/// Grant, annotation, release and lease deletion.
pub async fn grant_and_release(work: &TestNamespace) {
    create_pod(work, "p").await;
    create_fenced_lease(work, "l", 15);
    work.create_claim("a", "l", Some("p")).await;
    work.create_claim("b", "l", None).await;
    let a = wait_for("a granted", WAIT, || work.granted_token("a")).await;
    wait_annotated(work, "pod p annotated", "p", "l", a).await;
    delete::<FencedLeaseClaim>(work, "a").await;
    let b = wait_for("b granted", WAIT, || work.granted_token("b")).await;
    assert!(b > a);
    work.delete_lease("l").await;
}
