//! The apiserver's own write rate and latency on this machine, the ceiling of everything else:
//! status patches of FencedLeases no operator watches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fenced_lease::api::FencedLease;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::Args;
use crate::Res;
use crate::cluster::create_all;
use crate::figures::{Results, ms};
use crate::objects::lease;

pub(super) async fn raw_writes(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..64).map(|i| format!("raw-{i}")).collect();
    create_all(&leases, names.iter().map(|n| lease(n, 60)).collect(), 16).await?;
    for &c in &args.raw_concurrency {
        let deadline = Instant::now() + Duration::from_secs(args.raw_seconds);
        let counter = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let workers = (0..c).map(|w| {
            let (leases, name, counter) = (
                leases.clone(),
                names[w % names.len()].clone(),
                counter.clone(),
            );
            async move {
                let mut latencies = vec![];
                while Instant::now() < deadline {
                    let k = counter.fetch_add(1, Ordering::Relaxed);
                    let patch = json!({"status": {"waiting": (k % 1000) as i32}});
                    let at = Instant::now();
                    leases
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    latencies.push(ms(at.elapsed()));
                }
                Res::Ok(latencies)
            }
        });
        let all: Vec<f64> = futures::future::try_join_all(workers)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let rate = all.len() as f64 / started.elapsed().as_secs_f64();
        results.value(
            "apiserver",
            "kube-apiserver + etcd (this machine)",
            &format!("status writes/s, {c} in flight"),
            rate,
            "/s",
            "merge patches of FencedLease status, no operator",
        );
        results.samples(
            "apiserver",
            "kube-apiserver + etcd (this machine)",
            &format!("status write latency, {c} in flight"),
            &all,
            "ms",
            "",
        );
    }
    Ok(())
}
