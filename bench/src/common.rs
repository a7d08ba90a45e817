//! What the benchmark programs (`src/bin/*.rs`) share: the operator as a child process
//! whose log is kept, a watch that records when each claim is granted, the operator's state
//! for failure reports, process figures from /proc, the apiserver's own request counters,
//! and the results file `hack/bench` turns into BENCHMARKS.md's table.

#![allow(dead_code)] // each program uses a part

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_lease::api::{ClaimPhase, FencedLease, FencedLeaseClaim};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Fails with `message` (for `?` in the programs).
pub fn fail<T>(message: impl Into<String>) -> Res<T> {
    Err(message.into().into())
}

// --- objects -----------------------------------------------------------------------------

pub fn lease(name: &str, duration_seconds: u32) -> FencedLease {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name},
        "spec": {"leaseDurationSeconds": duration_seconds, "annotateHolderPod": false}
    }))
    .expect("a valid FencedLease")
}

pub fn claim(name: &str, lease: &str) -> FencedLeaseClaim {
    serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": name},
        "spec": {"leaseName": lease, "holderIdentity": name}
    }))
    .expect("a valid FencedLeaseClaim")
}

/// A pod with a Deployment's labels and an annotation, never run here. No owner reference:
/// the garbage collector would delete a pod whose owner does not exist.
pub fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": "bench-holder", "pod-template-hash": "5d9f7c8b6"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T00:00:00Z"}
        },
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .expect("a valid Pod")
}

/// A fresh namespace `prefix-xxxxxx`.
pub async fn namespace(client: &Client, prefix: &str) -> Res<String> {
    let ns = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xffffff);
    let object: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await?;
    Ok(ns)
}

/// Creates `objects` with `concurrency` requests in flight; returns how long it took.
pub async fn create_all<K>(api: &Api<K>, objects: Vec<K>, concurrency: usize) -> Res<Duration>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(|o| async move {
            let pp = PostParams::default();
            match api.create(&pp, &o).await {
                Ok(_) => Ok(()),
                Err(e) if is_conflict(&e) => Ok(()), // exists already
                Err(e) => Err(e),
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(started.elapsed())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// With no operator left to run the finalizers: strip the leases' finalizers, then delete the
/// namespace and wait until the namespace controller has removed it.
pub async fn cleanup(client: &Client, ns: &str) {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let names: Vec<String> = leases
        .list_metadata(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(|m| m.name_any()).collect())
        .unwrap_or_default();
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| {
            let (leases, strip) = (&leases, &strip);
            async move {
                let _ = leases.patch(&name, &PatchParams::default(), strip).await;
            }
        })
        .await;
    let namespaces = Api::<Namespace>::all(client.clone());
    let _ = namespaces.delete(ns, &DeleteParams::background()).await;
    // Wait until it is gone: an operator of the next run watching all namespaces would
    // otherwise put its finalizer back on leases being deleted and finalize each of them.
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline && matches!(namespaces.get_opt(ns).await, Ok(Some(_))) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// --- figures -----------------------------------------------------------------------------

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median, p99 and worst of `samples` (nearest rank).
pub fn spread(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99), *samples.last().unwrap_or(&f64::NAN))
}

/// Where the figures go: printed, and appended as tab-separated rows to `--results` for
/// `hack/bench` to render (section, system, figure, n, median, p99, worst, unit, note).
#[derive(Clone, Debug, Default)]
pub struct Results {
    file: Option<PathBuf>,
}

impl Results {
    pub fn new(file: Option<PathBuf>) -> Self {
        Results { file }
    }

    /// Latency-like samples: median, p99 and worst.
    pub fn samples(
        &self,
        section: &str,
        system: &str,
        figure: &str,
        samples: &[f64],
        unit: &str,
        note: &str,
    ) {
        if samples.is_empty() {
            self.row(section, system, figure, "0", "-", "-", "-", unit, note);
            return;
        }
        let mut s = samples.to_vec();
        let (median, p99, worst) = spread(&mut s);
        println!(
            "{section:<10} {system:<34} {figure:<34} n={:<4} median {median:>9.1} {unit:<4} p99 {p99:>9.1} worst {worst:>9.1}  {note}",
            s.len()
        );
        self.row(
            section,
            system,
            figure,
            &s.len().to_string(),
            &fmt(median),
            &fmt(p99),
            &fmt(worst),
            unit,
            note,
        );
    }

    /// One figure (a rate, a size).
    pub fn value(
        &self,
        section: &str,
        system: &str,
        figure: &str,
        value: f64,
        unit: &str,
        note: &str,
    ) {
        println!("{section:<10} {system:<34} {figure:<34} {value:>10.2} {unit:<8} {note}");
        self.row(
            section,
            system,
            figure,
            "1",
            &fmt(value),
            "",
            "",
            unit,
            note,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        section: &str,
        system: &str,
        figure: &str,
        n: &str,
        median: &str,
        p99: &str,
        worst: &str,
        unit: &str,
        note: &str,
    ) {
        let Some(file) = &self.file else { return };
        let line = [section, system, figure, n, median, p99, worst, unit, note]
            .map(|f| f.replace(['\t', '\n'], " "))
            .join("\t");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Three significant digits at most, so that a fraction of a millisecond keeps two.
fn fmt(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 1.0 || a == 0.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

// --- processes ---------------------------------------------------------------------------

/// Ticks of /proc/<pid>/stat's utime and stime per second (USER_HZ; 100 on Linux/x86_64).
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's CPU time so far, in seconds (user + system), and its thread count.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ") ".
    (tick(11) + tick(12)) / TICKS_PER_SECOND
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory now (VmRSS), MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmRSS:") as f64 / 1024.0
}

/// Peak resident memory (VmHWM), MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmHWM:") as f64 / 1024.0
}

/// Open file descriptors, and how many of them are sockets (connections).
pub fn fds(pid: u32) -> (usize, usize) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    let mut total = 0;
    let mut sockets = 0;
    for entry in dir.flatten() {
        total += 1;
        if std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
        {
            sockets += 1;
        }
    }
    (total, sockets)
}

/// Client TCP connections to `port` on this machine, by state (from /proc/net/tcp{,6}):
/// with thousands in SYN_SENT or TIME_WAIT, connecting is what a client waits on.
pub fn tcp_states(port: u16) -> BTreeMap<&'static str, usize> {
    let mut states = BTreeMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state)) = (fields.get(2), fields.get(3)) else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port != Some(port) {
                continue;
            }
            let name = match *state {
                "01" => "established",
                "02" => "syn-sent",
                "06" => "time-wait",
                "08" => "close-wait",
                _ => "other",
            };
            *states.entry(name).or_insert(0) += 1;
        }
    }
    states
}

