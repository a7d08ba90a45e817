//! The fence as a security reviewer tries it before installing it in a shared cluster (issue
//! 38, invariants I7, I11, I12, I13): against the real control plane, pods authenticating with
//! their own pod-bound ServiceAccount tokens, the operator a real process.
//!
//! - no way around it: a scale through the `scale` subresource of a Deployment fenced with a
//!   selector, a pod of another namespace naming a local pod in its claim, a `*` verb standing
//!   in for the `override` exemption;
//! - no power beyond a lease's author's: a lease fences only what its author may write, and
//!   never what the cluster needs to run (leader elections, Events);
//! - no collateral: a lease deleted with its finalizer stripped leaves nothing that refuses;
//! - fail closed: a bad selector is refused at admission, and a lease whose fence cannot be put
//!   in place is not granted (a condition, a Warning Event, a metric);
//! - tokens within 2^53 − 1, which every shipped fence compares exactly;
//! - the operator's own identity may change only the token annotations of a pod.
//!
//! Every test checks what a user would notice, each in its own namespace(s); cluster-scoped
//! writes that could remove a shared object are server-side dry runs (admission still runs on
//! them), and the cluster-scoped objects a test creates are deleted when it ends.

use crate::common;

use std::time::{Duration, Instant};

use common::fence::fenced_config_map;
use common::operator::OperatorProcess;
use common::pods::TestPod;
use common::{Beating, TestNamespace, control_plane, repo_root, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim, token_annotation_key};
use fenced_lease_operator::admission::shipped;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::harness::{
    Findings, WAIT, accepted_within, apply, books_held_by, claim_as_pod, config_map,
    create_config_map, create_lease_as, describe, fencing_configmaps, grant, merge_patch, poll,
    refusal, refused_within, wait_allowed, wait_fence_refuses_pb,
};

/// 2^52 and 2^53: the edges of the token bound (2^53 − 1, exact in a double).
const TWO_52: i64 = 1 << 52;
const TWO_53: i64 = 1 << 53;

/// A scale of Deployment `name` to `replicas` through `deployments/scale`, as `kubectl scale`
/// sends it (a merge patch of the Scale).
async fn scale(api: &Api<Deployment>, name: &str, replicas: i32) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"replicas": replicas}});
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// Cluster-scoped objects a test created, deleted when it ends (passed or failed).
#[derive(Default)]
struct ClusterObjects(Vec<(&'static str, String)>);

impl ClusterObjects {
    fn add(&mut self, kind: &'static str, name: &str) {
        self.0.push((kind, name.to_string()));
    }
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        for (kind, name) in self.0.iter().rev() {
            let _ = control_plane()
                .kubectl_cmd()
                .args(["delete", kind, name, "--ignore-not-found", "--wait=false"])
                .output();
        }
    }
}

/// The documents of deploy/rbac/operator.yaml as the repository has them now.
fn operator_rbac_documents() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo_root().join("deploy/rbac/operator.yaml"))
        .expect("read deploy/rbac/operator.yaml");
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .expect("parse deploy/rbac/operator.yaml")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn operator_rbac_document(kind: &str, name: &str) -> serde_json::Value {
    operator_rbac_documents()
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/rbac/operator.yaml has no {kind} {name}"))
}

/// Waits until the rules of `role` (a Role or ClusterRole document) are in force for the user
/// of `client` in `ns`: the first verb on the first resource (and name) of each rule.
async fn wait_role_in_force(client: &Client, ns: &str, role: &serde_json::Value) {
    for rule in role["rules"].as_array().into_iter().flatten() {
        let first = |field: &str| rule[field][0].as_str().map(str::to_string);
        let (Some(resource), Some(verb)) = (first("resources"), first("verbs")) else {
            continue; // nonResourceURLs
        };
        let group = first("apiGroups").unwrap_or_default();
        let name = first("resourceNames");
        wait_allowed(client, ns, &verb, &group, &resource, name.as_deref()).await;
    }
}

/// Binds ServiceAccount `ns/sa`, cluster-wide, to the rules of each ClusterRole `roles` of
/// deploy/rbac/operator.yaml (read now, so the rules are the repository's): a private copy of
/// each, named `<role>.<ns>` (the shared ClusterRoles of other tests' runs stay untouched),
/// and a ClusterRoleBinding of the same name. Both are removed with `cleanup`.
fn bind_operator_cluster_roles(
    ns: &TestNamespace,
    sa: &str,
    roles: &[&str],
    cleanup: &mut ClusterObjects,
) {
    for role in roles {
        let mut copy = operator_rbac_document("ClusterRole", role);
        let name = format!("{role}.{}", ns.name);
        copy["metadata"] = json!({"name": name, "labels": {"fencing.dev/test-namespace": ns.name}});
        cleanup.add("clusterrole", &name);
        apply(ns, &copy.to_string());
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"fencing.dev/test-namespace": ns.name}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns.name}],
        });
        cleanup.add("clusterrolebinding", &name);
        apply(ns, &binding.to_string());
    }
}

