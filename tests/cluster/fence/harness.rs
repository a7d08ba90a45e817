//! What the fence tests share, as a security reviewer tries the fence: requests sent until
//! the apiserver refuses or accepts them (the fence reads leases through the apiserver's
//! informer, so a refusal can trail a grant), findings collected so that one run shows every
//! gap, RBAC waited for until the authorizer applies it, and leases, claims and ConfigMaps made
//! as a user or a pod makes them.

use crate::common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::pods::TestPod;
use common::{Beating, TestNamespace, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

pub(super) const WAIT: Duration = Duration::from_secs(30);

/// What the test found wrong, collected so that one run on unfixed code shows every gap of an
/// item, not only the first; [`Findings::finish`] fails the test with all of them.
#[derive(Default)]
pub(super) struct Findings(Vec<String>);

impl Findings {
    pub(super) fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            eprintln!("FINDING: {what}");
            self.0.push(what);
        }
    }

    /// Fails now, with everything found so far, if anything was.
    pub(super) fn finish(&self) {
        assert!(
            self.0.is_empty(),
            "{} finding(s):\n- {}",
            self.0.len(),
            self.0.join("\n- ")
        );
    }
}

/// What came of a request, for messages.
pub(super) fn describe<T>(result: &Result<T, kube::Error>) -> String {
    match result {
        Ok(_) => "accepted".into(),
        Err(kube::Error::Api(s)) => format!("{} {}: {}", s.code, s.reason, s.message),
        Err(e) => format!("error: {e}"),
    }
}

/// `(code, message)` when the apiserver refused the request.
pub(super) fn refusal<T>(result: &Result<T, kube::Error>) -> Option<(u16, String)> {
    match result {
        Err(kube::Error::Api(s)) => Some((s.code, s.message.clone())),
        _ => None,
    }
}

/// Polls `check` until it returns `Some`, or `None` once `timeout` has passed.
pub(super) async fn poll<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `attempt` until the apiserver refuses it with 403 or 422 (the fence reads the lease
/// through the apiserver's informer, so a refusal can trail a grant by a short window):
/// `Ok((code, message))`, or `Err(what came of the last attempt)` after `timeout`.
pub(super) async fn refused_within<T, F, Fut>(
    timeout: Duration,
    mut attempt: F,
) -> Result<(u16, String), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let result = attempt().await;
        if let Some(refused) = refusal(&result).filter(|(code, _)| *code == 403 || *code == 422) {
            return Ok(refused);
        }
        if Instant::now() >= deadline {
            return Err(describe(&result));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `attempt` until it is accepted: `Ok`, or `Err(what came of the last attempt)` after
/// `timeout`.
pub(super) async fn accepted_within<T, F, Fut>(
    timeout: Duration,
    mut attempt: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let result = attempt().await;
        let last = describe(&result);
        if let Ok(value) = result {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the user of `client` may `verb` `group`/`resource` (`resource/subresource`,
/// optionally named `name`) in `ns`, as the authorizer answers it: RBAC bindings reach the authorizer through an
/// informer, and a test must not mistake "not yet bound" for a refusal by the fence.
pub(super) async fn wait_allowed(
    client: &Client,
    ns: &str,
    verb: &str,
    group: &str,
    resource: &str,
    name: Option<&str>,
) {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let (kind, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let mut attributes = json!({
        "namespace": ns, "verb": verb, "group": group, "resource": kind, "subresource": subresource,
    });
    if let Some(name) = name {
        attributes["name"] = json!(name);
    }
    let review: SelfSubjectAccessReview =
        serde_json::from_value(json!({"spec": {"resourceAttributes": attributes}})).unwrap();
    wait_for(
        &format!("RBAC to allow {verb} {group}/{resource} in {ns}"),
        WAIT,
        || async {
            let answer = api.create(&PostParams::default(), &review).await.ok()?;
            answer.status?.allowed.then_some(())
        },
    )
    .await;
}

/// A FencedLease `name` with `spec`, as a user writes it.
fn lease(name: &str, spec: serde_json::Value) -> FencedLease {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("a FencedLease")
}

/// Creates lease `name` with `spec` as the user of `client` in `ns`.
pub(super) async fn create_lease_as(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> Result<FencedLease, kube::Error> {
    Api::<FencedLease>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &lease(name, spec))
        .await
}

/// Claim `pod.name` on `lease`, made by the pod itself with its own token (naming and owned by
/// the pod, as the holder library and `kubectl fence` make it).
pub(super) async fn claim_as_pod(ns: &TestNamespace, pod: &TestPod, lease: &str) {
    let claim: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {
            "name": pod.name,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
        },
        "spec": {"leaseName": lease, "holderIdentity": pod.name, "podName": pod.name},
    }))
    .unwrap();
    let claims: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as_pod(pod).await, &ns.name);
    wait_for("the pod's claim created", WAIT, || async {
        claims.create(&PostParams::default(), &claim).await.ok()
    })
    .await;
}

pub(super) fn config_map(name: &str, data: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"x": data}})).unwrap()
}

pub(super) async fn create_config_map(
    api: &Api<ConfigMap>,
    cm: ConfigMap,
) -> Result<ConfigMap, kube::Error> {
    api.create(&PostParams::default(), &cm).await
}

pub(super) async fn merge_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: serde_json::Value,
) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// Creates every object of `manifest` (YAML or JSON) with kubectl as the admin; panics on error.
pub(super) fn apply(ns: &TestNamespace, manifest: &str) {
    let out = ns.kubectl_apply(manifest);
    assert!(out.status.success(), "{}", common::cli::both(&out));
}

/// Role `role` with `rules` (YAML list items) in the test namespace, bound by RoleBinding
/// `<sa>-<role>` to ServiceAccount `sa` of the namespace.
pub(super) fn grant(ns: &TestNamespace, role: &str, sa: &str, rules: &str) {
    apply(
        ns,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {role}}}\nrules:{rules}---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {sa}-{role}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {role}}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n",
            ns = ns.name
        ),
    );
}

/// The spec of a lease that fences the namespace's ConfigMaps, with a 30 s term.
pub(super) fn fencing_configmaps() -> serde_json::Value {
    json!({"leaseDurationSeconds": 30, "fence": {"resources": [{"resource": "configmaps"}]}})
}

/// Lease `books` with `spec`, created by the admin and granted to pod `pa` (the pod's own
/// claim), which heartbeats every second while the returned [`Beating`] lives.
pub(super) async fn books_held_by(
    ns: &TestNamespace,
    pa: &TestPod,
    spec: serde_json::Value,
) -> Beating {
    create_lease_as(&ns.client, &ns.name, "books", spec)
        .await
        .expect("create lease books");
    claim_as_pod(ns, pa, "books").await;
    wait_for(&format!("{} granted", pa.name), WAIT, || {
        ns.granted_token(&pa.name)
    })
    .await;
    ns.keep_beating(&pa.name, Duration::from_secs(1))
}

/// Waits until the fence refuses pb's ConfigMap creates through `as_pb` (new names `pb-<n>`):
/// it is in force in the apiserver's caches.
pub(super) async fn wait_fence_refuses_pb(as_pb: &Api<ConfigMap>) {
    let mut n = 0;
    refused_within(WAIT, || {
        n += 1;
        create_config_map(as_pb, config_map(&format!("pb-{n}"), "pb"))
    })
    .await
    .unwrap_or_else(|last| panic!("precondition: the fence never refused pb: {last}"));
}
