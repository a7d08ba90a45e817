//! The packaged chart, as a platform engineer installs it: `helm install --wait`, `helm test`,
//! `helm uninstall`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::node::{env, helm, kubectl, ready, wait_for};
use crate::{LEADER_LEASE_SECONDS, NAMESPACE, RELEASE};

/// The operator's pods: the chart's selector.
const SELECTOR: &str = "app.kubernetes.io/instance=fl,app.kubernetes.io/component=operator";
/// The operator's leader-election Lease (the chart's `--leader-election-name`).
pub const LEADER_LEASE: &str = "fl-fenced-lease-operator";

/// Installs the packaged chart with its defaults (two replicas of the image, its
/// securityContext, probes, PDB, policies) but a shorter leader lease; both replicas become
/// Ready on the node and one leads.
pub async fn install(client: &Client) {
    let chart = env("FL_NODE_CHART");
    let listing = common::run(std::process::Command::new("tar").args(["-tzf", &chart]));
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.contains("fenced-lease/templates/tests/grant.yaml\n")
            && !listing.contains("fenced-lease/tests/"),
        "the package holds helm test's template and not the helm-unittest suites:\n{listing}"
    );
    let lease = format!("leaderElection.leaseDurationSeconds={LEADER_LEASE_SECONDS}");
    helm(&[
        "install",
        RELEASE,
        &chart,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "180s",
        "--set",
        &lease,
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let running = operator_pods(&pods, "two Ready operator pods", |p| {
        p.iter().filter(|p| ready(p)).count() == 2
    })
    .await;
    for pod in &running {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.node_name.as_deref(),
            Some("fl-node"),
            "{}",
            pod.name_any()
        );
        let image = &spec.containers[0].image;
        assert!(
            image
                .as_deref()
                .is_some_and(|i| i.starts_with("ghcr.io/fenced-lease/fenced-lease-operator:")),
            "the chart's default image, {image:?}"
        );
    }
    let leader = leader(client).await;
    assert!(
        running.iter().any(|p| p.name_any() == leader),
        "the leader {leader} is one of the two pods"
    );
}

/// The holder identity of the operator's leader-election Lease now, if it has one.
pub async fn holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    leases
        .get_opt(LEADER_LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// The holder identity of the operator's leader-election Lease, once it has one.
pub async fn leader(client: &Client) -> String {
    wait_for("a leading operator pod", Duration::from_secs(60), || {
        holder(client)
    })
    .await
}

/// The operator's pods, once `wanted` holds of them (within 60 s).
pub async fn operator_pods(pods: &Api<Pod>, what: &str, wanted: fn(&[Pod]) -> bool) -> Vec<Pod> {
    wait_for(what, Duration::from_secs(60), || async {
        let list = pods
            .list(&ListParams::default().labels(SELECTOR))
            .await
            .ok()?;
        wanted(&list.items).then_some(list.items)
    })
    .await
}

/// `helm test`: the chart's own test pod takes and releases a lease with kubectl-fence.
pub fn helm_test() {
    let out = helm(&["test", RELEASE, "-n", NAMESPACE, "--timeout", "120s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Phase:          Succeeded"), "{stdout}");
}

/// `helm uninstall` removes every object the release made and keeps the CRDs (README:
/// "`helm uninstall` leaves them, every lease and claim and the token records").
pub async fn uninstall_leaves_what_the_readme_says(client: &Client) {
    helm(&[
        "uninstall",
        RELEASE,
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "120s",
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    operator_pods(&pods, "the operator's pods gone", <[Pod]>::is_empty).await;
    let label = format!("app.kubernetes.io/instance={RELEASE}");
    let namespaced = kubectl(&[
        "get",
        "-n",
        NAMESPACE,
        "-l",
        &label,
        "-o",
        "name",
        "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,networkpolicies,poddisruptionbudgets,configmaps,secrets",
    ]);
    assert_eq!(
        namespaced.trim(),
        "",
        "left in {NAMESPACE} after helm uninstall"
    );
    let cluster = kubectl(&[
        "get",
        "-l",
        &label,
        "-o",
        "name",
        "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingadmissionpolicies,mutatingadmissionpolicybindings",
    ]);
    assert_eq!(
        cluster.trim(),
        "",
        "cluster objects left after helm uninstall"
    );
    let crds = kubectl(&[
        "get",
        "crd",
        "fencedleases.fencing.dev",
        "fencedleaseclaims.fencing.dev",
        "-o",
        "name",
    ]);
    assert_eq!(crds.lines().count(), 2, "the CRDs stay: {crds}");
}