/// The sum of the series of counter `name` whose labels include `label` (`error="fence"`),
/// on the operator's /metrics; `None` when there is none.
async fn metric_with_label(op: &OperatorProcess, name: &str, label: &str) -> Option<f64> {
    let (_, page) = common::http_get(op.http_port().await, "/metrics").await?;
    let values: Vec<f64> = page
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter(|l| {
            l.split('}')
                .next()
                .is_some_and(|labels| labels.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

// ---- 1 ----

/// Lease books fencing Deployments labelled `app: books`, and such a Deployment, web, of one
/// replica, both created by the admin.
async fn deployment_web_fenced_by_selector(ns: &TestNamespace) {
    create_lease_as(
        &ns.client,
        &ns.name,
        "books",
        json!({
            "leaseDurationSeconds": 30,
            "fence": {
                "resources": [{"group": "apps", "resource": "deployments"}],
                "selector": {"matchLabels": {"app": "books"}},
            },
        }),
    )
    .await
    .expect("create lease books");
    let web: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "books"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]},
            },
        },
    }))
    .unwrap();
    ns.api::<Deployment>()
        .create(&PostParams::default(), &web)
        .await
        .expect("the admin creates Deployment web");
}

/// pb, which does not hold the lease, scales web to 0: a PATCH, then a PUT of the Scale; each
/// must be refused by the fence, and web keep the holder's 2 replicas.
async fn pbs_scales_are_refused(
    ns: &TestNamespace,
    as_pb: &Api<Deployment>,
    findings: &mut Findings,
) {
    let patch = refused_within(Duration::from_secs(10), || scale(as_pb, "web", 0)).await;
    let put = refused_within(Duration::from_secs(10), || async {
        let mut scale = ns.api::<Deployment>().get_scale("web").await?;
        scale.spec.get_or_insert_default().replicas = Some(0);
        as_pb
            .replace_scale("web", &PostParams::default(), &scale)
            .await
    })
    .await;
    for (what, outcome) in [("PATCH", patch), ("PUT", put)] {
        match outcome {
            Ok((code, message)) => findings.check(
                code == 403 && message.contains("does not hold"),
                || format!("pb's scale ({what}) was refused, but not by the fence: {code} {message}"),
            ),
            Err(last) => findings.check(false, || {
                format!("pb, not the holder, scaled web through deployments/scale ({what}) for 10 s: {last}")
            }),
        }
    }
    let replicas = ns
        .api::<Deployment>()
        .get("web")
        .await
        .unwrap()
        .spec
        .replicas;
    findings.check(replicas == Some(2), || {
        format!("web has {replicas:?} replicas, not the holder's 2: pb's scale got through")
    });
}

/// Issue 38, item 1 (I11): a lease that fences Deployments with a selector fences their
/// `scale` subresource too, though a Scale carries no labels. A pod that does not hold the
/// lease is refused its scale (PATCH and PUT) with 403 "does not hold"; the holder's pod
/// scales.
#[tokio::test]
async fn a_scale_of_a_deployment_fenced_with_a_selector_is_refused_to_a_pod_that_does_not_hold() {
    let ns = TestNamespace::new("sec-scale").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    deployment_web_fenced_by_selector(&ns).await;
    claim_as_pod(&ns, pa, "books").await;
    wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    let _beat = ns.keep_beating("pa", Duration::from_secs(1));
    let as_pa: Api<Deployment> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<Deployment> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    wait_allowed(
        &ns.client_as_pod(pb).await,
        &ns.name,
        "patch",
        "apps",
        "deployments/scale",
        None,
    )
    .await;

    // The holder scales (once the apiserver's cache shows it as the holder).
    accepted_within(WAIT, || scale(&as_pa, "web", 2))
        .await
        .unwrap_or_else(|last| panic!("the holder pa's scale of web was refused: {last}"));

    let mut findings = Findings::default();
    pbs_scales_are_refused(&ns, &as_pb, &mut findings).await;
    findings.finish();

    // The holder's scale still passes.
    scale(&as_pa, "web", 3)
        .await
        .expect("the holder scales again");
}

// ---- 2 ----

/// B/twin, a pod of namespace `b` whose ServiceAccount is bound in `a` to the holder Role:
/// a client as that pod, once it may create claims in `a`.
async fn a_pod_of_b_that_may_claim_in_a(a: &TestNamespace, b: &TestNamespace) -> Client {
    let b_twin = b.create_pod_as("twin", "app").await;
    apply(
        a,
        &std::fs::read_to_string(repo_root().join("deploy/rbac/holder-role.yaml")).unwrap(),
    );
    apply(
        a,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "b-app-holder"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fenced-lease-holder"},
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": b.name}],
        })
        .to_string(),
    );
    let as_b_twin = b.client_as_pod(&b_twin).await;
    wait_allowed(
        &as_b_twin,
        &a.name,
        "create",
        "fencing.dev",
        "fencedleaseclaims",
        None,
    )
    .await;
    as_b_twin
}

