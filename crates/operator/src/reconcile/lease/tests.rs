//! Each step of a lease's reconcile against a scripted apiserver: what a user would see of it
//! (the status written, the claims told, the Events), and the requests it took, in order.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::reconcile;
use crate::reconcile::fixtures::{
    Apiserver, NS, World, claim, claim_path, expect, lease, lease_path, records_path, scripted,
    status,
};
use fenced_lease_api::{
    ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseClaimStatus, FencedLeaseStatus,
    LeaseHolder,
};

/// Lease `l` held by claim `name` with `token` (terms of 10 s).
fn held_by(name: &str, token: i64) -> FencedLease {
    let mut lease = lease("l", json!({"leaseDurationSeconds": 10}));
    lease.status = Some(FencedLeaseStatus {
        holder: Some(LeaseHolder {
            claim: name.into(),
            claim_uid: format!("uid-{name}"),
            identity: format!("id-{name}"),
            ..Default::default()
        }),
        fencing_token: token,
        lease_duration_seconds: Some(10),
        ..Default::default()
    });
    lease
}

/// Claim `name` of lease `l`, granted `token`, with the condition every status the operator
/// writes has (`LeaseFound`).
fn granted(name: &str, token: i64) -> FencedLeaseClaim {
    let mut claim = claim(name, "l", 1);
    let found = json!({"type": "LeaseFound", "status": "True", "reason": "Found", "message": "",
        "lastTransitionTime": Time(Timestamp::UNIX_EPOCH)});
    claim.status = Some(FencedLeaseClaimStatus {
        phase: Some(ClaimPhase::Granted),
        fencing_token: Some(token),
        conditions: vec![serde_json::from_value(found).unwrap_or_else(|e| panic!("{e}"))],
        ..Default::default()
    });
    claim
}

fn holder_is(name: &'static str) -> impl Fn(&Value) -> bool + Send {
    move |b| {
        b["status"]["holder"]["claim"] == name
            && b["status"]["holder"]["identity"] == format!("id-{name}")
    }
}

fn phase_is(phase: &'static str) -> impl Fn(&Value) -> bool + Send {
    move |b| b["status"]["phase"] == phase
}

/// Reconciles `lease` in `world`; the apiserver must have had every request it expected.
async fn run(
    world: &World,
    apiserver: &Apiserver,
    lease: FencedLease,
) -> crate::error::Result<crate::reconcile::Again> {
    let result = reconcile(Arc::new(lease), world.ctx.clone()).await;
    apiserver.done();
    result
}

fn token(body: &Value) -> i64 {
    body["status"]["fencingToken"].as_i64().unwrap_or_default()
}

#[tokio::test]
async fn a_free_lease_is_granted_to_its_claim_and_the_claim_is_told() {
    let started_ms = Timestamp::now().as_millisecond();
    let (client, apiserver) = scripted(vec![
        // The first grant of a lease object reads the record of its name.
        expect(Method::GET, records_path(Some(NS))).not_found(),
        expect(Method::PUT, status(lease_path("l"))).check("the holder a", holder_is("a")),
        expect(Method::PATCH, status(claim_path("a")))
            .check("Granted", phase_is("Granted"))
            .patched(claim("a", "l", 1)),
    ]);
    let mut world = World::new(client);
    world.cache(claim("a", "l", 1), Duration::ZERO);

    let again = run(&world, &apiserver, lease("l", json!({}))).await;
    assert!(matches!(again, Ok(Some(_))), "{again:?}");
    let (status, told) = (apiserver.body(1), apiserver.body(2));
    assert!(
        token(&status) >= started_ms,
        "a first token is the clock's at least"
    );
    assert_eq!(
        told["status"]["fencingToken"].as_i64(),
        Some(token(&status))
    );
    assert_eq!(world.events(), ["Granted"]);
}

