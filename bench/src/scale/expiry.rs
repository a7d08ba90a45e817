//! Expiry while the heartbeats go on: leases whose holder never beats and whose waiter does.
//! How late after the holder's term does the waiter get the lease?

use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use super::start::Started;
use super::{Profile, SECTION, SYSTEM};
use crate::cluster::create_all;
use crate::figures::ms;
use crate::grants::Grants;
use crate::objects::{beat, claim, lease};
use crate::{Res, fail};

/// How far apart the expiry leases' holders start: 20 expiries a second, one at a time, as
/// independent holders' are, on leases created before. At 15 ms apart (67 a second, each
/// costing ~5 writes, besides ~150 waiter heartbeats a second) the apiserver of this 2-core
/// machine was past its write rate, and the lateness measured its backlog; at 25 ms with the
/// leases created meanwhile, the first expiries fell into this bench's own burst of creates.
const EXPIRY_STAGGER: Duration = Duration::from_millis(50);
/// The lease duration of the expiry leases.
const DURATION: Duration = Duration::from_secs(2);

/// `count` leases of 2 s whose holder never beats and whose waiter does: how long after the
/// holder's term does the waiter get the lease?
/// One outcome per lease: the lateness, or `None` when the holder was expired before it was
/// granted (skipped as a silent waiter: the operator was a whole term behind).
pub(super) async fn expiries(
    client: &kube::Client,
    ns: &str,
    grants: &Grants,
    count: usize,
) -> Res<Vec<Option<f64>>> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    // The leases first, all of them: each takes the operator a finalizer and a status write.
    let names: Vec<String> = (0..count).map(|i| format!("exp-{i}")).collect();
    create_all(&leases, names.iter().map(|l| lease(l, 2)).collect(), 8).await?;
    let settled = Instant::now() + Duration::from_secs(30);
    while Instant::now() < settled {
        let list = leases.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|l| names.contains(&l.name_any()) && l.status.is_some())
            .count();
        if ready == count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tasks = names.into_iter().enumerate().map(|(i, l)| {
        let (claims, grants) = (claims.clone(), grants.clone());
        async move {
            tokio::time::sleep(EXPIRY_STAGGER * i as u32).await;
            expire(&claims, ns, &grants, &l).await
        }
    });
    futures::future::join_all(tasks).await.into_iter().collect()
}

/// Lease `l`'s silent holder and its waiter: the waiter's lateness, or `None` when the holder
/// was expired before it was granted.
async fn expire(
    claims: &Api<FencedLeaseClaim>,
    ns: &str,
    grants: &Grants,
    l: &str,
) -> Res<Option<f64>> {
    let pp = PostParams::default();
    claims
        .create(&pp, &claim(&format!("{l}-a-holder"), l))
        .await?;
    // Queued right behind the holder (FIFO: creation time, then name), not once this
    // bench's watch shows the grant: that watch can lag past the holder's term.
    let waiter = format!("{l}-b-waiter");
    claims.create(&pp, &claim(&waiter, l)).await?;
    // It beats from its creation on, as a library candidate does while it waits: a
    // waiter silent for a whole term is skipped at the hand-over.
    let held = Instant::now();
    let mut last_beat = Instant::now();
    loop {
        if grants.granted_at(ns, &waiter).is_some() {
            // From the operator's own timestamps (its grant times of the two claims),
            // not from when this bench's watch saw them: right after thousands of
            // grants that watch lags by hundreds of ms.
            let granted = |name: String| async move {
                let claim = claims.get(&name).await?;
                Res::Ok(claim.status.and_then(|s| s.grant_time).map(|t| t.0))
            };
            let Some(first) = granted(format!("{l}-a-holder")).await? else {
                return Res::Ok(None);
            };
            let Some(next) = granted(waiter.clone()).await? else {
                return fail(format!("{waiter} has no grantTime"));
            };
            let gap = next.duration_since(first).as_secs_f64() * 1000.0;
            return Res::Ok(Some(gap - ms(DURATION)));
        }
        if held.elapsed() > Duration::from_secs(30) {
            return fail(format!("{waiter} not granted 30 s after it was queued"));
        }
        // Beats every third of the term, as the library does.
        if last_beat.elapsed() >= DURATION / 3 {
            let _ = beat(claims, &waiter).await;
            last_beat = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The expiry lateness's row; or, when the expiries failed, the failure.
pub(super) async fn report(
    p: &Profile<'_>,
    started: &Started,
    lateness: Res<Vec<Option<f64>>>,
) -> Res<()> {
    let outcomes = match lateness {
        Ok(outcomes) => outcomes,
        Err(e) => return started.failed(p, &[p.ns], format!("expiry: {e}")).await,
    };
    let samples: Vec<f64> = outcomes.iter().flatten().copied().collect();
    let skipped = outcomes.len() - samples.len();
    p.results.samples(
        SECTION,
        SYSTEM,
        &format!("N={}: expiry lateness", p.n),
        &samples,
        "ms",
        &format!("the waiter's grant after the silent holder's grant + 2 s, by the operator's clock (its term counts from first sight of the claim, a little before the grant), heartbeats running; holders queued 50 ms apart on leases created before; {skipped} of {} holders expired before they were granted (the operator a whole term behind), not counted", outcomes.len()),
    );
    Ok(())
}