/// Whether A/twin (`a_twin`) is made the holder of books, for a few seconds of the operator
/// running: its annotation `key` and the lease's holder podUid, as found.
async fn made_holder(
    a: &TestNamespace,
    a_twin: &TestPod,
    key: &str,
) -> Option<(Option<String>, Option<String>)> {
    let leases = a.api::<FencedLease>();
    let pods = a.api::<Pod>();
    poll(Duration::from_secs(5), || async {
        let annotated = pods
            .get("twin")
            .await
            .ok()
            .and_then(|p| p.metadata.annotations?.get(key).cloned());
        let named = leases
            .get("books")
            .await
            .ok()
            .and_then(|l| l.status?.holder?.pod_uid)
            .filter(|uid| *uid == a_twin.uid);
        match (annotated, named) {
            (None, None) => None,
            found => Some(found),
        }
    })
    .await
}

/// Issue 38, item 2 (I7, I5): a pod of another namespace cannot make a local pod of the same
/// name the holder. `B/twin`, allowed to make claims in A, creates there a claim naming
/// `podName: twin`: refused 403 (the claim may name only the pod its creator runs in, and
/// `B/twin` is not `A/twin`); `A/twin` never gets the token annotation and the lease never
/// names its UID, while a pod of A that claims for itself is granted.
#[tokio::test]
async fn a_pod_of_another_namespace_cannot_make_a_local_pod_the_holder() {
    let a = TestNamespace::new("sec-twin-a").await;
    let b = TestNamespace::new("sec-twin-b").await;
    a.with_fence_policies().await;
    let _op = OperatorProcess::start(&a.name, &[]);
    a.create_lease("books", 30);
    // A/twin and a pod of A that will claim for itself (SA app of A, with the holder Role).
    let local = a.app_pods(&["twin", "own"]).await;
    let (a_twin, own) = (&local[0], &local[1]);
    let as_b_twin = a_pod_of_b_that_may_claim_in_a(&a, &b).await;

    let claim: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": "twin"},
        "spec": {"leaseName": "books", "holderIdentity": "twin", "podName": "twin"},
    }))
    .unwrap();
    let created = Api::<FencedLeaseClaim>::namespaced(as_b_twin.clone(), &a.name)
        .create(&PostParams::default(), &claim)
        .await;

    let mut findings = Findings::default();
    match refusal(&created) {
        Some((code, message)) => findings.check(
            code == 403 && message.contains("only the pod its creator runs in"),
            || format!("B/twin's claim in A was refused, but not as naming another pod: {code} {message}"),
        ),
        None => findings.check(false, || {
            format!(
                "B/twin created in {} a claim naming pod twin: {}",
                a.name,
                describe(&created)
            )
        }),
    }
    // Whatever came of the create: A/twin is never made the holder, for a few seconds of the
    // operator running.
    let key = token_annotation_key("books");
    let made_holder = made_holder(&a, a_twin, &key).await;
    findings.check(made_holder.is_none(), || {
        format!("A/twin, which never asked, was made the holder of books by B/twin's claim: (annotation {key}, lease holder podUid) = {made_holder:?}")
    });
    findings.finish();

    // The operator was serving A all along: a pod of A that claims for itself is granted.
    claim_as_pod(&a, own, "books").await;
    wait_for("A/own granted", WAIT, || a.granted_token("own")).await;
    let twin = a.api::<Pod>().get("twin").await.unwrap();
    assert!(
        !twin
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(&key),
        "A/twin carries {key}"
    );
}

// ---- 3 ----

/// Role lease-admin, `verbs: ["*"]` on fencedleases and fencedleaseclaims, for ServiceAccount
/// app; Role fence-exempt, `override` by name and ConfigMap writes, for ServiceAccount scaler.
fn grant_star_and_override(ns: &TestNamespace) {
    grant(
        ns,
        "lease-admin",
        "app",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases", "fencedleaseclaims"]
    verbs: ["*"]
"#,
    );
    grant(
        ns,
        "fence-exempt",
        "scaler",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases"]
    verbs: ["override"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "create", "update", "patch", "delete"]
"#,
    );
}

/// pb, not the holder but allowed `*` on fencedleases, creates and updates ConfigMaps: each
/// must be refused by the fence.
async fn pbs_writes_are_refused(as_pb: &Api<ConfigMap>, findings: &mut Findings) {
    let mut n = 0;
    let create = refused_within(Duration::from_secs(10), || {
        n += 1;
        create_config_map(as_pb, config_map(&format!("pb-{n}"), "pb"))
    })
    .await;
    let update = refused_within(Duration::from_secs(10), || {
        merge_patch(as_pb, "ledger", json!({"data": {"x": "pb"}}))
    })
    .await;
    for (what, outcome) in [("create", create), ("update", update)] {
        match outcome {
            Ok((code, message)) => findings.check(
                code == 403 && message.contains("does not hold"),
                || format!("pb's ConfigMap {what} was refused, but not by the fence: {code} {message}"),
            ),
            Err(last) => findings.check(false, || {
                format!("pb, not the holder but allowed verbs [\"*\"] on fencedleases, had its ConfigMap {what} accepted for 10 s: {last}")
            }),
        }
    }
}

