//! How a holder identifies itself and paces its heartbeats.

use std::sync::OnceLock;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// Options of [`acquire`](fn@super::acquire). Build them with the methods below.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// Who is asking. Default: [`default_identity`] (unique per process).
    pub identity: Option<String>,
    /// The holder's Pod. Default: [`PodRef::from_env`] (`POD_NAME`, `POD_UID`).
    pub pod: Option<PodRef>,
    /// Longest wait for the grant; `None` waits until cancelled; zero takes the lease only
    /// if it is free (one try, see [`wait`](Self::wait)).
    pub wait: Option<Duration>,
    /// Cancels the wait (the claim is withdrawn).
    pub cancel: Option<CancellationToken>,
    /// Safety margin taken off the lease duration for the local deadline; must be shorter
    /// than the duration. Default: [`Timing::default_margin`].
    pub margin: Option<Duration>,
    /// Longest wait for one API request. Default: a third of the lease duration, between
    /// 250 ms and 10 s. A heartbeat never waits past the local safe deadline whatever this
    /// says.
    pub request_timeout: Option<Duration>,
}

impl AcquireOptions {
    /// Sets the holder identity.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Gives up (and withdraws the claim) when not granted within `wait`. Transient API
    /// errors are retried until then. It never gives up before the operator has answered
    /// its claim once (or one request timeout has passed), so `Duration::ZERO` means "take
    /// it if it is free": one try, [`Error::Timeout`](super::Error::Timeout) at once when
    /// the lease is held or others wait.
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

    /// Overrides the per-request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }
}

/// Where a pod's ServiceAccount token mount says which namespace the pod runs in.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The holder's own Pod: the operator annotates it with the token, and its deletion frees the
/// lease (the claim is owned by it when the UID is known).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodRef {
    /// Pod name (same namespace as the lease).
    pub name: String,
    /// Pod UID, for the claim's ownerReference.
    pub uid: Option<String>,
}

impl PodRef {
    /// A pod by name, and UID if known.
    pub fn new(name: impl Into<String>, uid: Option<String>) -> Self {
        PodRef {
            name: name.into(),
            uid,
        }
    }

    /// From the downward API variables `POD_NAME`, `POD_UID` and `POD_NAMESPACE` (when
    /// `POD_NAMESPACE` is unset, the namespace comes from the ServiceAccount mount,
    /// [`SERVICE_ACCOUNT_NAMESPACE_FILE`]). `None` outside a pod, or when the pod lives in
    /// another namespace than the lease (an ownerReference cannot cross namespaces).
    pub fn from_env(lease_namespace: &str) -> Option<Self> {
        Self::from_sources(
            lease_namespace,
            |name| std::env::var(name).ok(),
            || std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE).ok(),
        )
    }

    fn from_sources(
        lease_namespace: &str,
        var: impl Fn(&str) -> Option<String>,
        service_account_namespace: impl FnOnce() -> Option<String>,
    ) -> Option<Self> {
        let name = var("POD_NAME").filter(|n| !n.is_empty())?;
        let namespace = var("POD_NAMESPACE")
            .filter(|ns| !ns.is_empty())
            .or_else(|| service_account_namespace().map(|ns| ns.trim().to_string()))
            .filter(|ns| !ns.is_empty());
        if namespace.is_some_and(|ns| ns != lease_namespace) {
            tracing::debug!(
                pod = name,
                lease_namespace,
                "the pod runs in another namespace than the lease: no ownerReference"
            );
            return None;
        }
        Some(PodRef {
            name,
            uid: var("POD_UID").filter(|u| !u.is_empty()),
        })
    }
}

/// Default holder identity, unique per process (like client-go's examples): `POD_NAME`,
/// else the hostname, else `holder`, followed by a random suffix chosen once per process,
/// e.g. `web-0-3f9a1c2e`. Candidates must never share an identity: leadership is reported
/// by identity.
pub fn default_identity() -> String {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            identity_from(
                std::env::var("POD_NAME").ok(),
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok()),
                rand::random::<u32>(),
            )
        })
        .clone()
}

/// Longest holder identity the claim schema accepts.
const MAX_IDENTITY_LEN: usize = 253;

fn identity_from(pod_name: Option<String>, hostname: Option<String>, suffix: u32) -> String {
    let base = pod_name
        .filter(|n| !n.is_empty())
        .or(hostname.filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "holder".into());
    let suffix = format!("-{suffix:08x}");
    let keep = base
        .char_indices()
        .map(|(i, c)| i + c.len_utf8())
        .take_while(|end| *end <= MAX_IDENTITY_LEN - suffix.len())
        .last()
        .unwrap_or(0);
    format!("{}{suffix}", &base[..keep])
}

