//! How a holder identifies itself and paces its heartbeats.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Options of [`acquire`](super::acquire).
#[derive(Clone, Debug, Default)]
pub struct AcquireOptions {
    /// Who is asking. Default: [`default_identity`] (`POD_NAME`, else the hostname).
    pub identity: Option<String>,
    /// The holder's Pod. Default: [`PodRef::from_env`] (`POD_NAME`, `POD_UID`).
    pub pod: Option<PodRef>,
    /// Longest wait for the grant; `None` waits until cancelled.
    pub wait: Option<Duration>,
    /// Cancels the wait (the claim is withdrawn).
    pub cancel: Option<CancellationToken>,
    /// Safety margin taken off the lease duration for the local deadline.
    /// Default: [`Timing::default_margin`].
    pub margin: Option<Duration>,
}

impl AcquireOptions {
    /// Sets the holder identity.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Gives up (and withdraws the claim) when not granted within `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Gives up (and withdraws the claim) when `cancel` is cancelled.
    pub fn cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Names the holder's Pod (ownerReference when its UID is known).
    pub fn pod(mut self, pod: PodRef) -> Self {
        self.pod = Some(pod);
        self
    }

    /// Overrides the safety margin of the local deadline.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }
}

/// The holder's own Pod: the operator annotates it with the token, and its deletion frees the
/// lease (the claim is owned by it when the UID is known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Pod name (same namespace as the lease).
    pub name: String,
    /// Pod UID, for the claim's ownerReference.
    pub uid: Option<String>,
}

impl PodRef {
    /// From the downward API variables `POD_NAME`, `POD_UID` and `POD_NAMESPACE`. `None`
    /// outside a pod, or when the pod lives in another namespace than the lease (an
    /// ownerReference cannot cross namespaces).
    pub fn from_env(lease_namespace: &str) -> Option<Self> {
        Self::from_vars(lease_namespace, |name| std::env::var(name).ok())
    }

    fn from_vars(lease_namespace: &str, var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let name = var("POD_NAME").filter(|n| !n.is_empty())?;
        if var("POD_NAMESPACE").is_some_and(|ns| !ns.is_empty() && ns != lease_namespace) {
            return None;
        }
        Some(PodRef {
            name,
            uid: var("POD_UID").filter(|u| !u.is_empty()),
        })
    }
}

/// Default holder identity: `POD_NAME`, else the hostname, else a random `holder-xxxxxxxx`.
pub fn default_identity() -> String {
    identity_from(
        std::env::var("POD_NAME").ok(),
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok()),
    )
}

fn identity_from(pod_name: Option<String>, hostname: Option<String>) -> String {
    pod_name
        .filter(|n| !n.is_empty())
        .or(hostname.filter(|h| !h.is_empty()))
        .unwrap_or_else(|| format!("holder-{:08x}", rand::random::<u32>()))
}

/// Heartbeat pacing for one lease duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The lease's `leaseDurationSeconds`.
    pub duration: Duration,
    /// Taken off the duration for the local safe deadline (clock rate drift, the operator's
    /// watch latency).
    pub margin: Duration,
    /// Time between heartbeats.
    pub renew_every: Duration,
    /// Longest wait for one API call.
    pub call_timeout: Duration,
}

impl Timing {
    /// The pacing for `duration`, with the default margin unless one is given.
    pub fn new(duration: Duration, margin: Option<Duration>) -> Self {
        let margin = margin
            .unwrap_or_else(|| Self::default_margin(duration))
            .min(duration);
        let renew_every = (duration / 3).max(Duration::from_millis(50));
        Timing {
            duration,
            margin,
            renew_every,
            call_timeout: renew_every.clamp(Duration::from_millis(250), Duration::from_secs(10)),
        }
    }

    /// A tenth of the duration, between 100 ms and 2 s.
    pub fn default_margin(duration: Duration) -> Duration {
        (duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }

    /// Pause before retry number `attempt` (1-based) of a failed heartbeat: exponential from
    /// 100 ms, at most a fifth of the renew period, with full jitter (`jitter` in 0..=1) so
    /// that many holders do not retry in step.
    pub fn retry_after(&self, attempt: u32, jitter: f64) -> Duration {
        let cap = (self.renew_every / 5).max(Duration::from_millis(20));
        let exp =
            Duration::from_millis(100).saturating_mul(1 << attempt.clamp(1, 10).saturating_sub(1));
        let full = exp.min(cap);
        full.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_prefers_pod_then_hostname_then_random() {
        assert_eq!(
            identity_from(Some("web-0".into()), Some("node".into())),
            "web-0"
        );
        assert_eq!(identity_from(None, Some("node".into())), "node");
        assert_eq!(
            identity_from(Some(String::new()), Some("node".into())),
            "node"
        );
        let random = identity_from(None, None);
        assert!(
            random.starts_with("holder-") && random.len() == 15,
            "{random}"
        );
    }

    #[test]
    fn pod_comes_from_the_downward_api_in_the_same_namespace_only() {
        let vars = |ns: Option<&'static str>| {
            move |name: &str| match name {
                "POD_NAME" => Some("web-0".to_string()),
                "POD_UID" => Some("1234".to_string()),
                "POD_NAMESPACE" => ns.map(str::to_string),
                _ => None,
            }
        };
        let same = PodRef::from_vars("prod", vars(Some("prod")));
        assert_eq!(
            same,
            Some(PodRef {
                name: "web-0".into(),
                uid: Some("1234".into())
            })
        );
        assert_eq!(PodRef::from_vars("prod", vars(None)), same);
        assert_eq!(PodRef::from_vars("prod", vars(Some("other"))), None);
        assert_eq!(PodRef::from_vars("prod", |_| None), None);
    }

    #[test]
    fn renews_three_times_per_duration_with_a_tenth_as_margin() {
        let t = Timing::new(Duration::from_secs(15), None);
        assert_eq!(t.renew_every, Duration::from_secs(5));
        assert_eq!(t.margin, Duration::from_millis(1500));
        assert_eq!(t.call_timeout, Duration::from_secs(5));
    }

    #[test]
    fn margin_is_bounded_and_never_exceeds_the_duration() {
        assert_eq!(
            Timing::new(Duration::from_secs(1), None).margin,
            Duration::from_millis(100)
        );
        assert_eq!(
            Timing::new(Duration::from_secs(3600), None).margin,
            Duration::from_secs(2)
        );
        assert_eq!(
            Timing::new(Duration::from_secs(1), Some(Duration::from_secs(5))).margin,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn retries_back_off_with_jitter_and_stay_well_inside_the_renew_period() {
        let t = Timing::new(Duration::from_secs(15), None);
        assert_eq!(t.retry_after(1, 1.0), Duration::from_millis(100));
        assert_eq!(t.retry_after(1, 0.0), Duration::from_millis(50));
        assert_eq!(t.retry_after(3, 1.0), Duration::from_millis(400));
        assert_eq!(t.retry_after(30, 1.0), Duration::from_secs(1));
        let short = Timing::new(Duration::from_secs(1), None);
        assert!(short.retry_after(5, 1.0) <= short.renew_every / 5);
    }
}