/// Issue 38, item 3 (I12): the exemption from the identity fence is explicit. A Role granting
/// `verbs: ["*"]` on fencedleases and fencedleaseclaims ("manage our leases") does not exempt
/// its pods: a pod that does not hold the lease is refused its ConfigMap create and update
/// (403 "does not hold"); a pod whose Role names `override` explicitly writes.
#[tokio::test]
async fn a_star_verb_on_fencedleases_does_not_exempt_from_the_fence_but_override_named_does() {
    let ns = TestNamespace::new("sec-star").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    grant_star_and_override(&ns);
    let scaler = ns.create_pod_as("scaler", "scaler").await;
    let _beat = books_held_by(&ns, pa, fencing_configmaps()).await;

    let pb_client = ns.client_as_pod(pb).await;
    let scaler_client = ns.client_as_pod(&scaler).await;
    // The `*` Role is in force for pb, and the explicit one for scaler, before anything is
    // judged: the authorizer answers `override` for both.
    for client in [&pb_client, &scaler_client] {
        wait_allowed(
            client,
            &ns.name,
            "override",
            "fencing.dev",
            "fencedleases",
            Some("books"),
        )
        .await;
    }
    wait_allowed(&scaler_client, &ns.name, "create", "", "configmaps", None).await;
    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<ConfigMap> = Api::namespaced(pb_client, &ns.name);
    let as_scaler: Api<ConfigMap> = Api::namespaced(scaler_client, &ns.name);
    // The holder writes, once the apiserver's cache shows it as the holder.
    accepted_within(WAIT, || {
        create_config_map(&as_pa, config_map("ledger", "pa"))
    })
    .await
    .unwrap_or_else(|last| panic!("the holder pa's ConfigMap was refused: {last}"));

    let mut findings = Findings::default();
    pbs_writes_are_refused(&as_pb, &mut findings).await;
    // A Role that names `override` is an exemption.
    let exempt = accepted_within(WAIT, || {
        create_config_map(&as_scaler, config_map("scaler", "scaler"))
    })
    .await;
    findings.check(exempt.is_ok(), || {
        format!(
            "scaler, allowed override by name, was refused: {}",
            exempt.as_ref().err().unwrap()
        )
    });
    findings.finish();
}

// ---- 4 ----

/// ServiceAccount tenant, allowed only to create and read FencedLeases: a client as it, once
/// it may create them.
async fn a_tenant_that_may_only_create_leases(ns: &TestNamespace) -> Client {
    grant(
        ns,
        "lease-author",
        "tenant",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases"]
    verbs: ["create", "get", "list", "watch"]
"#,
    );
    let tenant = ns.client_as("tenant", None).await;
    wait_allowed(
        &tenant,
        &ns.name,
        "create",
        "fencing.dev",
        "fencedleases",
        None,
    )
    .await;
    tenant
}

/// Anyone, the admin too: what the cluster needs to run (coordination.k8s.io Leases, Events)
/// is never fenced, refused 422 naming `spec.fence.resources`.
async fn nobody_fences_leases_or_events(ns: &TestNamespace, findings: &mut Findings) {
    for (what, resource) in [
        (
            "coordination.k8s.io leases",
            json!({"group": "coordination.k8s.io", "resource": "leases"}),
        ),
        ("events", json!({"resource": "events"})),
    ] {
        let name = format!("fences-{}", what.split(' ').next_back().unwrap());
        let created = create_lease_as(
            &ns.client,
            &ns.name,
            &name,
            json!({"fence": {"resources": [resource]}}),
        )
        .await;
        match refusal(&created) {
            Some((code, message)) => findings.check(
                code == 422 && message.contains("spec.fence.resources"),
                || format!("the admin's lease fencing {what} was refused, but not as an invalid spec.fence.resources: {code} {message}"),
            ),
            None => findings.check(false, || {
                format!("the admin created a lease fencing {what}: {}", describe(&created))
            }),
        }
    }
}

/// Once the tenant may write ConfigMaps, it may fence them.
async fn once_allowed_to_write_configmaps_the_tenant_fences_them(
    ns: &TestNamespace,
    tenant: &Client,
    spec: &serde_json::Value,
) {
    grant(
        ns,
        "configmap-writer",
        "tenant",
        r#"
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["create", "update", "patch", "delete"]
"#,
    );
    for verb in ["create", "update", "patch", "delete"] {
        wait_allowed(tenant, &ns.name, verb, "", "configmaps", None).await;
    }
    accepted_within(WAIT, || {
        create_lease_as(tenant, &ns.name, "books", spec.clone())
    })
    .await
    .unwrap_or_else(|last| {
        panic!("tenant, now allowed to write ConfigMaps, cannot fence them: {last}")
    });
}

