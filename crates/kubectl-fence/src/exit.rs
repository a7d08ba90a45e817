//! Exit codes of `kubectl fence`, for scripts. `run` exits with CMD's own code when CMD ran
//! to the end while the lease was held; the codes below say everything else.

use std::process::ExitStatus;

use fenced_lease::holder::{Error, LostReason};

/// Success.
pub const OK: u8 = 0;
/// Any other failure: lease not found, bad kubeconfig, unexpected API error.
pub const ERROR: u8 = 1;
/// Bad command line (clap's own code).
pub const USAGE: u8 = 2;
/// The Kubernetes API could not be reached or did not answer in time (EX_UNAVAILABLE),
/// within `--wait` when waiting.
pub const UNAVAILABLE: u8 = 69;
/// Not acquired within `--wait` (EX_TEMPFAIL): try again later.
pub const NOT_ACQUIRED: u8 = 75;
/// The lease was lost while CMD ran: CMD was sent SIGTERM, then SIGKILL after `--grace`.
pub const LOST: u8 = 76;
/// The apiserver refused a request or a heartbeat with 403 (EX_NOPERM): bind the holder
/// Role; a claim may be changed only by its creator (the pod that made it). Not a loss:
/// waiting would not help.
pub const FORBIDDEN: u8 = 77;
/// CMD exists but could not be executed (as in a shell).
pub const CANNOT_EXECUTE: u8 = 126;
/// CMD was not found (as in a shell).
pub const COMMAND_NOT_FOUND: u8 = 127;
/// The shell's code for "ended by signal N" is 128 + N.
const SIGNALLED: u8 = 128;

/// The exit code for a failed holder operation.
pub fn for_error(error: &Error) -> u8 {
    match error {
        Error::Timeout { .. } => NOT_ACQUIRED,
        Error::Cancelled { .. } => for_signal(nix::sys::signal::Signal::SIGINT),
        Error::Lost {
            reason: LostReason::Forbidden(_),
            ..
        }
        | Error::Forbidden { .. } => FORBIDDEN,
        Error::Lost { .. } => LOST,
        Error::Unavailable { .. } => UNAVAILABLE,
        _ => ERROR,
    }
}

/// The code for a lease lost while CMD ran: 77 when a heartbeat was forbidden, else 76.
pub fn for_loss(reason: &LostReason) -> u8 {
    match reason {
        LostReason::Forbidden(_) => FORBIDDEN,
        _ => LOST,
    }
}

/// 128 + N for signal N, as in a shell.
pub fn for_signal(signal: nix::sys::signal::Signal) -> u8 {
    u8::try_from(i32::from(SIGNALLED) + signal as i32).unwrap_or(ERROR)
}

/// CMD's own exit code; 128 + N when a signal N ended it, as in a shell.
pub fn for_child(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(ERROR),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(ERROR),
        (None, None) => ERROR,
    }
}

/// The exit code when CMD could not be started.
pub fn for_spawn_error(error: &std::io::Error) -> u8 {
    match error.kind() {
        std::io::ErrorKind::NotFound => COMMAND_NOT_FOUND,
        _ => CANNOT_EXECUTE,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::time::Duration;

    use super::*;
    use fenced_lease::holder::LostReason;

    #[test]
    fn holder_failures_have_distinct_codes() {
        let lease = || "db".to_string();
        let codes = [
            for_error(&Error::Timeout {
                lease: lease(),
                waited: Duration::from_secs(1),
            }),
            for_error(&Error::Lost {
                lease: lease(),
                token: Some(3),
                reason: LostReason::Expired,
            }),
            for_error(&Error::Unavailable {
                what: "x".into(),
                source: None,
            }),
            for_error(&Error::Cancelled { lease: lease() }),
            for_error(&Error::LeaseNotFound {
                namespace: "ns".into(),
                lease: lease(),
            }),
            for_error(&Error::Lost {
                lease: lease(),
                token: Some(3),
                reason: LostReason::Forbidden("no".into()),
            }),
        ];
        assert_eq!(
            codes,
            [NOT_ACQUIRED, LOST, UNAVAILABLE, 130, ERROR, FORBIDDEN]
        );
        let mut distinct = codes.to_vec();
        distinct.extend([USAGE, CANNOT_EXECUTE, COMMAND_NOT_FOUND, OK]);
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 10);
    }

    #[test]
    fn signals_map_to_128_plus_n_and_a_forbidden_heartbeat_to_77() {
        use nix::sys::signal::Signal;
        assert_eq!(for_signal(Signal::SIGINT), 130);
        assert_eq!(for_signal(Signal::SIGTERM), 143);
        assert_eq!(for_signal(Signal::SIGHUP), 129);
        assert_eq!(for_loss(&LostReason::Forbidden("x".into())), FORBIDDEN);
        assert_eq!(for_loss(&LostReason::Expired), LOST);
    }

    #[test]
    fn cmd_code_passes_through_and_signals_map_to_128_plus() {
        // Raw wait statuses: exit code in the high byte, terminating signal in the low bits.
        assert_eq!(for_child(ExitStatus::from_raw(0)), 0);
        assert_eq!(for_child(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(for_child(ExitStatus::from_raw(255 << 8)), 255);
        assert_eq!(for_child(ExitStatus::from_raw(15)), 143);
        assert_eq!(for_child(ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn spawn_failures_follow_the_shell() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(for_spawn_error(&missing), 127);
        assert_eq!(for_spawn_error(&denied), 126);
    }
}
