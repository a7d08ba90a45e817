//! What `helm template` renders, against the repository: the chart carries current copies of
//! crds/, deploy/rbac/ and deploy/admission/ and renders them as they are, names one image of
//! this version (as the install commands of the docs do), renders the MutatingAdmissionPolicy
//! only where the cluster serves it, renders whatever file deploy/admission/ holds, and binds a
//! second operator ClusterRole cluster-wide.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::common::repo_root;
use crate::helm::{chart_dir, documents, find, render_dir, render_with, run_ok};

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

/// The text of a file of the repository.
fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap()
}

/// CRDs: the generated ones, with only the chart's labels and keep annotation added.
fn assert_crds_as_generated(objects: &[Value]) {
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
}

/// RBAC: exactly the rules of deploy/rbac, under the release's names.
fn assert_rbac_as_deploy_rbac(objects: &[Value]) {
    let operator = documents(&read("deploy/rbac/operator.yaml"));
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(
            rules_of(objects, kind, "fenced-lease-operator"),
            rules_of(&operator, kind, "fenced-lease-operator"),
            "the chart's operator {kind} differs from deploy/rbac/operator.yaml"
        );
    }
    let holder = documents(&read("deploy/rbac/holder-role.yaml"));
    assert_eq!(
        rules_of(objects, "ClusterRole", "fenced-lease-holder"),
        rules_of(&holder, "Role", "fenced-lease-holder"),
        "the chart's holder ClusterRole differs from deploy/rbac/holder-role.yaml"
    );
}

/// Admission policies: every object of deploy/admission/, as it is.
fn assert_admission_policies_as_deploy_admission(objects: &[Value]) {
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
}

/// The image the chart's default, `make image` and the README name.
const IMAGE: &str = "ghcr.io/fenced-lease/fenced-lease-operator";

/// One image reference: the chart's default, what `make image` builds and what the README
/// names, tagged with the crate's version.
fn assert_one_image_of_this_version(objects: &[Value]) {
    let version = env!("CARGO_PKG_VERSION");
    let chart: Value = serde_saphyr::from_str(&read("charts/fenced-lease/Chart.yaml")).unwrap();
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
        find(objects, "Deployment", "fenced-lease-operator")["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        format!("{IMAGE}:{version}")
    );
    assert!(
        read("hack/image").contains(&format!("IMAGE_NAME:-{IMAGE}}}")),
        "hack/image builds the image the chart points at"
    );
}

/// The install commands (README.md; from source, docs/operating.md) name this version and
/// what the chart installs by default.
fn assert_install_commands_name_this_version(objects: &[Value]) {
    let version = env!("CARGO_PKG_VERSION");
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
    find(objects, "ClusterRole", "fenced-lease-holder");
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
    assert_crds_as_generated(&objects);
    assert_rbac_as_deploy_rbac(&objects);
    assert_admission_policies_as_deploy_admission(&objects);
    assert_one_image_of_this_version(&objects);
    assert_install_commands_name_this_version(&objects);
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

/// A copy of the chart in a scratch directory, to change a file of.
fn scratch_chart() -> PathBuf {
    let scratch =
        std::env::temp_dir().join(format!("fenced-lease-chart-{:08x}", rand::random::<u32>()));
    run_ok(Command::new("cp").arg("-r").arg(chart_dir()).arg(&scratch));
    scratch
}

/// Every file dropped into deploy/admission/ (and synced) is rendered, whatever it holds.
#[test]
fn every_file_of_deploy_admission_is_rendered() {
    let scratch = scratch_chart();
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
    let scratch = scratch_chart();
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
