//! The writer's identity as a fence (I11) and claims owned by the pod that made them (I7),
//! tried as a user would: two pods of one ServiceAccount take a lease in turn, and the stale
//! one uses plain `kubectl` with its own pod-bound token.
//! - every write of the stale pod to what the lease fences is refused, whatever the verb,
//!   subresource or patch type, stamped or not; the holder's own writes pass;
//! - writers that are not pods still meet the token rule, and nothing more;
//! - a sibling pod cannot renew or release another pod's claim, through the API or
//!   `kubectl fence release`; the owning pod can, and the garbage collector when the pod goes.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::cli::{both, fence_as};
use common::operator::OperatorProcess;
use common::pods::TestPod;
use common::{Beating, TestNamespace, wait_for};
use fenced_lease::api::FencedLeaseClaim;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Claim `pod.name` on `lease`, made by the pod itself with its own token (naming and owned
/// by the pod, and carrying its creator annotations, as the holder library and `kubectl
/// fence` make it).
async fn claim_as_pod(ns: &TestNamespace, pod: &TestPod, lease: &str) {
    let claim: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {
            "name": pod.name,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
            "annotations": {
                "fencing.dev/created-by": format!("system:serviceaccount:{}:{}", ns.name, pod.service_account),
                "fencing.dev/created-by-pod": pod.name,
                "fencing.dev/created-by-pod-uid": pod.uid,
            },
        },
        "spec": {"leaseName": lease, "holderIdentity": pod.name, "podName": pod.name},
    }))
    .unwrap();
    let claims: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as_pod(pod).await, &ns.name);
    // RBAC bindings reach the authorizer with a delay.
    wait_for("the pod's claim created", WAIT, || async {
        claims.create(&PostParams::default(), &claim).await.ok()
    })
    .await;
}

/// `kubectl COMMAND` (split on spaces: JSON in it has none) as the user of `kubeconfig`, with
/// `stdin` piped in when given.
fn kubectl_as(ns: &TestNamespace, kubeconfig: &Path, command: &str, stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut cmd = std::process::Command::new(&common::control_plane().kubectl);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout=30s", "-n", &ns.name])
        .args(command.split(' '))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kubectl");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().expect("kubectl")
}

fn stamped_config_map(name: &str, token: i64, data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels: {{fencing.dev/lease: books}}\n  annotations: {{fencing.dev/token: \"{token}\"}}\ndata: {{x: \"{data}\"}}\n"
    )
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {fencing.dev/lease: books}
  annotations: {fencing.dev/token: "TOKEN"}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: example.invalid/web:1}]}
"#;

/// The lease `books`: labelled objects, and every Deployment and ConfigMap of the namespace.
const BOOKS: &str = r#"
apiVersion: fencing.dev/v1alpha1
kind: FencedLease
metadata: {name: books}
spec:
  leaseDurationSeconds: 5
  fenceObjects: true
  fence:
    resources:
      - {group: apps, resource: deployments}
      - {resource: configmaps}
"#;

/// pa holds `books` first, then stalls: its claim stops beating and expires; pb, queued, is
/// granted. Returns both tokens, and pb's heartbeat.
async fn pb_takes_over_from_pa(
    ns: &TestNamespace,
    pa: &TestPod,
    pb: &TestPod,
) -> (i64, i64, Beating) {
    claim_as_pod(ns, pa, "books").await;
    let ta = wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    claim_as_pod(ns, pb, "books").await;
    let beat = ns.keep_beating("pb", Duration::from_millis(500));
    let tb = wait_for("pb granted once pa expires", WAIT, || {
        ns.granted_token("pb")
    })
    .await;
    assert!(tb > ta);
    (ta, tb, beat)
}

/// pb writes a Deployment and a ConfigMap stamped with its token `tb`, once the apiserver's
/// cache shows it as the holder (the identity rule reads the lease through an informer), and
/// an unlabelled ConfigMap.
async fn the_holder_writes_its_objects(ns: &TestNamespace, as_pb: &Path, tb: i64) {
    let deployment = DEPLOYMENT.replace("TOKEN", &tb.to_string());
    wait_for("pb's Deployment accepted", WAIT, || async {
        kubectl_as(ns, as_pb, "apply -f -", Some(&deployment))
            .status
            .success()
            .then_some(())
    })
    .await;
    let out = kubectl_as(
        ns,
        as_pb,
        "apply -f -",
        Some(&stamped_config_map("ledger", tb, "pb")),
    );
    assert!(
        out.status.success(),
        "pb writes its ConfigMap: {}",
        both(&out)
    );
    let out = kubectl_as(
        ns,
        as_pb,
        "create configmap plain --from-literal=x=pb",
        None,
    );
    assert!(
        out.status.success(),
        "pb creates an unlabelled ConfigMap: {}",
        both(&out)
    );
}

