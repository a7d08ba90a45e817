//! What the fence's admission objects cost the cluster, at 0, 1,000 and 10,000 fenced leases
//! (issue 39), side by side in one run on one control plane, with the operator (the real
//! binary, serving every namespace) running and every lease Held, so that its fences are in
//! force. At each size N, in the order given (the first, 0, is the baseline; it is measured
//! again at the end, for drift):
//!
//! 1. N leases spread over 100 namespaces: 50 namespaces of leases with `spec.fenceObjects:
//!    true`, 50 of leases with `spec.fence: {resources: [{resource: configmaps}]}`, each with
//!    one claim (no pod; made by the admin, as `bench_scale` does) — how long until all are
//!    Held, and how many admission objects (ValidatingAdmissionPolicies and bindings) the
//!    cluster then holds;
//! 2. the kube-apiserver's resident memory (VmRSS, from its pid file under `$FL_CP_DIR`) right
//!    then, and again after a deliberate settle of `--settle` seconds (Go's heap and the
//!    apiserver's informers come to rest; the only sleep of this program that is not a wait
//!    on a condition);
//! 3. write latencies, as cluster-admin over one keep-alive connection of their own, in
//!    interleaved rounds so that any drift of the machine hits every kind alike: a ConfigMap
//!    create, update and delete in a namespace no lease touches (unfenced); an update of a
//!    ConfigMap labelled `fencing.dev/lease=<lease>` and stamped with that lease's current
//!    token, in a namespace of fenceObjects leases; a ConfigMap create, update and delete in a
//!    namespace of leases that fence configmaps by kind. Every one must be accepted. At N = 0
//!    the same objects are written in the same namespaces, where no lease exists;
//! 4. the grant latency of `--grant-samples` fresh leases created at that size (half of each
//!    kind, in the same namespaces, one at a time: the lease, then at once its claim; claim
//!    created -> lease Held, as a watch on the leases sees it), and the identity window of
//!    I11: hand-overs of a lease that fences configmaps by kind between two pods (Pending pods,
//!    clients with tokens bound to them, as a pod mounts), the holder releasing its claim and
//!    the operator granting the other pod's waiting claim; the old holder's pod probes with
//!    dry-run ConfigMap creates until the apiserver refuses it. The window is measured from the
//!    grant (the lease's `status.acquireTime`, which the operator sets before it sends the
//!    write) and from the release. The fencing is the operator's: this program creates no
//!    admission object;
//! 5. every lease and claim deleted (claims first, `--concurrency` at a time): how long until
//!    all leases are gone, and until the admission objects are back to the baseline count;
//!    the apiserver's memory after that and a settle.
//!
//! Rows go to `--results` (section "admission at scale"), every sample to
//! `<log-dir>/admission-<run>-samples.tsv`, the operator's log to `<log-dir>`; a table of the
//! medians is printed at the end. Fails (exit 1) when a fenced write is refused, a lease is not
//! Held in time (`--stall`, `--grant-timeout`), or the operator exits; it then prints the
//! operator's state and deletes what it created.
//!
//! ```console
//! $ export FL_CP_DIR=/tmp/fl-cp-bench; eval "$(hack/control-plane up)"
//! $ KUBECTL=$(hack/control-plane bin-dir)/kubectl hack/crds install   # CRDs and deploy/admission/
//! $ cargo build --release --bin fenced-lease-operator --example bench_admission
//! $ target/release/bench-admission --sizes 0,1000 --operator target/release/fenced-lease-operator
//! ```
//! (`BENCH_ONLY=admission BENCH_ADMISSION_SIZES=0,1000 make bench`, or `make bench-admission`,
//! does all of this.)

use fenced_lease_bench::common;
use fenced_lease_bench::writers;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use common::*;
use fenced_lease::api::{FencedLease, FencedLeaseClaim, LEASE_LABEL, TOKEN_ANNOTATION};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use writers::{writer_clients, writer_pods};

const SECTION: &str = "admission at scale";
/// The label every lease of a run carries (its value: the run's id), for the lease watch.
const RUN_LABEL: &str = "bench.fencing.dev/admission";
/// Namespaces of each kind of lease (100 in all).
const HALF: usize = 50;

/// The admission objects' cost at 0 / 1,000 / 10,000 fenced leases: unfenced and fenced write
/// latency, apiserver memory, grant latency and the I11 window.
#[derive(Parser)]
struct Args {
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

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("bench_admission: {e}");
            std::process::exit(1);
        }
    }
}

// --- calls with deadlines --------------------------------------------------------------------

/// Every API call's deadline (`--call-timeout`).
static CALL_TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

fn call_timeout() -> Duration {
    *CALL_TIMEOUT.get().unwrap_or(&Duration::from_secs(60))
}

/// `fut` within the call deadline; its error or the timeout named by `what`.
async fn call<T, E: Display>(
    what: impl Display,
    fut: impl Future<Output = Result<T, E>>,
) -> Res<T> {
    match tokio::time::timeout(call_timeout(), fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => fail(format!("{what}: {e}")),
        Err(_) => fail(format!("{what}: no answer within {:?}", call_timeout())),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Deletes `name`, a 404 counting as done.
async fn delete_quietly<K>(api: &Api<K>, name: &str) -> Res<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(call_timeout(), api.delete(name, &DeleteParams::default())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if is_status(&e, 404) => Ok(()),
        Ok(Err(e)) => fail(format!("delete {name}: {e}")),
        Err(_) => fail(format!(
            "delete {name}: no answer within {:?}",
            call_timeout()
        )),
    }
}

/// Every object `api` lists (metadata only, in pages).
async fn count<K>(api: &Api<K>, lp: &ListParams) -> Res<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut total = 0;
    let mut continue_token: Option<String> = None;
    loop {
        let mut page_params = lp.clone().limit(1000);
        if let Some(c) = &continue_token {
            page_params = page_params.continue_token(c);
        }
        let page = call("list", api.list_metadata(&page_params)).await?;
        total += page.items.len();
        continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
        if continue_token.is_none() {
            return Ok(total);
        }
    }
}