/// Following a coordination Lease reveals its holder: only an author who may read it.
async fn only_who_may_get_a_lease_follows_it(ns: &TestNamespace, tenant: &Client) {
    let following = json!({"follow": {"lease": "ctrl"}});
    let created = create_lease_as(tenant, &ns.name, "follower", following.clone()).await;
    match refusal(&created) {
        Some((code, message)) => assert!(
            code == 403 && message.contains("may not get Lease ctrl"),
            "tenant's lease following Lease ctrl was refused, but not for want of get: {code} {message}"
        ),
        None => panic!(
            "tenant, who may not read Leases, created a lease following one: {}",
            describe(&created)
        ),
    }
    grant(
        ns,
        "lease-reader",
        "tenant",
        r#"
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get"]
"#,
    );
    wait_allowed(
        tenant,
        &ns.name,
        "get",
        "coordination.k8s.io",
        "leases",
        None,
    )
    .await;
    accepted_within(WAIT, || {
        create_lease_as(tenant, &ns.name, "follower", following.clone())
    })
    .await
    .unwrap_or_else(|last| panic!("tenant, now allowed to get Leases, cannot follow one: {last}"));
}

/// Issue 38, item 4 (I12): a lease fences only what its author may write. A user allowed only
/// to create and read FencedLeases is refused a lease fencing ConfigMaps (the message names
/// `configmaps`); once allowed to write ConfigMaps, the same user creates it. No one, the
/// admin included, may fence coordination.k8s.io Leases (leader elections) or Events: 422
/// naming `spec.fence.resources`. A lease following a coordination Lease (`spec.follow`) is
/// refused until its author may `get` that Lease.
#[tokio::test]
async fn a_lease_fences_only_what_its_author_may_write_and_never_leases_or_events() {
    let ns = TestNamespace::new("sec-author").await;
    ns.with_fence_policies().await;
    let tenant = a_tenant_that_may_only_create_leases(&ns).await;
    let fencing_configmaps = fencing_configmaps();

    let mut findings = Findings::default();
    let created = create_lease_as(&tenant, &ns.name, "books", fencing_configmaps.clone()).await;
    match refusal(&created) {
        Some((code, message)) => findings.check(
            (code == 403 || code == 422) && message.contains("configmaps"),
            || format!("tenant's lease fencing configmaps was refused, but the message does not name configmaps: {code} {message}"),
        ),
        None => findings.check(false, || {
            format!(
                "tenant, who may not write ConfigMaps, created a lease fencing configmaps: {}",
                describe(&created)
            )
        }),
    }
    nobody_fences_leases_or_events(&ns, &mut findings).await;
    findings.finish();

    once_allowed_to_write_configmaps_the_tenant_fences_them(&ns, &tenant, &fencing_configmaps)
        .await;
    only_who_may_get_a_lease_follows_it(&ns, &tenant).await;
}

// ---- 5 ----

