//! Hand-overs per second on one lease: a queue of waiters, each releasing as soon as it holds;
//! and one waiter at a time.

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};

use super::Args;
use crate::Res;
use crate::cluster::create_all;
use crate::figures::{Results, ms};
use crate::grants::Grants;
use crate::objects::{claim, lease};

/// Hand-overs per second on one lease: holders release the moment they are granted.
pub(super) async fn handovers(
    client: &Client,
    args: &Args,
    results: &Results,
    ns: &str,
    grants: &Grants,
) -> Res<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    let n = args.handovers;

    // (a) A queue of n waiters, each releasing as soon as it holds; then (with --deep-queue)
    // the first n hand-overs of a queue that long.
    queue_handovers(&claims, &leases, results, ns, grants, "queue", n, n).await?;
    if args.deep_queue > 0 {
        let deep = args.deep_queue.max(n);
        queue_handovers(&claims, &leases, results, ns, grants, "deep", deep, n).await?;
    }

    // (b) One waiter at a time: the next claim is created, then the holder releases.
    leases.create(&pp, &lease("pair", 3600)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    claims.create(&pp, &claim("p-00000", "pair")).await?;
    let first = grants.wait(ns, "p-00000", Duration::from_secs(60)).await?;
    let mut last = first;
    let mut gaps = vec![];
    for i in 1..=n {
        let (holder, waiter) = (format!("p-{:05}", i - 1), format!("p-{i:05}"));
        claims.create(&pp, &claim(&waiter, "pair")).await?;
        claims.delete(&holder, &DeleteParams::default()).await?;
        let at = grants.wait(ns, &waiter, Duration::from_secs(60)).await?;
        gaps.push(ms(at - last));
        last = at;
    }
    let rate = n as f64 / (last - first).as_secs_f64();
    results.value(
        "rates",
        "fenced-lease",
        "hand-overs/s, one lease, 1 waiter",
        rate,
        "/s",
        "create the next claim, delete the holder's, wait for the grant",
    );
    results.samples(
        "rates",
        "fenced-lease",
        "hand-over gap, one lease, 1 waiter",
        &gaps,
        "ms",
        "grant seen -> next grant seen",
    );
    Ok(())
}

/// `measured` hand-overs at the head of a queue of `queued` claims on lease `lease`: each
/// holder deletes its claim once the bench sees its grant.
#[allow(clippy::too_many_arguments)]
async fn queue_handovers(
    claims: &Api<FencedLeaseClaim>,
    leases: &Api<FencedLease>,
    results: &Results,
    ns: &str,
    grants: &Grants,
    lease_name: &str,
    queued: usize,
    measured: usize,
) -> Res<()> {
    let pp = PostParams::default();
    leases.create(&pp, &lease(lease_name, 3600)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let names: Vec<String> = (0..=queued)
        .map(|i| format!("{lease_name}-{i:05}"))
        .collect();
    // The claims measured one at a time, so they queue in this order; those behind them many
    // at a time.
    for name in &names[..=measured] {
        claims.create(&pp, &claim(name, lease_name)).await?;
    }
    let behind: Vec<FencedLeaseClaim> = names[measured + 1..]
        .iter()
        .map(|n| claim(n, lease_name))
        .collect();
    if !behind.is_empty() {
        create_all(claims, behind, 32).await?;
        println!("{queued} claims queued on lease {lease_name}");
    }
    // Hand-overs are measured on a settled queue: every claim has had its first answer (its
    // place in the queue), so the operator is not still answering new claims meanwhile.
    let prefix = format!("{lease_name}-");
    let settled = grants
        .wait_answered(ns, &prefix, queued + 1, Duration::from_secs(1200))
        .await?;
    println!(
        "{} claims on lease {lease_name} answered {:.1} s after the last create",
        queued + 1,
        settled.as_secs_f64()
    );
    // The clock starts when the first holder lets go (it was granted before the wait).
    grants.wait(ns, &names[0], Duration::from_secs(60)).await?;
    let mut times = vec![Instant::now()];
    claims.delete(&names[0], &DeleteParams::default()).await?;
    for name in &names[1..=measured] {
        let at = grants.wait(ns, name, Duration::from_secs(60)).await?;
        times.push(at);
        claims.delete(name, &DeleteParams::default()).await?;
    }
    let rate = measured as f64 / (times[measured] - times[0]).as_secs_f64();
    let gaps: Vec<f64> = times.windows(2).map(|w| ms(w[1] - w[0])).collect();
    let what = if measured == queued {
        format!("{queued} queued")
    } else {
        format!("{queued} queued, first {measured}")
    };
    results.value(
        "rates",
        "fenced-lease",
        &format!("hand-overs/s, one lease, {what}"),
        rate,
        "/s",
        "each holder deletes its claim once it sees the grant",
    );
    results.samples(
        "rates",
        "fenced-lease",
        &format!("hand-over gap, one lease, {what}"),
        &gaps,
        "ms",
        "grant seen (the first: holder deletes) -> next grant seen",
    );
    Ok(())
}