/// ValidatingAdmissionPolicies and their bindings in the cluster now.
async fn admission_objects(client: &Client) -> Res<(usize, usize)> {
    let lp = ListParams::default();
    let policies = count(&Api::<ValidatingAdmissionPolicy>::all(client.clone()), &lp).await?;
    let bindings = count(
        &Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        &lp,
    )
    .await?;
    Ok((policies, bindings))
}

// --- the control plane's processes ------------------------------------------------------------

fn control_plane_dir() -> PathBuf {
    match std::env::var_os("FL_CP_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let tmp = std::env::var_os("TMPDIR").unwrap_or_else(|| "/tmp".into());
            // hack/control-plane's `id -u`: the owner of this process's /proc entry.
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
            PathBuf::from(tmp).join(format!("fenced-lease-control-plane-{uid}"))
        }
    }
}

/// The pid in `file`, if it names a running process.
fn pid_in(file: &std::path::Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    std::path::Path::new(&format!("/proc/{pid}"))
        .exists()
        .then_some(pid)
}

struct ControlPlane {
    apiserver_pid_file: PathBuf,
    etcd_pid_file: PathBuf,
}

impl ControlPlane {
    fn new(args: &Args) -> Self {
        let dir = control_plane_dir();
        ControlPlane {
            apiserver_pid_file: args
                .apiserver_pid_file
                .clone()
                .unwrap_or_else(|| dir.join("kube-apiserver.pid")),
            etcd_pid_file: dir.join("etcd.pid"),
        }
    }

    /// The apiserver's and etcd's VmRSS now, MiB (the pid files are read every time: a
    /// restart changes the pid).
    fn rss(&self) -> Res<(u32, f64, f64)> {
        let Some(pid) = pid_in(&self.apiserver_pid_file) else {
            return fail(format!(
                "no running kube-apiserver in {} (FL_CP_DIR, or --apiserver-pid-file)",
                self.apiserver_pid_file.display()
            ));
        };
        let etcd = pid_in(&self.etcd_pid_file).map_or(f64::NAN, rss_mib);
        Ok((pid, rss_mib(pid), etcd))
    }
}

// --- objects -----------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `spec.fenceObjects: true`
    Objects,
    /// `spec.fence: {resources: [{resource: configmaps}]}`
    Configmaps,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Objects => "fenceObjects",
            Kind::Configmaps => "spec.fence configmaps",
        }
    }
}

fn fenced_lease(name: &str, kind: Kind, run: &str) -> Res<FencedLease> {
    let mut spec = json!({"leaseDurationSeconds": 3600, "annotateHolderPod": false});
    match kind {
        Kind::Objects => spec["fenceObjects"] = json!(true),
        Kind::Configmaps => spec["fence"] = json!({"resources": [{"resource": "configmaps"}]}),
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": spec,
    }))?)
}

fn configmap(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ConfigMap {
    let map = |pairs: &[(&str, &str)]| {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        })
    };
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("n".to_string(), "0".to_string())])),
        ..Default::default()
    }
}

/// The namespaces of a run: `<run>-fo-NN` (fenceObjects leases), `<run>-k-NN` (leases fencing
/// configmaps), `<run>-free` (no lease: the unfenced writes), `<run>-op` (the operator's own
/// records), `<run>-i11` (the two writer pods and the hand-over lease).
struct Layout {
    run: String,
    objects: Vec<String>,
    kinds: Vec<String>,
    free: String,
    operator: String,
    i11: String,
}

impl Layout {
    fn new(run: &str) -> Self {
        Layout {
            run: run.to_string(),
            objects: (0..HALF).map(|i| format!("{run}-fo-{i:02}")).collect(),
            kinds: (0..HALF).map(|i| format!("{run}-k-{i:02}")).collect(),
            free: format!("{run}-free"),
            operator: format!("{run}-op"),
            i11: format!("{run}-i11"),
        }
    }

    fn all(&self) -> Vec<String> {
        let mut all = self.objects.clone();
        all.extend(self.kinds.iter().cloned());
        all.extend([self.free.clone(), self.operator.clone(), self.i11.clone()]);
        all
    }

    /// Lease `i` of the N: its namespace and kind (alternating over the 100 namespaces).
    fn place(&self, i: usize) -> (&str, Kind) {
        let j = i % (2 * HALF);
        if j < HALF {
            (&self.objects[j], Kind::Objects)
        } else {
            (&self.kinds[j - HALF], Kind::Configmaps)
        }
    }
}

// --- leases, as a watch sees them ----------------------------------------------------------------

/// By "namespace/name": the holding claim and when the watch first saw it hold.
type Held = HashMap<String, (String, Instant)>;
/// Leases seen, by "namespace/name" (without status too).
type Seen = HashMap<String, ()>;

#[derive(Default)]
struct LeaseState {
    held: Held,
    seen: Seen,
    /// A relist in progress: what it has listed so far.
    relist: Option<(Held, Seen)>,
    synced: bool,
}

