//! The Helm chart (charts/fenced-lease), with real Helm against the test apiserver: it carries
//! current copies of crds/, deploy/rbac/ and deploy/admission/; installed, the operator runs
//! with the chart's ServiceAccount and needs every permission the chart grants and no other;
//! the holder ClusterRole is all `kubectl fence` needs; it serves listed namespaces through
//! RoleBindings; its alerts, ServiceMonitor and dashboard install under prometheus-operator's
//! CRDs, and its critical alert fires in a real Prometheus when the fence refuses a write; upgrade and uninstall keep the CRDs and the leases; a wrong value fails the install
//! naming it; the pod meets the restricted Pod Security profile. The packaged chart installed
//! on a real node, its image's pods and `helm test`: tests/node (`make test-node`).

extern crate fenced_lease_tests as common;

mod alerts;
mod audit;
mod helm;
mod monitoring;
mod operator;
mod reported;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, repo_root, wait_for};
use fenced_lease::api::{ClaimPhase, FencedLeaseClaim, token_annotation_key};
use fenced_lease_operator::admission::shipped;
use helm::{Release, chart_dir, documents, find, render, render_dir, render_with, run_ok};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use operator::ChartOperator;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Tests that run an operator or create leases hold this: a cluster-wide operator would serve
/// the other tests' leases too.
static OPERATORS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `*.yaml` files of a directory: name -> text (none when it does not exist).
fn yaml_files(dir: &Path) -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).expect("read"))
        })
        .collect()
}

fn assert_copies(source: &str, copy: &str, only: Option<&[&str]>) {
    let mut sources = yaml_files(&repo_root().join(source));
    if let Some(only) = only {
        sources.retain(|name, _| only.contains(&name.as_str()));
    }
    let copies = yaml_files(&chart_dir().join(copy));
    let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&copies),
        names(&sources),
        "charts/fenced-lease/{copy} does not hold the files of {source}; run `make chart-sync`"
    );
    for (name, text) in &sources {
        assert!(
            copies[name] == *text,
            "charts/fenced-lease/{copy}{name} differs from {source}{name}; run `make chart-sync`"
        );
    }
}

#[test]
fn the_chart_carries_current_copies_of_crds_rbac_and_admission_policies() {
    assert_copies("crds/", "files/crds/", None);
    assert_copies(
        "deploy/rbac/",
        "files/rbac/",
        Some(&["operator.yaml", "holder-role.yaml"]),
    );
    assert_copies("deploy/admission/", "files/admission/", None);
}

fn rules_of(docs: &[Value], kind: &str, name: &str) -> Value {
    find(docs, kind, name)["rules"].clone()
}

fn without_chart_metadata(mut crd: Value) -> Value {
    let meta = crd["metadata"].as_object_mut().expect("metadata");
    for key in ["labels", "annotations"] {
        if let Some(map) = meta.get_mut(key).and_then(Value::as_object_mut) {
            map.retain(|k, _| {
                !(k.starts_with("app.kubernetes.io/")
                    || k.starts_with("helm.sh/")
                    || k.starts_with("meta.helm.sh/"))
            });
            if map.is_empty() {
                meta.remove(key);
            }
        }
    }
    crd
}

