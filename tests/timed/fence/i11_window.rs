//! I11's window against I6's margin. The identity fence reads the lease from the apiserver's
//! informer cache, so after a grant the old holder's pod can still write for a short window.
//! That window matters only for writes the old holder's library still allowed, and those were
//! all sent before its local safe deadline. So, with the real operator and the real holder
//! library, a lease goes from pod A, which stalls (its connections are cut, as a partition or
//! a frozen VM would), to pod B, queued; on one clock the test takes
//!   - `deadline`: A's local safe deadline, from which its `token()` fails;
//!   - `grant`: B's grant, the lease's `acquireTime`, which the operator reads just before its
//!     status write (so it is no later than the write);
//!   - `refused`: the answer to the first of A's writes (dry-run creates as pod A, with its
//!     pod-bound token, back to back from the stall on) that the identity rule refused;
//!
//! and asserts, with the default margin `m` (200 ms for this 2 s lease):
//!   - `deadline + m − ALLOWANCE ≤ grant`: A's library stopped handing out its token at
//!     least a margin before the grant was written. Every write it allowed was sent before
//!     `deadline`, so one that reaches the apiserver after the grant spent at least that long
//!     on the way;
//!   - `refused − grant < m`: the identity rule refused A less than a margin after the grant
//!     (`refused` bounds the window from above). So a write of A passes after the grant only
//!     if it was held up for longer than the margin and arrives within the window; one that
//!     was not held up reached the apiserver before the grant, while A was still the holder;
//!   - A's writes were still accepted after `deadline`, and first refused after `grant`: the
//!     library stops A first, the fence follows, and it never refuses a holder inside its
//!     deadline (nor did `token()` answer `Ok` past `deadline`, I6).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::operator::OperatorProcess;
use common::pods::TestPod;
use common::proxy::Proxy;
use common::{TestNamespace, client_from_kubeconfig, wait_for};
use fenced_lease::api::FencedLease;
use fenced_lease::holder::{AcquireOptions, LeaseHandle, PodRef, Timing, acquire};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// Lease duration (seconds); the default margin is a tenth of it.
const D: u64 = 2;
const WAIT: Duration = Duration::from_secs(60);
/// What comparing instants of two clocks may be off by: A's deadline is kept on the boot
/// clock and converted to the wall clock, on which the operator writes `acquireTime` (in
/// microseconds); their rates differ by NTP's slew at most (500 ppm: 1 ms over the 2 s from
/// A's last renew to the grant).
const ALLOWANCE: Duration = Duration::from_millis(5);

/// Lease `books`, fencing the namespace's ConfigMaps by kind.
fn lease() -> String {
    format!(
        "apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {{name: books}}\nspec:\n  leaseDurationSeconds: {D}\n  fence: {{resources: [{{resource: configmaps}}]}}\n"
    )
}

/// The instants around `token()`'s last `Ok`: read before the last call that answered `Ok`,
/// and after the first that did not.
#[derive(Clone, Copy, Debug, Default)]
struct TokenAnswers {
    last_ok: Option<SystemTime>,
    first_err: Option<SystemTime>,
}