/// The stale pod pa (token `ta`, pb holds `tb`), with plain kubectl and its own token: every
/// write is refused, and nothing of it gets through.
async fn every_write_of_the_stale_pod_is_refused(
    ns: &TestNamespace,
    as_pa: &Path,
    ta: i64,
    tb: i64,
) {
    // What is written, the command, and its stdin.
    let attempts = [
        ("a patch stamped with its old token", format!(r#"patch configmap ledger --type=merge -p {{"metadata":{{"annotations":{{"fencing.dev/token":"{ta}"}}}},"data":{{"x":"pa"}}}}"#), None),
        ("a patch that leaves the token alone", r#"patch configmap ledger --type=merge -p {"data":{"x":"pa"}}"#.into(), None),
        ("a patch of an unlabelled object", r#"patch configmap plain --type=merge -p {"data":{"x":"pa"}}"#.into(), None),
        ("a JSON patch", r#"patch deployment web --type=json -p [{"op":"replace","path":"/spec/replicas","value":5}]"#.into(), None),
        ("a status patch", r#"patch deployment web --subresource=status --type=merge -p {"status":{"observedGeneration":42}}"#.into(), None),
        ("a scale", "scale deployment web --replicas=4".into(), None),
        ("a label change", "label configmap ledger stale=pa".into(), None),
        ("a server-side apply", "apply --server-side --force-conflicts -f -".into(), Some(stamped_config_map("ledger", tb, "pa"))),
        ("a create", "create configmap pa-new --from-literal=x=pa".into(), None),
        ("a create stamped with its old token", "apply -f -".into(), Some(stamped_config_map("pa-stamped", ta, "pa"))),
        ("a delete of an object the holder wrote", "delete configmap ledger".into(), None),
        ("a delete by label selector", "delete configmaps -l fencing.dev/lease=books".into(), None),
        ("a delete of the Deployment", "delete deployment web".into(), None),
    ];
    for (what, command, stdin) in &attempts {
        let out = kubectl_as(ns, as_pa, command, stdin.as_deref());
        let text = both(&out);
        assert!(
            !out.status.success(),
            "the stale pod's {what} was accepted: {text}"
        );
        // A write with a lower token than the object's may meet the per-object rule first.
        let identity = format!(
            "pod pa does not hold FencedLease {}/books (pod pb holds it, token {tb}; this write carries ",
            ns.name
        );
        let stored = format!("fencing.dev/token {ta} is lower than {tb}");
        assert!(
            text.contains(&identity) || (what.contains("old token") && text.contains(&stored)),
            "{what}: {text}"
        );
    }
    // Nothing of pa's got through.
    let cms = ns.api::<ConfigMap>();
    for (name, x) in [("ledger", "pb"), ("plain", "pb")] {
        let cm = cms.get(name).await.expect("still there");
        assert_eq!(cm.data.unwrap()["x"], x, "{name} was changed");
    }
    assert!(cms.get_opt("pa-new").await.unwrap().is_none());
}

/// The holder's own patch, status patch and scale pass.
fn the_holders_writes_pass(ns: &TestNamespace, as_pb: &Path) {
    for (what, command) in [
        (
            "patch",
            r#"patch configmap ledger --type=merge -p {"data":{"x":"pb-again"}}"#,
        ),
        (
            "status patch",
            r#"patch deployment web --subresource=status --type=merge -p {"status":{"observedGeneration":1}}"#,
        ),
        ("scale", "scale deployment web --replicas=2"),
    ] {
        let out = kubectl_as(ns, as_pb, command, None);
        assert!(
            out.status.success(),
            "the holder's {what} was refused: {}",
            both(&out)
        );
    }
}

/// A writer that is no pod (the admin here) meets the token rule only: a write without a
/// token passes, one stamped with the old token `ta` is refused.
fn a_writer_that_is_no_pod_meets_the_token_rule_only(ns: &TestNamespace, ta: i64, tb: i64) {
    let admin = ns.admin_kubeconfig().to_path_buf();
    let out = kubectl_as(
        ns,
        &admin,
        r#"patch configmap plain --type=merge -p {"data":{"x":"admin"}}"#,
        None,
    );
    assert!(out.status.success(), "{}", both(&out));
    let out = kubectl_as(
        ns,
        &admin,
        "apply -f -",
        Some(&stamped_config_map("ledger", ta, "admin")),
    );
    let text = both(&out);
    assert!(
        !out.status.success()
            && text.contains(&format!("fencing.dev/token {ta} is lower than {tb}")),
        "a stamped write with the old token: {text}"
    );
}

/// Once pb releases (its heartbeat `beat` stopped, its claim deleted), nobody holds the lease:
/// every pod is refused.
async fn once_released_nobody_holds(ns: &TestNamespace, as_pb: &Path, beat: Beating) {
    drop(beat);
    ns.api::<FencedLeaseClaim>()
        .delete("pb", &DeleteParams::default())
        .await
        .unwrap();
    let text = wait_for("pb refused once it released", WAIT, || async {
        let out = kubectl_as(
            ns,
            as_pb,
            r#"patch configmap plain --type=merge -p {"data":{"x":"pb-late"}}"#,
            None,
        );
        (!out.status.success()).then(|| both(&out))
    })
    .await;
    assert!(text.contains("(nobody holds it, token "), "{text}");
}

#[tokio::test]
async fn a_stale_holder_pod_is_refused_every_write_and_the_holder_is_not() {
    let ns = TestNamespace::new("fence-identity").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let out = ns.kubectl_apply(BOOKS);
    assert!(out.status.success(), "{}", both(&out));
    let (ta, tb, beat) = pb_takes_over_from_pa(&ns, pa, pb).await;

    let as_pa = ns.kubeconfig_as_pod(pa).await;
    let as_pb = ns.kubeconfig_as_pod(pb).await;
    the_holder_writes_its_objects(&ns, &as_pb, tb).await;
    every_write_of_the_stale_pod_is_refused(&ns, &as_pa, ta, tb).await;
    the_holders_writes_pass(&ns, &as_pb);
    a_writer_that_is_no_pod_meets_the_token_rule_only(&ns, ta, tb);
    once_released_nobody_holds(&ns, &as_pb, beat).await;
}

/// The claim pa made records pa's name and UID.
async fn assert_made_by_pod(ns: &TestNamespace, claim: &str, pa: &TestPod) {
    let claim = ns.api::<FencedLeaseClaim>().get(claim).await.unwrap();
    let annotations = claim.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("fencing.dev/created-by-pod-uid"),
        Some(&pa.uid)
    );
    assert_eq!(
        annotations
            .get("fencing.dev/created-by-pod")
            .map(String::as_str),
        Some("pa")
    );
}

/// A patch that renews a claim now.
fn renewal() -> serde_json::Value {
    json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}})
}

/// pb (the same ServiceAccount, another pod) can neither renew nor release pa's claim, nor can
/// the ServiceAccount's token bound to no pod; a creator that is not a pod cannot pass itself
/// off as one.
async fn no_other_pod_renews_or_releases(ns: &TestNamespace, pa: &TestPod, pb: &TestPod) {
    let as_pb: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    let renew = as_pb
        .patch("pa", &PatchParams::default(), &Patch::Merge(&renewal()))
        .await;
    let release = as_pb.delete("pa", &DeleteParams::default()).await.map(drop);
    // The same ServiceAccount's token, bound to no pod, is not the pod either.
    let unbound: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as("app", None).await, &ns.name);
    let outside = unbound
        .delete("pa", &DeleteParams::default())
        .await
        .map(drop);
    for (what, result) in [
        ("renew", renew.map(drop)),
        ("release", release),
        ("release from outside the pod", outside),
    ] {
        let (code, message) = common::api_error_message(result);
        assert_eq!(code, 403, "pb could {what}: {message}");
        assert!(
            message.contains("fenced-lease-claim-ownership")
                && message.contains(&format!("belongs to pod pa (UID {})", pa.uid)),
            "{what}: {message}"
        );
    }
    let forged: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": "forged", "annotations": {"fencing.dev/created-by-pod-uid": pb.uid, "fencing.dev/created-by-pod": "pb"}},
        "spec": {"leaseName": "books", "holderIdentity": "forged"},
    }))
    .unwrap();
    let (code, message) =
        common::api_error_message(unbound.create(&PostParams::default(), &forged).await);
    assert_eq!(code, 403, "{message}");
}

