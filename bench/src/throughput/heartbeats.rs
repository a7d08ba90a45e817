//! The apiserver writes a heartbeat costs, on one held claim.

use std::collections::BTreeMap;
use std::time::Duration;

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::Client;
use kube::api::{Api, PostParams};

use super::Args;
use crate::Res;
use crate::apiserver::{apiserver_writes, diff, top_writes, total};
use crate::figures::Results;
use crate::grants::Grants;
use crate::objects::{beat, claim, lease};

/// Apiserver writes per heartbeat on one held claim.
pub(super) async fn heartbeat_writes(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
    grants: &Grants,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    leases.create(&pp, &lease("beats", 3600)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    claims.create(&pp, &claim("beater", "beats")).await?;
    grants.wait(ns, "beater", Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = apiserver_writes(client).await?;
    for _ in 0..args.beats {
        beat(&claims, "beater").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = diff(&before, &apiserver_writes(client).await?);
    let beats = args.beats as f64;
    for (what, count) in &writes {
        println!("  {count:>6.0} {what}");
    }
    // Only what a heartbeat can cause: the apiserver also counts, say, the namespace
    // controller emptying another benchmark's namespace, or leader-election renewals.
    let (caused, other): (BTreeMap<String, f64>, BTreeMap<String, f64>) =
        writes.into_iter().partition(|(what, _)| {
            let resource = what.split(' ').nth(1).unwrap_or("");
            let resource = resource.split('/').next().unwrap_or("");
            ["fencedleases", "fencedleaseclaims", "pods", "events"].contains(&resource)
        });
    results.value(
        "rates",
        "fenced-lease",
        "apiserver writes per heartbeat (1 holder)",
        total(&caused) / beats,
        "",
        &format!(
            "{}; not counted, other writes meanwhile: {:.2}/heartbeat",
            top_writes(&caused, beats, 5),
            total(&other) / beats
        ),
    );
    Ok(())
}
