//! Fenced leader election: lead while holding the lease, with the token to stamp on every
//! write and a cancellation tied to the lease; queue again after losing it.

use std::future::Future;
use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::acquire::acquire;
use super::error::Error;
use super::guard::LeaseHandle;
use super::options::AcquireOptions;

/// Options of [`elect`].
#[derive(Clone, Debug, Default)]
pub struct ElectOptions {
    /// Identity, pod and margin of each candidacy (`wait` and `cancel` are ignored).
    pub acquire: AcquireOptions,
    /// Stops the election: the current term ends, the lease is released, `elect` returns.
    pub shutdown: CancellationToken,
}

/// Runs for leadership of `lease` until `options.shutdown` is cancelled.
///
/// Each time the lease is granted, `lead` is called with a [`LeaseHandle`]: stamp
/// `handle.token()?` on every write, and tie background work to `handle.cancellation()`.
/// When the lease is lost, the handle's cancellation fires, the future returned by `lead`
/// is dropped, and a fresh claim joins the queue. When that future completes on its own
/// the leader steps down: the lease is released and `elect` returns `Ok(())`.
///
/// Transient failures (API unavailable) are retried with backoff; a missing lease or
/// missing RBAC is returned, since waiting would not fix it.
pub async fn elect<F, Fut>(
    client: Client,
    namespace: &str,
    lease: &str,
    options: ElectOptions,
    mut lead: F,
) -> Result<(), Error>
where
    F: FnMut(LeaseHandle) -> Fut,
    Fut: Future<Output = ()>,
{
    let shutdown = options.shutdown;
    let mut failures = 0u32;
    loop {
        let mut candidacy = options.acquire.clone().cancel(shutdown.clone());
        candidacy.wait = None;
        let guard = match acquire(client.clone(), namespace, lease, candidacy).await {
            Ok(guard) => guard,
            Err(Error::Cancelled { .. }) => return Ok(()),
            Err(error) if error.is_transient() || matches!(error, Error::Kube(_)) => {
                failures += 1;
                let pause = retry_pause(failures, rand::random::<f64>());
                tracing::warn!(lease, %error, ?pause, "candidacy failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => continue,
                    _ = shutdown.cancelled() => return Ok(()),
                }
            }
            Err(error) => return Err(error),
        };
        failures = 0;
        let handle = guard.handle();
        tracing::info!(lease, claim = handle.claim(), token = ?handle.granted_token(), "leading");
        let stepped_down = tokio::select! {
            () = lead(handle.clone()) => true,
            reason = handle.lost() => {
                tracing::warn!(lease, claim = handle.claim(), %reason, "leadership lost; queueing again");
                false
            }
            _ = shutdown.cancelled() => true,
        };
        if let Err(error) = guard.release().await {
            tracing::warn!(lease, %error, "could not delete claim; it expires instead");
        }
        if stepped_down {
            return Ok(());
        }
    }
}

/// Pause before candidacy retry `attempt`: 1 s doubling to 30 s, with jitter (`jitter` in
/// 0..=1) so that a fleet does not stampede a recovering apiserver.
fn retry_pause(attempt: u32, jitter: f64) -> Duration {
    let base = Duration::from_secs(1).saturating_mul(1 << attempt.clamp(1, 6).saturating_sub(1));
    base.min(Duration::from_secs(30))
        .mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidacy_retries_back_off_to_half_a_minute() {
        assert_eq!(retry_pause(1, 1.0), Duration::from_secs(1));
        assert_eq!(retry_pause(2, 1.0), Duration::from_secs(2));
        assert_eq!(retry_pause(10, 1.0), Duration::from_secs(30));
        assert_eq!(retry_pause(10, 0.0), Duration::from_secs(15));
    }
}
