//! Kubernetes objects fenced by the apiserver itself (deploy/admission/): the per-object rule
//! (a write's token against the token stored on the object), the lease rule (against the
//! lease's current token, for a lease with spec.fenceObjects), and the kinds slots the
//! operator keeps for spec.fence.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::fence::fenced_config_map;
use common::operator::OperatorProcess;
use common::{TestNamespace, api_error_message, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim, TOKEN_ANNOTATION};
use fenced_lease::fence::{self, kube::stamp_patch};
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Writes `data` to ConfigMap `name` with `token` (a merge patch, as a holder would).
async fn write(
    api: &Api<ConfigMap>,
    name: &str,
    lease: &str,
    token: i64,
    data: &str,
) -> Result<ConfigMap, kube::Error> {
    let mut patch = stamp_patch(lease, token);
    patch["data"] = json!({ "data": data });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

fn data_of(cm: &ConfigMap) -> String {
    cm.data.as_ref().unwrap()["data"].clone()
}

#[tokio::test]
async fn object_rule_refuses_a_lower_token_and_accepts_an_equal_one() {
    let ns = TestNamespace::new("fence-object").await;
    ns.with_fence_policies().await;
    let api = ns.api::<ConfigMap>();
    api.create(
        &PostParams::default(),
        &fenced_config_map("ledger", "payouts", "5", "first"),
    )
    .await
    .expect("create with token 5");

    write(&api, "ledger", "payouts", 5, "same holder again")
        .await
        .expect("an equal token is accepted");
    write(&api, "ledger", "payouts", 7, "newer holder")
        .await
        .expect("a higher token is accepted");

    let refused = write(&api, "ledger", "payouts", 6, "stale holder")
        .await
        .expect_err("a lower token is refused");
    let kube::Error::Api(status) = &refused else {
        panic!("{refused:?}")
    };
    let (code, message) = (status.code, status.message.clone());
    assert_eq!(code, 403, "{message}");
    for part in [
        &format!("ConfigMap {}/ledger", ns.name),
        "fencing.dev/token 6 is lower than 7",
        "stored on the object",
        "lease payouts",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert!(matches!(
        fence::Error::from(refused),
        fence::Error::Fenced {
            presented: 6,
            highest: 7,
            ..
        }
    ));
    assert_eq!(data_of(&api.get("ledger").await.unwrap()), "newer holder");

    // A delete is stamped first, so a stale holder cannot delete either.
    let stale_delete = fence::kube::delete(&api, "ledger", "payouts", 6).await;
    assert!(
        matches!(stale_delete, Err(fence::Error::Fenced { .. })),
        "{stale_delete:?}"
    );
    assert!(api.get_opt("ledger").await.unwrap().is_some());
    fence::kube::delete(&api, "ledger", "payouts", 7)
        .await
        .expect("the holder of the highest token deletes");
    assert!(api.get_opt("ledger").await.unwrap().is_none());
}

#[tokio::test]
async fn malformed_tokens_and_escapes_from_the_fence_are_refused_with_a_clear_message() {
    let ns = TestNamespace::new("fence-bad-input").await;
    ns.with_fence_policies().await;
    let api = ns.api::<ConfigMap>();
    for (token, shown) in [
        ("abc", "(got \"abc\")"),
        ("-1", "(got \"-1\")"),
        ("1.5", "(got \"1.5\")"),
        ("99999999999999999999", "(got \"99999999999999999999\")"),
        // Above 2^53 - 1: a Redis fence (doubles) could not compare it exactly.
        ("9007199254740992", "(got \"9007199254740992\")"),
    ] {
        let result = api
            .create(
                &PostParams::default(),
                &fenced_config_map("bad", "payouts", token, ""),
            )
            .await;
        let (code, message) = api_error_message(result);
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains("must carry the annotation fencing.dev/token")
                && message.contains("an integer from 0 to 9007199254740991")
                && message.contains(shown),
            "{message}"
        );
    }
    let mut unstamped = fenced_config_map("bad", "payouts", "1", "");
    unstamped.metadata.annotations = None;
    let (_, message) = api_error_message(api.create(&PostParams::default(), &unstamped).await);
    assert!(message.contains("(it has none)"), "{message}");

    // Removing the label or the token would take the object out of its fence.
    api.create(
        &PostParams::default(),
        &fenced_config_map("ledger", "payouts", "3", ""),
    )
    .await
    .unwrap();
    let unlabel = json!({"metadata": {"labels": {"fencing.dev/lease": null}}});
    let (code, message) = api_error_message(
        api.patch("ledger", &PatchParams::default(), &Patch::Merge(unlabel))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("fencing.dev/lease=payouts cannot be removed or changed"),
        "{message}"
    );
    let relabel = json!({"metadata": {"labels": {"fencing.dev/lease": "other"}}});
    assert!(
        api.patch("ledger", &PatchParams::default(), &Patch::Merge(relabel))
            .await
            .is_err()
    );
    let untoken = json!({"metadata": {"annotations": {TOKEN_ANNOTATION: null}}});
    let (code, _) = api_error_message(
        api.patch("ledger", &PatchParams::default(), &Patch::Merge(untoken))
            .await,
    );
    assert_eq!(code, 422);
}

#[tokio::test]
async fn concurrent_writers_never_leave_a_lower_token_after_a_higher_one() {
    let ns = TestNamespace::new("fence-object-race").await;
    ns.with_fence_policies().await;
    let api = ns.api::<ConfigMap>();
    api.create(
        &PostParams::default(),
        &fenced_config_map("history", "payouts", "0", ""),
    )
    .await
    .unwrap();

    // Each write appends its token to the object's history (read, append, write on that
    // resourceVersion): the history is the order in which the apiserver accepted writes.
    let refused = Arc::new(AtomicUsize::new(0));
    let writers = (0..8).map(|_| {
        let (api, refused) = (api.clone(), refused.clone());
        tokio::spawn(async move {
            for _ in 0..8 {
                let token: i64 = rand::random_range(0..1000);
                loop {
                    let mut cm = api.get("history").await.expect("get");
                    let history = data_of(&cm);
                    cm.data = Some([("data".into(), format!("{history} {token}"))].into());
                    cm.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(TOKEN_ANNOTATION.into(), token.to_string());
                    match api.replace("history", &PostParams::default(), &cm).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => continue,
                        Err(e) => match fence::Error::from(e) {
                            fence::Error::Fenced {
                                presented, highest, ..
                            } => {
                                assert_eq!(presented, token);
                                assert!(highest > token);
                                refused.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            other => panic!("unexpected error: {other}"),
                        },
                    }
                }
            }
        })
    });
    for writer in writers.collect::<Vec<_>>() {
        writer.await.unwrap();
    }

    let accepted: Vec<i64> = data_of(&api.get("history").await.unwrap())
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert!(
        accepted.windows(2).all(|w| w[0] <= w[1]),
        "a lower token was accepted after a higher one: {accepted:?}"
    );
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "no write was refused, so nothing was tested"
    );
    assert_eq!(
        accepted.len() + refused.load(Ordering::Relaxed),
        64,
        "every write was either accepted or refused"
    );
}

