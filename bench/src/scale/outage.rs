//! Step 1: N leases, each with one waiting claim (and with `--pods` a pod each), created while
//! no operator runs, as in an outage.

use std::time::Duration;

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::Profile;
use crate::Res;
use crate::cluster::create_all;
use crate::objects::{claim, lease, pod};

/// Creates the leases `names`, a claim `c-<name>` for each (and a pod `p-<name>`).
pub(super) async fn create(p: &Profile<'_>, names: &[String]) -> Res<()> {
    let (args, n) = (p.args, p.n);
    let leases: Api<FencedLease> = Api::namespaced(p.client.clone(), p.ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(p.client.clone(), p.ns);
    let took_pods = if args.pods {
        let pods: Api<Pod> = Api::namespaced(p.client.clone(), p.ns);
        create_all(
            &pods,
            names.iter().map(|l| pod(&format!("p-{l}"))).collect(),
            args.concurrency,
        )
        .await?
    } else {
        Duration::ZERO
    };
    let took = create_all(
        &leases,
        names
            .iter()
            .map(|l| {
                let mut lease = lease(l, 3600);
                lease.spec.annotate_holder_pod = args.pods;
                lease
            })
            .collect(),
        args.concurrency,
    )
    .await?;
    let took_claims = create_all(
        &claims,
        names
            .iter()
            .map(|l| {
                let mut claim = claim(&format!("c-{l}"), l);
                claim.spec.pod_name = args.pods.then(|| format!("p-{l}"));
                claim
            })
            .collect(),
        args.concurrency,
    )
    .await?;
    let objects = if args.pods { 3 * n } else { 2 * n };
    let took_all = took + took_claims + took_pods;
    let create_rate = objects as f64 / took_all.as_secs_f64();
    println!(
        "created {n} leases, {n} claims{} in {:.1} s ({create_rate:.0} creates/s, {} in flight), no operator running",
        if args.pods {
            format!(" and {n} pods")
        } else {
            String::new()
        },
        took_all.as_secs_f64(),
        args.concurrency
    );
    Ok(())
}
