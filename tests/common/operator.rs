//! The operator as a real process, for integration tests: started, killed, restarted.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::control_plane;

/// A running `fenced-lease-operator`, SIGKILLed when dropped.
pub struct OperatorProcess {
    child: Option<Child>,
    pub log: PathBuf,
    namespace: String,
    extra: Vec<String>,
    kubeconfig: PathBuf,
}

impl OperatorProcess {
    /// Starts an operator that watches `namespace` (and keeps its state there, unless `extra`
    /// names another `--operator-namespace`), leader election off, metrics on a free port.
    /// `extra` adds flags; the pseudo-flag `--all-namespaces` makes it watch every namespace.
    pub fn start(namespace: &str, extra: &[&str]) -> Self {
        Self::start_as(namespace, extra, &control_plane().kubeconfig)
    }

    /// Like [`start`](Self::start), authenticating with `kubeconfig`.
    pub fn start_as(namespace: &str, extra: &[&str], kubeconfig: &std::path::Path) -> Self {
        let log = std::env::temp_dir().join(format!(
            "{namespace}-operator-{:08x}.log",
            rand::random::<u32>()
        ));
        let mut op = Self {
            child: None,
            log,
            namespace: namespace.into(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            kubeconfig: kubeconfig.to_path_buf(),
        };
        op.spawn();
        op
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("operator log");
        let child = Command::new(crate::bin("fenced-lease-operator"))
            .args(
                ["--operator-namespace", &self.namespace]
                    .into_iter()
                    .filter(|_| !self.extra.iter().any(|a| a == "--operator-namespace")),
            )
            .args(
                ["--namespace", &self.namespace]
                    .into_iter()
                    .filter(|_| !self.extra.iter().any(|a| a == "--all-namespaces")),
            )
            .args(["--log-format", "text", "--metrics-addr", "127.0.0.1:0"])
            .args(
                self.extra
                    .iter()
                    .all(|a| !a.starts_with("--leader-election"))
                    .then_some("--leader-election=false"),
            )
            .args(self.extra.iter().filter(|a| *a != "--all-namespaces"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,fenced_lease=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start fenced-lease-operator");
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: no cleanup, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait for a graceful exit; returns whether it exited within `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGSTOP: the process is frozen (a GC pause, a throttled container, a frozen VM).
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the operator");
    }

    /// Starts the same operator again (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The value of the unlabelled series `name` on the operator's `/metrics` (`None`: the
    /// page or the series is missing).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, page) = super::http_get(self.http_port().await, "/metrics").await?;
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The port of /metrics, /livez and /readyz, read from the log once it is serving.
    pub async fn http_port(&self) -> u16 {
        super::wait_for(
            "the operator to serve HTTP",
            Duration::from_secs(30),
            || async {
                self.log_text()
                    .lines()
                    .filter(|l| l.contains("serving /livez"))
                    .filter_map(|l| l.split("addr=127.0.0.1:").nth(1))
                    .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
                    .next_back()
            },
        )
        .await
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- operator log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}
