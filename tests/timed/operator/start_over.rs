//! An operator started over many leases with a waiting claim each (as after any outage of
//! the operator) grants them all, keeps its connections to the apiserver bounded while it
//! works through them, and meanwhile still grants a new claim of another lease at once.
//! Without a bound on reconcile concurrency every lease is reconciled at once and each opens
//! its own connection: thousands of sockets, the apiserver's accept queue overflows, grants
//! stall (issue 11).

use crate::common;

use std::time::{Duration, Instant};

use common::TestNamespace;
use common::bulk::{claim, create_all, new_lease_granted};
use common::operator::OperatorProcess;
use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const LEASES: usize = 2_000;
/// Generous on 2 shared cores: the operator grants about 150–300 a second there.
const ALL_GRANTED: Duration = Duration::from_secs(60);
/// Sockets the operator may hold open: one connection per request in flight (HTTP/1.1) for 32
/// lease and 8 claim reconciles, 4 Events and 4 watches, and the metrics listener; 45–63 were
/// seen. Without the bound on reconciles it opens about one per lease: 1,000 and more.
const MAX_SOCKETS: usize = 80;
const PROBE_GRANTED: Duration = Duration::from_secs(5);

fn lease(name: &str) -> FencedLease {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name}, "spec": {"leaseDurationSeconds": 300},
    }))
    .expect("lease object")
}

/// Sockets among the open file descriptors of process `pid`.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

async fn granted(api: &Api<FencedLeaseClaim>) -> usize {
    api.list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Granted))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn an_operator_started_over_thousands_of_waiting_claims_grants_them_all() {
    let ns = TestNamespace::new("start-over").await;
    let (leases, claims) = (ns.api::<FencedLease>(), ns.api::<FencedLeaseClaim>());
    let names: Vec<String> = (0..LEASES).map(|i| format!("l-{i}")).collect();
    create_all(&leases, names.iter().map(|n| lease(n)).collect()).await;
    create_all(
        &claims,
        names.iter().map(|n| claim(&format!("c-{n}"), n)).collect(),
    )
    .await;

    let op = OperatorProcess::start(&ns.name, &[]);
    let started = Instant::now();
    let pid = op.pid();

    // A lease of its own, asked for while the operator works through the others: the
    // operator watches one namespace here (an all-namespace operator would act on other
    // tests' leases), so the probe is another lease in the same namespace.
    let probe = {
        let (leases, claims) = (leases.clone(), claims.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            new_lease_granted(&leases, &claims, &lease("probe"), PROBE_GRANTED).await
        })
    };

    let mut peak_sockets = 0;
    let mut next_count = Instant::now();
    let mut count = 0;
    while count < LEASES {
        peak_sockets = peak_sockets.max(sockets(pid));
        assert!(
            peak_sockets <= MAX_SOCKETS,
            "the operator holds {peak_sockets} sockets (more than {MAX_SOCKETS}) with {count} of {LEASES} granted"
        );
        if Instant::now() >= next_count {
            count = granted(&claims).await;
            next_count = Instant::now() + Duration::from_secs(1);
            assert!(
                started.elapsed() < ALL_GRANTED,
                "{count} of {LEASES} granted after {ALL_GRANTED:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    let probe = probe.await.expect("probe task");
    drop(op);
    // Without an operator no finalizer is removed: strip them and delete the leases here, 32
    // at a time, rather than leave 2,000 to the namespace's cleanup (one kubectl each).
    futures::stream::iter(names.iter().chain(std::iter::once(&"probe".to_string())))
        .map(|name| {
            let leases = leases.clone();
            async move {
                let strip = json!({"metadata": {"finalizers": null}});
                let _ = leases
                    .patch(name, &PatchParams::default(), &Patch::Merge(&strip))
                    .await;
                let _ = leases.delete(name, &Default::default()).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    eprintln!(
        "{LEASES} granted {:.1} s after the start ({:.0} grants/s, counting the operator's start); at most {peak_sockets} sockets; probe granted after {probe:?}",
        took.as_secs_f64(),
        LEASES as f64 / took.as_secs_f64()
    );
    assert!(
        probe.is_some(),
        "a claim of a free lease was not granted within {PROBE_GRANTED:?} while the operator worked through {LEASES} others"
    );
}
