//! `bench-admission`'s steps, one module each, run at every size by [`Bench::profile`]: N
//! leases put in place ([`in_place`]), the apiserver's memory ([`memory`]), write latencies
//! ([`writes`]), grant latency ([`grants`]), the I11 window ([`identity`]), and every lease
//! removed ([`removal`]). Beside them: the run's objects and namespaces ([`layout`]), the lease
//! watch ([`leases`]), calls with a deadline ([`calls`]), the control plane's processes
//! ([`control_plane`]), and where the figures go ([`out`]).

mod calls;
mod control_plane;
mod grants;
mod identity;
mod in_place;
mod layout;
mod leases;
mod memory;
mod out;
mod removal;
mod writes;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use fenced_lease::api::FencedLease;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::cluster::{client, create_namespace};
use crate::figures::Results;
use crate::operator::Operator;
use crate::writers::writer_pods;
use crate::{Res, fail};
use calls::{CALL_TIMEOUT, admission_objects, call, call_timeout};
use control_plane::ControlPlane;
use layout::Layout;
use leases::Leases;
use out::Out;

const SECTION: &str = "admission at scale";
/// The label every lease of a run carries (its value: the run's id), for the lease watch.
const RUN_LABEL: &str = "bench.fencing.dev/admission";
/// Namespaces of each kind of lease (100 in all).
const HALF: usize = 50;

/// The admission objects' cost at 0 / 1,000 / 10,000 fenced leases: unfenced and fenced write
/// latency, apiserver memory, grant latency and the I11 window.
#[derive(Parser)]
pub struct Args {
    /// The operator binary to measure.
    #[arg(long, default_value = "target/release/fenced-lease-operator")]
    operator: PathBuf,
    /// Numbers of fenced leases, measured in this order (0: the baseline).
    #[arg(long, value_delimiter = ',', default_value = "0,1000,10000")]
    sizes: Vec<usize>,
    /// Measure the first size again after the last, for drift (when there are several).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    again_at_end: bool,
    /// Samples of each write latency (rounds of every kind of write, interleaved).
    #[arg(long, default_value_t = 300)]
    samples: usize,
    /// Rounds of writes sent before the samples, not counted.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Fresh leases whose grant latency is measured at each size (half of each kind).
    #[arg(long, default_value_t = 50)]
    grant_samples: usize,
    /// Hand-overs between two pods for the I11 window at each size.
    #[arg(long, default_value_t = 50)]
    identity_samples: usize,
    /// Seconds of the deliberate pause before the settled memory readings.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    /// Creates and deletes in flight while putting the N leases in place and removing them.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Fail when not every lease is Held this long after the first create (seconds).
    #[arg(long, default_value_t = 1800)]
    grant_timeout: u64,
    /// Fail when no lease was granted (or, deleting, none went) for this long (seconds).
    #[arg(long, default_value_t = 120)]
    stall: u64,
    /// Seconds any one API call may take before it counts as failed.
    #[arg(long, default_value_t = 60)]
    call_timeout: u64,
    /// kube-apiserver's pid file (default: $FL_CP_DIR/kube-apiserver.pid, FL_CP_DIR defaulting
    /// as in hack/control-plane).
    #[arg(long)]
    apiserver_pid_file: Option<PathBuf>,
    /// The "system" column of the rows (say which design was measured).
    #[arg(long, default_value = "fenced-lease")]
    system: String,
    /// The operator's RUST_LOG.
    #[arg(long, default_value = "info")]
    rust_log: String,
    /// Directory for the operator's log and every sample.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
    /// Leave the namespaces in place afterwards (the leases are deleted regardless).
    #[arg(long)]
    keep: bool,
}

/// The run: what every step needs.
struct Bench {
    args: Args,
    /// Creates, lists and the watch.
    client: Client,
    /// The measured writes alone, over one keep-alive connection of their own.
    writer: Client,
    layout: Layout,
    leases: Leases,
    operator: Operator,
    control_plane: ControlPlane,
    out: Out,
    /// The admission objects before any lease (policies, bindings).
    baseline_objects: (usize, usize),
    /// The two writer pods of the I11 window: name and UID.
    pods: Vec<(String, String)>,
}