/// The kernel's count of connections dropped because a listening socket's accept queue was
/// full (TcpExt ListenOverflows, this network namespace): SYNs dropped, retried a second or
/// more later, which a client with a short connect timeout reports as a connect error.
pub fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let value = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "ListenOverflows")
            .and_then(|(_, v)| v.parse().ok());
        return value.unwrap_or(0);
    }
    0
}

/// The apiserver's port, from the KUBECONFIG's server URL.
pub fn apiserver_port() -> u16 {
    let path = std::env::var("KUBECONFIG").unwrap_or_default();
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .and_then(|url| url.rsplit(':').next()?.trim_end_matches('/').parse().ok())
        .unwrap_or(0)
}

/// A free TCP port on loopback (racy, good enough on a quiet machine).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// GET `path` from a plain-HTTP server on loopback (the operator's metrics endpoint).
pub fn http_get(port: u16, path: &str) -> String {
    let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(conn, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = conn.read_to_string(&mut body);
    body.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(body)
}

/// What the log of a child process held, for failure reports.
#[derive(Debug, Default)]
pub struct LogSummary {
    pub lines: u64,
    pub warnings: u64,
    pub errors: u64,
    /// WARN/ERROR messages (fields cut off) by count.
    pub messages: HashMap<String, u64>,
}

impl LogSummary {
    pub fn top(&self, n: usize) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> =
            self.messages.iter().map(|(m, c)| (m.clone(), *c)).collect();
        all.sort_by_key(|b| std::cmp::Reverse(b.1));
        all.truncate(n);
        all
    }
}

/// Longest log file kept (the head); the last [`TAIL_LINES`] lines are added at the end.
const LOG_CAP_BYTES: u64 = 64 << 20;
const TAIL_LINES: usize = 2000;