/// kubectl fence release --all, run in pb: pa's claim is refused and stays, with `token`.
async fn kubectl_fence_release_in_another_pod_is_refused(
    ns: &TestNamespace,
    pb: &TestPod,
    token: i64,
) {
    let pb_kubeconfig = ns.kubeconfig_as_pod(pb).await;
    let out = fence_as(ns, &pb_kubeconfig)
        .args(["release", "books", "--all"])
        .output()
        .unwrap();
    let text = both(&out);
    assert_eq!(out.status.code(), Some(77), "{text}");
    assert!(
        text.contains("claim pa not released") && text.contains("belongs to pod pa"),
        "{text}"
    );
    assert_eq!(
        ns.granted_token("pa").await,
        Some(token),
        "pb changed nothing"
    );
}

/// pa itself renews; deleting pod pa releases its claim (the garbage collector).
async fn the_owner_renews_and_its_deletion_releases(ns: &TestNamespace, pa: &TestPod) {
    let as_pa: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    as_pa
        .patch("pa", &PatchParams::default(), &Patch::Merge(&renewal()))
        .await
        .expect("pa renews its own claim");
    ns.api::<k8s_openapi::api::core::v1::Pod>()
        .delete("pa", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "pa's claim collected with its pod",
        Duration::from_secs(60),
        || async {
            ns.api::<FencedLeaseClaim>()
                .get_opt("pa")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_claim_belongs_to_the_pod_that_made_it() {
    let ns = TestNamespace::new("claim-pod").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("books", 30);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    claim_as_pod(&ns, pa, "books").await;
    let token = wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    assert_made_by_pod(&ns, "pa", pa).await;
    no_other_pod_renews_or_releases(&ns, pa, pb).await;
    kubectl_fence_release_in_another_pod_is_refused(&ns, pb, token).await;
    the_owner_renews_and_its_deletion_releases(&ns, pa).await;
}

/// Does the apiserver serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (1.36 on)?
fn serves_mutating_admission_policy(ns: &TestNamespace) -> bool {
    let out = ns
        .kubectl()
        .args(["get", "--raw", "/apis/admissionregistration.k8s.io/v1"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains(r#""kind":"MutatingAdmissionPolicy""#)
}

/// Claim `name` of lease books, with `annotations`.
fn claim_with(name: &str, annotations: serde_json::Value) -> FencedLeaseClaim {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"leaseName": "books", "holderIdentity": name},
    }))
    .unwrap()
}

/// Claims made with a token bound to no pod, as `user`: one with its creator's annotation is
/// created; one without, or with another creator's, is stamped with `user` where the apiserver
/// serves MutatingAdmissionPolicy (`mutating`), and refused saying what to send before.
async fn claims_carry_their_creator(unbound: &Api<FencedLeaseClaim>, user: &str, mutating: bool) {
    // RBAC bindings reach the authorizer with a delay: wait until a right claim passes.
    let right = wait_for(
        "a claim with its creator's annotations created",
        WAIT,
        || async {
            unbound
                .create(
                    &PostParams::default(),
                    &claim_with("right", json!({"fencing.dev/created-by": user})),
                )
                .await
                .ok()
        },
    )
    .await;
    let annotations = right.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("fencing.dev/created-by")
            .map(String::as_str),
        Some(user)
    );

    for (name, annotations) in [
        ("bare", json!({})),
        (
            "forged",
            json!({"fencing.dev/created-by": "system:serviceaccount:x:bob"}),
        ),
    ] {
        let result = unbound
            .create(&PostParams::default(), &claim_with(name, annotations))
            .await;
        if mutating {
            let created = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            let annotations = created.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations
                    .get("fencing.dev/created-by")
                    .map(String::as_str),
                Some(user),
                "{name}"
            );
        } else {
            let (code, message) = common::api_error_message(result);
            assert_eq!(code, 403, "{name}: {message}");
            assert!(
                message.contains("fenced-lease-claim-ownership")
                    && message.contains(&format!(
                        "must be created with the annotation fencing.dev/created-by: {user}"
                    )),
                "{name}: {message}"
            );
        }
    }
}

