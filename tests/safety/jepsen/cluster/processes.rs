//! The processes a run keeps running: the operator replicas, each behind its own proxy, and the
//! holder processes in their slots, started, restarted when they die, as a Deployment would.

use super::*;

/// One operator replica: a process behind its own proxy, restarted when it exits (a replica
/// that loses leadership exits) unless a fault keeps it down.
pub struct Replica {
    pub name: String,
    binary: PathBuf,
    pub proxy: Proxy,
    pub(super) kubeconfig: PathBuf,
    log: PathBuf,
    namespace: String,
    pub pid: AtomicU32,
    /// A fault keeps it down: do not restart it.
    pub held_down: AtomicBool,
    restarts: AtomicU32,
}

impl Replica {
    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        tokio::process::Command::new(&self.binary)
            .args([
                "--namespace",
                &self.namespace,
                "--operator-namespace",
                &self.namespace,
            ])
            .args(["--identity", &self.name, "--leader-election=true"])
            .args([
                "--leader-election-lease-seconds",
                &LEADER_LEASE_SECONDS.to_string(),
            ])
            .args([
                "--log-format",
                "text",
                "--metrics-addr",
                "127.0.0.1:0",
                "--api-timeout",
                "5s",
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
    }

    pub fn signal(&self, signal: Signal) {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }
}

/// What kind of holder a slot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Library,
    Cli,
    /// The Go library's holder: like `Library`, but writes only to the resources that order
    /// writes by token (not the workload fenced by kind).
    Go,
    /// The Go library's holder in `-mode=lock`: as `Go`, holding the lease through package
    /// lock (a `resourcelock.Interface`) and client-go's `leaderelection` elector.
    GoLock,
    /// The Go holder in `-mode=follow`: a client-go leader of [`FOLLOWED`], which writes
    /// (the workload too) while client-go says it leads, asking nothing else.
    Follow,
}

/// One holder slot: a process (re)started for one lease, again and again.
pub struct Slot {
    pub name: String,
    pub lease: String,
    pub kind: Kind,
    /// The running incarnation: its process name (the holder identity) and pid.
    pub current: std::sync::Mutex<Option<(String, u32)>>,
    /// A library holder reaches the apiserver through its own proxy (to be cut off alone).
    pub proxy: Option<Proxy>,
}

impl Slot {
    pub fn signal(&self, signal: Signal) {
        if let Some((_, pid)) = &*self.current.lock().unwrap() {
            let _ = kill(Pid::from_raw(*pid as i32), signal);
        }
    }
}

/// The programs a slot's holder process runs: this test binary (the library holder, and the
/// writer under `kubectl fence run`), `kubectl-fence` and the Go holder.
struct Programs {
    exe: PathBuf,
    kubectl_fence: PathBuf,
    go_holder: PathBuf,
}

impl Programs {
    /// The command of `slot`'s kind of holder, as process `settings.process`.
    fn command(&self, slot: &Slot, settings: &Settings) -> tokio::process::Command {
        match slot.kind {
            Kind::Library => {
                let mut cmd = tokio::process::Command::new(&self.exe);
                cmd.env("JEPSEN_ROLE", "holder");
                cmd
            }
            Kind::Go => tokio::process::Command::new(&self.go_holder),
            Kind::GoLock => {
                let mut cmd = tokio::process::Command::new(&self.go_holder);
                cmd.arg("-mode=lock");
                cmd
            }
            Kind::Follow => {
                let mut cmd = tokio::process::Command::new(&self.go_holder);
                cmd.args(["-mode=follow", &format!("-follow={FOLLOWED}")]);
                cmd
            }
            Kind::Cli => {
                let mut cmd = tokio::process::Command::new(&self.kubectl_fence);
                cmd.args([
                    "run",
                    &slot.lease,
                    "-n",
                    &settings.namespace,
                    "--wait",
                    "60s",
                ])
                .args(["--identity", &settings.process, "--grace", "1s", "--"])
                .arg(&self.exe)
                .env("JEPSEN_ROLE", "writer");
                cmd
            }
        }
    }

    /// Starts `slot`'s holder process with `settings` in its environment, its output appended
    /// to the slot's log.
    fn spawn(&self, slot: &Slot, settings: &Settings) -> tokio::process::Child {
        let mut cmd = self.command(slot, settings);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(settings.run_dir.join(format!("{}.log", slot.name)))
            .expect("holder log");
        cmd.envs(settings.to_env())
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true);
        cmd.spawn().expect("start a holder")
    }
}

impl Cluster {
    /// The two operator replicas, each through a proxy of its own, supervised.
    pub(super) async fn start_replicas(&mut self) {
        for i in 0..2 {
            let name = format!("op-{i}");
            let proxy = Proxy::start(&self.ns).await;
            let replica = Arc::new(Replica {
                kubeconfig: proxy.kubeconfig(&self.ns, &name),
                name,
                binary: self.operator.clone(),
                proxy,
                log: self.run_dir.join(format!("op-{i}.log")),
                namespace: self.ns.name.clone(),
                pid: AtomicU32::new(0),
                held_down: AtomicBool::new(false),
                restarts: AtomicU32::new(0),
            });
            self.supervise_replica(replica.clone());
            self.replicas.push(replica);
        }
    }