/// Deletes lease books with its finalizer stripped, stripped again until it is gone (the
/// operator may put it back between the strip and the delete: a live lease always has it), as
/// a user would. Returns when the delete was sent.
async fn delete_stripped_of_its_finalizer(ns: &TestNamespace) -> Instant {
    let leases = ns.api::<FencedLease>();
    leases
        .patch(
            "books",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip the finalizers");
    leases
        .delete("books", &DeleteParams::default())
        .await
        .expect("delete lease books");
    let deleted = Instant::now();
    wait_for("lease books gone", Duration::from_secs(10), || async {
        let lease = leases.get_opt("books").await.unwrap();
        if lease.is_some_and(|l| l.metadata.finalizers.is_some_and(|f| !f.is_empty())) {
            let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            let _ = leases.patch("books", &PatchParams::default(), &strip).await;
        }
        leases
            .get_opt("books")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    deleted
}

/// The admin writes ConfigMaps, 10 over 5 s: each must be accepted.
async fn the_admins_writes_are_accepted(ns: &TestNamespace, findings: &mut Findings) {
    let admin = ns.api::<ConfigMap>();
    let mut refused = Vec::new();
    for i in 0..10 {
        let result = admin
            .create(
                &PostParams::default(),
                &config_map(&format!("admin-{i}"), "admin"),
            )
            .await;
        if result.is_err() {
            refused.push(describe(&result));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    findings.check(refused.is_empty(), || {
        format!(
            "the admin's ConfigMap creates after the lease was gone were refused {} of 10 times: {}",
            refused.len(),
            refused.first().cloned().unwrap_or_default()
        )
    });
}

/// Whether no kinds slot lists `ns` any more by `deadline`.
async fn no_slot_lists_the_namespace_by(ns: &TestNamespace, deadline: Instant) -> bool {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ns.client.clone());
    let listing = || async {
        let mut listing = vec![];
        for name in shipped::slot_names() {
            let policy = policies.get(&name).await.ok()?;
            if let Ok(Some(a)) = shipped::assignment(&policy)
                && a.namespaces.contains(&ns.name)
            {
                listing.push(name);
            }
        }
        Some(listing)
    };
    poll(
        deadline.saturating_duration_since(Instant::now()),
        || async { listing().await.filter(|l| l.is_empty()) },
    )
    .await
    .is_some()
}

/// Issue 38, item 5 (I12): a lease deleted with its finalizer stripped leaves nothing that
/// refuses. After the lease that fenced ConfigMaps (granted to pa) is deleted that way, the
/// admin's ConfigMap writes are all accepted, so is a pod's, and the kinds slot of ConfigMaps
/// no longer lists the namespace within 10 s (not at the 5-minute sweep), so that nothing
/// refuses there even while the apiserver cannot read FencedLeases.
#[tokio::test]
async fn a_lease_deleted_with_its_finalizer_stripped_leaves_nothing_that_refuses() {
    let ns = TestNamespace::new("sec-stripped").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let _beat = books_held_by(&ns, pa, fencing_configmaps()).await;
    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    // The fence is in force: the holder writes, pb is refused.
    accepted_within(WAIT, || create_config_map(&as_pa, config_map("pa", "pa")))
        .await
        .unwrap_or_else(|last| panic!("the holder pa's ConfigMap was refused: {last}"));
    wait_fence_refuses_pb(&as_pb).await;

    let deleted = delete_stripped_of_its_finalizer(&ns).await;
    let mut findings = Findings::default();
    the_admins_writes_are_accepted(&ns, &mut findings).await;
    // A pod's write too: no lease fences ConfigMaps any more.
    let result = as_pb
        .create(&PostParams::default(), &config_map("pb-after", "pb"))
        .await;
    findings.check(result.is_ok(), || {
        format!(
            "pb's ConfigMap create after the lease was gone: {}",
            describe(&result)
        )
    });
    // The namespace leaves the kinds slot with the lease's delete event.
    let gone = no_slot_lists_the_namespace_by(&ns, deleted + Duration::from_secs(10)).await;
    findings.check(gone, || {
        "10 s after the lease's delete, a kinds slot still lists the namespace".to_string()
    });
    findings.finish();
}

// ---- 6 ----

/// Issue 38, item 6a (I8, I12): a bad fence selector is refused at admission, 422 naming
/// `spec.fence.selector` (operator `in` for `In`), instead of a lease granted with no fence.
#[tokio::test]
async fn a_lease_with_a_bad_fence_selector_is_refused_at_admission() {
    let ns = TestNamespace::new("sec-selector").await;
    ns.with_fence_policies().await;
    let created = create_lease_as(
        &ns.client,
        &ns.name,
        "books",
        json!({"fence": {
            "resources": [{"resource": "configmaps"}],
            "selector": {"matchExpressions": [{"key": "app", "operator": "in", "values": ["x"]}]},
        }}),
    )
    .await;
    let (code, message) = refusal(&created).unwrap_or_else(|| {
        panic!(
            "a lease with selector operator `in` was {}",
            describe(&created)
        )
    });
    assert!(
        code == 422 && message.contains("spec.fence.selector"),
        "{code} {message}"
    );
}

/// ServiceAccount `operator` of `ns` with the operator's documented RBAC but without
/// `fenced-lease-operator-fences`: its ClusterRole bound cluster-wide (removed with `cleanup`)
/// and its Role in `ns`, once both are in force.
async fn an_operator_identity_without_the_fences_role(
    ns: &TestNamespace,
    cleanup: &mut ClusterObjects,
) {
    ns.create_service_account("operator").await;
    bind_operator_cluster_roles(ns, "operator", &["fenced-lease-operator"], cleanup);
    apply(
        ns,
        &operator_rbac_document("Role", "fenced-lease-operator").to_string(),
    );
    apply(
        ns,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "fenced-lease-operator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fenced-lease-operator"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns.name}],
        })
        .to_string(),
    );
    let as_operator = ns.client_as("operator", None).await;
    for (kind, role) in [
        ("ClusterRole", "fenced-lease-operator"),
        ("Role", "fenced-lease-operator"),
    ] {
        wait_role_in_force(&as_operator, &ns.name, &operator_rbac_document(kind, role)).await;
    }
}

/// Lease fenced (fencing ConfigMaps) and lease plain (no fence), each with a claim that
/// heartbeats every second while the returned beats live.
async fn a_fenced_and_a_plain_lease_claimed(ns: &TestNamespace) -> [Beating; 2] {
    create_lease_as(&ns.client, &ns.name, "fenced", fencing_configmaps())
        .await
        .expect("create lease fenced");
    create_lease_as(
        &ns.client,
        &ns.name,
        "plain",
        json!({"leaseDurationSeconds": 30}),
    )
    .await
    .expect("create lease plain");
    ns.create_claim("c-fenced", "fenced", None).await;
    ns.create_claim("c-plain", "plain", None).await;
    [
        ns.keep_beating("c-fenced", Duration::from_secs(1)),
        ns.keep_beating("c-plain", Duration::from_secs(1)),
    ]
}

