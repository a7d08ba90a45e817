//! How long one `acquire` may keep trying, and how it paces its retries: every call of a wait
//! goes through its [`Budget`], which gives up at the wait's end or when it is cancelled.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::error::{Error, report};
use super::options::AcquireOptions;
use crate::backoff::Backoff;

/// How long one `acquire` may keep trying.
pub(super) struct Budget {
    pub(super) lease: String,
    pub(super) started: Instant,
    pub(super) give_up: Option<Instant>,
    /// A zero wait: one try, no retries.
    pub(super) once: bool,
    pub(super) cancel: CancellationToken,
}

impl Budget {
    /// The budget `options` give a wait for `lease`, starting now.
    pub(super) fn new(lease: &str, options: &AcquireOptions) -> Self {
        Budget {
            lease: lease.into(),
            started: Instant::now(),
            give_up: options.wait.map(|w| Instant::now() + w),
            once: options.wait == Some(Duration::ZERO),
            cancel: options.cancel.clone().unwrap_or_default(),
        }
    }

    pub(super) fn timed_out(&self) -> Error {
        Error::Timeout {
            lease: self.lease.clone(),
            waited: self.started.elapsed(),
        }
    }

    pub(super) fn cancelled(&self) -> Error {
        Error::Cancelled {
            lease: self.lease.clone(),
        }
    }

    pub(super) fn over(&self) -> bool {
        self.give_up.is_some_and(|at| Instant::now() >= at)
    }

    /// One API call with a timeout; `Err(Cancelled)` if the caller cancels meanwhile.
    pub(super) async fn call<T>(
        &self,
        what: &str,
        call_timeout: Duration,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, Error>, Error> {
        tokio::select! {
            r = timeout(call_timeout, call) => Ok(match r {
                Ok(result) => result.map_err(|e| Error::from_kube(what, e)),
                Err(_) => Err(Error::timed_out(what, call_timeout)),
            }),
            _ = self.cancel.cancelled() => Err(self.cancelled()),
        }
    }

    /// Waits before retry `attempt` after `error`; `Err` (the error itself) when the wait
    /// would end first, or `Err(Cancelled)`.
    pub(super) async fn pause(&self, attempt: u32, error: Error) -> Result<(), Error> {
        if self.once || !error.is_transient() {
            return Err(error);
        }
        let pause = WAIT_BACKOFF
            .pause(attempt)
            .max(error.retry_after().unwrap_or_default().min(MAX_PAUSE));
        if self.give_up.is_some_and(|at| Instant::now() + pause >= at) {
            return Err(error);
        }
        // Once per outage at WARN; the retries that follow at DEBUG.
        if attempt == 1 {
            tracing::warn!(lease = %self.lease, error = %report(&error), ?pause, "API request failed; retrying until the wait is over");
        } else {
            tracing::debug!(lease = %self.lease, error = %report(&error), attempt, ?pause, "API request failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => Ok(()),
            _ = self.cancel.cancelled() => Err(self.cancelled()),
        }
    }

    /// Calls until an answer, retrying transient failures within the wait.
    pub(super) async fn retry<T, F, Fut>(
        &self,
        what: &str,
        call_timeout: Duration,
        mut call: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut attempt = 0;
        loop {
            match self.call(what, call_timeout, call()).await? {
                Ok(value) => return Ok(value),
                Err(error) => {
                    attempt += 1;
                    self.pause(attempt, error).await?;
                }
            }
        }
    }
}

/// Longest pause between retries while waiting.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Pauses between retries while waiting: 200 ms doubling to 5 s, between half and all of it
/// by chance, so that a fleet does not stampede a recovering apiserver.
const WAIT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), MAX_PAUSE, 0.5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_retries_back_off_to_five_seconds_with_jitter() {
        assert_eq!(WAIT_BACKOFF.delay(1, 1.0), Duration::from_millis(200));
        assert_eq!(WAIT_BACKOFF.delay(1, 0.0), Duration::from_millis(100));
        assert_eq!(WAIT_BACKOFF.delay(3, 1.0), Duration::from_millis(800));
        assert_eq!(WAIT_BACKOFF.delay(30, 1.0), Duration::from_secs(5));
    }
}
