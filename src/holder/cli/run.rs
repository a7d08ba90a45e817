//! `kubectl fence run LEASE -- CMD`: hold the lease exactly while CMD runs, and stop CMD when
//! the lease is lost.

use std::time::Duration;

use kube::Client;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use super::{Failure, HolderArgs, acquire_options, exit};
use crate::holder::{LeaseGuard, acquire};

/// Acquires `lease`, runs `command` while holding it, and returns the exit code.
pub async fn run(
    client: Client,
    namespace: &str,
    lease: &str,
    holder: HolderArgs,
    grace: Duration,
    command: Vec<String>,
) -> Result<u8, Failure> {
    let Some((program, args)) = command.split_first() else {
        return Err(super::failure("no command given"));
    };
    let interrupted = tokio_util::sync::CancellationToken::new();
    let options = acquire_options(&holder).cancel(interrupted.clone());
    let guard = {
        let waiting = acquire(client, namespace, lease, options);
        let mut waiting = std::pin::pin!(waiting);
        tokio::select! {
            result = &mut waiting => result?,
            _ = next_signal() => {
                interrupted.cancel();
                // Let acquire withdraw its claim before reporting the interruption.
                let _ = waiting.await;
                return Ok(exit::INTERRUPTED);
            }
        }
    };
    let token = guard.token()?;
    let mut child = match Command::new(program)
        .args(args)
        .env("FENCE_TOKEN", token.to_string())
        .env("FENCE_LEASE", lease)
        .env("FENCE_HOLDER", guard.identity())
        .env("FENCE_CLAIM", guard.claim())
        .env("FENCE_NAMESPACE", namespace)
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("kubectl fence: cannot run {program}: {e}");
            release(guard).await;
            return Ok(exit::for_spawn_error(&e));
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    tracing::info!(lease, token, claim = guard.claim(), pid = ?group, "running command while holding the lease");

    loop {
        tokio::select! {
            status = child.wait() => {
                release(guard).await;
                return Ok(match status {
                    Ok(status) => exit::for_child(status),
                    Err(e) => {
                        eprintln!("kubectl fence: waiting for {program}: {e}");
                        exit::ERROR
                    }
                });
            }
            reason = guard.lost() => {
                eprintln!("kubectl fence: lost {lease} (token {token}): {reason}; stopping {program}");
                stop(&mut child, group, grace).await;
                release(guard).await;
                return Ok(exit::LOST);
            }
            sig = next_signal() => {
                // Pass it on; CMD decides how to end, and its exit ends the run.
                if let (Some(group), Some(sig)) = (group, sig) {
                    let _ = killpg(group, sig);
                }
            }
        }
    }
}

/// SIGTERM to CMD's process group, then SIGKILL if it has not exited after `grace`.
async fn stop(child: &mut Child, group: Option<Pid>, grace: Duration) {
    let Some(group) = group else {
        return;
    };
    let _ = killpg(group, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "kubectl fence: command still running after {}; killing it",
            humantime::format_duration(grace)
        );
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
    // Whatever else is left of the group (CMD exited, its children may not have).
    let _ = killpg(group, Signal::SIGKILL);
}

async fn release(guard: LeaseGuard) {
    if let Err(e) = guard.release().await {
        eprintln!("kubectl fence: could not release the claim ({e}); it expires instead");
    }
}

/// The next SIGINT, SIGTERM or SIGHUP this process receives.
pub(super) async fn next_signal() -> Option<Signal> {
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => Some(Signal::SIGINT),
        _ = term.recv() => Some(Signal::SIGTERM),
        _ = hup.recv() => Some(Signal::SIGHUP),
    }
}
