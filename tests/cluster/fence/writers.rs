//! Who writes what a lease fences (issue 55, items 2 and 3).
//!
//! `spec.onlyHolderWrites`: a lease author can say that only the holder's
//! pod writes what the lease fences. A pod that shares the holder's ServiceAccount, refused with
//! its own pod-bound token, mints a token of that ServiceAccount bound to no pod and writes the
//! fenced ConfigMap: accepted by default (such a writer meets only the token rule), refused
//! once the lease has `onlyHolderWrites`, with a message naming the field and the exemption; an
//! identity a Role rule naming `override` allows still writes, and so does the holder.
//!
//! Owners: the garbage collector deletes the dependents of a deleted owner for whoever deleted
//! it, so a lease that fences dependents fences their owners' kinds too (docs/fencing.md shows
//! the `spec.fence`); fenced that way, a non-holder's delete of the owner is refused and the
//! dependents stay.

use crate::common;

use common::TestNamespace;
use common::operator::OperatorProcess;
use fenced_lease::api::FencedLease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::harness::{
    Findings, WAIT, accepted_within, books_held_by, config_map, create_config_map, describe,
    fencing_configmaps, grant, merge_patch, refused_within, wait_allowed, wait_fence_refuses_pb,
};

/// CI: a ServiceAccount allowed to write ConfigMaps and `override` on the lease by name; a
/// client as it once the authorizer allows the override.
async fn ci_exempt_by_name(ns: &TestNamespace) -> Client {
    grant(
        ns,
        "ci-exempt",
        "ci",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases"]
    resourceNames: ["books"]
    verbs: ["override"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "create", "update", "patch"]
"#,
    );
    let ci = ns.client_as("ci", None).await;
    wait_allowed(
        &ci,
        &ns.name,
        "override",
        "fencing.dev",
        "fencedleases",
        Some("books"),
    )
    .await;
    ci
}

/// Once lease books has `spec.onlyHolderWrites`, a write through the minted token is refused,
/// naming the field and the exemption.
async fn only_holder_writes_refuses_the_minted_token(
    ns: &TestNamespace,
    as_minted: &Api<ConfigMap>,
    findings: &mut Findings,
) {
    ns.api::<FencedLease>()
        .patch(
            "books",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"onlyHolderWrites": true}})),
        )
        .await
        .expect("set spec.onlyHolderWrites");
    let refused = refused_within(WAIT, || {
        merge_patch(as_minted, "ledger", json!({"data": {"x": "minted-again"}}))
    })
    .await;
    match refused {
        Ok((code, message)) => findings.check(
            code == 403
                && message.contains("is not a pod")
                && message.contains("onlyHolderWrites")
                && message.contains("override"),
            || {
                format!(
                    "the minted token's patch was refused, but the message does not name \
                     onlyHolderWrites and the exemption: {code} {message}"
                )
            },
        ),
        Err(last) => findings.check(false, || {
            format!(
                "with onlyHolderWrites, a token bound to no pod still wrote for {WAIT:?}: {last}"
            )
        }),
    }
}

#[tokio::test]
async fn a_token_bound_to_no_pod_is_refused_when_only_the_holder_writes() {
    let ns = TestNamespace::new("only-holder").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let ci = ci_exempt_by_name(&ns).await;
    let _beat = books_held_by(&ns, pa, fencing_configmaps()).await;

    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    // pb's ServiceAccount, with a token bound to no pod (`create serviceaccounts/token`).
    let as_minted: Api<ConfigMap> =
        Api::namespaced(ns.client_as(&pb.service_account, None).await, &ns.name);
    let as_ci: Api<ConfigMap> = Api::namespaced(ci, &ns.name);
    accepted_within(WAIT, || {
        create_config_map(&as_pa, config_map("ledger", "pa"))
    })
    .await
    .unwrap_or_else(|last| panic!("the holder pa's ConfigMap was refused: {last}"));
    refused_within(WAIT, || {
        merge_patch(&as_pb, "ledger", json!({"data": {"x": "pb"}}))
    })
    .await
    .unwrap_or_else(|last| panic!("precondition: pb's own token was never refused: {last}"));

    let mut findings = Findings::default();
    // By default a writer that is not a pod meets only the token rule (unchanged).
    let minted = merge_patch(&as_minted, "ledger", json!({"data": {"x": "minted"}})).await;
    findings.check(minted.is_ok(), || {
        format!(
            "by default, the minted token's unstamped patch was refused: {}",
            describe(&minted)
        )
    });
    only_holder_writes_refuses_the_minted_token(&ns, &as_minted, &mut findings).await;
    // The exemption, and the holder, still write.
    let exempt = merge_patch(&as_ci, "ledger", json!({"data": {"x": "ci"}})).await;
    findings.check(exempt.is_ok(), || {
        format!(
            "ci, allowed override on the lease by name, was refused: {}",
            describe(&exempt)
        )
    });
    let holder = merge_patch(&as_pa, "ledger", json!({"data": {"x": "pa-again"}})).await;
    findings.check(holder.is_ok(), || {
        format!(
            "the holder was refused under onlyHolderWrites: {}",
            describe(&holder)
        )
    });
    findings.finish();
}

/// A ConfigMap `owner` owns Secret `payout`; the lease fences Secrets and, as docs/fencing.md
/// says to, ConfigMaps (the owners' kind). pb, not the holder, deletes the owner: refused, and
/// the Secret is still there after the garbage collector's next pass could have removed it.
#[tokio::test]
async fn a_non_holders_delete_of_a_fenced_owner_is_refused_and_its_dependents_stay() {
    let ns = TestNamespace::new("fence-owner").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let owner = ns
        .api::<ConfigMap>()
        .create(&PostParams::default(), &config_map("owner", "owner"))
        .await
        .expect("create the owner");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "payout", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.metadata.uid.clone().expect("uid"),
        }]},
        "stringData": {"amount": "100"},
    }))
    .unwrap();
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the dependent");
    let spec = json!({"leaseDurationSeconds": 30, "fence": {"resources": [
        {"resource": "secrets"}, {"resource": "configmaps"},
    ]}});
    let _beat = books_held_by(&ns, pa, spec).await;

    let as_pb: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    // The fence is in force in the apiserver's caches before the delete is tried once.
    wait_fence_refuses_pb(&as_pb).await;
    let deleted = as_pb.delete("owner", &DeleteParams::background()).await;
    let Err(kube::Error::Api(refusal)) = &deleted else {
        panic!("pb, not the holder, deleted the fenced owner: {deleted:?}");
    };
    let (code, message) = (refusal.code, &refusal.message);
    assert!(
        code == 403 && message.contains("does not hold"),
        "pb's delete of the owner was refused, but not by the fence: {code} {message}"
    );
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("owner")
            .await
            .unwrap()
            .is_some(),
        "the owner is gone"
    );
    assert!(
        ns.api::<Secret>()
            .get_opt("payout")
            .await
            .unwrap()
            .is_some(),
        "the owner's dependent is gone"
    );
}
