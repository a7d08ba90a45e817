//! Kubernetes objects fenced by the apiserver itself (deploy/admission/fence-policy.yaml):
//! the per-object rule (a write's token against the token stored on the object), the lease
//! rule (against the lease's current token, through the binding the operator keeps for a
//! lease with spec.fenceObjects), and the binding's life cycle.

#[path = "../common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::fence::fenced_config_map;
use common::operator::OperatorProcess;
use common::{TestNamespace, api_error_message, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim, TOKEN_ANNOTATION};
use fenced_lease::fence::{self, kube::stamp_patch};
use fenced_lease::operator::core::fence::{binding_name, desired_binding, kinds_binding_name};
use fenced_lease::operator::core::fence_policy::desired_kinds_policy;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
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
            highest: 7
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
                            fence::Error::Fenced { presented, highest } => {
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

async fn binding(ns: &TestNamespace, lease: &str) -> Option<ValidatingAdmissionPolicyBinding> {
    named_binding(ns, binding_name(&ns.name, lease)).await
}

async fn named_binding(
    ns: &TestNamespace,
    name: String,
) -> Option<ValidatingAdmissionPolicyBinding> {
    Api::<ValidatingAdmissionPolicyBinding>::all(ns.client.clone())
        .get_opt(&name)
        .await
        .expect("get binding")
}

#[tokio::test]
async fn lease_rule_refuses_tokens_below_the_lease_s_current_token() {
    let ns = TestNamespace::new("fence-lease").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    create_fencing_lease(&ns, "payouts").await;
    wait_for("the lease's binding", WAIT, || binding(&ns, "payouts")).await;
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
        matches!(stale, Err(fence::Error::Fenced { presented, highest }) if presented == ta && highest == tb),
        "{stale:?}"
    );
    fence::kube::delete(&api, "a-1", "payouts", tb)
        .await
        .expect("the holder deletes");
}

#[tokio::test]
async fn operator_keeps_a_binding_exactly_while_the_lease_fences_objects() {
    let ns = TestNamespace::new("fence-binding").await;
    let mut op = OperatorProcess::start(&ns.name, &[]);
    create_fencing_lease(&ns, "payouts").await;
    let b = wait_for("the binding", WAIT, || binding(&ns, "payouts")).await;
    let param = b.spec.param_ref.unwrap();
    assert_eq!(
        (param.name.as_deref(), param.namespace.as_deref()),
        (Some("payouts"), Some(ns.name.as_str()))
    );

    let leases = ns.api::<FencedLease>();
    let set = |spec: serde_json::Value| {
        let leases = leases.clone();
        async move {
            leases
                .patch(
                    "payouts",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": spec })),
                )
                .await
                .unwrap();
        }
    };
    set(json!({"fenceObjects": false})).await;
    wait_for("the binding deleted", WAIT, || async {
        binding(&ns, "payouts").await.is_none().then_some(())
    })
    .await;
    set(json!({"fenceObjects": true})).await;
    wait_for("the binding back", WAIT, || binding(&ns, "payouts")).await;

    // spec.fence: a second binding, for the kinds it names, kept and removed the same way.
    let kinds = || named_binding(&ns, kinds_binding_name(&ns.name, "payouts"));
    let fence = |value: serde_json::Value| set(json!({ "fence": value }));
    fence(json!({"resources": [{"group": "apps", "resource": "deployments"}]})).await;
    let b = wait_for("the kinds binding", WAIT, kinds).await;
    let rules = b.spec.match_resources.unwrap().resource_rules.unwrap();
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["deployments".to_string(), "deployments/*".to_string()][..])
    );
    fence(json!({"resources": [{"resource": "configmaps"}]})).await;
    wait_for("the kinds binding follows the spec", WAIT, || async {
        let b = kinds().await?;
        let rules = b.spec.match_resources?.resource_rules?;
        (rules[0].resources.as_deref()? == ["configmaps", "configmaps/*"]).then_some(())
    })
    .await;
    let kinds_policy = || async {
        Api::<ValidatingAdmissionPolicy>::all(ns.client.clone())
            .get_opt(&kinds_binding_name(&ns.name, "payouts"))
            .await
            .expect("get policy")
    };
    let policy = kinds_policy()
        .await
        .expect("the kinds binding's own policy");
    let constraints = policy.spec.unwrap().match_constraints.unwrap();
    assert_eq!(
        constraints.resource_rules.unwrap()[0].resources.as_deref(),
        Some(&["configmaps".to_string(), "configmaps/*".to_string()][..]),
        "the policy matches what its binding does"
    );
    fence(serde_json::Value::Null).await;
    wait_for("the kinds binding deleted", WAIT, || async {
        kinds().await.is_none().then_some(())
    })
    .await;
    wait_for("its policy deleted", WAIT, || async {
        kinds_policy().await.is_none().then_some(())
    })
    .await;
    assert!(
        binding(&ns, "payouts").await.is_some(),
        "the label binding stays"
    );
    fence(json!({"resources": [{"resource": "configmaps"}]})).await;
    wait_for("the kinds binding back", WAIT, kinds).await;

    // The bindings go before the lease's finalizer does.
    ns.delete_lease("payouts").await;
    assert!(binding(&ns, "payouts").await.is_none());
    assert!(kinds().await.is_none());
    assert!(kinds_policy().await.is_none());

    // One left behind (its lease deleted while no operator ran) goes when an operator starts.
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(ns.client.clone());
    bindings
        .create(&PostParams::default(), &desired_binding(&ns.name, "gone"))
        .await
        .unwrap();
    let fence: fenced_lease::api::FenceSpec =
        serde_json::from_value(json!({"resources": [{"resource": "configmaps"}]})).unwrap();
    let orphan = desired_kinds_policy(&ns.name, "gone", &fence).unwrap();
    let policies = Api::<ValidatingAdmissionPolicy>::all(ns.client.clone());
    policies
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    op.restart();
    wait_for("the orphaned binding deleted", WAIT, || async {
        binding(&ns, "gone").await.is_none().then_some(())
    })
    .await;
    wait_for("the orphaned policy deleted", WAIT, || async {
        let gone = policies.get_opt(&orphan.name_any()).await.unwrap();
        gone.is_none().then_some(())
    })
    .await;
}
