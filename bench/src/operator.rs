//! `fenced-lease-operator` as a child process: its log (stderr) kept in a file with its
//! warnings and errors counted, its metrics endpoint read, its process figures.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Res;
use crate::procfs::{apiserver_port, cpu_seconds, fds, peak_rss_mib, rss_mib, tcp_states};

/// A free TCP port on loopback (racy, good enough on a quiet machine).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// GET `path` from a plain-HTTP server on loopback (the operator's metrics endpoint).
fn http_get(port: u16, path: &str) -> String {
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
struct LogSummary {
    lines: u64,
    warnings: u64,
    errors: u64,
    /// WARN/ERROR messages (fields cut off) by count.
    messages: HashMap<String, u64>,
}

impl LogSummary {
    fn top(&self, n: usize) -> Vec<(String, u64)> {
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