#[test]
fn the_chart_renders_the_crds_rbac_and_policies_of_the_repository() {
    // As on a cluster that serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (1.36 on).
    let objects = render_with(
        "fenced-lease",
        &[
            "--api-versions",
            "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
        ],
    );

    // CRDs: the generated ones, with only the chart's labels and keep annotation added.
    let mut generated = vec![];
    for text in yaml_files(&repo_root().join("crds")).values() {
        generated.extend(documents(text));
    }
    let rendered: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .cloned()
        .collect();
    assert_eq!(rendered.len(), generated.len(), "one CRD per generated CRD");
    for crd in &rendered {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "CRDs are kept on uninstall by default"
        );
        let name = &crd["metadata"]["name"];
        let source = generated
            .iter()
            .find(|g| g["metadata"]["name"] == *name)
            .unwrap_or_else(|| panic!("the chart renders CRD {name}, which crds/ lacks"));
        assert!(
            without_chart_metadata(crd.clone()) == *source,
            "the chart's CRD {name} differs from crds/; run `make chart-sync`"
        );
    }

    // RBAC: exactly the rules of deploy/rbac, under the release's names.
    let operator =
        documents(&std::fs::read_to_string(repo_root().join("deploy/rbac/operator.yaml")).unwrap());
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(
            rules_of(&objects, kind, "fenced-lease-operator"),
            rules_of(&operator, kind, "fenced-lease-operator"),
            "the chart's operator {kind} differs from deploy/rbac/operator.yaml"
        );
    }
    let holder = documents(
        &std::fs::read_to_string(repo_root().join("deploy/rbac/holder-role.yaml")).unwrap(),
    );
    assert_eq!(
        rules_of(&objects, "ClusterRole", "fenced-lease-holder"),
        rules_of(&holder, "Role", "fenced-lease-holder"),
        "the chart's holder ClusterRole differs from deploy/rbac/holder-role.yaml"
    );

    // Admission policies: every object of deploy/admission/, as it is.
    for (file, text) in yaml_files(&repo_root().join("deploy/admission")) {
        for doc in documents(&text) {
            assert!(
                objects.contains(&doc),
                "the chart does not render {} {} of deploy/admission/{file}",
                doc["kind"],
                doc["metadata"]["name"]
            );
        }
    }

    // One image reference: the chart's default, what `make image` builds and what the README
    // names, tagged with the crate's version.
    const IMAGE: &str = "ghcr.io/fenced-lease/fenced-lease-operator";
    let version = env!("CARGO_PKG_VERSION");
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["appVersion"], version);
    assert_eq!(chart["version"], version);
    assert_eq!(
        chart["home"],
        "https://github.com/fenced-lease/fenced-lease"
    );
    assert!(
        chart["sources"]
            .as_array()
            .is_some_and(|s| s.contains(&json!("https://github.com/fenced-lease/fenced-lease"))),
        "Chart.yaml names its sources"
    );
    assert_eq!(
        find(&objects, "Deployment", "fenced-lease-operator")["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        format!("{IMAGE}:{version}")
    );
    // The install commands (README.md; from source, docs/operating.md) name this version and
    // what the chart installs by default.
    let read = |doc: &str| std::fs::read_to_string(repo_root().join(doc)).unwrap();
    let (readme, operating) = (read("README.md"), read("docs/operating.md"));
    for (doc, text, command) in [
        ("README.md", &readme, format!(
            "$ helm install fenced-lease oci://ghcr.io/fenced-lease/charts/fenced-lease --version {version} -n fenced-lease --create-namespace\n"
        )),
        ("README.md", &readme, "$ kubectl -n my-app create rolebinding my-app-fence-holder --clusterrole=fenced-lease-holder ".into()),
        ("README.md", &readme, format!("$ go get github.com/fenced-lease/fenced-lease/go@v{version}\n")),
        ("docs/operating.md", &operating, format!("oci:target/image/oci:{version} docker://registry.example.com/fenced-lease/fenced-lease-operator:{version}")),
        ("docs/operating.md", &operating, "$ helm install fenced-lease charts/fenced-lease -n fenced-lease --create-namespace".into()),
    ] {
        assert!(text.contains(&command), "{doc} lacks {command:?}");
    }
    find(&objects, "ClusterRole", "fenced-lease-holder");

    let image_script = std::fs::read_to_string(repo_root().join("hack/image")).unwrap();
    assert!(
        image_script.contains(&format!("IMAGE_NAME:-{IMAGE}}}")),
        "hack/image builds the image the chart points at"
    );
}

