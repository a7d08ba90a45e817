//! Exit codes of `kubectl fence`, for scripts. `run` exits with CMD's own code when CMD ran
//! to the end while the lease was held; the codes below say everything else.

use std::process::ExitStatus;

use crate::holder::Error;

/// Success.
pub const OK: u8 = 0;
/// Any other failure: lease not found, bad kubeconfig, unexpected API error.
pub const ERROR: u8 = 1;
/// Bad command line (clap's own code).
pub const USAGE: u8 = 2;
/// The Kubernetes API could not be reached or did not answer in time (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// Not acquired within `--wait` (EX_TEMPFAIL): try again later.
pub const NOT_ACQUIRED: u8 = 75;
/// The lease was lost while CMD ran: CMD was sent SIGTERM, then SIGKILL after `--grace`.
pub const LOST: u8 = 76;
/// RBAC refused a request (EX_NOPERM): bind the holder Role.
pub const FORBIDDEN: u8 = 77;
/// CMD exists but could not be executed (as in a shell).
pub const CANNOT_EXECUTE: u8 = 126;
/// CMD was not found (as in a shell).
pub const COMMAND_NOT_FOUND: u8 = 127;
/// Interrupted (SIGINT) while waiting for the lease: 128 + 2, as in a shell.
pub const INTERRUPTED: u8 = 130;

/// The exit code for a failed holder operation.
pub fn for_error(error: &Error) -> u8 {
    match error {
        Error::Timeout { .. } => NOT_ACQUIRED,
        Error::Cancelled { .. } => INTERRUPTED,
        Error::Lost { .. } => LOST,
        Error::Forbidden { .. } => FORBIDDEN,
        Error::Unavailable { .. } => UNAVAILABLE,
        Error::LeaseNotFound { .. } | Error::Kube(_) => ERROR,
    }
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
    use crate::holder::LostReason;

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
        ];
        assert_eq!(codes, [NOT_ACQUIRED, LOST, UNAVAILABLE, INTERRUPTED, ERROR]);
        let mut distinct = codes.to_vec();
        distinct.extend([FORBIDDEN, USAGE, CANNOT_EXECUTE, COMMAND_NOT_FOUND, OK]);
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 10);
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
