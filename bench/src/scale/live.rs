//! `--live`: leases and claims created one by one while the operator runs, as a growing user
//! does; only the grants and the operator's memory are measured.

use std::path::Path;
use std::time::{Duration, Instant};

use fenced_lease::api::{FencedLease, FencedLeaseClaim};
use kube::api::{Api, PostParams};

use super::Profile;
use crate::grants::{Grants, failure_report};
use crate::objects::{claim, lease};
use crate::operator::Operator;
use crate::procfs::rss_mib;
use crate::{Res, fail};

/// Creates the leases `names` and a claim for each, one after the other, with the operator
/// serving the namespace; waits until all are granted.
pub(super) async fn live(p: &Profile<'_>, names: &[String]) -> Res<()> {
    let (n, ns) = (p.n, p.ns);
    let leases: Api<FencedLease> = Api::namespaced(p.client.clone(), ns);
    let claims: Api<FencedLeaseClaim> = Api::namespaced(p.client.clone(), ns);
    let grants = Grants::watch(p.client, None);
    grants.synced().await;
    let log = p
        .args
        .log_dir
        .join(format!("live-{n}-run{}-{ns}.log", p.run));
    let mut operator = Operator::start(&p.args.operator, Some(ns), ns, &log, &p.args.rust_log)?;
    println!(
        "operator pid {} (namespace {ns} only), log {}",
        operator.pid,
        log.display()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_mib(operator.pid);
    let started = Instant::now();
    let pp = PostParams::default();
    let mut next_print = Instant::now();
    for (i, l) in names.iter().enumerate() {
        leases.create(&pp, &lease(l, 3600)).await?;
        claims.create(&pp, &claim(&format!("c-{l}"), l)).await?;
        if Instant::now() >= next_print {
            next_print = Instant::now() + Duration::from_secs(5);
            println!(
                "t+{:>5.1}s created {i:>6}/{n} granted {:>6}  {}",
                started.elapsed().as_secs_f64(),
                grants.granted_in(ns).0,
                operator.proc_line()
            );
        }
    }
    let created = started.elapsed();
    all_granted(p, &grants, &mut operator, &log).await?;
    let all = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_mib(operator.pid);
    println!(
        "created {n} leases + claims one by one in {:.1} s; all granted {:.1} s after the first create; RSS {rss:.1} MiB (idle {idle:.1})",
        created.as_secs_f64(),
        all.as_secs_f64()
    );
    p.value(
        "RSS, leases and claims created one by one",
        rss,
        "MiB",
        &format!(
            "idle {idle:.1} MiB; all granted {:.1} s after the first create",
            all.as_secs_f64()
        ),
    );
    println!("{}", operator.log_summary());
    operator.stop();
    Ok(())
}

/// Waits until the watch sees every claim granted; fails, with the operator's state, when
/// none is for `--stall` seconds or the operator exits.
async fn all_granted(
    p: &Profile<'_>,
    grants: &Grants,
    operator: &mut Operator,
    log: &Path,
) -> Res<()> {
    let (n, ns) = (p.n, p.ns);
    let mut last_count = 0;
    let mut last_change = Instant::now();
    loop {
        let (count, _, _) = grants.granted_in(ns);
        if count >= n {
            return Ok(());
        }
        if count != last_count {
            (last_count, last_change) = (count, Instant::now());
        }
        if last_change.elapsed() > Duration::from_secs(p.args.stall) || !operator.alive() {
            let report = failure_report(p.client, operator, &[ns], grants).await;
            operator.stop();
            println!("{report}");
            return fail(format!(
                "stalled: {count} of {n} granted, none for {} s (log: {})",
                p.args.stall,
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