async fn create_fencing_lease(ns: &TestNamespace, name: &str) {
    let out = ns.kubectl_apply(&format!(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: {name}\nspec:\n  leaseDurationSeconds: 15\n  fenceObjects: true\n"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kinds slots that list namespace `ns` for `resource` (core group), as stored.
async fn slots_listing(ns: &TestNamespace, resource: &str) -> Vec<String> {
    let policies = Api::<ValidatingAdmissionPolicy>::all(ns.client.clone());
    let mut listing = vec![];
    for name in shipped::slot_names() {
        let policy = policies
            .get(&name)
            .await
            .expect("the kinds slots are installed");
        if let Ok(Some(a)) = shipped::assignment(&policy)
            && a.kind.resource == resource
            && a.namespaces.contains(&ns.name)
        {
            listing.push(name);
        }
    }
    listing
}

/// Admission objects in the cluster, by kind: the operator creates and deletes none.
async fn admission_objects(ns: &TestNamespace) -> (usize, usize) {
    let lp = kube::api::ListParams::default();
    let policies = Api::<ValidatingAdmissionPolicy>::all(ns.client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(ns.client.clone());
    (
        policies.list_metadata(&lp).await.unwrap().items.len(),
        bindings.list_metadata(&lp).await.unwrap().items.len(),
    )
}

#[tokio::test]
async fn lease_rule_refuses_tokens_below_the_lease_s_current_token() {
    let ns = TestNamespace::new("fence-lease").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    create_fencing_lease(&ns, "payouts").await;
    ns.create_claim("a", "payouts", None).await;
    let ta = wait_for("a granted", WAIT, || ns.granted_token("a")).await;
    let api = ns.api::<ConfigMap>();
    let create = |name: &str, token: i64| {
        let cm = fenced_config_map(name, "payouts", &token.to_string(), name);
        let api = api.clone();
        async move { api.create(&PostParams::default(), &cm).await }
    };
    // The binding reaches admission through an informer: the first write may be early.
    wait_for("a's first write accepted", WAIT, || async {
        create("a-1", ta).await.ok()
    })
    .await;

    ns.create_claim("b", "payouts", None).await;
    ns.api::<FencedLeaseClaim>()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let tb = wait_for("b granted", WAIT, || ns.granted_token("b")).await;
    assert!(tb > ta);

    // An object b never wrote: only the lease rule can refuse a's write to it.
    let refusal = wait_for("a's stale create refused", WAIT, || async {
        let _ = api.delete("a-2", &DeleteParams::default()).await; // accepted during the lag
        create("a-2", ta).await.err()
    })
    .await;
    let (code, message) = api_error_message::<ConfigMap>(Err(refusal));
    assert_eq!(code, 403, "{message}");
    for part in [
        format!("ConfigMap {}/a-2", ns.name),
        format!("fencing.dev/token {ta} is lower than {tb}"),
        format!("current token of FencedLease {}/payouts", ns.name),
    ] {
        assert!(message.contains(&part), "{part:?} not in {message:?}");
    }
    create("b-1", tb).await.expect("the holder writes");

    // a-1 still carries a's token: nobody deletes it without stamping a current token.
    let (code, message) = api_error_message(api.delete("a-1", &DeleteParams::default()).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("stamp yours first"), "{message}");
    let stale = fence::kube::delete(&api, "a-1", "payouts", ta).await;
    assert!(
        matches!(stale, Err(fence::Error::Fenced { presented, highest, .. }) if presented == ta && highest == tb),
        "{stale:?}"
    );
    fence::kube::delete(&api, "a-1", "payouts", tb)
        .await
        .expect("the holder deletes");
}

/// Sets `spec.fence` of lease `lease` to `value`.
async fn set_fence(leases: &Api<FencedLease>, lease: &str, value: serde_json::Value) {
    let patch = Patch::Merge(json!({ "spec": { "fence": value } }));
    leases
        .patch(lease, &PatchParams::default(), &patch)
        .await
        .unwrap();
}

/// Waits until a kinds slot lists `ns` for `resource` (`want`), or none does.
async fn wait_listed(ns: &TestNamespace, what: &str, resource: &str, want: bool) {
    wait_for(what, WAIT, || async {
        (slots_listing(ns, resource).await.is_empty() != want).then_some(())
    })
    .await;
}

/// The slot that lists `ns` for ConfigMaps, edited by hand to leave it out: put back.
async fn a_slot_edited_by_hand_is_put_back(ns: &TestNamespace) {
    let slot = slots_listing(ns, "configmaps").await.remove(0);
    let policies = Api::<ValidatingAdmissionPolicy>::all(ns.client.clone());
    let mut edited = policies.get(&slot).await.unwrap();
    let mut assigned = shipped::assignment(&edited).unwrap().unwrap();
    assigned.namespaces.remove(&ns.name);
    edited.spec = shipped::slot_policy(0, Some(&assigned).filter(|a| !a.namespaces.is_empty()))
        .unwrap()
        .spec;
    policies
        .replace(&slot, &PostParams::default(), &edited)
        .await
        .unwrap();
    wait_listed(ns, "listed again", "configmaps", true).await;
}

#[tokio::test]
async fn operator_lists_a_namespace_in_a_kinds_slot_exactly_while_a_lease_there_fences_the_kind() {
    let ns = TestNamespace::new("fence-slots").await;
    ns.with_fence_policies().await;
    let before = admission_objects(&ns).await;
    let mut op = OperatorProcess::start(&ns.name, &[]);
    let leases = ns.api::<FencedLease>();
    create_fencing_lease(&ns, "payouts").await;
    set_fence(
        &leases,
        "payouts",
        json!({"resources": [{"resource": "secrets"}]}),
    )
    .await;
    wait_listed(&ns, "secrets listed", "secrets", true).await;
    set_fence(
        &leases,
        "payouts",
        json!({"resources": [{"resource": "configmaps"}]}),
    )
    .await;
    wait_listed(&ns, "configmaps listed", "configmaps", true).await;
    wait_listed(&ns, "secrets no longer listed", "secrets", false).await;

    // Another lease of the namespace fencing the same kind keeps it listed.
    create_fencing_lease(&ns, "other").await;
    set_fence(
        &leases,
        "other",
        json!({"resources": [{"resource": "configmaps"}]}),
    )
    .await;
    ns.delete_lease("payouts").await;
    tokio::time::sleep(Duration::from_secs(2)).await; // nothing is to happen: give it the chance
    assert_eq!(
        slots_listing(&ns, "configmaps").await.len(),
        1,
        "kept for `other`"
    );
    a_slot_edited_by_hand_is_put_back(&ns).await;

    // A lease deleted while no operator ran (its finalizer stripped) leaves the slot when
    // one starts.
    op.kill();
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    leases
        .patch("other", &PatchParams::default(), &strip)
        .await
        .unwrap();
    leases
        .delete("other", &DeleteParams::default())
        .await
        .unwrap();
    op.restart();
    wait_listed(&ns, "the namespace leaves the slot", "configmaps", false).await;
    assert_eq!(
        admission_objects(&ns).await,
        before,
        "the operator created or deleted an admission object"
    );
}