/// Heartbeat pacing for one lease duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timing {
    /// The lease duration in force (the term's, once granted).
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
    /// The pacing for `duration`, with the default margin unless one is given (callers
    /// check beforehand that it is shorter than the duration).
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

    /// The same pacing with another per-call timeout (`None` keeps the default).
    pub fn with_call_timeout(mut self, call_timeout: Option<Duration>) -> Self {
        if let Some(t) = call_timeout.filter(|t| !t.is_zero()) {
            self.call_timeout = t;
        }
        self
    }

    /// A tenth of the duration, between 100 ms and 2 s.
    pub fn default_margin(duration: Duration) -> Duration {
        (duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }

    /// Pause before retry number `attempt` (1-based) of a failed heartbeat: 100 ms doubling
    /// at most nine times, to at most a fifth of the renew period, with jitter (`jitter` in
    /// 0..=1: 0 takes off half, 1 nothing) so that many holders do not retry in step.
    pub fn retry_after(&self, attempt: u32, jitter: f64) -> Duration {
        let cap = (self.renew_every / 5).max(Duration::from_millis(20));
        Backoff::new(Duration::from_millis(100), cap, 0.5).delay(attempt.min(10), jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_pod_then_hostname_then_holder_with_a_per_process_suffix() {
        assert_eq!(
            identity_from(Some("web-0".into()), Some("node".into()), 0x3f9a1c2e),
            "web-0-3f9a1c2e"
        );
        assert_eq!(identity_from(None, Some("node".into()), 1), "node-00000001");
        assert_eq!(
            identity_from(Some(String::new()), Some("node".into()), 1),
            "node-00000001"
        );
        assert_eq!(identity_from(None, None, 1), "holder-00000001");
        let long = identity_from(Some("p".repeat(300)), None, 1);
        assert_eq!(long.len(), MAX_IDENTITY_LEN);
        assert!(long.ends_with("p-00000001"));
        // One identity per process: every call answers the same.
        assert_eq!(default_identity(), default_identity());
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
        let web_0 = Some(PodRef::new("web-0", Some("1234".into())));
        assert_eq!(
            PodRef::from_sources("prod", vars(Some("prod")), || None),
            web_0
        );
        assert_eq!(PodRef::from_sources("prod", vars(None), || None), web_0);
        assert_eq!(
            PodRef::from_sources("prod", vars(Some("other")), || None),
            None
        );
        assert_eq!(PodRef::from_sources("prod", |_| None, || None), None);
    }

    #[test]
    fn without_pod_namespace_the_service_account_mount_says_where_the_pod_runs() {
        let vars = |name: &str| match name {
            "POD_NAME" => Some("web-0".to_string()),
            _ => None,
        };
        let sa = |ns: &'static str| move || Some(ns.to_string());
        assert_eq!(
            PodRef::from_sources("prod", vars, sa("prod\n")),
            Some(PodRef::new("web-0", None))
        );
        assert_eq!(PodRef::from_sources("prod", vars, sa("other")), None);
        // POD_NAMESPACE wins over the mount.
        let with_ns = |name: &str| match name {
            "POD_NAME" => Some("web-0".to_string()),
            "POD_NAMESPACE" => Some("prod".to_string()),
            _ => None,
        };
        assert!(PodRef::from_sources("prod", with_ns, sa("other")).is_some());
    }

    #[test]
    fn renews_three_times_per_duration_with_a_tenth_as_margin() {
        let t = Timing::new(Duration::from_secs(15), None);
        assert_eq!(t.renew_every, Duration::from_secs(5));
        assert_eq!(t.margin, Duration::from_millis(1500));
        assert_eq!(t.call_timeout, Duration::from_secs(5));
        let t = t.with_call_timeout(Some(Duration::from_secs(2)));
        assert_eq!(t.call_timeout, Duration::from_secs(2));
        assert_eq!(
            t.with_call_timeout(Some(Duration::ZERO)).call_timeout,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn default_margin_is_bounded() {
        assert_eq!(
            Timing::new(Duration::from_secs(1), None).margin,
            Duration::from_millis(100)
        );
        assert_eq!(
            Timing::new(Duration::from_secs(3600), None).margin,
            Duration::from_secs(2)
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
        // Nine doublings at most, however long the renew period.
        let long = Timing::new(Duration::from_secs(3600), None);
        assert_eq!(long.retry_after(10, 1.0), Duration::from_millis(51_200));
        assert_eq!(long.retry_after(30, 1.0), Duration::from_millis(51_200));
    }
}