/// Where the cluster does not serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
/// (before 1.36, and `helm template` unless told), the chart leaves it out and installs the
/// rest: claim ownership then rests on the holders' own creator annotations, which the
/// ValidatingAdmissionPolicy checks.
#[test]
fn the_mutating_admission_policy_is_rendered_only_where_the_cluster_serves_it() {
    let kinds = |args: &[&str]| -> Vec<String> {
        render_with("fenced-lease", args)
            .iter()
            .filter(|o| {
                o["metadata"]["name"] == "fenced-lease-claim-creator"
                    || o["metadata"]["name"] == "fenced-lease-claim-ownership"
            })
            .map(|o| o["kind"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        kinds(&["--kube-version", "1.34.0"]),
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    assert_eq!(
        kinds(&[
            "--kube-version",
            "1.37.2",
            "--api-versions",
            "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
        ]),
        [
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
}

/// Every file dropped into deploy/admission/ (and synced) is rendered, whatever it holds.
#[test]
fn every_file_of_deploy_admission_is_rendered() {
    let scratch =
        std::env::temp_dir().join(format!("fenced-lease-chart-{:08x}", rand::random::<u32>()));
    run_ok(Command::new("cp").arg("-r").arg(chart_dir()).arg(&scratch));
    let policy = "# A policy of the project.\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: sample.fencing.dev\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules:\n      - apiGroups: [fencing.dev]\n        apiVersions: [\"*\"]\n        operations: [UPDATE]\n        resources: [fencedleaseclaims]\n  validations:\n    - expression: \"true\"\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata:\n  name: sample.fencing.dev\nspec:\n  policyName: sample.fencing.dev\n  validationActions: [Deny]\n";
    std::fs::create_dir_all(scratch.join("files/admission")).unwrap();
    std::fs::write(scratch.join("files/admission/sample.yaml"), policy).unwrap();
    let kinds = |set: &[&str]| -> Vec<String> {
        render_dir(&scratch, "fenced-lease", set)
            .iter()
            .filter(|o| o["metadata"]["name"] == "sample.fencing.dev")
            .map(|o| o["kind"].as_str().unwrap().to_string())
            .collect()
    };
    let rendered = kinds(&[]);
    let disabled = kinds(&["admissionPolicies.enabled=false"]);
    let _ = std::fs::remove_dir_all(&scratch);
    assert_eq!(
        rendered,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    assert!(disabled.is_empty(), "admissionPolicies.enabled=false: none");
}

/// deploy/rbac/operator.yaml may hold a second ClusterRole for cluster-scoped objects (admission
/// policy bindings, say): the chart binds it cluster-wide even when the operator serves listed
/// namespaces only, since a RoleBinding cannot grant cluster-scoped objects.
#[test]
fn another_cluster_role_of_deploy_rbac_is_bound_cluster_wide() {
    let scratch =
        std::env::temp_dir().join(format!("fenced-lease-chart-{:08x}", rand::random::<u32>()));
    run_ok(Command::new("cp").arg("-r").arg(chart_dir()).arg(&scratch));
    let rbac = scratch.join("files/rbac/operator.yaml");
    let mut text = std::fs::read_to_string(&rbac).unwrap();
    text.push_str("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: fenced-lease-operator-policies\nrules:\n  - apiGroups: [admissionregistration.k8s.io]\n    resources: [validatingadmissionpolicybindings]\n    verbs: [create]\n");
    std::fs::write(&rbac, text).unwrap();
    let objects = render_dir(&scratch, "fenced-lease", &["watchNamespaces[0]=team-a"]);
    let _ = std::fs::remove_dir_all(&scratch);
    let binding = find(
        &objects,
        "ClusterRoleBinding",
        "fenced-lease-operator-policies",
    );
    assert_eq!(binding["roleRef"]["name"], "fenced-lease-operator-policies");
    assert_eq!(binding["subjects"][0]["name"], "fenced-lease-operator");
    let watch = find(&objects, "RoleBinding", "fenced-lease-operator-watch");
    assert_eq!(watch["metadata"]["namespace"], "team-a");
    assert!(
        !objects.iter().any(|o| o["kind"] == "ClusterRoleBinding"
            && o["metadata"]["name"] == "fenced-lease-operator"),
        "the namespaced ClusterRole is not bound cluster-wide"
    );
}

#[tokio::test]
async fn a_wrong_value_fails_the_install_naming_it() {
    audit::log_path(); // turning the audit log on restarts the apiserver: not mid-test
    let ns = TestNamespace::new("chart-badvalue").await;
    let release = Release::named(&ns.name);
    let out = release.try_install(&["replicaCount=two", "crds.enabled=false"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "installed with replicaCount=two");
    assert!(
        stderr.contains("/replicaCount") && stderr.contains("want integer"),
        "the message names the value and what it should be: {stderr}"
    );
    let out = release.try_install(&["crds.enabled=false", "replicas=3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("additional properties 'replicas' not allowed"),
        "an unknown key is refused by name: {stderr}"
    );
    let deployments = ns
        .kubectl()
        .args(["get", "deployments", "-o", "name"])
        .output()
        .unwrap();
    assert!(deployments.stdout.is_empty(), "nothing was installed");
}

/// Creates FencedLease `name` that asks for its objects to be fenced, labelled ones
/// (`spec.fenceObjects`) and a kind (`spec.fence`), so that whatever the operator does for that
/// (per-lease admission policy bindings, and a policy for the kind) needs the chart's
/// permissions too.
fn create_fenced_lease(ns: &TestNamespace, name: &str, duration_seconds: i32) {
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
async fn core_scenario(ns: &TestNamespace, policy_prefix: &str) {
    create_pod(ns, "p").await;
    create_pod(ns, "q").await;
    create_fenced_lease(ns, "l", 2);
    ns.create_claim("a", "l", Some("p")).await;
    ns.create_claim("b", "l", None).await;
    ns.create_claim("c", "l", Some("q")).await;
    // They wait like live candidates: a waiter silent for a lease duration is skipped, and a
    // lease that fences objects is granted only once its binding is in force (2 s).
    let _a_beats = ns.keep_beating("a", Duration::from_millis(500));
    let b_beats = ns.keep_beating("b", Duration::from_millis(500));
    let _c_beats = ns.keep_beating("c", Duration::from_millis(500));
    let a = wait_for("a granted", WAIT, || ns.granted_token("a")).await;
    wait_for("pod p annotated with a's token", WAIT, || async {
        (annotation(ns, "p", "l").await? == a.to_string()).then_some(())
    })
    .await;

    // The kinds slot that lists the namespace, edited by hand, is put back.
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

    // Release: b is next, at once.
    delete::<FencedLeaseClaim>(ns, "a").await;
    let b = wait_for("b granted", WAIT, || ns.granted_token("b")).await;
    drop(b_beats);
    assert!(b > a, "tokens grow: {a} then {b}");
    wait_for("p's annotation removed", WAIT, || async {
        annotation(ns, "p", "l").await.is_none().then_some(())
    })
    .await;

    // Expiry: b no longer heartbeats, so c is granted after the lease duration.
    wait_phase(ns, "b", ClaimPhase::Expired).await;
    let c = wait_for("c granted", WAIT, || ns.granted_token("c")).await;
    assert!(c > b, "tokens grow: {b} then {c}");
    wait_for("pod q annotated with c's token", WAIT, || async {
        (annotation(ns, "q", "l").await? == c.to_string()).then_some(())
    })
    .await;

    // Revocation: c's pod goes.
    delete::<Pod>(ns, "q").await;
    wait_phase(ns, "c", ClaimPhase::Revoked).await;

    // A claim for a lease that does not exist waits, and says so.
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

    // A pod the operator may not write: the grant stands, the annotation fails and is
    // retried, with a Warning Event that repeats (an Event series).
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
    wait_for(
        "pod locked annotated once writes are allowed again",
        WAIT,
        || async { (annotation(ns, "locked", "m").await? == d.to_string()).then_some(()) },
    )
    .await;

    // A lease that follows a coordination Lease: the pod its holder identity names holds it
    // (the operator watches and reads Leases).
    let out = ns.kubectl_apply(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: ctrl}\nspec: {holderIdentity: p_0b1a4c8e}\n---\napiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {name: f}\nspec: {follow: {lease: ctrl}}\n",
    );
    assert!(out.status.success(), "{}", common::cli::both(&out));
    wait_for("pod p annotated with f's token", WAIT, || async {
        annotation(ns, "p", "f").await.map(|_| ())
    })
    .await;
    ns.delete_lease("f").await;

    // Deleting leases goes through the finalizer, which records their last tokens (the
    // operator's own records, in its namespace): a lease re-created under the same name
    // continues above them.
    ns.delete_lease("l").await;
    ns.delete_lease("m").await;
    create_fenced_lease(ns, "l", 2);
    ns.create_claim("e", "l", None).await;
    let _e_beats = ns.keep_beating("e", Duration::from_millis(500));
    let e = wait_for("e granted", WAIT, || ns.granted_token("e")).await;
    assert!(e > c, "the re-created lease continues above {c}: {e}");
    ns.delete_lease("l").await;
}

/// Waits until the authorizer applies `user`'s bindings (they reach it through an informer).
fn wait_bindings_in_force(user: &str, checks: &[(&str, &str, Option<&str>)]) {
    for (verb, resource, namespace) in checks {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let mut cmd = common::control_plane().kubectl_cmd();
            cmd.args(["auth", "can-i", verb, resource, "--as", user]);
            if let Some(ns) = namespace {
                cmd.args(["-n", ns]);
            }
            if cmd.output().unwrap().status.success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{user} never got {verb} {resource}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs `scenario`; if it fails, says which of `user`'s requests the apiserver refused (a
/// missing permission shows as a wait that times out).
async fn explain_failure(user: &str, scenario: impl std::future::Future<Output = ()>) {
    use futures::FutureExt;
    if let Err(panic) = std::panic::AssertUnwindSafe(scenario).catch_unwind().await {
        let refused = audit::forbidden(&audit::requests_by(user));
        if !refused.is_empty() {
            panic!(
                "{user} lacks permissions it needs; refused:\n  {}",
                refused.join("\n  ")
            );
        }
        std::panic::resume_unwind(panic);
    }
}

/// Polls the audit log until every permission was used, or the deadline passes; then asserts
/// that nothing was refused and nothing granted went unused.
async fn assert_uses_exactly(user: &str, granted: &[audit::Permission]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let requests = loop {
        let requests = audit::requests_by(user);
        if audit::unused(granted, &requests).is_empty() || tokio::time::Instant::now() > deadline {
            break requests;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        !requests.is_empty(),
        "the audit log has no request of {user}"
    );
    let refused = audit::forbidden(&requests);
    assert!(
        refused.is_empty(),
        "{user} lacks permissions it needs; refused:\n  {}",
        refused.join("\n  ")
    );
    let unused = audit::unused(granted, &requests);
    assert!(
        unused.is_empty(),
        "{user} is granted permissions it never used:\n{}",
        audit::table(&unused)
    );
    eprintln!(
        "{user} used every permission it holds:\n{}",
        audit::table(granted)
    );
}

#[tokio::test]
async fn the_operator_needs_every_permission_the_chart_grants_and_no_other() {
    let _serial = OPERATORS.lock().await;
    audit::log_path();
    let home = TestNamespace::new("chart-op").await;
    let work = TestNamespace::new("chart-op-work").await;
    // The harness applied crds/ and deploy/admission/ with kubectl already.
    let release = Release::install(
        &home.name,
        &["crds.enabled=false", "admissionPolicies.enabled=false"],
    );
    let manifest = release.manifest();
    let deployment = find(&manifest, "Deployment", &release.object("operator"));
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_string();
    let user = audit::service_account_user(&home.name, &sa);
    wait_bindings_in_force(
        &user,
        &[
            ("watch", "fencedleases.fencing.dev", None),
            ("update", "leases.coordination.k8s.io", Some(&home.name)),
        ],
    );

    // The chart's own ServiceAccount, through a token from the TokenRequest API.
    let kubeconfig = home.service_account_kubeconfig(&sa);
    let op = ChartOperator::start(deployment, &home.name, "operator-0", &kubeconfig);
    op.wait_probes_pass(deployment).await;
    explain_failure(&user, core_scenario(&work, &release.fullname)).await;

    let granted = audit::granted_to(&home.name, &sa);
    assert!(
        granted.iter().any(|p| p.namespace.is_none()),
        "cluster-wide by default: a ClusterRoleBinding"
    );
    assert_uses_exactly(&user, &granted).await;
    drop(op);
}

/// Installed as an on-call team would: three watched namespaces, with the alerts, the
/// ServiceMonitor and the dashboard.
#[tokio::test]
async fn limited_to_listed_namespaces_the_operator_serves_them_through_role_bindings() {
    let _serial = OPERATORS.lock().await;
    audit::log_path();
    let home = TestNamespace::new("chart-ns").await;
    let mut served = Vec::new();
    for prefix in ["chart-ns-a", "chart-ns-b", "chart-ns-c"] {
        served.push(TestNamespace::new(prefix).await);
    }
    let other = TestNamespace::new("chart-ns-other").await;
    let mut set = vec![
        "crds.enabled=false".to_string(),
        "admissionPolicies.enabled=false".to_string(),
    ];
    for (i, ns) in served.iter().enumerate() {
        set.push(format!("watchNamespaces[{i}]={}", ns.name));
    }
    set.extend(monitoring::ENABLED.map(String::from));
    monitoring::install_crds();
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    let release = Release::install(&home.name, &set);
    monitoring::assert_installed(&release, 15);
    let manifest = release.manifest();
    let deployment = find(&manifest, "Deployment", &release.object("operator"));
    let sa = release.object("operator");
    let granted = audit::granted_to(&home.name, &sa);
    // Cluster-wide only what is cluster-scoped: the admission bindings of fenced leases, and
    // `get` of FencedLeases, which the apiserver requires of whoever creates a policy with
    // FencedLease params (a lease's kinds policy).
    let mut namespaces: Vec<&String> = served.iter().map(|ns| &ns.name).collect();
    namespaces.push(&home.name);
    assert!(
        granted.iter().all(|p| {
            p.namespace
                .as_ref()
                .is_some_and(|ns| namespaces.contains(&ns))
                || p.group == "admissionregistration.k8s.io"
                || (p.group == "fencing.dev" && p.resource == "fencedleases" && p.verb == "get")
        }),
        "nothing namespaced cluster-wide, only the release's and the three served namespaces:\n{}",
        audit::table(&granted)
    );
    let user = audit::service_account_user(&home.name, &sa);
    let mut checks: Vec<(&str, &str, Option<&str>)> = served
        .iter()
        .map(|ns| ("watch", "fencedleases.fencing.dev", Some(ns.name.as_str())))
        .collect();
    checks.push(("update", "leases.coordination.k8s.io", Some(&home.name)));
    wait_bindings_in_force(&user, &checks);
    // A claim in a namespace it does not serve, made first: it must still be untouched after
    // the served namespaces' leases have changed hands.
    create_fenced_lease(&other, "l", 15);
    other.create_claim("a", "l", None).await;
    let kubeconfig = home.service_account_kubeconfig(&sa);
    let op = ChartOperator::start(deployment, &home.name, "operator-0", &kubeconfig);
    op.wait_probes_pass(deployment).await;

    for ns in &served {
        explain_failure(&user, grant_and_release(ns)).await;
    }
    let claim = other.api::<FencedLeaseClaim>().get("a").await.unwrap();
    assert!(claim.status.is_none(), "{:?}", claim.status);
    let refused = audit::forbidden(&audit::requests_by(&user));
    assert!(refused.is_empty(), "refused:\n  {}", refused.join("\n  "));
    drop(op);
}

/// Grant, annotation, release and lease deletion.
async fn grant_and_release(work: &TestNamespace) {
    create_pod(work, "p").await;
    create_fenced_lease(work, "l", 15);
    work.create_claim("a", "l", Some("p")).await;
    work.create_claim("b", "l", None).await;
    let a = wait_for("a granted", WAIT, || work.granted_token("a")).await;
    wait_for("pod p annotated", WAIT, || async {
        (annotation(work, "p", "l").await? == a.to_string()).then_some(())
    })
    .await;
    delete::<FencedLeaseClaim>(work, "a").await;
    let b = wait_for("b granted", WAIT, || work.granted_token("b")).await;
    assert!(b > a);
    work.delete_lease("l").await;
}

#[tokio::test]
async fn the_holder_cluster_role_is_all_kubectl_fence_and_the_library_need() {
    let _serial = OPERATORS.lock().await;
    audit::log_path();
    let home = TestNamespace::new("chart-holder").await;
    let work = TestNamespace::new("chart-holder-work").await;
    // The harness applied crds/ and deploy/admission/ with kubectl already.
    let release = Release::install(
        &home.name,
        &["crds.enabled=false", "admissionPolicies.enabled=false"],
    );
    let _operator = OperatorProcess::start(&work.name, &[]);

    // What the README and NOTES tell a user to do.
    let _ = work.client_as_service_account("worker").await;
    let role = release.object("holder");
    run_ok(work.kubectl().args([
        "create",
        "rolebinding",
        "worker-fence-holder",
        &format!("--clusterrole={role}"),
        &format!("--serviceaccount={}:worker", work.name),
    ]));
    let user = audit::service_account_user(&work.name, "worker");
    wait_bindings_in_force(
        &user,
        &[("create", "fencedleaseclaims.fencing.dev", Some(&work.name))],
    );
    let kubeconfig = work.service_account_kubeconfig("worker");
    work.create_lease("db", 3);

    let fence = |args: &[&str]| {
        let out = Command::new(common::bin("kubectl-fence"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("kubectl fence");
        assert!(
            out.status.success(),
            "kubectl fence {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let first: i64 = fence(&[
        "run",
        "db",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
        "sleep 2; echo \"$FENCE_TOKEN\"",
    ])
    .parse()
    .expect("run prints the token");
    let second: i64 = fence(&["acquire", "db", "--wait", "30s"])
        .parse()
        .expect("a token");
    assert!(second > first, "tokens grow: {first} then {second}");
    fence(&["status", "db"]);
    fence(&["list"]);
    fence(&["release", "db", "--all"]);
    report_two_refusals(&kubeconfig, &work.name).await;

    let granted = audit::granted_to(&work.name, "worker");
    assert_uses_exactly(&user, &granted).await;
}

/// What the Rust library does with a guard's refusals under the holder role: acquires `db`,
/// and reports two refusals of its writes (a guard's errors as the PostgreSQL and Redis fences
/// return them; tests/chart/reported.rs has real ones): an Event created, then its series
/// updated.
async fn report_two_refusals(kubeconfig: &std::path::Path, namespace: &str) {
    use fenced_lease::holder::{AcquireOptions, acquire};
    let client = common::client_from_kubeconfig(kubeconfig).await;
    let options = AcquireOptions::default().wait(WAIT);
    let guard = acquire(client, namespace, "db", options)
        .await
        .expect("acquire db");
    let token = guard.token().expect("held");
    for highest in [token + 1, token + 2] {
        let refused = fenced_lease::fence::Error::Fenced {
            scope: Some("db".into()),
            presented: token,
            highest,
        };
        assert!(guard.refusal(&refused).is_some());
        guard.reported().await;
    }
    guard.release().await.expect("release db");
}

#[tokio::test]
async fn install_upgrade_and_uninstall_keep_the_crds_and_the_leases() {
    // Its lease must not meet another test's cluster-wide operator (a finalizer nobody removes).
    let _serial = OPERATORS.lock().await;
    audit::log_path(); // turning the audit log on restarts the apiserver: not mid-test
    let home = TestNamespace::new("chart-life").await;
    // Dropped after the release: the policies go with it however this test ends.
    let _reinstall = ReinstallPolicies;
    let release = Release::named(&home.name);
    // The CRDs and admission policies exist already (the test harness applied crds/ and
    // deploy/admission/ with kubectl): the chart takes them over, as after an install by hand.
    let out = release.try_install_with(&["--take-ownership", "--force-conflicts"], &[]);
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(
        notes.contains(&format!("--clusterrole={}", release.object("holder")))
            && notes.contains("kubectl fence run"),
        "NOTES say what to do next:\n{notes}"
    );

    let get = |args: &[&str]| -> Value {
        let out = run_ok(
            common::control_plane()
                .kubectl_cmd()
                .args(args)
                .args(["-o", "json"]),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let operator = release.object("operator");
    let deployment = get(&["get", "deployment", &operator, "-n", &home.name]);
    assert_eq!(deployment["spec"]["replicas"], 2);
    for (kind, name) in [
        ("poddisruptionbudget", operator.clone()),
        ("service", release.object("metrics")),
        ("serviceaccount", operator.clone()),
        ("role", operator.clone()),
        ("rolebinding", operator.clone()),
    ] {
        get(&["get", kind, &name, "-n", &home.name]);
    }
    for (kind, name) in [
        ("clusterrole", operator.clone()),
        ("clusterrolebinding", operator.clone()),
        ("clusterrole", release.object("holder")),
    ] {
        get(&["get", kind, &name]);
    }
    for crd in ["fencedleases.fencing.dev", "fencedleaseclaims.fencing.dev"] {
        let crd = get(&["get", "crd", crd]);
        assert_eq!(
            crd["metadata"]["annotations"]["meta.helm.sh/release-name"],
            *release.name
        );
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }
    home.create_lease("kept", 15);

    // Upgrade with a value changed.
    release.upgrade(&["replicaCount=3", "leaderElection.leaseDurationSeconds=20"]);
    let deployment = get(&["get", "deployment", &operator, "-n", &home.name]);
    assert_eq!(deployment["spec"]["replicas"], 3);
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--leader-election-lease-seconds=20")),
        "{args}"
    );

    // Uninstall: the operator and its RBAC go; the CRDs and the leases stay.
    let out = release.uninstall();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("kept due to the resource policy"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let gone = |args: &[&str]| {
        let out = common::control_plane()
            .kubectl_cmd()
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).contains("NotFound")
    };
    assert!(gone(&["get", "deployment", &operator, "-n", &home.name]));
    assert!(gone(&["get", "clusterrole", &operator]));
    assert!(gone(&["get", "clusterrole", &release.object("holder")]));
    get(&["get", "crd", "fencedleases.fencing.dev"]);
    get(&["get", "fencedlease", "kept", "-n", &home.name]);
}

/// Applies crds/ and deploy/admission/ again when dropped: a release that took over the
/// policies the harness applied takes them with it when it goes, and the tests that follow need
/// them, even after a failed test. It cannot panic (a drop may run while a test unwinds).
struct ReinstallPolicies;

impl Drop for ReinstallPolicies {
    fn drop(&mut self) {
        let out = common::control_plane().install_crds_command().output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("reinstalling crds/ and deploy/admission/: {out:?}");
        }
    }
}

#[tokio::test]
async fn the_operator_pod_meets_the_restricted_pod_security_profile() {
    audit::log_path(); // turning the audit log on restarts the apiserver: not mid-test
    let ns = TestNamespace::new("chart-psa").await;
    run_ok(common::control_plane().kubectl_cmd().args([
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ]));
    let objects = render(&ns.name, &[]);
    let spec =
        find(&objects, "Deployment", "fenced-lease-operator")["spec"]["template"]["spec"].clone();
    let pod = |name: &str, spec: &Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    let out = ns.kubectl_apply(&pod("operator", &spec));
    assert!(
        out.status.success(),
        "the apiserver's PodSecurity admission refuses the chart's pod: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The check is live: the same pod without its container securityContext is refused.
    let mut loose = spec.clone();
    loose["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("securityContext");
    let out = ns.kubectl_apply(&pod("loose", &loose));
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("violates PodSecurity \"restricted"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
