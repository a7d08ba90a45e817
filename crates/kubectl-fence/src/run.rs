//! `kubectl fence run LEASE -- CMD`: hold the lease exactly while CMD's process group runs,
//! like flock(1) and `timeout --foreground`:
//! - the lease is released only once the whole group is gone (with `--kill-group`, what CMD
//!   leaves behind is stopped instead of waited for);
//! - CMD cannot outlive `kubectl fence` (see [`child`]);
//! - when stdin is the terminal, CMD gets it (an interactive CMD can read it); Ctrl-Z stops
//!   CMD and `kubectl fence` both, `fg` continues both;
//! - the signals a shell or a supervisor sends are passed on to CMD's group, none is lost,
//!   and `kubectl fence` ends with CMD's code (128 + N for a signal N), or 128 + N when a
//!   signal N ended the wait for the lease;
//! - when the lease is lost the group gets SIGTERM, then SIGKILL after `--grace`.

use std::time::Duration;

use kube::Client;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use super::child;
use super::commands::{Waited, acquire_or_signal};
use super::signals::{Signals, stop_self};
use super::{Failure, HolderArgs, exit};
use fenced_lease::holder::{LeaseGuard, LostReason, report};

/// How often the group is looked at even without SIGCHLD (signals coalesce).
const POLL: Duration = Duration::from_millis(250);

/// What `run` does about processes CMD leaves behind in its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leftovers {
    /// Kill them (SIGTERM, SIGKILL after `grace`) rather than wait for them.
    pub kill: bool,
}

/// How CMD is run.
#[derive(Clone, Copy, Debug)]
pub struct How<'a> {
    /// What CMD's group gets after SIGTERM before SIGKILL.
    pub grace: Duration,
    pub leftovers: Leftovers,
    /// What its writes fence (FENCE_SCOPE).
    pub scope: &'a str,
    /// CMD's exit code for "a write was refused for a stale token": reported.
    pub refused_exit_code: Option<u8>,
}

/// Acquires `lease`, runs `command` while holding it, and returns the exit code.
pub async fn run(
    client: Client,
    namespace: &str,
    lease: &str,
    holder: &HolderArgs,
    request_timeout: Option<Duration>,
    how: How<'_>,
    command: &[String],
) -> Result<u8, Failure> {
    let How {
        grace,
        leftovers,
        scope,
        refused_exit_code,
    } = how;
    let Some((program, args)) = command.split_first() else {
        return Err(super::failure("no command given"));
    };
    // Listen before anything can arrive: from here on, no signal is lost.
    let mut signals = Signals::new();
    let mut sigchld = signal(SignalKind::child())
        .map_err(|e| super::failure(format!("cannot listen to SIGCHLD: {e}")))?;
    child::become_subreaper();

    let guard = match acquire_or_signal(
        client,
        namespace,
        lease,
        holder,
        request_timeout,
        &mut signals,
    )
    .await?
    {
        Waited::Granted(guard) => *guard,
        Waited::Signalled(code) => return Ok(code),
    };
    let token = guard.token()?;
    let mut cmd = match Cmd::start(program, args, &guard, token, scope) {
        Ok(cmd) => cmd,
        Err(e) => {
            eprintln!("kubectl fence: cannot run {program}: {e}");
            release(guard).await;
            return Ok(exit::for_spawn_error(&e));
        }
    };
    let ending = cmd
        .hold(&guard, &mut signals, &mut sigchld, leftovers, program)
        .await;
    let code = match ending {
        Ending::Done(code) => code,
        Ending::Leftovers(code) => {
            tracing::info!(lease, "stopping what the command left in its process group");
            cmd.stop(grace).await;
            code
        }
        Ending::Lost(reason) => {
            eprintln!("kubectl fence: lost {lease} (token {token}): {reason}; stopping {program}");
            cmd.stop(grace).await;
            exit::for_loss(&reason)
        }
    };
    if refused_exit_code.is_some_and(|refused| refused == code) {
        eprintln!(
            "kubectl fence: {program} exited {code} (--refused-exit-code): a write with token {token} was refused for a stale token; reported on FencedLease {namespace}/{lease}"
        );
        guard.report_refusal(&format!(
            "{program} exited {code} (--refused-exit-code): a write with token {token} was refused"
        ));
    }
    release(guard).await; // sends the report first
    Ok(code)
}

/// How a run ends.
enum Ending {
    /// CMD's group is gone; CMD's code.
    Done(u8),
    /// CMD exited (its code); what it left in its group is to be stopped.
    Leftovers(u8),
    /// The lease was lost.
    Lost(LostReason),
}

/// CMD and its process group.
struct Cmd {
    /// CMD's PID, which is its group's ID.
    group: Pid,
    /// CMD was given the terminal.
    tty: bool,
    /// CMD's exit code once it has ended.
    status: Option<u8>,
}

