//! Grants at a steady rate of claims, each on a free lease of its own: the grant latency, and
//! the operator's apiserver writes per grant.

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use super::Args;
use crate::Res;
use crate::apiserver::{apiserver_writes, diff, top_writes, total};
use crate::cluster::create_all;
use crate::figures::{Results, ms};
use crate::grants::Grants;
use crate::objects::{claim, lease};

pub(super) async fn steady_rates(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
    grants: &Grants,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    for (r, &rate) in args.rates.iter().enumerate() {
        let count = (rate * args.rate_seconds as f64).round() as usize;
        let names: Vec<String> = (0..count).map(|i| format!("s{r}-{i}")).collect();
        create_all(&leases, names.iter().map(|n| lease(n, 3600)).collect(), 16).await?;
        // Wait for the finalizers, so the grants are all that is left to do.
        let deadline = Instant::now() + Duration::from_secs(60);
        while with_finalizer(client, ns).await < names.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = apiserver_writes(client).await?;
        let started = Instant::now();
        let created: Vec<(String, Instant)> = futures::stream::iter(names.iter().enumerate())
            .map(|(i, n)| {
                let claims = claims.clone();
                let at = started + Duration::from_secs_f64(i as f64 / rate);
                async move {
                    tokio::time::sleep_until(at.into()).await;
                    let name = format!("c-{n}");
                    claims
                        .create(&PostParams::default(), &claim(&name, n))
                        .await?;
                    Res::Ok((name, Instant::now()))
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Res<_>>()?;
        let mut latencies = vec![];
        let mut last = started;
        for (name, at) in &created {
            let granted = grants.wait(ns, name, Duration::from_secs(60)).await?;
            latencies.push(ms(granted.saturating_duration_since(*at)));
            last = last.max(granted);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut writes = diff(&before, &apiserver_writes(client).await?);
        // The claims are the bench's writes, not the operator's.
        writes.remove("POST fencedleaseclaims");
        let per_grant = total(&writes) / count as f64;
        let achieved = count as f64 / (last - started).as_secs_f64();
        results.samples(
            "rates",
            "fenced-lease",
            &format!("grant latency at {rate:.0} claims/s"),
            &latencies,
            "ms",
            &format!("claim created -> Granted seen; {achieved:.0} grants/s achieved"),
        );
        results.value(
            "rates",
            "fenced-lease",
            &format!("operator writes per grant at {rate:.0} claims/s"),
            per_grant,
            "",
            &top_writes(&writes, count as f64, 5),
        );
    }
    Ok(())
}

/// Waits for namespace `ns`'s leases to carry the operator's finalizer (it adds it before
/// the first grant); returns how many do.
async fn with_finalizer(client: &Client, ns: &str) -> usize {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    leases
        .list_metadata(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|m| !m.finalizers().is_empty())
                .count()
        })
        .unwrap_or(0)
}