/// Copies the lines of `from` into `file`: the first [`LOG_CAP_BYTES`], then the last
/// [`TAIL_LINES`], counting warnings and errors by message on the way.
fn keep_log(
    from: impl Read + Send + 'static,
    file: PathBuf,
    summary: Arc<Mutex<LogSummary>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let Ok(out) = std::fs::File::create(&file) else {
            return;
        };
        let mut out = std::io::BufWriter::new(out);
        let mut written = 0u64;
        let mut dropped = 0u64;
        let mut tail: VecDeque<String> = VecDeque::new();
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            {
                let mut s = summary.lock().unwrap();
                s.lines += 1;
                let level = if line.contains(" ERROR ") {
                    s.errors += 1;
                    true
                } else if line.contains(" WARN ") {
                    s.warnings += 1;
                    true
                } else {
                    false
                };
                if level {
                    *s.messages.entry(message_of(&line)).or_default() += 1;
                }
            }
            if written < LOG_CAP_BYTES {
                written += line.len() as u64 + 1;
                let _ = writeln!(out, "{line}");
            } else {
                dropped += 1;
                tail.push_back(line);
                if tail.len() > TAIL_LINES {
                    tail.pop_front();
                }
            }
            if summary.lock().unwrap().lines.is_multiple_of(256) {
                let _ = out.flush();
            }
        }
        if dropped > 0 {
            let _ = writeln!(
                out,
                "... [bench: {} lines left out; the last {} follow] ...",
                dropped as usize - tail.len(),
                tail.len()
            );
            for line in tail {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = out.flush();
    })
}

/// The message of a text-format tracing line, without its fields: "LEVEL target: message".
fn message_of(line: &str) -> String {
    let start = line
        .find(" WARN ")
        .or_else(|| line.find(" ERROR "))
        .unwrap_or(0);
    let line = line[start..].trim();
    let cut = match line.find('=') {
        Some(eq) => line[..eq].rsplit_once(' ').map_or(line, |(head, _)| head),
        None => line,
    };
    cut.chars().take(160).collect()
}

/// `fenced-lease-operator` as a child process, its log (stderr) kept in a file.
pub struct Operator {
    child: Child,
    pub pid: u32,
    pub log: PathBuf,
    pub metrics_port: u16,
    pub started: Instant,
    summary: Arc<Mutex<LogSummary>>,
    log_thread: Option<std::thread::JoinHandle<()>>,
}

impl Operator {
    /// Starts `bin` watching `namespace` (all when `None`), its state in `state_ns`, leader
    /// election off, logging at `rust_log` in text to `log`.
    pub fn start(
        bin: &Path,
        namespace: Option<&str>,
        state_ns: &str,
        log: &Path,
        rust_log: &str,
    ) -> Res<Self> {
        let metrics_port = free_port();
        let mut command = Command::new(bin);
        if let Some(ns) = namespace {
            command.args(["--namespace", ns]);
        }
        let mut child = command
            .args([
                "--operator-namespace",
                state_ns,
                "--leader-election=false",
                "--log-format",
                "text",
            ])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .env("RUST_LOG", rust_log)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let summary = Arc::new(Mutex::new(LogSummary::default()));
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let log_thread = keep_log(stderr, log.to_path_buf(), summary.clone());
        Ok(Operator {
            pid: child.id(),
            child,
            log: log.to_path_buf(),
            metrics_port,
            started: Instant::now(),
            summary,
            log_thread: Some(log_thread),
        })
    }

    /// Is it still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its own Prometheus metrics whose name starts with `fenced_lease_`, without comments and
    /// without the per-lease series.
    pub fn metrics(&self) -> String {
        http_get(self.metrics_port, "/metrics")
            .lines()
            .filter(|l| l.starts_with("fenced_lease_") && !l.contains("_bucket{"))
            .filter(|l| !l.contains(",lease=\"")) // one series per lease
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn log_summary(&self) -> String {
        let s = self.summary.lock().unwrap();
        let mut out = format!(
            "operator log {} ({} lines so far, {} WARN, {} ERROR)",
            self.log.display(),
            s.lines,
            s.warnings,
            s.errors
        );
        for (message, count) in s.top(8) {
            out.push_str(&format!("\n  {count:>8} x {message}"));
        }
        out
    }

    /// One line of the process's figures: CPU, RSS, threads, fds and sockets, and the
    /// machine's TCP connections to the apiserver by state.
    pub fn proc_line(&self) -> String {
        let (fds, sockets) = fds(self.pid);
        format!(
            "operator pid {}: cpu {:.1} s, rss {:.1} MiB (peak {:.1}), fds {fds} ({sockets} sockets), up {:.0} s; tcp to apiserver {:?}",
            self.pid,
            cpu_seconds(self.pid),
            rss_mib(self.pid),
            peak_rss_mib(self.pid),
            self.started.elapsed().as_secs_f64(),
            tcp_states(apiserver_port())
        )
    }

    /// SIGTERM, up to 5 s for a graceful exit, then SIGKILL; the log is complete afterwards.
    pub fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.alive() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.log_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if self.log_thread.is_some() {
            self.stop();
        }
    }
}