/// Asks `token()` every millisecond until it fails.
fn watch_token(handle: LeaseHandle) -> Arc<Mutex<TokenAnswers>> {
    let answers = Arc::new(Mutex::new(TokenAnswers::default()));
    let recorded = answers.clone();
    tokio::spawn(async move {
        loop {
            let asked = SystemTime::now();
            if handle.token().is_err() {
                recorded.lock().unwrap().first_err = Some(SystemTime::now());
                return;
            }
            recorded.lock().unwrap().last_ok = Some(asked);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    answers
}

/// A's writes, sent back to back until one is refused.
#[derive(Debug)]
struct Probes {
    accepted: usize,
    /// Send time of the last accepted write.
    last_accepted_sent: Option<SystemTime>,
    /// Send and answer times of the first refused write, and the apiserver's message.
    refused_sent: SystemTime,
    refused_answered: SystemTime,
    message: String,
}

/// How the apiserver answered one of A's writes.
enum Answer {
    Accepted,
    /// Refused by the identity rule, with its message.
    Refused(String),
}

/// A dry-run create of a ConfigMap (a kind the lease fences) as the client's pod.
async fn write_as_pod(configmaps: &Api<ConfigMap>) -> Result<Answer, kube::Error> {
    let probe = ConfigMap {
        metadata: ObjectMeta {
            name: Some("probe".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match configmaps.create(&dry_run, &probe).await {
        Ok(_) => Ok(Answer::Accepted),
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("does not hold") => {
            Ok(Answer::Refused(s.message))
        }
        Err(e) => Err(e),
    }
}

/// Writes as A back to back until the identity rule refuses one.
async fn probe_until_refused(configmaps: Api<ConfigMap>) -> Probes {
    let give_up = SystemTime::now() + WAIT;
    let (mut accepted, mut last_accepted_sent) = (0, None);
    loop {
        let sent = SystemTime::now();
        let answer = tokio::time::timeout(WAIT, write_as_pod(&configmaps))
            .await
            .expect("an answer to A's write")
            .expect("A's write accepted, or refused by the identity rule");
        let answered = SystemTime::now();
        match answer {
            Answer::Accepted => {
                accepted += 1;
                last_accepted_sent = Some(sent);
            }
            Answer::Refused(message) => {
                return Probes {
                    accepted,
                    last_accepted_sent,
                    refused_sent: sent,
                    refused_answered: answered,
                    message,
                };
            }
        }
        assert!(
            answered < give_up,
            "A's writes were still accepted {WAIT:?} after it stalled"
        );
    }
}

async fn pod_client(ns: &TestNamespace, pod: &TestPod) -> Client {
    client_from_kubeconfig(&ns.kubeconfig_as_pod(pod).await).await
}

fn wall(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(t.0.as_microsecond()).unwrap())
}

/// `later − earlier` in milliseconds, negative when `later` is not later.
fn ms(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    }
}

/// A's library reaches the apiserver through a proxy the test cuts; A's writes and B go
/// directly. Both authenticate as their pods.
struct Clients {
    a_proxy: Proxy,
    a_library: Client,
    a_writes: Api<ConfigMap>,
    b_library: Client,
}

async fn clients(ns: &TestNamespace, pa: &TestPod, pb: &TestPod) -> Clients {
    let a_proxy = Proxy::start(ns).await;
    let a_kubeconfig = a_proxy.rewrite(
        &ns.kubeconfig_as_pod(pa).await,
        &std::env::temp_dir().join(format!("{}-pa-proxied.kubeconfig", ns.name)),
    );
    let a_library = client_from_kubeconfig(&a_kubeconfig).await;
    let a_writes: Api<ConfigMap> = Api::namespaced(pod_client(ns, pa).await, &ns.name);
    let b_library = pod_client(ns, pb).await;
    // RBAC bindings reach the authorizer with a delay; the library takes a 403 as final.
    let leases: Api<FencedLease> = Api::namespaced(b_library.clone(), &ns.name);
    wait_for("the pods' holder Role in force", WAIT, || async {
        leases.get("books").await.ok()
    })
    .await;
    Clients {
        a_proxy,
        a_library,
        a_writes,
        b_library,
    }
}

fn options(pod: &TestPod) -> AcquireOptions {
    AcquireOptions::default()
        .identity(pod.name.clone())
        .pod(PodRef::new(pod.name.clone(), Some(pod.uid.clone())))
        .wait(WAIT)
}

/// B acquires books, in a task of its own, and is queued once this returns.
async fn b_queues(
    ns: &TestNamespace,
    pb: &TestPod,
    b_library: Client,
) -> tokio::task::JoinHandle<Result<fenced_lease::holder::LeaseGuard, fenced_lease::holder::Error>>
{
    let b = tokio::spawn({
        let (ns, options) = (ns.name.clone(), options(pb));
        async move { acquire(b_library, &ns, "books", options).await }
    });
    let admin_leases: Api<FencedLease> = ns.api();
    wait_for("B to queue", WAIT, || async {
        let lease = admin_leases.get("books").await.ok()?;
        (lease.status?.waiting == 1).then_some(())
    })
    .await;
    b
}

/// The lease names B's pod with B's token `b_token`, and A was refused as B's grant says:
/// the grant's instant (the lease's `acquireTime`).
async fn granted_to_b(
    ns: &TestNamespace,
    pb: &TestPod,
    b_token: i64,
    probes: &Probes,
) -> SystemTime {
    let status = ns
        .api::<FencedLease>()
        .get("books")
        .await
        .expect("read lease")
        .status
        .expect("status");
    let holder = status.holder.expect("a holder");
    assert_eq!(
        (holder.pod_uid.as_deref(), status.fencing_token),
        (Some(pb.uid.as_str()), b_token),
        "the lease names B's pod with B's token"
    );
    assert!(
        probes
            .message
            .contains(&format!("pod {} holds it", pb.name)),
        "A refused as B's grant says: {}",
        probes.message
    );
    wall(status.acquire_time.as_ref().expect("acquireTime"))
}

/// The instants the test compares, on the wall clock.
struct Instants {
    /// A's local safe deadline.
    deadline: SystemTime,
    /// B's grant (the lease's `acquireTime`).
    grant: SystemTime,
    /// Before A's last `token()` call that answered `Ok`, and after its first that did not.
    last_ok: SystemTime,
    first_err: SystemTime,
    /// The send time of A's last accepted write.
    last_accepted: SystemTime,
}

/// The instants, relative to A's deadline, for the test's log and its failure message.
fn timeline(i: &Instants, probes: &Probes, margin: Duration, op_log: &std::path::Path) -> String {
    format!(
        "margin {margin:?}, allowance {ALLOWANCE:?}; on the wall clock, relative to A's deadline:\n\
         \x20 A's last token() = Ok asked   {:+9.3} ms\n\
         \x20 A's first token() = Err seen  {:+9.3} ms\n\
         \x20 B's grant (acquireTime)       {:+9.3} ms\n\
         \x20 A's last accepted write sent  {:+9.3} ms ({} accepted after the stall)\n\
         \x20 A's first refused write sent  {:+9.3} ms, answered {:+9.3} ms\n\
         \x20 window (refused answer − grant) {:.3} ms\n\
         operator log: {}",
        ms(i.last_ok, i.deadline),
        ms(i.first_err, i.deadline),
        ms(i.grant, i.deadline),
        ms(i.last_accepted, i.deadline),
        probes.accepted,
        ms(probes.refused_sent, i.deadline),
        ms(probes.refused_answered, i.deadline),
        ms(probes.refused_answered, i.grant),
        op_log.display(),
    )
}

/// What of the module's rules the instants break.
fn broken(i: &Instants, probes: &Probes, margin: Duration) -> Vec<&'static str> {
    let mut broken = Vec::new();
    if i.last_ok > i.deadline + ALLOWANCE {
        broken.push("A's token() answered Ok past its deadline (I6)");
    }
    if i.grant < i.deadline + margin - ALLOWANCE {
        broken.push("B was granted less than a margin after A's library stopped");
    }
    if probes.refused_answered >= i.grant + margin {
        broken.push("the identity fence refused A only a margin or more after the grant");
    }
    if i.last_accepted <= i.deadline {
        broken.push("A's writes were refused while its library still held (no write of A accepted past its deadline)");
    }
    if probes.refused_answered <= i.grant {
        broken.push("A's write was refused before B's grant was written");
    }
    broken
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i11_the_old_holders_library_stops_a_margin_before_the_grant_and_the_fence_within_it() {
    let ns = TestNamespace::new("i11-window").await;
    ns.with_fence_policies().await;
    let op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let out = ns.kubectl_apply(&lease());
    assert!(out.status.success(), "{}", common::cli::both(&out));
    let margin = Timing::default_margin(Duration::from_secs(D));
    let c = clients(&ns, pa, pb).await;

    let a = acquire(c.a_library, &ns.name, "books", options(pa))
        .await
        .expect("A acquires the free lease");
    let a_token = a.token().expect("A holds");
    let a_answers = watch_token(a.handle());
    // A may write once the apiserver's cache shows its grant (and RBAC lets it create
    // ConfigMaps).
    wait_for("A's writes accepted", WAIT, || async {
        matches!(write_as_pod(&c.a_writes).await, Ok(Answer::Accepted)).then_some(())
    })
    .await;
    let b = b_queues(&ns, pb, c.b_library).await;

    // A stalls: its heartbeats stop. It keeps writing directly until the apiserver refuses.
    c.a_proxy.cut();
    let probes = tokio::spawn(probe_until_refused(c.a_writes.clone()));
    let b = b
        .await
        .expect("B's task")
        .expect("B is granted once A expires");
    let b_token = b.token().expect("B holds");
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    let probes = probes.await.expect("A's writes");

    let ago = a
        .deadline_from_now()
        .expect_err("A's deadline has passed by B's grant");
    let deadline = SystemTime::now() - ago;
    let answers = *a_answers.lock().unwrap();
    let grant = granted_to_b(&ns, pb, b_token, &probes).await;
    let instants = Instants {
        deadline,
        grant,
        last_ok: answers.last_ok.expect("A's token() answered Ok"),
        first_err: answers.first_err.expect("A's token() failed"),
        last_accepted: probes.last_accepted_sent.expect("a write of A accepted"),
    };
    let timeline = timeline(&instants, &probes, margin, &op.log);
    eprintln!("{timeline}");
    let broken = broken(&instants, &probes, margin);
    assert!(broken.is_empty(), "{}\n{timeline}", broken.join("\n"));
    drop(b);
}