#[tokio::test]
async fn a_silent_holder_is_expired_on_its_claim_before_the_next_claim_is_granted() {
    let (client, apiserver) = scripted(vec![
        // The expiry is made final on the claim, preconditioned on the version last seen.
        expect(Method::PUT, status(claim_path("a")))
            .check("Expired", phase_is("Expired"))
            .check("on the version cached", |b| {
                b["metadata"]["resourceVersion"] == "1"
            }),
        expect(Method::PUT, status(lease_path("l")))
            .check("the holder b", holder_is("b"))
            .check("a token above a's", |b| token(b) > 100),
        // The expired claim's status is final already: only the new holder is told.
        expect(Method::PATCH, status(claim_path("b")))
            .check("Granted", phase_is("Granted"))
            .patched(claim("b", "l", 2)),
    ]);
    let mut world = World::new(client);
    world.cache(granted("a", 100), Duration::from_secs(60));
    world.cache(claim("b", "l", 2), Duration::ZERO);

    let again = run(&world, &apiserver, held_by("a", 100)).await;
    assert!(matches!(again, Ok(Some(_))), "{again:?}");
    assert_eq!(
        token(&apiserver.body(2)),
        token(&apiserver.body(1)),
        "b is told the token the lease issued"
    );
    assert_eq!(world.events(), ["Expired", "Expired", "Granted"]);
}

#[tokio::test]
async fn a_released_lease_goes_to_the_next_claim_without_waiting_for_expiry() {
    let (client, apiserver) = scripted(vec![
        // The cache no longer has the holder's claim: only the API may say it is gone.
        expect(Method::GET, claim_path("a")).not_found(),
        expect(Method::PUT, status(lease_path("l")))
            .check("the holder b", holder_is("b"))
            .check("a token above a's", |b| token(b) > 100),
        expect(Method::PATCH, status(claim_path("b")))
            .check("Granted", phase_is("Granted"))
            .patched(claim("b", "l", 2)),
    ]);
    let mut world = World::new(client);
    world.cache(claim("b", "l", 2), Duration::ZERO);

    let again = run(&world, &apiserver, held_by("a", 100)).await;
    assert!(matches!(again, Ok(Some(_))), "{again:?}");
    assert_eq!(world.events(), ["Released", "Granted"]);
}

/// Lease `l` as another writer left it: free, last token 100, at resourceVersion `version`.
fn free(version: &str) -> FencedLease {
    let mut lease = lease("l", json!({}));
    lease.metadata.resource_version = Some(version.into());
    lease.status = Some(FencedLeaseStatus {
        fencing_token: 100,
        ..Default::default()
    });
    lease
}

#[tokio::test]
async fn a_conflicting_status_write_is_decided_again_on_the_lease_read_after_it() {
    let (client, apiserver) = scripted(vec![
        expect(Method::PUT, status(lease_path("l")))
            .check("on the version read", |b| {
                b["metadata"]["resourceVersion"] == "1"
            })
            .conflict(),
        expect(Method::GET, lease_path("l")).answer(free("7")),
        expect(Method::PUT, status(lease_path("l")))
            .check("on the version read after the conflict", |b| {
                b["metadata"]["resourceVersion"] == "7"
            })
            .check("the holder a", holder_is("a")),
        expect(Method::PATCH, status(claim_path("a")))
            .check("Granted", phase_is("Granted"))
            .patched(claim("a", "l", 1)),
    ]);
    let mut world = World::new(client);
    world.cache(claim("a", "l", 1), Duration::ZERO);

    let again = run(&world, &apiserver, free("1")).await;
    assert!(matches!(again, Ok(Some(_))), "{again:?}");
    assert_eq!(world.ctx.metrics.conflicts.get(), 1);
    assert_eq!(token(&apiserver.body(3)), token(&apiserver.body(2)));
}

#[tokio::test]
async fn a_conflict_with_a_lease_now_being_deleted_is_requeued_and_grants_no_one() {
    let mut deleting = free("7");
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    let (client, apiserver) = scripted(vec![
        expect(Method::PUT, status(lease_path("l"))).conflict(),
        expect(Method::GET, lease_path("l")).answer(deleting),
    ]);
    let mut world = World::new(client);
    world.cache(claim("a", "l", 1), Duration::ZERO);

    let again = run(&world, &apiserver, free("1")).await;
    assert!(
        matches!(again, Ok(Some(after)) if after <= Duration::from_millis(100)),
        "decided again from the start, soon: {again:?}"
    );
    assert_eq!(world.events(), Vec::<String>::new(), "no grant reported");
}
