//! Many leases at once, and a new one asked for meanwhile: for the tests of the operator at
//! scale (an operator started over thousands of claims, thousands of leases deleted).

use std::time::{Duration, Instant};

use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use serde_json::json;

/// Claim `name` of lease `lease`, holder identity `name`.
pub fn claim(name: &str, lease: &str) -> FencedLeaseClaim {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": name}, "spec": {"leaseName": lease, "holderIdentity": name},
    }))
    .expect("claim object")
}

/// Creates `objects` with 32 requests in flight.
pub async fn create_all<K>(api: &Api<K>, objects: Vec<K>)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await.map(drop) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("create");
}

/// Creates `lease` and a claim of it named like it; how long after the claim's creation it
/// was granted, or `None` when not within `within`.
pub async fn new_lease_granted(
    leases: &Api<FencedLease>,
    claims: &Api<FencedLeaseClaim>,
    lease: &FencedLease,
    within: Duration,
) -> Option<Duration> {
    let name = lease.metadata.name.clone().expect("a named lease");
    leases
        .create(&PostParams::default(), lease)
        .await
        .expect("new lease");
    claims
        .create(&PostParams::default(), &claim(&name, &name))
        .await
        .expect("new lease's claim");
    let asked = Instant::now();
    loop {
        let phase = claims.get(&name).await.ok().and_then(|c| c.status?.phase);
        if phase == Some(ClaimPhase::Granted) {
            return Some(asked.elapsed());
        }
        if asked.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
