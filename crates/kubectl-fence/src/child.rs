//! CMD as a child of `kubectl fence run`: in a process group of its own (so that the whole
//! group can be signalled, waited for, and given the terminal), and unable to outlive
//! `kubectl fence`.
//!
//! On Linux the kernel SIGKILLs CMD when `kubectl fence` dies, however it dies (the
//! parent-death signal, `prctl(PR_SET_PDEATHSIG)`). That signal must be set in the child,
//! between fork and exec. std's only hook there, `CommandExt::pre_exec`, is `unsafe` (code
//! run after fork in a multi-threaded process must be async-signal-safe), and the crate
//! forbids unsafe code. So CMD is started through a trampoline instead: `kubectl-fence`
//! itself, run with a hidden first argument ([`TRAMPOLINE_ARG`]). It sets the parent-death
//! signal on itself (safe in nix), checks that its parent is still the process that started
//! it (else that one died before the signal was armed), takes the terminal when asked, and
//! `exec`s CMD (safe in std). The parent-death signal survives `exec`, except into a
//! set-user-ID program. It fires when the *thread* that started the child ends: the child is
//! started from a Tokio worker thread, and those live as long as the runtime.
//!
//! `kubectl fence` also makes itself a child subreaper, so that processes of CMD's group that
//! CMD leaves behind become its children: it can wait for them and reap them.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::{Command, ExitCode};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

use super::exit;

/// First argument of `kubectl-fence` when it runs as the trampoline.
pub const TRAMPOLINE_ARG: &str = "__fence_exec";

/// Blocks SIGTTOU for this process (call before any thread starts, so that all inherit it):
/// `kubectl fence` hands the terminal to CMD and back, which a background process group may
/// do only with SIGTTOU blocked or ignored; a caught SIGTTOU would make the call fail.
pub fn block_sigttou() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    if let Err(error) = set.thread_block() {
        tracing::debug!(%error, "cannot block SIGTTOU");
    }
}

/// When this process was started as the trampoline (`kubectl-fence __fence_exec PARENT TTY
/// CMD ARGS...`): become CMD. Returns only if CMD could not be run.
pub fn trampoline(args: &[OsString]) -> Option<ExitCode> {
    if args.get(1).is_none_or(|a| a != TRAMPOLINE_ARG) {
        return None;
    }
    let [parent, tty, program, rest @ ..] = &args[2..] else {
        eprintln!("kubectl fence: {TRAMPOLINE_ARG} is internal to kubectl fence run");
        return Some(ExitCode::from(exit::USAGE));
    };
    #[cfg(target_os = "linux")]
    {
        if let Err(error) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
            eprintln!("kubectl fence: cannot tie the command's life to kubectl fence: {error}");
            return Some(ExitCode::from(exit::CANNOT_EXECUTE));
        }
        if parent.to_str() != Some(nix::unistd::getppid().to_string().as_str()) {
            // kubectl fence died before the signal was armed: it will not come.
            return Some(ExitCode::from(exit::for_signal(Signal::SIGKILL)));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = parent;
    if tty == "1" {
        block_sigttou();
        let _ = tcsetpgrp(std::io::stdin(), getpgrp());
        let mut set = SigSet::empty();
        set.add(Signal::SIGTTOU);
        let _ = set.thread_unblock();
    }
    use std::os::unix::process::CommandExt;
    let error = Command::new(program).args(rest).exec();
    eprintln!(
        "kubectl fence: cannot run {}: {error}",
        program.to_string_lossy()
    );
    Some(ExitCode::from(exit::for_spawn_error(&error)))
}

/// Starts CMD in a process group of its own (its PID is the group's ID), with `env` added to
/// its environment; `take_tty`: CMD takes the terminal on stdin as its foreground group.
pub fn spawn(
    program: &str,
    args: &[String],
    env: &[(&str, String)],
    take_tty: bool,
) -> std::io::Result<Pid> {
    use std::os::unix::process::CommandExt;
    let mut command = if cfg!(target_os = "linux") {
        let mut c = Command::new("/proc/self/exe");
        c.arg0("kubectl-fence")
            .arg(TRAMPOLINE_ARG)
            .arg(std::process::id().to_string())
            .arg(if take_tty { "1" } else { "0" })
            .arg(program)
            .args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    };
    command
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .process_group(0);
    let child = command.spawn()?;
    let pid = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
    // Reaped with waitpid on its group; dropping `child` neither waits nor kills.
    drop(child);
    Ok(pid)
}

/// Makes this process a child subreaper: orphans among its descendants become its children.
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(%error, "cannot become a child subreaper");
    }
}

/// Sends `signal` to process group `group`; false if the group is gone.
pub fn signal_group(group: Pid, signal: Signal) -> bool {
    !matches!(killpg(group, signal), Err(Errno::ESRCH))
}

/// Whether any process of group `group` is still there (reap it first: a zombie counts).
pub fn group_alive(group: Pid) -> bool {
    !matches!(killpg(group, None), Err(Errno::ESRCH))
}

/// What happened to the processes of a group since last asked.
pub fn reap(group: Pid) -> Vec<WaitStatus> {
    let flags = WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED | WaitPidFlag::WCONTINUED;
    let mut seen = Vec::new();
    // -pgid: any child in that group. ECHILD: none left.
    while let Ok(status) = waitpid(Pid::from_raw(-group.as_raw()), Some(flags)) {
        if status == WaitStatus::StillAlive {
            break;
        }
        seen.push(status);
    }
    seen
}

/// Whether stdin is a terminal whose foreground process group is ours: the terminal is
/// ours to hand to CMD.
pub fn owns_terminal() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(&stdin) == Ok(getpgrp())
}

/// Makes `group` the terminal's foreground process group.
pub fn give_terminal(group: Pid) {
    if let Err(error) = tcsetpgrp(std::io::stdin(), group) {
        tracing::debug!(%error, "cannot hand the terminal over");
    }
}

/// Takes the terminal back for this process's group.
pub fn take_terminal_back() {
    give_terminal(getpgrp());
}