/// Every size in turn, the first again at the end; then the table of medians, and what is
/// left deleted. Whether every size was measured.
pub async fn run(args: Args) -> Res<bool> {
    let _ = CALL_TIMEOUT.set(Duration::from_secs(args.call_timeout));
    let writer = client().await?;
    let client = client().await?;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    if call("get policy", policies.get_opt("fenced-lease-object-token"))
        .await?
        .is_none()
    {
        return fail(
            "fenced-lease's admission policies are not installed: hack/crds install (kubectl apply -f crds/ -f deploy/admission/)",
        );
    }
    std::fs::create_dir_all(&args.log_dir)?;
    let run = format!("adm-{:06x}", rand::random::<u32>() & 0xffffff);
    let layout = Layout::new(&run);
    let samples_path = args.log_dir.join(format!("admission-{run}-samples.tsv"));
    let results = Results::new(args.results.clone());
    let out = Out::create(results, args.system.clone(), &samples_path)?;
    let control_plane = ControlPlane::new(&args);
    control_plane.rss()?;

    println!("run {run}: {} namespaces", layout.all().len());
    for ns in layout.all() {
        call(
            format!("create namespace {ns}"),
            create_namespace(&client, &ns),
        )
        .await?;
    }
    let started = Bench::start(args, client.clone(), writer, layout, control_plane, out);
    let mut bench = match started.await {
        Ok(b) => b,
        Err(e) => {
            removal::remove_namespaces(&client, &Layout::new(&run).all()).await;
            return Err(e);
        }
    };
    let ok = bench.sizes().await;
    bench.out.print_table();
    println!("every sample: {}", samples_path.display());
    bench.finish().await;
    Ok(ok)
}

impl Bench {
    /// The writer pods, the lease watch, and the operator serving every namespace.
    async fn start(
        args: Args,
        client: Client,
        writer: Client,
        layout: Layout,
        control_plane: ControlPlane,
        out: Out,
    ) -> Res<Self> {
        let pods = writer_pods(&client, &layout.i11, call_timeout()).await?;
        let leases = Leases::watch(&client, &layout.run);
        leases.synced(Duration::from_secs(60)).await?;
        let log = args
            .log_dir
            .join(format!("admission-{}-operator.log", layout.run));
        let operator =
            Operator::start(&args.operator, None, &layout.operator, &log, &args.rust_log)?;
        println!(
            "operator pid {} serving every namespace, log {}",
            operator.pid,
            log.display()
        );
        let baseline_objects = admission_objects(&client).await?;
        Ok(Bench {
            args,
            client,
            writer,
            layout,
            leases,
            operator,
            control_plane,
            out,
            baseline_objects,
            pods,
        })
    }

    /// Every size, in the order given, and the first again at the end (when there are
    /// several); stops at the first that fails. Whether none did.
    async fn sizes(&mut self) -> bool {
        let mut profiles: Vec<(usize, String)> = self
            .args
            .sizes
            .iter()
            .map(|&n| (n, format!("{n} fenced leases")))
            .collect();
        if self.args.again_at_end && self.args.sizes.len() > 1 {
            let n = self.args.sizes[0];
            profiles.push((n, format!("{n} fenced leases, again at the end")));
        }
        for (n, label) in profiles {
            println!("\n== {label} ==");
            if let Err(e) = self.profile(n, &label).await {
                println!("FAILED at {label}: {e}");
                println!("{}", self.operator_report().await);
                self.out.value(
                    &label,
                    "run FAILED",
                    0.0,
                    "",
                    e.to_string().lines().next().unwrap_or(""),
                );
                return false;
            }
        }
        true
    }

    /// One size: N leases put in place, memory, writes, grants and the I11 window, removal.
    async fn profile(&mut self, n: usize, label: &str) -> Res<()> {
        if n > 0 {
            self.put_in_place(n, label).await?;
        }
        let (policies, bindings) = admission_objects(&self.client).await?;
        self.out.value(
            label,
            "admission objects in the cluster",
            (policies + bindings) as f64,
            "",
            &format!(
                "{policies} ValidatingAdmissionPolicies + {bindings} bindings (before any lease: {} + {}){}",
                self.baseline_objects.0,
                self.baseline_objects.1,
                if n > 0 { ", every lease Held" } else { "" }
            ),
        );
        self.memory(n, label, "in place").await?;
        self.writes(n, label).await?;
        self.grants(label).await?;
        self.identity_window(label).await?;
        if n > 0 {
            self.remove(n, label).await?;
            self.memory(n, label, "deleted").await?;
        }
        println!("{}", self.operator.proc_line());
        Ok(())
    }

    /// The operator's state when something failed.
    async fn operator_report(&mut self) -> String {
        let (seen, held, _) = self.leases.tally("l-");
        let mut out = vec![
            "---- operator state at the failure ----".to_string(),
            self.operator.proc_line(),
            format!("bulk leases (watch): {seen} seen, {held} held"),
        ];
        // The conditions of a lease not held, if any.
        for ns in self
            .layout
            .objects
            .iter()
            .take(1)
            .chain(self.layout.kinds.iter().take(1))
        {
            let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
            if let Ok(Ok(list)) =
                tokio::time::timeout(call_timeout(), leases.list(&ListParams::default())).await
                && let Some(l) = list
                    .items
                    .iter()
                    .find(|l| l.status.as_ref().is_none_or(|s| s.holder.is_none()))
            {
                let conditions = l.status.as_ref().map(|s| s.conditions.clone());
                out.push(format!(
                    "lease {ns}/{} not held; conditions {conditions:?}",
                    l.name_any()
                ));
            }
        }
        out.push(format!("operator metrics:\n{}", self.operator.metrics()));
        out.push(self.operator.log_summary());
        out.join("\n")
    }
}