/// Lease fenced says, within 15 s each, that its fence is not in force: its condition
/// Held=False reason FenceNotInForce, a Warning Event, and the operator's error metric.
async fn the_fence_not_in_force_is_told(
    ns: &TestNamespace,
    op: &OperatorProcess,
    findings: &mut Findings,
) {
    let leases = ns.api::<FencedLease>();
    let condition = poll(Duration::from_secs(15), || async {
        let lease = leases.get("fenced").await.ok()?;
        lease
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Held" && c.status == "False" && c.reason == "FenceNotInForce")
    })
    .await;
    let conditions = leases
        .get("fenced")
        .await
        .ok()
        .and_then(|l| l.status)
        .map(|s| s.conditions);
    findings.check(condition.is_some(), || {
        format!("lease fenced has no condition Held=False reason FenceNotInForce: {conditions:?}")
    });
    let events = ns.api::<Event>();
    let event = poll(Duration::from_secs(15), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("FenceNotInForce")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("fenced")
        })
    })
    .await;
    findings.check(event.is_some(), || {
        "no Warning Event FenceNotInForce on lease fenced".into()
    });
    let errors = poll(Duration::from_secs(15), || async {
        metric_with_label(op, "fenced_lease_reconcile_errors_total", "error=\"fence\"")
            .await
            .filter(|v| *v > 0.0)
    })
    .await;
    findings.check(errors.is_some(), || {
        "fenced_lease_reconcile_errors_total{error=\"fence\"} is not > 0".into()
    });
}