impl Cmd {
    /// Starts CMD (`program` with `args`) in a group of its own, with the lease `guard` holds,
    /// `token` and `scope` in its environment, and the terminal when this process has it.
    fn start(
        program: &str,
        args: &[String],
        guard: &LeaseGuard,
        token: i64,
        scope: &str,
    ) -> std::io::Result<Cmd> {
        let lease = guard.lease();
        let take_tty = child::owns_terminal();
        let env = [
            ("FENCE_TOKEN", token.to_string()),
            ("FENCE_SCOPE", scope.to_string()),
            ("FENCE_LEASE", lease.to_string()),
            ("FENCE_HOLDER", guard.identity().to_string()),
            ("FENCE_CLAIM", guard.claim().to_string()),
            ("FENCE_NAMESPACE", guard.namespace().to_string()),
        ];
        let group = child::spawn(program, args, &env, take_tty)?;
        if take_tty {
            child::give_terminal(group);
        }
        tracing::info!(
            lease,
            token,
            claim = guard.claim(),
            pid = group.as_raw(),
            tty = take_tty,
            "running command while holding the lease"
        );
        Ok(Cmd {
            group,
            tty: take_tty,
            status: None,
        })
    }

    /// Holds the lease while CMD's group runs: reaps, passes signals on, and says how the run
    /// ends (`program` is CMD's name, for the messages).
    async fn hold(
        &mut self,
        guard: &LeaseGuard,
        signals: &mut Signals,
        sigchld: &mut tokio::signal::unix::Signal,
        leftovers: Leftovers,
        program: &str,
    ) -> Ending {
        let mut told = false;
        loop {
            tokio::select! {
                biased;
                _ = sigchld.recv() => self.reap(),
                reason = guard.lost() => return Ending::Lost(reason),
                sig = signals.recv() => self.pass_on(sig),
                _ = tokio::time::sleep(POLL) => self.reap(),
            }
            let Some(code) = self.status else { continue };
            if !child::group_alive(self.group) {
                return Ending::Done(code);
            }
            if leftovers.kill {
                return Ending::Leftovers(code);
            }
            if !told {
                told = true;
                eprintln!(
                    "kubectl fence: {program} exited; holding {} until the processes it left in its group end (--kill-group to stop them instead)",
                    guard.lease()
                );
            }
        }
    }

    /// Reaps what ended in the group; follows CMD's own exit and stops.
    fn reap(&mut self) {
        for status in child::reap(self.group) {
            match status {
                WaitStatus::Exited(pid, code) if pid == self.group => {
                    self.status = Some(u8::try_from(code & 0xff).unwrap_or(exit::ERROR));
                    self.ended();
                }
                WaitStatus::Signaled(pid, sig, _) if pid == self.group => {
                    self.status = Some(exit::for_signal(sig));
                    self.ended();
                }
                WaitStatus::Stopped(pid, sig) if pid == self.group => self.stopped(sig),
                _ => {}
            }
        }
    }

    fn ended(&mut self) {
        if self.tty {
            child::take_terminal_back();
            self.tty = false;
        }
    }

    /// CMD stopped. With the terminal, Ctrl-Z (or a read or write it may not do) stops CMD
    /// itself: stop too, so that the shell sees the job stopped; `fg` continues both.
    fn stopped(&mut self, sig: Signal) {
        if self.tty && matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU) {
            child::take_terminal_back();
            stop_self();
            // Continued: SIGCONT arrives through `pass_on`, which continues CMD.
        }
    }

    /// Passes a signal this process received on to CMD's group.
    fn pass_on(&mut self, sig: Signal) {
        match sig {
            Signal::SIGTSTP => {
                // Ctrl-Z came to us (CMD does not have the terminal): stop CMD, then ourselves.
                child::signal_group(self.group, Signal::SIGTSTP);
                stop_self();
            }
            Signal::SIGCONT => {
                // `fg` gives us the terminal back; `bg` does not, and then CMD must not take it.
                if self.tty && child::owns_terminal() {
                    child::give_terminal(self.group);
                }
                child::signal_group(self.group, Signal::SIGCONT);
            }
            other => {
                tracing::debug!(signal = %other, "passing signal on to the command");
                child::signal_group(self.group, other);
            }
        }
    }

    /// SIGTERM to the group (and SIGCONT, in case it is stopped), SIGKILL after `grace`,
    /// then waits for the group to be gone.
    async fn stop(&mut self, grace: Duration) {
        child::signal_group(self.group, Signal::SIGTERM);
        child::signal_group(self.group, Signal::SIGCONT);
        if self.wait_gone(grace).await {
            return;
        }
        eprintln!(
            "kubectl fence: command still running after {}; killing it",
            humantime::format_duration(grace)
        );
        child::signal_group(self.group, Signal::SIGKILL);
        if !self.wait_gone(Duration::from_secs(10)).await {
            eprintln!("kubectl fence: processes of the command's group survived SIGKILL");
        }
    }

    /// Waits up to `within` for the group to be gone.
    async fn wait_gone(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            self.reap();
            if !child::group_alive(self.group) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn release(guard: LeaseGuard) {
    if let Err(e) = guard.release().await {
        eprintln!(
            "kubectl fence: could not release the claim ({}); it expires instead",
            report(&e)
        );
    }
}
