//! Step 4: every lease and claim deleted at once (as with their namespace), the operator
//! running: how fast are the leases finalized, and does a new claim in another namespace get
//! its grant meanwhile? Fails when no lease goes for 60 s.

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

use super::Profile;
use super::start::Started;
use crate::figures::ms;
use crate::grants::Grants;
use crate::objects::{claim, lease};
use crate::operator::Operator;
use crate::{Res, fail};

/// Deletes them all and adds the figure; on failure, the operator's state.
pub(super) async fn measure(p: &Profile<'_>, started: &Started) -> Res<()> {
    let (grants, operator) = (&started.grants, &started.operator);
    let concurrency = p.args.concurrency;
    let (per_s, took, probe) =
        match deletion(p.client, p.ns, p.probe_ns, grants, concurrency, operator).await {
            Ok(deleted) => deleted,
            Err(e) => {
                let namespaces = [p.ns, p.probe_ns];
                return started
                    .failed(p, &namespaces, format!("deletion: {e}"))
                    .await;
            }
        };
    let probe = probe
        .map(|d| format!("{:.0} ms", ms(d)))
        .unwrap_or_else(|e| format!("not granted: {e}"));
    println!(
        "deleted every lease and claim: all leases gone {:.1} s after the first delete ({per_s:.0} leases/s); a new claim in another namespace meanwhile granted in {probe}; {}",
        took.as_secs_f64(),
        operator.proc_line()
    );
    p.value(
        "leases finalized/s, all deleted at once",
        per_s,
        "/s",
        &format!(
            "{} leases and their claims deleted, {concurrency} at a time: all gone in {:.1} s; a new claim in another namespace meanwhile granted in {probe}",
            p.n,
            took.as_secs_f64()
        ),
    );
    Ok(())
}

/// Deletes every lease and claim of `ns`, `concurrency` at a time, and meanwhile asks for a
/// new lease in `probe_ns`: how fast does the operator finalize the leases, and does the new
/// claim still get its lease at once? Fails when the leases stop going for 60 s.
async fn deletion(
    client: &Client,
    ns: &str,
    probe_ns: &str,
    grants: &Grants,
    concurrency: usize,
    operator: &Operator,
) -> Res<(f64, Duration, Res<Duration>)> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let (lease_names, claim_names) = (names(&leases).await?, names(&claims).await?);
    let total = lease_names.len();
    let probe = {
        let (client, probe_ns, grants) = (client.clone(), probe_ns.to_string(), grants.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let pp = PostParams::default();
            Api::<FencedLease>::namespaced(client.clone(), &probe_ns)
                .create(&pp, &lease("during-deletion", 3600))
                .await?;
            let at = Instant::now();
            Api::<FencedLeaseClaim>::namespaced(client, &probe_ns)
                .create(&pp, &claim("during-deletion", "during-deletion"))
                .await?;
            let granted = grants
                .wait(&probe_ns, "during-deletion", Duration::from_secs(30))
                .await?;
            Res::Ok(granted - at)
        })
    };
    let started = Instant::now();
    let dp = DeleteParams::default();
    let deletes = claim_names
        .iter()
        .map(|c| (true, c))
        .chain(lease_names.iter().map(|l| (false, l)));
    futures::stream::iter(deletes)
        .for_each_concurrent(concurrency, |(is_claim, name)| {
            let (leases, claims, dp) = (&leases, &claims, &dp);
            async move {
                let _ = if is_claim {
                    claims.delete(name, dp).await.map(drop)
                } else {
                    leases.delete(name, dp).await.map(drop)
                };
            }
        })
        .await;
    let mut left = total;
    let mut last_change = Instant::now();
    while left > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = leases
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        if now != left {
            left = now;
            last_change = Instant::now();
        } else if last_change.elapsed() > Duration::from_secs(60) {
            return fail(format!(
                "{left} of {total} deleted leases still there, none gone for 60 s; {}",
                operator.proc_line()
            ));
        }
    }
    let took = started.elapsed();
    let probe = match probe.await {
        Ok(result) => result,
        Err(e) => fail(format!("probe task: {e}")),
    };
    Ok((total as f64 / took.as_secs_f64(), took, probe))
}

/// The names of every object `api` lists.
async fn names<K>(api: &Api<K>) -> Res<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.iter().map(|o| o.name_any()).collect())
}