/// Claim c-fenced is never granted, over at least 5 s of the operator running (since
/// `started`), and stays Pending.
async fn the_fenced_claim_stays_pending(
    ns: &TestNamespace,
    op: &OperatorProcess,
    started: Instant,
    findings: &mut Findings,
) {
    let claims = ns.api::<FencedLeaseClaim>();
    let mut phase = None;
    loop {
        let claim = claims.get("c-fenced").await.expect("claim c-fenced");
        phase = claim.status.and_then(|s| s.phase).or(phase);
        if phase == Some(ClaimPhase::Granted) || started.elapsed() >= Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    findings.check(phase != Some(ClaimPhase::Granted), || {
        format!(
            "claim c-fenced was granted though the operator cannot put lease fenced's fence in place (its log: {})",
            op.log_text()
                .lines()
                .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
                .take(1)
                .collect::<String>()
        )
    });
    findings.check(phase == Some(ClaimPhase::Pending), || {
        format!("claim c-fenced is {phase:?}, not Pending")
    });
}

/// Issue 38, item 6b (I12): fail closed, loudly. An operator running with its documented RBAC
/// but without `fenced-lease-operator-fences` cannot put a lease's fence in place, so it does
/// not grant that lease: its claim stays Pending, the lease's condition `Held` is `False` with
/// reason `FenceNotInForce`, a Warning Event `FenceNotInForce` is on the lease, and
/// `fenced_lease_reconcile_errors_total{error="fence"}` counts it. A lease without a fence in
/// the same namespace is granted as usual.
#[tokio::test]
async fn a_lease_whose_fence_cannot_be_put_in_place_is_not_granted() {
    let ns = TestNamespace::new("sec-closed").await;
    ns.with_fence_policies().await;
    let mut cleanup = ClusterObjects::default();
    an_operator_identity_without_the_fences_role(&ns, &mut cleanup).await;
    let _beats = a_fenced_and_a_plain_lease_claimed(&ns).await;

    let kubeconfig = ns.service_account_kubeconfig("operator");
    let op = OperatorProcess::start_as(&ns.name, &[], &kubeconfig);
    let started = Instant::now();
    // No collateral: the lease without a fence is granted.
    wait_for("c-plain granted", WAIT, || ns.granted_token("c-plain")).await;

    let mut findings = Findings::default();
    the_fence_not_in_force_is_told(&ns, &op, &mut findings).await;
    the_fenced_claim_stays_pending(&ns, &op, started, &mut findings).await;
    findings.finish();
}

// ---- 7 ----

/// Issue 38, item 7 (I13): tokens stay within 2^53 − 1, the bound every shipped fence compares
/// exactly. `minToken: 10^18` is refused 422 naming `spec.minToken`; `minToken: 2^52` is
/// accepted, its first grant's token is 2^52 + 1, which the object policy accepts on an object
/// the holder stamps; a stamp of 2^53 is refused 422 as malformed.
#[tokio::test]
async fn tokens_stay_within_two_to_the_53() {
    let ns = TestNamespace::new("sec-tokens").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa"]).await;
    let pa = &pods[0];

    let mut findings = Findings::default();
    let huge = create_lease_as(
        &ns.client,
        &ns.name,
        "huge",
        json!({"minToken": 1_000_000_000_000_000_000_i64}),
    )
    .await;
    match refusal(&huge) {
        Some((code, message)) => findings.check(
            code == 422 && message.contains("spec.minToken"),
            || format!("minToken 10^18 was refused, but not as an invalid spec.minToken: {code} {message}"),
        ),
        None => findings.check(false, || {
            format!("a lease with minToken 10^18 was {}", describe(&huge))
        }),
    }

    create_lease_as(
        &ns.client,
        &ns.name,
        "books",
        json!({"leaseDurationSeconds": 30, "minToken": TWO_52, "fenceObjects": true}),
    )
    .await
    .expect("a lease with minToken 2^52 is accepted");
    claim_as_pod(&ns, pa, "books").await;
    let token = wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    let _beat = ns.keep_beating("pa", Duration::from_secs(1));
    assert_eq!(token, TWO_52 + 1, "the first token above minToken 2^52");

    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let stamped = accepted_within(WAIT, || {
        create_config_map(
            &as_pa,
            fenced_config_map("ledger", "books", &token.to_string(), "pa"),
        )
    })
    .await;
    findings.check(stamped.is_ok(), || {
        format!(
            "the holder's ConfigMap stamped {token} was refused: {}",
            stamped.as_ref().err().unwrap()
        )
    });
    let too_high = as_pa
        .create(
            &PostParams::default(),
            &fenced_config_map("too-high", "books", &TWO_53.to_string(), "pa"),
        )
        .await;
    match refusal(&too_high) {
        Some((code, message)) => findings
            .check(code == 422 && message.contains("fencing.dev/token"), || {
                format!("a stamp of 2^53 was refused, but not as malformed (422): {code} {message}")
            }),
        None => findings.check(false, || {
            format!(
                "the holder's ConfigMap stamped 2^53 = {TWO_53} was {}",
                describe(&too_high)
            )
        }),
    }
    findings.finish();
}

// ---- 8 ----

/// A ServiceAccount `op` of `ns` bound to exactly the ClusterRoles of
/// deploy/rbac/operator.yaml, with a token bound to no pod, once its rules are in force.
async fn operator_identity(ns: &TestNamespace, cleanup: &mut ClusterObjects) -> Client {
    let roles = ["fenced-lease-operator", "fenced-lease-operator-fences"];
    ns.create_service_account("op").await;
    bind_operator_cluster_roles(ns, "op", &roles, cleanup);
    let op = ns.client_as("op", None).await;
    for role in roles {
        wait_role_in_force(&op, &ns.name, &operator_rbac_document("ClusterRole", role)).await;
    }
    op
}

/// Issue 38, item 8 (I12): the operator's identity can do no more than its job with a pod. A
/// ServiceAccount bound to exactly the ClusterRoles of deploy/rbac/operator.yaml may write a
/// pod's `token.fencing.dev/*` annotation, and nothing else of it: a patch of its image, a
/// label or another annotation is refused 403.
#[tokio::test]
async fn the_operators_identity_may_change_only_token_annotations_of_a_pod() {
    let ns = TestNamespace::new("sec-oppod").await;
    ns.with_fence_policies().await;
    let mut cleanup = ClusterObjects::default();
    ns.create_pod_as("target", "workload").await;
    let op = operator_identity(&ns, &mut cleanup).await;
    let pods: Api<Pod> = Api::namespaced(op, &ns.name);

    // Its job: the token annotation.
    let key = token_annotation_key("books");
    accepted_within(WAIT, || {
        merge_patch(
            &pods,
            "target",
            json!({"metadata": {"annotations": {key.clone(): "5"}}}),
        )
    })
    .await
    .unwrap_or_else(|last| panic!("the operator's identity cannot annotate a pod: {last}"));

    let mut findings = Findings::default();
    let image = pods
        .patch(
            "target",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "main", "image": "example.invalid/evil:1"}]}})),
        )
        .await;
    let label = merge_patch(
        &pods,
        "target",
        json!({"metadata": {"labels": {"evil": "yes"}}}),
    )
    .await;
    let other = merge_patch(
        &pods,
        "target",
        json!({"metadata": {"annotations": {"other/x": "y"}}}),
    )
    .await;
    for (what, result) in [
        ("patch the pod's image", image.map(drop)),
        ("add a label to the pod", label.map(drop)),
        ("add the annotation other/x to the pod", other.map(drop)),
    ] {
        findings.check(
            refusal(&result).is_some_and(|(code, _)| code == 403),
            || format!("the operator's identity may {what}: {}", describe(&result)),
        );
    }
    let now = ns.api::<Pod>().get("target").await.unwrap();
    let image = now.spec.unwrap().containers[0].image.clone();
    findings.check(image.as_deref() == Some("example.invalid/holder:1"), || {
        format!("the target pod's image is now {image:?}")
    });
    findings.finish();
}
