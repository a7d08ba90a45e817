//! The CRDs against a real kube-apiserver: installed with kubectl, valid objects accepted and
//! printed with their columns, invalid ones refused with a message that names the problem.

use crate::common;

use common::{TestNamespace, api_error_message};
use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

fn lease(name: &str, spec: serde_json::Value) -> FencedLease {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("lease object")
}

fn claim(name: &str, spec: serde_json::Value) -> FencedLeaseClaim {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("claim object")
}

fn kubectl_stdout(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Splits `kubectl get` output into rows of cells, cutting each line where the header's
/// columns start (an empty cell leaves no word behind, so splitting on spaces would not do).
fn table(output: &str) -> Vec<Vec<String>> {
    let mut lines = output.lines();
    let header = lines.next().unwrap_or_default();
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    std::iter::once(header)
        .chain(lines)
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(n, &start)| {
                    let end = starts
                        .get(n + 1)
                        .copied()
                        .unwrap_or(line.len())
                        .min(line.len());
                    line.get(start.min(end)..end)
                        .unwrap_or_default()
                        .trim()
                        .to_string()
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn valid_lease_is_defaulted_and_shown_with_its_columns() {
    let ns = TestNamespace::new("crd-lease").await;
    let out = ns.kubectl_apply(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: db-migrate\nspec: {}\n",
    );
    assert!(
        out.status.success(),
        "apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let created = ns.api::<FencedLease>().get("db-migrate").await.unwrap();
    assert_eq!(
        created.spec.lease_duration_seconds, 15,
        "default lease duration"
    );
    assert_eq!(created.spec.min_token, 0, "default minToken");
    assert!(
        created.spec.annotate_holder_pod,
        "pods are annotated by default"
    );

    // The operator's status write, done here by the admin, shows up in the columns.
    let status = json!({"status": {
        "holder": {"claim": "worker-1", "identity": "worker-1", "podName": "worker-1"},
        "fencingToken": 3, "waiting": 2,
    }});
    ns.api::<FencedLease>()
        .patch_status(
            "db-migrate",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();

    let rows = table(&kubectl_stdout(
        ns.kubectl().args(["get", "flease"]).output().unwrap(),
    ));
    assert_eq!(rows[0], ["NAME", "HOLDER", "TOKEN", "WAITING", "AGE"]);
    assert_eq!(rows[1][..4], ["db-migrate", "worker-1", "3", "2"]);

    let wide = table(&kubectl_stdout(
        ns.kubectl()
            .args(["get", "fencedleases", "-o", "wide"])
            .output()
            .unwrap(),
    ));
    assert_eq!(
        wide[0],
        [
            "NAME", "HOLDER", "TOKEN", "FOLLOWS", "WAITING", "DURATION", "AGE"
        ]
    );
    assert_eq!(
        wide[1][3..6],
        ["", "2", "15"],
        "a lease that follows nothing"
    );
}

#[tokio::test]
async fn valid_claim_is_accepted_and_shown_with_its_columns() {
    let ns = TestNamespace::new("crd-claim").await;
    let out = ns.kubectl_apply(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLeaseClaim\nmetadata:\n  name: worker-1\n\
         spec:\n  leaseName: db-migrate\n  holderIdentity: worker-1\n  podName: worker-1\n\
         \x20 renewTime: \"2026-01-01T00:00:00.000000Z\"\n",
    );
    assert!(
        out.status.success(),
        "apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let status = json!({"status": {"phase": "Pending", "queuePosition": 1}});
    ns.api::<FencedLeaseClaim>()
        .patch_status("worker-1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    let rows = table(&kubectl_stdout(
        ns.kubectl().args(["get", "fclaim"]).output().unwrap(),
    ));
    assert_eq!(
        rows[0],
        [
            "NAME", "LEASE", "HOLDER", "PHASE", "TOKEN", "POSITION", "AGE"
        ]
    );
    assert_eq!(
        rows[1][..6],
        ["worker-1", "db-migrate", "worker-1", "Pending", "", "1"]
    );

    let wide = table(&kubectl_stdout(
        ns.kubectl()
            .args(["get", "fclaim", "-o", "wide"])
            .output()
            .unwrap(),
    ));
    assert_eq!(wide[0][6], "POD");
    assert_eq!(wide[1][6], "worker-1");
}

#[tokio::test]
async fn i8_lease_duration_and_min_token_bounds_are_enforced() {
    let ns = TestNamespace::new("crd-bounds").await;
    let leases = ns.api::<FencedLease>();
    let pp = PostParams::default();

    for bad in [0, 3601, -5] {
        let (code, msg) = api_error_message(
            leases
                .create(&pp, &lease("l", json!({"leaseDurationSeconds": bad})))
                .await,
        );
        assert_eq!(code, 422, "{msg}");
        assert!(
            msg.contains("spec.leaseDurationSeconds"),
            "message names the field: {msg}"
        );
    }
    let (code, msg) = api_error_message(
        leases
            .create(&pp, &lease("l", json!({"minToken": -1})))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.minToken") && msg.contains("greater than or equal to 0"),
        "{msg}"
    );

    // The bounds themselves are accepted.
    leases
        .create(&pp, &lease("one", json!({"leaseDurationSeconds": 1})))
        .await
        .unwrap();
    leases
        .create(
            &pp,
            &lease("hour", json!({"leaseDurationSeconds": 3600, "minToken": 0})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn i8_what_a_lease_fences_is_checked_at_admission() {
    let ns = TestNamespace::new("crd-fence").await;
    let leases = ns.api::<FencedLease>();
    let pp = PostParams::default();
    for (fence, expected) in [
        (
            json!({"resources": [{"group": "fencing.dev", "resource": "fencedleaseclaims"}]}),
            "objects of group fencing.dev cannot be fenced",
        ),
        (json!({"resources": []}), "spec.fence.resources"),
        (
            json!({"resources": [{"resource": "deployments/scale"}]}),
            "spec.fence.resources[0].resource",
        ),
        (
            json!({"resources": [{"resource": "*"}]}),
            "spec.fence.resources[0].resource",
        ),
    ] {
        let (code, msg) = api_error_message(
            leases
                .create(&pp, &lease("l", json!({"fence": fence})))
                .await,
        );
        assert_eq!(code, 422, "{fence}: {msg}");
        assert!(msg.contains(expected), "{fence}: {expected:?} not in {msg}");
    }
    let fenced = leases
        .create(
            &pp,
            &lease(
                "l",
                json!({"fence": {"resources": [{"group": "apps", "resource": "deployments"}, {"resource": "configmaps"}], "selector": {"matchLabels": {"app": "books"}}}}),
            ),
        )
        .await
        .expect("a valid fence");
    let fence = fenced.spec.fence.expect("kept");
    assert_eq!(fence.resources[1].group, "", "the core group by default");
}

#[tokio::test]
async fn i8_names_that_do_not_fit_the_annotation_key_are_refused() {
    let ns = TestNamespace::new("crd-names").await;
    let pp = PostParams::default();
    let long = "a".repeat(64);

    let (code, msg) = api_error_message(
        ns.api::<FencedLease>()
            .create(&pp, &lease(&long, json!({})))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("limited to 63 characters") && msg.contains("token.fencing.dev/"),
        "{msg}"
    );
    // 63 is fine.
    ns.api::<FencedLease>()
        .create(&pp, &lease(&"a".repeat(63), json!({})))
        .await
        .unwrap();

    let (code, msg) = api_error_message(
        ns.api::<FencedLeaseClaim>()
            .create(
                &pp,
                &claim("c", json!({"leaseName": long, "holderIdentity": "me"})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.leaseName") && msg.contains("limited to 63 characters"),
        "{msg}"
    );

    // The same message reaches a kubectl user.
    let out = ns.kubectl_apply(&format!(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata:\n  name: {long}\nspec: {{}}\n"
    ));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("limited to 63 characters"));
}

#[tokio::test]
async fn i8_claim_identity_fields_are_immutable() {
    let ns = TestNamespace::new("crd-immutable").await;
    let claims = ns.api::<FencedLeaseClaim>();
    let pp = PostParams::default();
    let pat = PatchParams::default();
    claims
        .create(
            &pp,
            &claim(
                "with-pod",
                json!({"leaseName": "l", "holderIdentity": "me", "podName": "p"}),
            ),
        )
        .await
        .unwrap();
    claims
        .create(
            &pp,
            &claim("no-pod", json!({"leaseName": "l", "holderIdentity": "me"})),
        )
        .await
        .unwrap();

    let cases = [
        (
            "with-pod",
            json!({"spec": {"leaseName": "other"}}),
            "leaseName is immutable",
        ),
        (
            "with-pod",
            json!({"spec": {"holderIdentity": "you"}}),
            "holderIdentity is immutable",
        ),
        (
            "with-pod",
            json!({"spec": {"podName": "q"}}),
            "podName is immutable",
        ),
        (
            "with-pod",
            json!({"spec": {"podName": null}}),
            "podName is immutable",
        ),
        (
            "no-pod",
            json!({"spec": {"podName": "p"}}),
            "podName is immutable",
        ),
    ];
    for (name, patch, expected) in cases {
        let (code, msg) = api_error_message(claims.patch(name, &pat, &Patch::Merge(&patch)).await);
        assert_eq!(code, 422, "{patch}: {msg}");
        assert!(
            msg.contains(expected),
            "{patch}: expected {expected:?} in {msg}"
        );
    }

    // The heartbeat is what a candidate does change.
    let beat = json!({"spec": {"renewTime": "2026-01-01T00:00:01.000000Z"}});
    claims
        .patch("with-pod", &pat, &Patch::Merge(&beat))
        .await
        .unwrap();
}

#[tokio::test]
async fn i7_fencing_token_cannot_be_lowered_even_by_an_admin() {
    let ns = TestNamespace::new("crd-token").await;
    let leases = ns.api::<FencedLease>();
    leases
        .create(&PostParams::default(), &lease("l", json!({})))
        .await
        .unwrap();
    let pat = PatchParams::default();
    let set = |token: i64| json!({"status": {"fencingToken": token}});

    leases
        .patch_status("l", &pat, &Patch::Merge(&set(5)))
        .await
        .unwrap();
    leases
        .patch_status("l", &pat, &Patch::Merge(&set(5)))
        .await
        .unwrap(); // equal is fine
    leases
        .patch_status("l", &pat, &Patch::Merge(&set(6)))
        .await
        .unwrap();

    let (code, msg) =
        api_error_message(leases.patch_status("l", &pat, &Patch::Merge(&set(2))).await);
    assert_eq!(code, 422);
    assert!(msg.contains("can never be lowered"), "{msg}");

    // Unsetting the field, or the whole status, is not a way around the rule; neither is a
    // full replace carrying the current resourceVersion.
    let current = serde_json::to_value(leases.get_status("l").await.unwrap()).unwrap();
    let mut without_token = current.clone();
    without_token["status"]
        .as_object_mut()
        .unwrap()
        .remove("fencingToken");
    let mut without_status = current.clone();
    without_status.as_object_mut().unwrap().remove("status");
    let mut null_status = current.clone();
    null_status["status"] = serde_json::Value::Null;
    let mut lower = current.clone();
    lower["status"]["fencingToken"] = json!(1);
    let raw: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::erase::<FencedLease>(&()),
    );
    for attempt in [without_token, without_status, null_status, lower] {
        let object: DynamicObject = serde_json::from_value(attempt.clone()).unwrap();
        let (code, msg) = api_error_message(
            raw.replace_status("l", &PostParams::default(), &object)
                .await,
        );
        assert_eq!(code, 422, "{attempt}: {msg}");
    }
    let (code, msg) = api_error_message(
        leases
            .patch_status("l", &pat, &Patch::Merge(&json!({"status": null})))
            .await,
    );
    assert_eq!(code, 422, "{msg}");

    assert_eq!(
        leases
            .get_status("l")
            .await
            .unwrap()
            .status
            .unwrap()
            .fencing_token,
        6
    );
}

#[tokio::test]
async fn service_account_client_is_subject_to_rbac() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let ns = TestNamespace::new("crd-rbac").await;
    ns.api::<FencedLease>()
        .create(&PostParams::default(), &lease("l", json!({})))
        .await
        .unwrap();

    let sa_client = ns.client_as_service_account("reader").await;
    let as_sa: kube::Api<FencedLease> = kube::Api::namespaced(sa_client, &ns.name);
    let (code, msg) = api_error_message(as_sa.get("l").await);
    assert_eq!(code, 403, "a fresh ServiceAccount has no access: {msg}");
    assert!(
        msg.contains(&format!("system:serviceaccount:{}:reader", ns.name)),
        "{msg}"
    );

    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "flease-reader"},
        "rules": [{"apiGroups": ["fencing.dev"], "resources": ["fencedleases"], "verbs": ["get", "list"]}],
    }))
    .unwrap();
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "flease-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "flease-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns.name}],
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // RBAC changes reach the authorizer through its informer: wait with a deadline.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match as_sa.get("l").await {
            Ok(got) => {
                assert_eq!(got.metadata.name.as_deref(), Some("l"));
                break;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the bound role never took effect: {e}"),
        }
    }
    // Reading is all it may do.
    let (code, _) = api_error_message(
        as_sa
            .patch_status(
                "l",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"fencingToken": 9}})),
            )
            .await,
    );
    assert_eq!(code, 403);
}
