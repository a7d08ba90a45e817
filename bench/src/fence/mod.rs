//! `bench-fence`'s measurements, one module each: the lease rule's window ([`lease_window`]),
//! the identity rule's ([`identity_window`]), with the kinds slot the latter needs
//! ([`slots`]); and guarded PostgreSQL and Redis writes beside unguarded ones ([`costs`]).

mod costs;
mod identity_window;
mod lease_window;
mod slots;

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use fenced_lease::fence::kube::LEASE_POLICY;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams};

use crate::cluster::create_namespace;
use crate::figures::{Results, ms_each};
use crate::{Res, fail};

/// Benchmark the fences against the control plane KUBECONFIG points at, and the PostgreSQL and
/// Redis of FL_POSTGRES_URL and FL_REDIS_URL.
#[derive(Parser)]
pub struct Args {
    /// Samples of the lease rule's window.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// Samples of the identity rule's window (hand-overs between two pods).
    #[arg(long, default_value_t = 600)]
    identity_samples: usize,
    /// Writes of each kind to PostgreSQL and Redis.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// Directory for every sample of the two windows.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
}

/// Every sample of the two windows, one TSV row each.
type Log = std::io::BufWriter<std::fs::File>;

/// Prints `samples` of `system`'s figure `what` (median, p99, worst) and adds its row.
fn report(results: &Results, system: &str, what: &str, samples: &[Duration], note: &str) {
    results.samples("fence", system, what, &ms_each(samples), "ms", note);
}

/// The two windows, then the datastores' costs.
pub async fn run(args: Args) -> Res<()> {
    let results = Results::new(args.results.clone());
    let client = Client::try_default().await?;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    if policies.get_opt(LEASE_POLICY).await?.is_none() {
        return fail("the fence policies are not installed: kubectl apply -f deploy/admission/");
    }
    std::fs::create_dir_all(&args.log_dir)?;
    let path = args.log_dir.join(format!(
        "fence-windows-{}.tsv",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ")
    ));
    let mut log = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(
        log,
        "rule\tsample\twindow_ms\tprobes\tgrant_write_ms\tprobe_before_ms"
    )?;
    lease_window::lease_window(&client, args.samples, &mut log, &results).await?;
    identity_window::identity_window(&client, args.identity_samples, &mut log, &results).await?;
    log.flush()?;
    println!("  (every sample: {})", path.display());
    costs::postgres_cost(args.writes, &results).await?;
    costs::redis_cost(args.writes, &results).await?;
    Ok(())
}

/// A namespace of its own for `run`, deleted afterwards with the lease bindings of its leases
/// (cluster-scoped, labelled with the lease's namespace).
async fn in_namespace<F, Fut>(client: &Client, run: F) -> Res<()>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Res<()>>,
{
    let ns = format!("bench-fence-{:08x}", rand::random::<u32>());
    create_namespace(client, &ns).await?;
    let result = run(ns.clone()).await;
    let _ = slots::unlist(client, &ns).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    result
}
