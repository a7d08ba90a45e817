//! A candidate's process: started with its stdout read for `<kind> <unix ns>` lines, told to
//! go by a line on its stdin, released by SIGTERM, killed by SIGKILL.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use crate::{Res, fail};

/// A running candidate and what it prints.
pub(super) struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<(String, i128, Option<i32>)>,
    /// kubectl fence run's CMD says its process group after its stamp (others may print
    /// something else there: the Go candidate its token).
    pub(super) says_group: bool,
    /// Process group of kubectl fence run's CMD, to SIGKILL with it.
    cmd_group: Option<i32>,
}

impl Proc {
    pub(super) fn spawn(mut command: Command) -> Res<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut words = line.split_whitespace();
                let (Some(kind), Some(stamp)) =
                    (words.next(), words.next().and_then(|s| s.parse().ok()))
                else {
                    continue;
                };
                let extra = words.next().and_then(|w| w.parse().ok());
                let _ = tx.send((kind.to_string(), stamp, extra));
            }
        });
        let stdin = child.stdin.take();
        Ok(Proc {
            child,
            stdin,
            lines,
            says_group: false,
            cmd_group: None,
        })
    }

    /// Waits for a line starting with `kind`; returns its stamp.
    pub(super) async fn expect(&mut self, kind: &str, timeout: Duration) -> Res<i128> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some((k, stamp, extra))) if k == kind => {
                    if self.says_group && extra.is_some() {
                        self.cmd_group = extra;
                    }
                    return Ok(stamp);
                }
                Ok(Some(_)) => {}
                Ok(None) => return fail(format!("candidate exited before saying {kind}")),
                Err(_) => return fail(format!("candidate did not say {kind} within {timeout:?}")),
            }
        }
    }

    pub(super) fn go(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
            let _ = stdin.flush();
        }
    }

    pub(super) fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    /// SIGKILL, with kubectl fence run's CMD.
    pub(super) fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        if let Some(group) = self.cmd_group.take() {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// SIGTERM (a release), then wait for the exit.
    pub(super) async fn release(&mut self) {
        self.signal(Signal::SIGTERM);
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A candidate in Go (client-go's or the Go library's): both take the same flags and wait for
/// a line on stdin once ready.
pub(super) fn go_candidate(
    bin: Option<&PathBuf>,
    flag: &str,
    namespace: &str,
    lease: &str,
    identity: &str,
) -> Res<Command> {
    let bin = bin.ok_or(format!("{flag} is not set"))?;
    let mut c = Command::new(bin);
    c.args([
        "-namespace",
        namespace,
        "-name",
        lease,
        "-identity",
        identity,
    ])
    .arg("-wait-stdin");
    Ok(c)
}