// --- grants, as a watch sees them ----------------------------------------------------------

#[derive(Default)]
struct GrantState {
    /// Current phase by "namespace/name" (`None`: no status yet).
    phase: HashMap<String, Option<ClaimPhase>>,
    /// When each claim was first seen Granted.
    granted_at: HashMap<String, Instant>,
    /// When each claim was first seen at all.
    seen_at: HashMap<String, Instant>,
    synced: bool,
}

/// Records, by a watch on claims, when each is first seen `Granted`.
#[derive(Clone, Default)]
pub struct Grants {
    state: Arc<Mutex<GrantState>>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl Grants {
    /// Watches the claims of `namespace` (all namespaces when `None`).
    pub fn watch(client: &Client, namespace: Option<&str>) -> Self {
        let grants = Grants::default();
        let api: Api<FencedLeaseClaim> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let state = grants.state.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let mut s = state.lock().unwrap();
                match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        let k = key(&c.namespace().unwrap_or_default(), &c.name_any());
                        let phase = c.status.as_ref().and_then(|s| s.phase);
                        if phase == Some(ClaimPhase::Granted) {
                            s.granted_at.entry(k.clone()).or_insert(now);
                        }
                        s.seen_at.entry(k.clone()).or_insert(now);
                        s.phase.insert(k, phase);
                    }
                    Ok(watcher::Event::Delete(c)) => {
                        s.phase
                            .remove(&key(&c.namespace().unwrap_or_default(), &c.name_any()));
                    }
                    Ok(watcher::Event::InitDone) => s.synced = true,
                    Ok(watcher::Event::Init) | Err(_) => {}
                }
            }
        });
        grants
    }

    pub async fn synced(&self) {
        while !self.state.lock().unwrap().synced {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn granted_at(&self, ns: &str, name: &str) -> Option<Instant> {
        self.state
            .lock()
            .unwrap()
            .granted_at
            .get(&key(ns, name))
            .copied()
    }

    /// Waits until claim `ns/name` is seen Granted; fails after `timeout`.
    pub async fn wait(&self, ns: &str, name: &str, timeout: Duration) -> Res<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.granted_at(ns, name) {
                return Ok(at);
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "claim {ns}/{name} was not granted within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Claims of `ns` whose name starts with `prefix` that the watch sees with a status.
    pub fn answered(&self, ns: &str, prefix: &str) -> usize {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/{prefix}");
        s.phase
            .iter()
            .filter(|(k, p)| k.starts_with(&prefix) && p.is_some())
            .count()
    }

    /// Waits until `count` claims of `ns` named `prefix...` have a status; fails after `timeout`.
    pub async fn wait_answered(
        &self,
        ns: &str,
        prefix: &str,
        count: usize,
        timeout: Duration,
    ) -> Res<Duration> {
        let started = Instant::now();
        loop {
            let answered = self.answered(ns, prefix);
            if answered >= count {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                return fail(format!(
                    "{answered} of {count} claims {ns}/{prefix}* had a status after {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Claims of namespace `ns` ever seen Granted, and the instants of the first and last grant.
    pub fn granted_in(&self, ns: &str) -> (usize, Option<Instant>, Option<Instant>) {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/");
        let times: Vec<Instant> = s
            .granted_at
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, t)| *t)
            .collect();
        (
            times.len(),
            times.iter().min().copied(),
            times.iter().max().copied(),
        )
    }

    /// Every grant time in namespace `ns`.
    pub fn grant_times(&self, ns: &str) -> Vec<Instant> {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/");
        s.granted_at
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, t)| *t)
            .collect()
    }

    /// How many claims of `ns` the watch sees in each phase now.
    pub fn phases(&self, ns: &str) -> BTreeMap<String, usize> {
        let s = self.state.lock().unwrap();
        let prefix = format!("{ns}/");
        let mut counts = BTreeMap::new();
        for (_, phase) in s.phase.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            let name = phase.map_or("no status".to_string(), |p| format!("{p:?}"));
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }
}

/// The state of namespace `ns` as the API has it: claims by phase, leases held or not.
pub async fn api_state(client: &Client, ns: &str) -> String {
    let claims: Api<FencedLeaseClaim> = Api::namespaced(client.clone(), ns);
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut held = 0;
    let mut free = 0;
    let mut no_finalizer = 0;
    let mut no_status = 0;
    let mut continue_token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(1000);
        if let Some(c) = &continue_token {
            lp = lp.continue_token(c);
        }
        let Ok(page) = claims.list(&lp).await else {
            return "cannot list claims".into();
        };
        for c in &page.items {
            let phase = c
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map_or("no status".into(), |p| format!("{p:?}"));
            *phases.entry(phase).or_insert(0) += 1;
        }
        continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
        if continue_token.is_none() {
            break;
        }
    }
    loop {
        let mut lp = ListParams::default().limit(1000);
        if let Some(c) = &continue_token {
            lp = lp.continue_token(c);
        }
        let Ok(page) = leases.list(&lp).await else {
            return "cannot list leases".into();
        };
        for l in &page.items {
            match l.status.as_ref() {
                None => no_status += 1,
                Some(s) if s.holder.is_some() => held += 1,
                Some(_) => free += 1,
            }
            if l.finalizers().is_empty() {
                no_finalizer += 1;
            }
        }
        continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
        if continue_token.is_none() {
            break;
        }
    }
    format!(
        "namespace {ns} (from the API): claims {phases:?}; leases: {held} held, {free} free, {no_status} without status, {no_finalizer} without the finalizer"
    )
}

/// Everything worth knowing when a claim was not granted in time.
pub async fn failure_report(
    client: &Client,
    operator: &Operator,
    namespaces: &[&str],
    grants: &Grants,
) -> String {
    let mut out = vec![
        "---- operator state at the failure ----".to_string(),
        operator.proc_line(),
    ];
    for ns in namespaces {
        out.push(format!(
            "namespace {ns} (as the bench's watch sees it): claims {:?}",
            grants.phases(ns)
        ));
        out.push(api_state(client, ns).await);
    }
    out.push(format!("operator metrics:\n{}", operator.metrics()));
    out.push(operator.log_summary());
    out.join("\n")
}

// --- the apiserver's own counters ------------------------------------------------------------

/// `apiserver_request_total` of the write verbs, by "VERB resource[/subresource]".
pub async fn apiserver_writes(client: &Client) -> Res<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(vec![])?;
    let text = client.request_text(request).await?;
    let mut writes = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let verb = label("verb");
        if !matches!(
            verb.as_str(),
            "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY" | "DELETECOLLECTION"
        ) {
            continue;
        }
        let (resource, sub) = (label("resource"), label("subresource"));
        let what = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        *writes.entry(what).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(writes)
}

/// `after - before`, dropping what did not change.
pub fn diff(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

pub fn total(writes: &BTreeMap<String, f64>) -> f64 {
    writes.values().sum()
}

/// Sets the heartbeat (`spec.renewTime`) of claim `name`: the holder's one write.
pub async fn beat(claims: &Api<FencedLeaseClaim>, name: &str) -> kube::Result<()> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let patch = json!({"spec": {"renewTime": now}});
    claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// The kubeconfig the programs use; children inherit KUBECONFIG.
pub async fn client() -> Res<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        return fail("KUBECONFIG is not set: eval \"$(hack/control-plane up)\" first");
    }
    Ok(fenced_lease::client::infer().await?)
}

/// Waits for namespace `ns`'s leases to carry the operator's finalizer (it adds it before
/// the first grant); returns how many do.
pub async fn with_finalizer(client: &Client, ns: &str) -> usize {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    leases
        .list_metadata(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|m| !m.finalizers().is_empty())
                .count()
        })
        .unwrap_or(0)
}
