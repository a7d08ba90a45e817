//! Safety at the edges (I9, I6): a holder that keeps renewing is never expired, whatever
//! happens to the operator alone — cut off from the apiserver, or frozen — and when a holder
//! does lose the lease, the next grant comes only after its own safe deadline, by at least
//! its margin. Each scenario runs several times.
//!
//! The operator reaches the apiserver through a loopback proxy (`tests/common/proxy.rs`) the
//! test cuts and heals; holder A through another; holder B directly.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::operator::OperatorProcess;
use common::proxy::Proxy;
use common::{TestNamespace, wait_for};
use fenced_lease::api::FencedLease;
use fenced_lease::holder::{AcquireOptions, Error, LeaseGuard, Timing, acquire};
use tokio::task::JoinHandle;

/// Lease duration of these scenarios (seconds).
const D: u64 = 2;
const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The operator's connections are dropped and refused, then let through again.
    Partition(Duration),
    /// The operator is SIGSTOPped, then SIGCONTed; while it is frozen its connections are
    /// dropped, as a peer's keepalive does to a frozen VM, so what it missed is not waiting in
    /// a socket buffer when it wakes.
    Pause(Duration),
}

/// The wall-clock time of the last `token()` that answered `Ok`, kept by a task that asks
/// every few milliseconds until the answer is an error.
fn watch_token_answers(handle: fenced_lease::holder::LeaseHandle) -> Arc<Mutex<SystemTime>> {
    let last_ok = Arc::new(Mutex::new(SystemTime::now()));
    let recorded = last_ok.clone();
    tokio::spawn(async move {
        while handle.token().is_ok() {
            *recorded.lock().unwrap() = SystemTime::now();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    last_ok
}

async fn holder_of(ns: &TestNamespace, lease: &str) -> Option<String> {
    let lease = ns.api::<FencedLease>().get(lease).await.ok()?;
    Some(lease.status?.holder?.claim)
}

/// B acquires lease l directly, in a task of its own, and is queued once this returns.
async fn b_queues(ns: &TestNamespace) -> JoinHandle<Result<LeaseGuard, Error>> {
    let b = tokio::spawn({
        let (client, ns) = (ns.holder_client().await, ns.name.clone());
        async move {
            acquire(
                client,
                &ns,
                "l",
                AcquireOptions::default()
                    .identity("B")
                    .wait(Duration::from_secs(120)),
            )
            .await
        }
    });
    wait_for("B to queue", WAIT, || async {
        let lease = ns.api::<FencedLease>().get("l").await.ok()?;
        (lease.status?.waiting == 1).then_some(())
    })
    .await;
    b
}

/// The fault, on the operator alone (it reaches the apiserver through `op_proxy`).
async fn inflict(fault: Fault, op: &OperatorProcess, op_proxy: &Proxy) {
    match fault {
        Fault::Partition(outage) => {
            op_proxy.cut();
            tokio::time::sleep(outage).await;
            op_proxy.heal();
            assert!(
                op_proxy.refused() > 0,
                "the operator never tried to reach the apiserver while cut"
            );
        }
        Fault::Pause(outage) => {
            op.pause();
            op_proxy.cut();
            tokio::time::sleep(outage).await;
            op_proxy.heal();
            op.resume();
        }
    }
}

/// The operator works again (it grants another lease) — and for a whole lease duration
/// after that, A (claim `a_claim`) still holds: nothing the operator missed counts against it.
async fn a_still_holds_after(
    fault: Fault,
    attempt: usize,
    ns: &TestNamespace,
    op: &OperatorProcess,
    a: &LeaseGuard,
    a_claim: &str,
) {
    let probe = format!("probe-{attempt}");
    ns.create_claim(&probe, "probe", None).await;
    wait_for("the operator to grant again", WAIT, || {
        ns.granted_token(&probe)
    })
    .await;
    let until = Instant::now() + Duration::from_secs(D) + Duration::from_secs(1);
    while Instant::now() < until {
        assert!(
            a.token().is_ok(),
            "{fault:?}: A lost the lease although it kept renewing: {:?}\n{}",
            a.state(),
            op.log_text()
        );
        assert_eq!(
            holder_of(ns, "l").await.as_deref(),
            Some(a_claim),
            "{fault:?}: the lease went to someone else while A kept renewing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The instant of lease l's grant, its `acquireTime`.
async fn granted_at(ns: &TestNamespace) -> SystemTime {
    let lease = ns.api::<FencedLease>().get("l").await.unwrap();
    let at = lease.status.unwrap().acquire_time.expect("acquireTime").0;
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(at.as_microsecond()).unwrap())
}

/// One run: A holds, B waits, the fault hits the operator alone while A keeps renewing; once
/// the operator works again A must still hold for a whole lease duration. Then A alone is cut
/// off: it loses the lease at its safe deadline, and B's grant comes after that by at least
/// A's margin. Returns that gap.
async fn run(fault: Fault, attempt: usize) -> Duration {
    let ns = TestNamespace::new(&format!("i9-{attempt}")).await;
    let op_proxy = Proxy::start(&ns).await;
    let op = OperatorProcess::start_as(&ns.name, &[], &op_proxy.kubeconfig(&ns, "operator"));
    ns.create_lease("l", i32::try_from(D).unwrap());
    ns.create_lease("probe", 30);

    let a_proxy = Proxy::start(&ns).await;
    let a_client = a_proxy.client(&ns).await;
    let a = acquire(
        a_client,
        &ns.name,
        "l",
        AcquireOptions::default().identity("A").wait(WAIT),
    )
    .await
    .expect("A acquires the free lease");
    let a_token = a.token().expect("A holds");
    let a_claim = a.claim().to_string();
    let a_last_ok = watch_token_answers(a.handle());
    let b = b_queues(&ns).await;

    // The fault, on the operator alone. A keeps renewing directly all along.
    inflict(fault, &op, &op_proxy).await;
    a_still_holds_after(fault, attempt, &ns, &op, &a, &a_claim).await;

    // Now A alone is cut off: it cannot renew, loses the lease at its safe deadline, and B
    // is granted — after that deadline, never before.
    a_proxy.cut();
    let b = b
        .await
        .expect("B's task")
        .expect("B acquires after A stops renewing");
    let b_token = b.token().expect("B holds");
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    assert!(a.token().is_err(), "A still answers Ok after B's grant");
    let granted_at = granted_at(&ns).await;
    let last_ok = *a_last_ok.lock().unwrap();
    let gap = granted_at.duration_since(last_ok).unwrap_or_else(|e| {
        panic!(
            "{fault:?}: B was granted {:?} before A's last token() = Ok",
            e.duration()
        )
    });
    let margin = Timing::default_margin(Duration::from_secs(D));
    assert!(
        gap >= margin,
        "{fault:?}: B granted {gap:?} after A's last Ok, less than A's margin {margin:?}"
    );
    drop(b);
    gap
}

async fn scenario(fault: Fault) {
    let mut gaps = vec![];
    for attempt in 0..2 {
        gaps.push(run(fault, attempt).await);
    }
    eprintln!("{fault:?}: gap between A's last token() = Ok and B's grant: {gaps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i9_an_operator_cut_off_past_the_lease_expires_no_renewing_holder() {
    scenario(Fault::Partition(Duration::from_secs(2 * D))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i9_an_operator_frozen_past_the_lease_expires_no_renewing_holder() {
    scenario(Fault::Pause(Duration::from_secs(2 * D))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i9_an_operator_whose_watches_reconnect_expires_no_renewing_holder() {
    // Cut for less than a lease: the watches reconnect and resume from where they were, and
    // the expiry timer fires just after, on whatever the cache holds by then.
    scenario(Fault::Partition(Duration::from_millis(D * 1000 * 3 / 2))).await;
}
