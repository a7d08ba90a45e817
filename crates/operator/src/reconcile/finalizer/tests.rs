//! The finalizer's cycle through the lease reconciler, against a scripted apiserver: added
//! before the first grant, the last token recorded when the lease is deleted, the name kept
//! while its holder may still believe it holds, then the finalizer removed.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::FINALIZER;
use crate::error::{Error, Result};
use crate::reconcile::fixtures::{
    Apiserver, NS, World, claim, claim_path, expect, lease, lease_path, records_path, scripted,
    status,
};
use crate::reconcile::{Again, lease::reconcile};
use fenced_lease_api::{
    ClaimPhase, FencedLease, FencedLeaseClaimStatus, FencedLeaseStatus, LeaseHolder,
};

/// The token records of namespace [`NS`], holding `data`, at resourceVersion 3.
fn records(data: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": format!("fenced-lease-tokens.{NS}"), "resourceVersion": "3"},
        "data": data,
    }))
    .unwrap_or_else(|e| panic!("a ConfigMap: {e}"))
}

/// Lease `l`, deleted, its last token 100, held by claim `holder` if any (terms of 10 s).
fn deleted(holder: Option<&str>) -> FencedLease {
    let mut lease = lease("l", json!({"leaseDurationSeconds": 10}));
    lease.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    lease.status = Some(FencedLeaseStatus {
        holder: holder.map(|name| LeaseHolder {
            claim: name.into(),
            claim_uid: format!("uid-{name}"),
            identity: format!("id-{name}"),
            ..Default::default()
        }),
        fencing_token: 100,
        lease_duration_seconds: Some(10),
        ..Default::default()
    });
    lease
}

fn finalizers(body: &Value) -> &Value {
    &body["metadata"]["finalizers"]
}

async fn run(world: &World, apiserver: &Apiserver, lease: FencedLease) -> Result<Again> {
    let result = reconcile(Arc::new(lease), world.ctx.clone()).await;
    apiserver.done();
    result
}

#[tokio::test]
async fn a_new_lease_gets_its_finalizer_and_its_record_read_before_its_first_grant() {
    // A record above the clock: the first token continues from it, and is recorded before it
    // is issued.
    let record = Timestamp::now().as_millisecond() + 1_000_000_000;
    let next = record + 1;
    let stored = records(json!({"l": record.to_string()}));
    let mut new = lease("l", json!({}));
    new.metadata.finalizers = None;
    let (client, apiserver) = scripted(vec![
        expect(Method::GET, records_path(Some(NS))).answer(stored.clone()),
        expect(Method::PATCH, lease_path("l"))
            .check("the finalizer added", |b| {
                finalizers(b) == &json!([FINALIZER])
            })
            .check("on the version read", |b| {
                b["metadata"]["resourceVersion"] == "1"
            })
            .patched(new.clone()),
        expect(Method::GET, records_path(Some(NS))).answer(stored),
        expect(Method::PUT, records_path(Some(NS))).check("the token recorded ahead", move |b| {
            b["data"]["l"] == json!(next.to_string())
        }),
        expect(Method::PUT, status(lease_path("l")))
            .check("the token above the record", move |b| {
                b["status"]["fencingToken"] == next
            })
            .check("on the lease with its finalizer", |b| {
                b["metadata"]["resourceVersion"] == "2" && finalizers(b) == &json!([FINALIZER])
            }),
        expect(Method::PATCH, status(claim_path("a")))
            .check("granted that token", move |b| {
                b["status"]["fencingToken"] == next
            })
            .patched(claim("a", "l", 1)),
    ]);
    let mut world = World::new(client);
    world.cache(claim("a", "l", 1), Duration::ZERO);

    let again = run(&world, &apiserver, new).await;
    assert!(matches!(again, Ok(Some(_))), "{again:?}");
    assert_eq!(world.events(), ["Granted"]);
}

#[tokio::test]
async fn a_deleted_lease_whose_record_was_lost_records_its_last_token_then_lets_go() {
    let (client, apiserver) = scripted(vec![
        expect(Method::GET, records_path(Some(NS))).not_found(),
        expect(Method::POST, records_path(None))
            .check("the last token recorded", |b| b["data"]["l"] == "100"),
        expect(Method::PUT, status(lease_path("l")))
            .check("held by no one", |b| b["status"]["holder"].is_null())
            .check("its token kept", |b| b["status"]["fencingToken"] == 100),
        expect(Method::PATCH, lease_path("l"))
            .check("the finalizer removed", |b| finalizers(b) == &json!([]))
            .check("on the version last written", |b| {
                b["metadata"]["resourceVersion"] == "2"
            })
            .patched(deleted(None)),
    ]);
    let world = World::new(client);

    let again = run(&world, &apiserver, deleted(None)).await;
    assert!(matches!(again, Ok(None)), "{again:?}");
}

#[tokio::test]
async fn a_deleted_lease_is_kept_while_its_revoked_holder_may_still_believe_it_holds() {
    // The record of another lease is kept; this lease's, lost from the ConfigMap, is written.
    let other = (Timestamp::now().as_millisecond() - 1000).to_string();
    let stored = records(json!({"m": other}));
    let (client, apiserver) = scripted(vec![
        expect(Method::GET, records_path(Some(NS))).answer(stored),
        expect(Method::PUT, records_path(Some(NS))).check("both records", move |b| {
            b["data"] == json!({"l": "100", "m": other})
        }),
        expect(Method::PUT, status(lease_path("l")))
            .check("held by no one", |b| b["status"]["holder"].is_null()),
        expect(Method::PATCH, status(claim_path("a")))
            .check("Revoked", |b| b["status"]["phase"] == "Revoked")
            .patched(claim("a", "l", 1)),
    ]);
    let mut world = World::new(client);
    let mut holder = claim("a", "l", 1);
    holder.status = Some(FencedLeaseClaimStatus {
        phase: Some(ClaimPhase::Granted),
        fencing_token: Some(100),
        ..Default::default()
    });
    world.cache(holder, Duration::from_secs(4));

    let again = run(&world, &apiserver, deleted(Some("a"))).await;
    let Ok(Some(left)) = again else {
        panic!("the finalizer is kept for the term's rest: {again:?}");
    };
    assert!(
        left > Duration::from_secs(5) && left <= Duration::from_secs(6),
        "{left:?}"
    );
    assert_eq!(world.events(), ["Revoked", "Revoked"]);
}

#[tokio::test]
async fn a_damaged_record_holds_a_deleted_lease_and_is_never_overwritten() {
    let (client, apiserver) = scripted(vec![
        expect(Method::GET, records_path(Some(NS))).answer(records(json!({"l": "10x"}))),
    ]);
    let world = World::new(client);

    let again = run(&world, &apiserver, deleted(None)).await;
    assert!(matches!(again, Err(Error::TokenRecord { .. })), "{again:?}");
}
