//! The holder library's promises to the code that uses it, against a real apiserver and the
//! operator: `release()` finishes even when its caller stops waiting; a guard dropped at the
//! end of `main` releases before the runtime goes; a margin that leaves no time is refused;
//! a heartbeat refused because the claim is over (I9) ends the hold at once; a holder reaches
//! the apiserver over one connection.

use crate::common;

use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::proxy::Proxy;
use common::{TestNamespace, claims_of, next_renew, wait_for};
use fenced_lease::api::FencedLeaseClaim;
use fenced_lease::holder::{AcquireOptions, Error, LostReason, acquire};
use kube::api::{Api, Patch, PatchParams};

const WAIT: Duration = Duration::from_secs(30);

fn options(identity: &str) -> AcquireOptions {
    AcquireOptions::default().identity(identity).wait(WAIT)
}

/// `release()` in a `select!` or under a timeout that fires first still deletes the claim:
/// here the network is slow (new connections take half a second) and the caller gives up
/// after 50 ms.
#[tokio::test]
async fn release_completes_when_its_caller_stops_waiting() {
    let ns = TestNamespace::new("release-cancel").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 3600);
    let proxy = Proxy::start(&ns).await;
    let guard = acquire(
        proxy.client(&ns).await,
        &ns.name,
        "db",
        options("impatient"),
    )
    .await
    .expect("acquire");
    // Every connection the holder has is dropped; the next ones are slow to come up.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.delay_new_connections(Duration::from_millis(500));
    proxy.heal();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), guard.release()).await;
    assert!(
        gave_up.is_err(),
        "release finished within 50 ms: {gave_up:?}"
    );
    let claims: Api<FencedLeaseClaim> = ns.api();
    wait_for("the claim to be deleted anyway", WAIT, || async {
        claims_of(&claims, "impatient")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}

/// The child for the next test: acquires in a runtime of its own and lets the guard drop at
/// the very end, as `#[tokio::main] async fn main` does; the runtime shuts down right after.
#[test]
#[ignore = "run by a_guard_dropped_at_the_end_of_main_releases_before_the_runtime_goes"]
fn guard_dropped_at_the_end_of_main_child() {
    let (Ok(ns), Ok(kubeconfig)) = (
        std::env::var("FL_CHILD_NAMESPACE"),
        std::env::var("FL_CHILD_KUBECONFIG"),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = common::client_from_kubeconfig(std::path::Path::new(&kubeconfig)).await;
        let guard = acquire(client, &ns, "db", options("short-lived"))
            .await
            .expect("child acquires");
        println!("HOLDING {}", guard.claim());
    });
    drop(runtime);
}

#[tokio::test]
async fn a_guard_dropped_at_the_end_of_main_releases_before_the_runtime_goes() {
    let ns = TestNamespace::new("release-drop").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 3600);
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &common::test_name(module_path!(), "guard_dropped_at_the_end_of_main_child"),
            "--nocapture",
        ])
        .env("FL_CHILD_NAMESPACE", &ns.name)
        .env("FL_CHILD_KUBECONFIG", ns.admin_kubeconfig())
        .output()
        .expect("run child");
    assert!(out.status.success(), "{}", common::cli::both(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("HOLDING"));
    // Gone already: the lease lasts an hour, so expiry cannot be what removed it.
    let claims: Api<FencedLeaseClaim> = ns.api();
    assert_eq!(
        claims_of(&claims, "short-lived").await.len(),
        0,
        "the claim outlived the process that dropped its guard"
    );
}

/// A safety margin not shorter than the lease duration would leave no time to act: refused
/// with a clear error before anything is queued.
#[tokio::test]
async fn a_margin_not_shorter_than_the_lease_is_refused() {
    let ns = TestNamespace::new("margin").await;
    ns.create_lease("db", 15);
    let client = ns.holder_client().await;
    let err = acquire(
        client,
        &ns.name,
        "db",
        options("careful").margin(Duration::from_secs(15)),
    )
    .await
    .expect_err("margin = duration");
    assert!(matches!(err, Error::InvalidMargin { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the safety margin (15s) must be shorter than the lease duration (15s)"
    );
    assert!(claims_of(&ns.api(), "careful").await.is_empty());
}

/// A holder's claim, watches, heartbeats and release share one connection to the apiserver
/// (HTTP/2, `fenced_lease::client`). Over HTTP/1.1 each watch held a connection of its own, and
/// the acquire paid a TLS handshake for each while the operator granted it.
#[tokio::test]
async fn a_holder_reaches_the_apiserver_over_one_connection() {
    let ns = TestNamespace::new("one-connection").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 3);
    let proxy = Proxy::start(&ns).await;
    let client = proxy.client(&ns).await;
    let version = client
        .send(
            http::Request::get("/version")
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("GET /version")
        .version();
    assert_eq!(version, http::Version::HTTP_2);
    let guard = acquire(client, &ns.name, "db", options("multiplexed"))
        .await
        .expect("acquire");
    // Two heartbeats (every second, for a 3 s lease) while the watches run.
    let claims: Api<FencedLeaseClaim> = ns.api();
    for _ in 0..2 {
        tokio::time::timeout(WAIT, next_renew(&claims, guard.claim()))
            .await
            .expect("a heartbeat");
    }
    guard.release().await.expect("release");
    assert_eq!(
        proxy.accepted(),
        1,
        "connections the holder opened to the apiserver"
    );
}

/// I9: once the claim is `Expired`, the apiserver refuses its heartbeats (the CRD's rule) and
/// the holder counts the lease as lost at that refusal, long before its local deadline. Its
/// watches are held up here, so the refused heartbeat is the only way it can learn.
#[tokio::test]
async fn i9_a_heartbeat_refused_because_the_claim_expired_ends_the_hold_at_once() {
    let ns = TestNamespace::new("holder-i9").await;
    let mut operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("db", 30);
    let client = {
        let config = ns.client_config().await;
        kube::client::ClientBuilder::try_from(config)
            .expect("client builder")
            .with_layer(&tower::layer::layer_fn(|inner| StallWatches { inner }))
            .build()
    };
    let guard = acquire(client, &ns.name, "db", options("expired"))
        .await
        .expect("acquire");
    // Nor may the lease tell it: an operator ending the hold there races the heartbeat
    // (its list of the lease, before the watch, saw no holder 1 run in 4 clean clones).
    operator.kill();
    let claims: Api<FencedLeaseClaim> = ns.api();
    claims
        .patch_status(
            guard.claim(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Expired"}})),
        )
        .await
        .expect("expire the claim as the operator would");
    let expired_at = Instant::now();
    let reason = tokio::time::timeout(WAIT, guard.lost())
        .await
        .expect("lost fires");
    let after = expired_at.elapsed();
    eprintln!(
        "MEASURED refused heartbeat ended the hold {after:?} after the claim expired (renew every 10s, deadline 28s)"
    );
    assert_eq!(reason, LostReason::Expired);
    assert!(after < Duration::from_secs(15), "{after:?}");
    assert!(guard.token().is_err());
}

/// Passes requests on, except watches, which never answer.
struct StallWatches<S> {
    inner: S,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<kube::client::Body>> for StallWatches<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Error = tower::BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = BoxFuture<Result<S::Response, tower::BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let watch = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        if watch {
            return Box::pin(std::future::pending());
        }
        Box::pin(self.inner.call(request))
    }
}
