//! The chart's two replicas under the faults a node brings: the leading pod deleted (a drain,
//! a rollout), the leading pod frozen past its lease (a stopped VM, a GC pause). Each prints
//! what it saw; the bounds asserted are the chart's stated ones.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::chart::{holder, leader, operator_pods};
use crate::node::{freeze, ready, restarts, wait_for};
use crate::{LEADER_LEASE_SECONDS, NAMESPACE};

/// A standby leads within the leader lease of the deleted pod's last renewal (the chart's
/// values: "A standby takes over this long after the leader's last renewal"); the Deployment
/// brings the second replica back.
pub async fn deleting_the_leading_pod_hands_over(client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let old = leader(client).await;
    let started = Instant::now();
    pods.delete(&old, &DeleteParams::default())
        .await
        .expect("delete the leading pod");
    let new = another_leads(client, &old).await;
    println!(
        "deleted leading pod {old}: {new} led after {:?}",
        started.elapsed()
    );
    two_ready(&pods).await;
}

/// The leader's whole pod frozen past its lease: the standby leads and grants; thawed, the
/// frozen process finds its leadership lost and exits (as on every lost leadership), and the
/// kubelet restarts it as a standby while the new leader keeps leading.
pub async fn a_frozen_leader_is_replaced_then_restarted(client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let old = leader(client).await;
    let frozen = pods.get(&old).await.expect("the leading pod");
    let (uid, restarted_before) = (frozen.uid().expect("uid"), restarts(&frozen));
    freeze(&uid, true);
    let started = Instant::now();
    let new = another_leads(client, &old).await;
    println!(
        "froze leading pod {old}: {new} led after {:?}",
        started.elapsed()
    );
    grants_a_lease(client).await;
    freeze(&uid, false);
    let thawed = Instant::now();
    let back = wait_for(
        "the thawed pod restarted and Ready",
        Duration::from_secs(60),
        || async {
            let pod = pods.get(&old).await.ok()?;
            (restarts(&pod) > restarted_before && ready(&pod)).then_some(pod)
        },
    )
    .await;
    println!(
        "thawed {old}: restarted {} time(s), Ready again after {:?}",
        restarts(&back) - restarted_before,
        thawed.elapsed()
    );
    assert_eq!(leader(client).await, new, "the new leader kept leading");
}

/// The pod that leads after `old`, within the leader lease plus the time a standby takes to
/// notice (it retries at a fraction of the lease) and 2 s for a busy 2-core machine.
async fn another_leads(client: &Client, old: &str) -> String {
    let takeover = Duration::from_secs(LEADER_LEASE_SECONDS * 2 + 2);
    wait_for("another pod leading", takeover, || async {
        holder(client).await.filter(|now| now != old)
    })
    .await
}

async fn two_ready(pods: &Api<Pod>) {
    operator_pods(pods, "two Ready operator pods", |p| {
        p.iter().filter(|p| ready(p)).count() == 2
    })
    .await;
}

/// The new leader grants a lease: a FencedLease and a claim, granted.
async fn grants_a_lease(client: &Client) {
    let namespace = "leader-check";
    let _ = crate::node::kubectl(&["create", "namespace", namespace]);
    let leases: Api<fenced_lease::api::FencedLease> = Api::namespaced(client.clone(), namespace);
    let claims: Api<fenced_lease::api::FencedLeaseClaim> =
        Api::namespaced(client.clone(), namespace);
    let lease = serde_json::from_value(json!({
        "metadata": {"name": "after-freeze"}, "spec": {"leaseDurationSeconds": 15},
    }))
    .expect("lease");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create lease");
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "after-freeze"},
        "spec": {"leaseName": "after-freeze", "holderIdentity": "check"},
    }))
    .expect("claim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    wait_for(
        "the claim granted by the new leader",
        Duration::from_secs(30),
        || async {
            let claim = claims.get("after-freeze").await.ok()?;
            (claim.status?.phase == Some(fenced_lease::api::ClaimPhase::Granted)).then_some(())
        },
    )
    .await;
    leases
        .delete("after-freeze", &DeleteParams::default())
        .await
        .expect("delete lease");
}