/// Claims made from pod pa: the pod's name and UID too, stamped where the apiserver serves
/// MutatingAdmissionPolicy (`mutating`), and refused without them before.
async fn claims_from_a_pod_carry_the_pod(
    ns: &TestNamespace,
    pa: &TestPod,
    user: &str,
    mutating: bool,
) {
    let from_pa: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let pod_annotations = json!({
        "fencing.dev/created-by": user,
        "fencing.dev/created-by-pod": pa.name,
        "fencing.dev/created-by-pod-uid": pa.uid,
    });
    let created = wait_for("pa's claim created", WAIT, || async {
        from_pa
            .create(
                &PostParams::default(),
                &claim_with("pod-right", pod_annotations.clone()),
            )
            .await
            .ok()
    })
    .await;
    let annotations = created.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("fencing.dev/created-by-pod-uid"),
        Some(&pa.uid)
    );
    let result = from_pa
        .create(
            &PostParams::default(),
            &claim_with("pod-bare", json!({"fencing.dev/created-by": user})),
        )
        .await;
    if mutating {
        let created = result.expect("stamped by the MutatingAdmissionPolicy");
        let annotations = created.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations.get("fencing.dev/created-by-pod"),
            Some(&pa.name)
        );
    } else {
        let (code, message) = common::api_error_message(result);
        assert_eq!(code, 403, "{message}");
        assert!(
            message.contains(&format!(
                "must carry its pod in the annotations fencing.dev/created-by-pod: pa and fencing.dev/created-by-pod-uid: {}",
                pa.uid
            )),
            "{message}"
        );
    }
}