    /// Every lease's holder slots, supervised; all but `kubectl fence run`'s through a proxy
    /// of their own.
    pub(super) async fn start_slots(&mut self) {
        for (lease, _) in LEASES {
            for kind in slot_kinds(lease) {
                let n = self.slots.len();
                let name = match kind {
                    Kind::Library => format!("holder-{n}"),
                    Kind::Cli => format!("cli-{n}"),
                    Kind::Go => format!("go-{n}"),
                    Kind::GoLock => format!("golock-{n}"),
                    Kind::Follow => format!("follow-{n}"),
                };
                let proxy = match kind {
                    Kind::Library | Kind::Go | Kind::GoLock | Kind::Follow => {
                        Some(Proxy::start(&self.ns).await)
                    }
                    Kind::Cli => None,
                };
                let slot = Arc::new(Slot {
                    name,
                    lease: lease.into(),
                    kind,
                    current: std::sync::Mutex::new(None),
                    proxy,
                });
                self.supervise_slot(slot.clone());
                self.slots.push(slot);
            }
        }
    }

    fn supervise_replica(&mut self, replica: Arc<Replica>) {
        let (rec, stopping) = (self.runner.clone(), self.stopping.clone());
        self.tasks.push(tokio::spawn(async move {
            loop {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if replica.held_down.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let n = replica.restarts.fetch_add(1, Ordering::SeqCst);
                let mut child = replica.spawn().expect("start fenced-lease-operator");
                let pid = child.id().unwrap_or(0);
                replica.pid.store(pid, Ordering::SeqCst);
                rec.record(Event::Spawned {
                    process: format!("{}.{n}", replica.name),
                    pid,
                    lease: String::new(),
                    pod: None,
                });
                let status = tokio::select! {
                    status = child.wait() => status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
                    () = wait_flag(&stopping) => {
                        let _ = child.kill().await;
                        "stopped by the runner".into()
                    }
                };
                replica.pid.store(0, Ordering::SeqCst);
                rec.record(Event::Exited {
                    process: format!("{}.{n}", replica.name),
                    status,
                });
                // A Deployment restarts a replica that exits, after a short pause.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }));
    }

    fn supervise_slot(&mut self, slot: Arc<Slot>) {
        let (rec, stopping) = (self.runner.clone(), self.stopping.clone());
        let pods = self.pods.clone();
        let programs = Programs {
            exe: std::env::current_exe().expect("this test binary"),
            kubectl_fence: self.kubectl_fence.clone(),
            go_holder: self.go_holder.clone(),
        };
        let base = Settings {
            process: String::new(),
            namespace: self.ns.name.clone(),
            lease: slot.lease.clone(),
            kubeconfig: PathBuf::new(),
            run_dir: self.run_dir.clone(),
            postgres: self.postgres.clone(),
            redis: self.redis.clone(),
            term: Cluster::term_of(&slot.lease),
            seed: self.seed,
            kubectl: control_plane().kubectl.clone(),
            pod: None,
        };
        self.tasks.push(tokio::spawn(async move {
            for n in 0.. {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let process = format!("{}.{n}", slot.name);
                // Its own pod, as a Deployment's new replica (retried through a restart of
                // the control plane).
                let pod = loop {
                    match pods.create(&process, slot.proxy.as_ref()).await {
                        Ok(pod) => break pod,
                        Err(_) if stopping.load(Ordering::SeqCst) => return,
                        Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                };
                let settings = Settings {
                    process: process.clone(),
                    kubeconfig: pod.kubeconfig.clone(),
                    pod: Some((pod.name.clone(), pod.uid.clone())),
                    ..base.clone()
                };
                let mut child = programs.spawn(&slot, &settings);
                let pid = child.id().unwrap_or(0);
                *slot.current.lock().unwrap() = Some((process.clone(), pid));
                rec.record(Event::Spawned {
                    process: process.clone(),
                    pid,
                    lease: slot.lease.clone(),
                    pod: Some(pod.uid),
                });
                let status = child
                    .wait()
                    .await
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                *slot.current.lock().unwrap() = None;
                rec.record(Event::Exited { process, status });
                if !stopping.load(Ordering::SeqCst) {
                    let pause = 200 + (n * 7919 + slot.name.len() as u64 * 131) % 800;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }));
    }
}

/// Builds the Go library's holder (`go/internal/cmd/jepsenholder`) into the run's `bin/`, with the
/// Go toolchain `hack/control-plane` uses (it fetches one if none is installed).
pub(super) fn build_go_holder(run_dir: &Path) -> PathBuf {
    let root = crate::common::repo_root();
    let out = run_dir.join("bin").join("jepsenholder");
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"PATH="$("$1/hack/control-plane" go-bin-dir):$PATH" GOTOOLCHAIN=local go build -o "$2" ./internal/cmd/jepsenholder"#)
        .args(["build-go-holder", &root.display().to_string(), &out.display().to_string()])
        .current_dir(root.join("go"))
        .status()
        .expect("run go build");
    assert!(
        status.success(),
        "go build of go/internal/cmd/jepsenholder failed ({status})"
    );
    out
}

/// A hard link to `binary` in the run directory, so that the whole run uses the binary it
/// started with, whatever rebuilds `target/` meanwhile (a long run outlasts many builds);
/// warns when the binary was not built from this source tree (a shared target directory).
pub(super) fn pin_binary(source: PathBuf, run_dir: &Path) -> PathBuf {
    let binary = source.display();
    let dir = run_dir.join("bin");
    std::fs::create_dir_all(&dir).expect("bin dir");
    let pinned = dir.join(source.file_name().expect("a file name"));
    if std::fs::hard_link(&source, &pinned).is_err() {
        std::fs::copy(&source, &pinned).expect("copy the binary");
    }
    let ours = common::repo_root().to_str().expect("a UTF-8 path");
    let built_here = std::process::Command::new("grep")
        .args(["-qaF", ours])
        .arg(&pinned)
        .status()
        .is_ok_and(|s| s.success());
    if !built_here {
        eprintln!(
            "jepsen: WARNING: {binary} does not name {ours}: it was built from another source tree sharing the target directory"
        );
    }
    pinned
}