/// Records, by a watch on the run's leases, when each is first seen held by each claim.
#[derive(Clone, Default)]
struct Leases {
    state: Arc<Mutex<LeaseState>>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl Leases {
    fn watch(client: &Client, run: &str) -> Self {
        let leases = Leases::default();
        let api: Api<FencedLease> = Api::all(client.clone());
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
        let state = leases.state.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api, config).boxed();
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let mut guard = state.lock().unwrap();
                let s = &mut *guard;
                match event {
                    Ok(watcher::Event::Init) => s.relist = Some(Default::default()),
                    Ok(watcher::Event::InitApply(l)) => {
                        let k = key(&l.namespace().unwrap_or_default(), &l.name_any());
                        let before = s.held.get(&k).cloned();
                        if let Some((held, seen)) = s.relist.as_mut() {
                            record(held, seen, before, k, &l, now);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some((held, seen)) = s.relist.take() {
                            (s.held, s.seen) = (held, seen);
                        }
                        s.synced = true;
                    }
                    Ok(watcher::Event::Apply(l)) => {
                        let k = key(&l.namespace().unwrap_or_default(), &l.name_any());
                        let before = s.held.get(&k).cloned();
                        record(&mut s.held, &mut s.seen, before, k, &l, now);
                    }
                    Ok(watcher::Event::Delete(l)) => {
                        let k = key(&l.namespace().unwrap_or_default(), &l.name_any());
                        s.held.remove(&k);
                        s.seen.remove(&k);
                    }
                    Err(_) => {}
                }
            }
        });
        leases
    }

    async fn synced(&self, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        while !self.state.lock().unwrap().synced {
            if Instant::now() > deadline {
                return fail(format!("the lease watch did not sync within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// When lease `ns/name` was first seen held by `claim`, if it is now.
    fn held_by(&self, ns: &str, name: &str, claim: &str) -> Option<Instant> {
        let s = self.state.lock().unwrap();
        s.held
            .get(&key(ns, name))
            .filter(|(c, _)| c == claim)
            .map(|(_, at)| *at)
    }

    /// Leases whose name starts with `prefix` seen, and of them held, and the last time one
    /// was first seen held.
    fn tally(&self, prefix: &str) -> (usize, usize, Option<Instant>) {
        let s = self.state.lock().unwrap();
        let matches = |k: &String| {
            k.split_once('/')
                .is_some_and(|(_, n)| n.starts_with(prefix))
        };
        let seen = s.seen.keys().filter(|k| matches(k)).count();
        let held: Vec<Instant> = s
            .held
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, (_, at))| *at)
            .collect();
        (seen, held.len(), held.iter().max().copied())
    }

    /// Waits until lease `ns/name` is held by `claim`; fails after `timeout` or when the
    /// operator exits.
    async fn wait_held(
        &self,
        operator: &mut Operator,
        ns: &str,
        name: &str,
        claim: &str,
        timeout: Duration,
    ) -> Res<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.held_by(ns, name, claim) {
                return Ok(at);
            }
            if !operator.alive() {
                return fail("the operator exited");
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "lease {ns}/{name} was not held by claim {claim} within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn record(
    held: &mut Held,
    seen: &mut Seen,
    before: Option<(String, Instant)>,
    k: String,
    lease: &FencedLease,
    now: Instant,
) {
    seen.insert(k.clone(), ());
    let holder = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .map(|h| h.claim.clone());
    match holder {
        Some(claim) => {
            let at = match before {
                Some((c, at)) if c == claim => at,
                _ => now,
            };
            held.insert(k, (claim, at));
        }
        None => {
            held.remove(&k);
        }
    }
}

// --- results -------------------------------------------------------------------------------

/// Every sample to a file, the rows to `--results`, the medians to the closing table.
struct Out {
    results: Results,
    system: String,
    samples: Mutex<std::io::BufWriter<std::fs::File>>,
    /// figure (without the size) -> size label -> "median (p99)"; in the order first seen.
    table: Mutex<Vec<(String, String, String)>>,
}

impl Out {
    fn samples(&self, size: &str, figure: &str, values: &[f64], unit: &str, note: &str) {
        if let Ok(mut f) = self.samples.lock() {
            for (i, v) in values.iter().enumerate() {
                let _ = writeln!(f, "{size}\t{figure}\t{i}\t{v:.3}");
            }
            let _ = f.flush();
        }
        self.results.samples(
            SECTION,
            &self.system,
            &format!("{figure}, {size}"),
            values,
            unit,
            note,
        );
        let cell = if values.is_empty() {
            "-".to_string()
        } else {
            let mut s = values.to_vec();
            let (median, p99, _) = spread(&mut s);
            format!("{} ({}) {unit}", short(median), short(p99))
        };
        self.cell(figure, size, cell);
    }

    fn value(&self, size: &str, figure: &str, value: f64, unit: &str, note: &str) {
        self.results.value(
            SECTION,
            &self.system,
            &format!("{figure}, {size}"),
            value,
            unit,
            note,
        );
        self.cell(figure, size, format!("{} {unit}", short(value)));
    }

    fn cell(&self, figure: &str, size: &str, cell: String) {
        self.table
            .lock()
            .unwrap()
            .push((figure.to_string(), size.to_string(), cell));
    }

    /// Figures down, sizes across: median (p99) of each.
    fn print_table(&self) {
        let table = self.table.lock().unwrap();
        let mut sizes: Vec<&str> = vec![];
        let mut figures: Vec<&str> = vec![];
        for (figure, size, _) in table.iter() {
            if !sizes.contains(&size.as_str()) {
                sizes.push(size);
            }
            if !figures.contains(&figure.as_str()) {
                figures.push(figure);
            }
        }
        let cells: HashMap<(&str, &str), &str> = table
            .iter()
            .map(|(f, s, c)| ((f.as_str(), s.as_str()), c.as_str()))
            .collect();
        println!("\n== admission at scale: median (p99), by number of fenced leases ==\n");
        println!("| figure | {} |", sizes.join(" | "));
        println!("|---|{}", "---|".repeat(sizes.len()));
        for figure in figures {
            let row: Vec<&str> = sizes
                .iter()
                .map(|s| cells.get(&(figure, *s)).copied().unwrap_or(""))
                .collect();
            println!("| {figure} | {} |", row.join(" | "));
        }
        println!();
    }
}

fn short(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

// --- the run ----------------------------------------------------------------------------------

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

async fn run(args: Args) -> Res<bool> {
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
    let mut samples_file = std::io::BufWriter::new(std::fs::File::create(&samples_path)?);
    writeln!(samples_file, "size\tfigure\tsample\tvalue")?;
    let out = Out {
        results: Results::new(args.results.clone()),
        system: args.system.clone(),
        samples: Mutex::new(samples_file),
        table: Mutex::new(vec![]),
    };
    let control_plane = ControlPlane::new(&args);
    control_plane.rss()?;

    println!("run {run}: {} namespaces", layout.all().len());
    for ns in layout.all() {
        let object: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        call(
            format!("create namespace {ns}"),
            Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &object),
        )
        .await?;
    }
    let outcome = async {
        let pods = writer_pods(&client, &layout.i11, call_timeout()).await?;
        let leases = Leases::watch(&client, &run);
        leases.synced(Duration::from_secs(60)).await?;
        let log = args.log_dir.join(format!("admission-{run}-operator.log"));
        let operator =
            Operator::start(&args.operator, None, &layout.operator, &log, &args.rust_log)?;
        println!(
            "operator pid {} serving every namespace, log {}",
            operator.pid,
            log.display()
        );
        let baseline_objects = admission_objects(&client).await?;
        Res::Ok(Bench {
            args,
            client: client.clone(),
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
    .await;
    let mut bench = match outcome {
        Ok(b) => b,
        Err(e) => {
            remove_namespaces(&client, &Layout::new(&run).all()).await;
            return Err(e);
        }
    };

    let mut profiles: Vec<(usize, String)> = bench
        .args
        .sizes
        .iter()
        .map(|&n| (n, format!("{n} fenced leases")))
        .collect();
    if bench.args.again_at_end && bench.args.sizes.len() > 1 {
        let n = bench.args.sizes[0];
        profiles.push((n, format!("{n} fenced leases, again at the end")));
    }
    let mut ok = true;
    for (n, label) in profiles {
        println!("\n== {label} ==");
        if let Err(e) = bench.profile(n, &label).await {
            ok = false;
            println!("FAILED at {label}: {e}");
            println!("{}", bench.operator_report().await);
            bench.out.value(
                &label,
                "run FAILED",
                0.0,
                "",
                e.to_string().lines().next().unwrap_or(""),
            );
            break;
        }
    }
    bench.out.print_table();
    println!("every sample: {}", samples_path.display());
    bench.finish().await;
    Ok(ok)
}

impl Bench {
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

    /// Creates N leases and a claim for each, 32 at a time, and waits until all are Held.
    async fn put_in_place(&mut self, n: usize, label: &str) -> Res<()> {
        let started = Instant::now();
        let items: Vec<(String, String, Kind)> = (0..n)
            .map(|i| {
                let (ns, kind) = self.layout.place(i);
                (ns.to_string(), format!("l-{i}"), kind)
            })
            .collect();
        let (client, run) = (&self.client, &self.layout.run);
        let creates = futures::stream::iter(items)
            .map(|(ns, name, kind)| async move {
                let leases: Api<FencedLease> = Api::namespaced(client.clone(), &ns);
                let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), &ns);
                let pp = PostParams::default();
                let lease = fenced_lease(&name, kind, run)?;
                call(
                    format!("create lease {ns}/{name}"),
                    leases.create(&pp, &lease),
                )
                .await?;
                let claim = claim(&format!("c-{name}"), &name);
                call(
                    format!("create claim {ns}/c-{name}"),
                    claims.create(&pp, &claim),
                )
                .await?;
                Res::Ok(())
            })
            .buffer_unordered(self.args.concurrency);
        let mut creates = std::pin::pin!(creates);
        let mut created = 0;
        let mut next_print = Instant::now() + Duration::from_secs(10);
        while let Some(result) = creates.next().await {
            result?;
            created += 1;
            if Instant::now() >= next_print {
                next_print = Instant::now() + Duration::from_secs(10);
                let (_, held, _) = self.leases.tally("l-");
                println!(
                    "t+{:>6.1}s created {created:>6}/{n}, held {held:>6}",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        let created_in = started.elapsed();
        println!(
            "created {n} leases and claims in {:.1} s ({} in flight)",
            created_in.as_secs_f64(),
            self.args.concurrency
        );
        let mut last = (0, Instant::now());
        let mut next_print = Instant::now();
        let last_held = loop {
            let (seen, held, last_at) = self.leases.tally("l-");
            let now = Instant::now();
            if held != last.0 {
                last = (held, now);
            }
            if now >= next_print {
                next_print = now + Duration::from_secs(10);
                println!(
                    "t+{:>6.1}s held {held:>6}/{n} (watch sees {seen}); {}",
                    started.elapsed().as_secs_f64(),
                    self.operator.proc_line()
                );
            }
            if held >= n {
                break last_at.unwrap_or(now);
            }
            let why = if !self.operator.alive() {
                Some("the operator exited".to_string())
            } else if now - last.1 > Duration::from_secs(self.args.stall) {
                Some(format!(
                    "stalled: no lease granted for {} s, {held} of {n} Held",
                    self.args.stall
                ))
            } else if started.elapsed() > Duration::from_secs(self.args.grant_timeout) {
                Some(format!(
                    "{held} of {n} Held {} s after the first create",
                    self.args.grant_timeout
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return fail(why);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let all_held = last_held.saturating_duration_since(started);
        println!(
            "all {n} Held {:.1} s after the first create; {}",
            all_held.as_secs_f64(),
            self.operator.proc_line()
        );
        self.out.value(
            label,
            "create leases and claims -> all Held",
            all_held.as_secs_f64(),
            "s",
            &format!(
                "{n} leases, each with one claim (no pod), created lease then claim, {} pairs in flight: created in {:.1} s; 100 namespaces, half fenceObjects, half spec.fence configmaps",
                self.args.concurrency,
                created_in.as_secs_f64()
            ),
        );
        Ok(())
    }

    /// The apiserver's (and etcd's) RSS now and after the settle.
    async fn memory(&mut self, n: usize, label: &str, when: &str) -> Res<()> {
        let (pid, rss, etcd) = self.control_plane.rss()?;
        let (what, settled_what) = match when {
            "in place" => (
                "apiserver RSS, leases in place",
                "apiserver RSS, leases in place, settled",
            ),
            _ => (
                "apiserver RSS, leases deleted",
                "apiserver RSS, leases deleted, settled",
            ),
        };
        if when == "in place" {
            self.out.value(
                label,
                what,
                rss,
                "MiB",
                &format!(
                    "kube-apiserver pid {pid} VmRSS {}; etcd {etcd:.0} MiB",
                    if n > 0 {
                        "right after all leases were Held"
                    } else {
                        "with no lease"
                    }
                ),
            );
        }
        // A deliberate pause, not a wait on a condition: the apiserver's heap and informers
        // come to rest before the reading that counts.
        tokio::time::sleep(Duration::from_secs(self.args.settle)).await;
        let (pid, settled, etcd) = self.control_plane.rss()?;
        self.out.value(
            label,
            settled_what,
            settled,
            "MiB",
            &format!(
                "kube-apiserver pid {pid} VmRSS {} s after {}; etcd {etcd:.0} MiB",
                self.args.settle,
                if when == "in place" {
                    if n > 0 {
                        "all leases were Held"
                    } else {
                        "the previous reading"
                    }
                } else {
                    "the leases and their admission objects were gone"
                }
            ),
        );
        Ok(())
    }

    /// The write latencies: rounds of every kind, interleaved.
    async fn writes(&mut self, n: usize, label: &str) -> Res<()> {
        let free: Api<ConfigMap> = Api::namespaced(self.writer.clone(), &self.layout.free);
        let objects_ns = &self.layout.objects[0];
        let kinds_ns = &self.layout.kinds[0];
        let objects: Api<ConfigMap> = Api::namespaced(self.writer.clone(), objects_ns);
        let kinds: Api<ConfigMap> = Api::namespaced(self.writer.clone(), kinds_ns);
        // Lease l-0 is a fenceObjects lease of the first namespace; its current token.
        let target_lease = "l-0";
        let token = if n > 0 {
            let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), objects_ns);
            let lease = call("get lease l-0", leases.get(target_lease)).await?;
            lease.status.map_or(0, |s| s.fencing_token)
        } else {
            1
        };
        let token = token.to_string();
        let pp = PostParams::default();
        // The objects updated in every round, made afresh at every size.
        for (api, name) in [(&free, "u-target"), (&kinds, "k-target")] {
            delete_quietly(api, name).await?;
            call(
                format!("create {name}"),
                api.create(&pp, &configmap(name, &[], &[])),
            )
            .await?;
        }
        let labelled = configmap(
            "fo-target",
            &[(LEASE_LABEL, target_lease)],
            &[(TOKEN_ANNOTATION, &token)],
        );
        match call("create fo-target", objects.create(&pp, &labelled)).await {
            Ok(_) => {}
            Err(_) => {
                // Left from an earlier size, carrying a lower token: stamp the current one.
                let patch = json!({"metadata": {"annotations": {TOKEN_ANNOTATION: &token}}});
                call(
                    "stamp fo-target",
                    objects.patch("fo-target", &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await?;
            }
        }
        let names = [
            "unfenced ConfigMap create",
            "unfenced ConfigMap update",
            "unfenced ConfigMap delete",
            "fenceObjects ConfigMap update (labelled, stamped)",
            "spec.fence ConfigMap create",
            "spec.fence ConfigMap update",
            "spec.fence ConfigMap delete",
        ];
        let mut samples: Vec<Vec<f64>> = vec![vec![]; names.len()];
        let started = Instant::now();
        for round in 0..self.args.warmup + self.args.samples {
            let mut took = [0.0; 7];
            let patch = json!({"data": {"n": round.to_string()}});
            let stamped = json!({
                "metadata": {"annotations": {TOKEN_ANNOTATION: &token}},
                "data": {"n": round.to_string()},
            });
            let merge = PatchParams::default();
            let name = format!("w-{round}");
            took[0] = timed(names[0], free.create(&pp, &configmap(&name, &[], &[]))).await?;
            took[1] = timed(
                names[1],
                free.patch("u-target", &merge, &Patch::Merge(&patch)),
            )
            .await?;
            took[2] = timed(names[2], free.delete(&name, &DeleteParams::default())).await?;
            took[3] = timed(
                names[3],
                objects.patch("fo-target", &merge, &Patch::Merge(&stamped)),
            )
            .await?;
            took[4] = timed(names[4], kinds.create(&pp, &configmap(&name, &[], &[]))).await?;
            took[5] = timed(
                names[5],
                kinds.patch("k-target", &merge, &Patch::Merge(&patch)),
            )
            .await?;
            took[6] = timed(names[6], kinds.delete(&name, &DeleteParams::default())).await?;
            if round >= self.args.warmup {
                for (s, t) in samples.iter_mut().zip(took) {
                    s.push(t);
                }
            }
        }
        let per_ns = n / (2 * HALF);
        let rounds = format!(
            "{} rounds of 7 writes, interleaved ({} s in all), after {} not counted; cluster-admin over one keep-alive HTTP/2 connection",
            self.args.samples,
            started.elapsed().as_secs().max(1),
            self.args.warmup
        );
        let notes = [
            format!("namespace {} (no lease); {rounds}", self.layout.free),
            format!(
                "namespace {} (no lease), one object; {rounds}",
                self.layout.free
            ),
            format!("namespace {} (no lease); {rounds}", self.layout.free),
            format!(
                "namespace {objects_ns} ({per_ns} fenceObjects leases), labelled {LEASE_LABEL}={target_lease}, stamped with its current token {token}, accepted; {rounds}"
            ),
            format!(
                "namespace {kinds_ns} ({per_ns} leases fencing configmaps by kind), unstamped, accepted; {rounds}"
            ),
            format!(
                "namespace {kinds_ns} ({per_ns} leases fencing configmaps by kind), one object, unstamped, accepted; {rounds}"
            ),
            format!(
                "namespace {kinds_ns} ({per_ns} leases fencing configmaps by kind), accepted; {rounds}"
            ),
        ];
        for ((name, values), note) in names.iter().zip(&samples).zip(&notes) {
            self.out.samples(label, name, values, "ms", note);
        }
        call(
            "delete fo-target",
            objects.delete("fo-target", &DeleteParams::default()),
        )
        .await?;
        Ok(())
    }

    /// Fresh leases, one at a time: the lease, then at once its claim; claim created -> Held.
    async fn grants(&mut self, label: &str) -> Res<()> {
        let mut samples = vec![];
        let mut by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut made = vec![];
        let result = async {
            for i in 0..self.args.grant_samples {
                // Alternating kinds, over the namespaces.
                let (ns, kind) = if i % 2 == 0 {
                    (&self.layout.objects[(i / 2) % HALF], Kind::Objects)
                } else {
                    (&self.layout.kinds[(i / 2) % HALF], Kind::Configmaps)
                };
                let ns = ns.clone();
                let name = format!("g-{i}");
                let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), &ns);
                let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), &ns);
                let pp = PostParams::default();
                let lease = fenced_lease(&name, kind, &self.layout.run)?;
                call(
                    format!("create lease {ns}/{name}"),
                    leases.create(&pp, &lease),
                )
                .await?;
                made.push((ns.clone(), name.clone()));
                let claim_name = format!("c-{name}");
                call(
                    format!("create claim {ns}/{claim_name}"),
                    claims.create(&pp, &claim(&claim_name, &name)),
                )
                .await?;
                let created = Instant::now();
                let held = self
                    .leases
                    .wait_held(
                        &mut self.operator,
                        &ns,
                        &name,
                        &claim_name,
                        Duration::from_secs(60),
                    )
                    .await?;
                let took = ms(held.saturating_duration_since(created));
                samples.push(took);
                by_kind.entry(kind.name()).or_default().push(took);
            }
            Res::Ok(())
        }
        .await;
        let removed = self.remove_leases(&made, "g-").await;
        result?;
        removed?;
        let kinds: Vec<String> = by_kind
            .iter_mut()
            .map(|(k, v)| {
                let (median, _, worst) = spread(v);
                format!("{k}: median {median:.0} ms, worst {worst:.0} ms")
            })
            .collect();
        self.out.samples(
            label,
            "grant latency, fresh lease (claim created -> lease Held)",
            &samples,
            "ms",
            &format!(
                "{} leases created one at a time beside the others, each lease then at once its claim; Held as a watch on the leases sees it; {}",
                self.args.grant_samples,
                kinds.join("; ")
            ),
        );
        Ok(())
    }

    /// Deletes the claims and then leases `made`, and waits until the leases are gone.
    async fn remove_leases(&mut self, made: &[(String, String)], prefix: &str) -> Res<()> {
        for (ns, name) in made {
            let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), ns);
            delete_quietly(&claims, &format!("c-{name}")).await?;
            let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
            delete_quietly(&leases, name).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(self.args.stall);
        while self.leases.tally(prefix).0 > 0 {
            if Instant::now() > deadline || !self.operator.alive() {
                return fail(format!(
                    "{} leases {prefix}* still there {} s after their deletion",
                    self.leases.tally(prefix).0,
                    self.args.stall
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// I11: hand-overs between the two writer pods of a lease fencing configmaps by kind.
    async fn identity_window(&mut self, label: &str) -> Res<()> {
        let ns = self.layout.i11.clone();
        let probe = configmap("probe", &[], &[]);
        let writers = writer_clients(&self.client, &ns, &self.pods, probe, call_timeout()).await?;
        let leases: Api<FencedLease> = Api::namespaced(self.client.clone(), &ns);
        let claims: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), &ns);
        let lease = "ident";
        let pp = PostParams::default();
        call(
            "create lease ident",
            leases.create(
                &pp,
                &fenced_lease(lease, Kind::Configmaps, &self.layout.run)?,
            ),
        )
        .await?;
        let pod_claim = |pod: &str, k: usize| {
            let mut c = claim(&format!("{pod}-{k}"), lease);
            c.spec.holder_identity = pod.to_string();
            c.spec.pod_name = Some(pod.to_string());
            c
        };
        let mut current = format!("{}-0", writers[0].name);
        let result = async {
            call(
                "create the first claim",
                claims.create(&pp, &pod_claim(&writers[0].name, 0)),
            )
            .await?;
            self.leases
                .wait_held(
                    &mut self.operator,
                    &ns,
                    lease,
                    &current,
                    Duration::from_secs(60),
                )
                .await?;
            // In force: the holder's pod may write, the other may not.
            let warm = Instant::now();
            loop {
                let holder_writes = !writers[0].refused().await?;
                if holder_writes && writers[1].refused().await? {
                    break;
                }
                if warm.elapsed() > Duration::from_secs(30) {
                    return fail("the identity rule was not in force 30 s after the grant");
                }
            }
            let (mut from_grant, mut from_release, mut handover, mut round_trips) =
                (vec![], vec![], vec![], vec![]);
            let mut first_probe = 0;
            for k in 1..=self.args.identity_samples {
                let (old, new) = (&writers[(k + 1) % 2], &writers[k % 2]);
                let next = format!("{}-{k}", new.name);
                call(
                    format!("create claim {next}"),
                    claims.create(&pp, &pod_claim(&new.name, k)),
                )
                .await?;
                // Queued: the operator has seen it (a status) before the release.
                let queued = Instant::now();
                loop {
                    let c = call(format!("get claim {next}"), claims.get(&next)).await?;
                    if c.status.is_some_and(|s| s.phase.is_some()) {
                        break;
                    }
                    if queued.elapsed() > Duration::from_secs(30) {
                        return fail(format!("claim {next} had no status 30 s after its create"));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let before = Instant::now();
                if old.refused().await? {
                    return fail(format!("pod {} refused before it released", old.name));
                }
                round_trips.push(ms(before.elapsed()));
                call(
                    format!("release {current}"),
                    claims.delete(&current, &DeleteParams::default()),
                )
                .await?;
                let released = Instant::now();
                let mut probes = 0;
                let refused_wall = loop {
                    probes += 1;
                    if old.refused().await? {
                        break SystemTime::now();
                    }
                    if released.elapsed() > Duration::from_secs(30) {
                        return fail(format!(
                            "pod {} still allowed to write 30 s after its release",
                            old.name
                        ));
                    }
                };
                let refused = Instant::now();
                first_probe += usize::from(probes == 1);
                let held = self
                    .leases
                    .wait_held(
                        &mut self.operator,
                        &ns,
                        lease,
                        &next,
                        Duration::from_secs(30),
                    )
                    .await?;
                let granted = call("get lease ident", leases.get(lease))
                    .await?
                    .status
                    .and_then(|s| s.acquire_time)
                    .ok_or("lease ident Held without an acquireTime")?;
                let granted = SystemTime::from(granted.0);
                let window = match refused_wall.duration_since(granted) {
                    Ok(d) => ms(d),
                    Err(e) => -ms(e.duration()),
                };
                from_grant.push(window);
                from_release.push(ms(refused - released));
                handover.push(ms(held.saturating_duration_since(released)));
                current = next;
            }
            Res::Ok((from_grant, from_release, handover, round_trips, first_probe))
        }
        .await;
        let _ = delete_quietly(&claims, &current).await;
        let removed = self
            .remove_leases(&[(ns.clone(), lease.to_string())], lease)
            .await;
        let (from_grant, from_release, handover, round_trips, first_probe) = result?;
        removed?;
        let samples = from_grant.len();
        let note = format!(
            "{samples} hand-overs of lease {ns}/{lease} (spec.fence configmaps) between two pods, each way in turn: the holder's claim deleted, the other pod's waiting claim granted by the operator; probes are dry-run ConfigMap creates by the old holder's pod (pod-bound token), back to back; the first probe after the release was already refused in {first_probe} of {samples}"
        );
        self.out.samples(
            label,
            "I11 window: grant (lease acquireTime) -> old holder's pod refused",
            &from_grant,
            "ms",
            &format!("{note}; acquireTime is set by the operator before it sends the grant, so this includes the grant's write"),
        );
        self.out.samples(
            label,
            "hand-over: release -> old holder's pod refused",
            &from_release,
            "ms",
            &note,
        );
        self.out.samples(
            label,
            "hand-over: release -> next holder Held",
            &handover,
            "ms",
            &format!("{note}; Held as a watch on the leases sees it"),
        );
        self.out.samples(
            label,
            "write by the holder's pod (dry-run ConfigMap create)",
            &round_trips,
            "ms",
            "one per hand-over, before the release: how long one probe takes",
        );
        Ok(())
    }

    /// Deletes every claim, then every lease, `concurrency` at a time; waits until the leases
    /// are gone and the admission objects are back to the baseline count.
    async fn remove(&mut self, n: usize, label: &str) -> Res<()> {
        let started = Instant::now();
        let (client, concurrency) = (&self.client, self.args.concurrency);
        let mut items: Vec<(bool, String, String)> = vec![];
        for i in 0..n {
            let (ns, _) = self.layout.place(i);
            items.push((true, ns.to_string(), format!("c-l-{i}")));
        }
        for i in 0..n {
            let (ns, _) = self.layout.place(i);
            items.push((false, ns.to_string(), format!("l-{i}")));
        }
        let deletes = futures::stream::iter(items)
            .map(|(is_claim, ns, name)| async move {
                if is_claim {
                    delete_quietly(
                        &Api::<FencedLeaseClaim>::namespaced(client.clone(), &ns),
                        &name,
                    )
                    .await
                } else {
                    delete_quietly(&Api::<FencedLease>::namespaced(client.clone(), &ns), &name)
                        .await
                }
            })
            .buffer_unordered(concurrency);
        let mut deletes = std::pin::pin!(deletes);
        while let Some(result) = deletes.next().await {
            result?;
        }
        let sent = started.elapsed();
        let mut last = (n, Instant::now());
        let mut next_print = Instant::now() + Duration::from_secs(10);
        let leases_gone = loop {
            let (left, _, _) = self.leases.tally("l-");
            let now = Instant::now();
            if left == 0 {
                break started.elapsed();
            }
            if left != last.0 {
                last = (left, now);
            }
            if now >= next_print {
                next_print = now + Duration::from_secs(10);
                println!(
                    "t+{:>6.1}s {left:>6} of {n} leases left; {}",
                    started.elapsed().as_secs_f64(),
                    self.operator.proc_line()
                );
            }
            if !self.operator.alive() {
                return fail("the operator exited");
            }
            if now - last.1 > Duration::from_secs(self.args.stall) {
                return fail(format!(
                    "{left} of {n} deleted leases still there, none gone for {} s",
                    self.args.stall
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let baseline = self.baseline_objects.0 + self.baseline_objects.1;
        let mut last = (usize::MAX, Instant::now());
        let objects_gone = loop {
            let (p, b) = admission_objects(&self.client).await?;
            let now = Instant::now();
            if p + b <= baseline {
                break started.elapsed();
            }
            if p + b != last.0 {
                last = (p + b, now);
            }
            if now - last.1 > Duration::from_secs(self.args.stall) {
                return fail(format!(
                    "{} admission objects left over the {baseline} before any lease, none gone for {} s",
                    p + b - baseline,
                    self.args.stall
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        println!(
            "deleted: every delete answered {:.1} s, leases gone {:.1} s, admission objects back to {baseline} {:.1} s after the first delete",
            sent.as_secs_f64(),
            leases_gone.as_secs_f64(),
            objects_gone.as_secs_f64()
        );
        self.out.value(
            label,
            "delete claims and leases -> all leases gone",
            leases_gone.as_secs_f64(),
            "s",
            &format!(
                "claims first, then leases, {concurrency} deletes in flight, the operator finalizing; every delete answered in {:.1} s",
                sent.as_secs_f64()
            ),
        );
        self.out.value(
            label,
            "delete claims and leases -> admission objects back to the baseline",
            objects_gone.as_secs_f64(),
            "s",
            &format!("{baseline} ValidatingAdmissionPolicies and bindings, as before any lease"),
        );
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

    /// Deletes what is left (the operator still running, so that it finalizes leases and
    /// removes their admission objects), stops the operator, removes the namespaces.
    async fn finish(mut self) {
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.layout.run));
        let leases: Api<FencedLease> = Api::all(self.client.clone());
        let left: Vec<(String, String)> = match call("list leases", leases.list_metadata(&lp)).await
        {
            Ok(list) => list
                .items
                .iter()
                .map(|m| (m.namespace().unwrap_or_default(), m.name_any()))
                .collect(),
            Err(e) => {
                println!("cannot list the leases left: {e}");
                vec![]
            }
        };
        if !left.is_empty() {
            println!("deleting the {} leases left", left.len());
            let claims: Api<FencedLeaseClaim> = Api::all(self.client.clone());
            if let Ok(list) =
                call("list claims", claims.list_metadata(&ListParams::default())).await
            {
                for m in list.items {
                    let ns = m.namespace().unwrap_or_default();
                    if ns.starts_with(&self.layout.run) {
                        let api: Api<FencedLeaseClaim> = Api::namespaced(self.client.clone(), &ns);
                        let _ = delete_quietly(&api, &m.name_any()).await;
                    }
                }
            }
            for (ns, name) in &left {
                let api: Api<FencedLease> = Api::namespaced(self.client.clone(), ns);
                let _ = delete_quietly(&api, name).await;
            }
            let deadline = Instant::now() + Duration::from_secs(600);
            while Instant::now() < deadline && self.operator.alive() {
                match call("list leases", leases.list_metadata(&lp)).await {
                    Ok(list) if list.items.is_empty() => break,
                    _ => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        }
        println!("{}", self.operator.log_summary());
        self.operator.stop();
        println!("operator log kept: {}", self.operator.log.display());
        if self.args.keep {
            println!("namespaces kept: {}-*", self.layout.run);
            return;
        }
        remove_namespaces(&self.client, &self.layout.all()).await;
    }
}

/// Deletes `namespaces` (the leases' finalizers stripped first, should any lease be left with
/// no operator to finalize it) and waits until the namespace controller has removed them.
async fn remove_namespaces(client: &Client, namespaces: &[String]) {
    let started = Instant::now();
    let api: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(namespaces)
        .for_each_concurrent(16, |ns| {
            let api = api.clone();
            async move {
                let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
                let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
                if let Ok(list) =
                    call("list leases", leases.list_metadata(&ListParams::default())).await
                {
                    for m in list.items.iter().filter(|m| !m.finalizers().is_empty()) {
                        let _ = call(
                            "strip",
                            leases.patch(&m.name_any(), &PatchParams::default(), &strip),
                        )
                        .await;
                    }
                }
                let _ = call(
                    format!("delete namespace {ns}"),
                    api.delete(ns, &DeleteParams::background()),
                )
                .await;
            }
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut left = namespaces.len();
    while Instant::now() < deadline {
        left = 0;
        for ns in namespaces {
            if !matches!(call("get namespace", api.get_opt(ns)).await, Ok(None)) {
                left += 1;
            }
        }
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "removed the run's {} namespaces in {:.1} s{}",
        namespaces.len(),
        started.elapsed().as_secs_f64(),
        if left > 0 {
            format!(" ({left} still terminating)")
        } else {
            String::new()
        }
    );
}

/// Runs `fut`, a write that must be accepted; its latency in ms.
async fn timed<T, E: Display>(what: &str, fut: impl Future<Output = Result<T, E>>) -> Res<f64> {
    let started = Instant::now();
    call(what, fut).await?;
    Ok(ms(started.elapsed()))
}