/// I7 at create, on every supported version: a claim records its creator as the apiserver
/// authenticates it. Where MutatingAdmissionPolicy is served (1.36 on) the apiserver writes
/// the annotations, whatever the client sent; before, the client must send them (the holders
/// do) and a claim without them, or with another creator's, is refused saying what to send.
#[tokio::test]
async fn a_claim_is_created_with_its_creators_annotations_or_refused() {
    let ns = TestNamespace::new("claim-creator").await;
    let pods = ns.app_pods(&["pa"]).await;
    let pa = &pods[0];
    let user = format!("system:serviceaccount:{}:app", ns.name);
    let mutating = serves_mutating_admission_policy(&ns);
    let unbound: Api<FencedLeaseClaim> = Api::namespaced(ns.client_as("app", None).await, &ns.name);
    claims_carry_their_creator(&unbound, &user, mutating).await;
    claims_from_a_pod_carry_the_pod(&ns, pa, &user, mutating).await;
}

/// A lease that fences objects is granted only once its binding is in force: a pod that does
/// not hold it is refused from the first grant on, also when the lease is new (or deleted and
/// created again while a former holder still writes).
#[tokio::test]
async fn the_fence_is_in_force_before_the_first_grant() {
    let ns = TestNamespace::new("fence-first").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    // pb queues for the lease before it exists; pa writes ConfigMaps all along.
    claim_as_pod(&ns, pb, "books").await;
    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let granted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let granted = granted.clone();
        tokio::spawn(async move {
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": "pa-write"}})).unwrap();
            let mut late = Vec::new();
            let mut refused_after_grant = 0;
            for _ in 0..2000 {
                let after_grant = granted.load(std::sync::atomic::Ordering::SeqCst);
                let result = as_pa.create(&dry_run, &cm).await;
                if after_grant {
                    match result {
                        Ok(_) => late.push("accepted"),
                        Err(_) => refused_after_grant += 1,
                    }
                    if refused_after_grant + late.len() >= 50 {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (late, refused_after_grant)
        })
    };
    let out = ns.kubectl_apply(BOOKS);
    assert!(out.status.success(), "{}", both(&out));
    let _beat = ns.keep_beating("pb", Duration::from_millis(500));
    wait_for("pb granted", WAIT, || ns.granted_token("pb")).await;
    granted.store(true, std::sync::atomic::Ordering::SeqCst);
    let (late, refused) = writer.await.unwrap();
    assert!(
        late.is_empty(),
        "{} of pa's writes sent after pb's grant was seen were accepted ({refused} refused)",
        late.len()
    );
    assert_eq!(refused, 50, "pa's writes after the grant");
}
