//! The apiserver's and etcd's CPU per write, for each write the operator makes per grant.
//! A one-off driver, kept with its run (see README.md); not built by the project. To run it
//! again: copy it to examples/writecost.rs, then, with KUBECONFIG set, the CRDs and
//! deploy/admission/ installed and no operator running,
//! `cargo run --release --example writecost -- ROUNDS` (it reads the control plane's pids from
//! /tmp/fenced-lease-control-plane-0/).
#[path = "bench/common.rs"]
mod common;

use common::*;
use fenced_lease::api::{
    ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseClaimStatus, FencedLeaseStatus,
    LeaseHolder,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchParams};
use std::time::{Duration, Instant};

const N: usize = 1000;
const IN_FLIGHT: usize = 16;

fn pid(name: &str) -> u32 {
    std::fs::read_to_string(format!("/tmp/fenced-lease-control-plane-0/{name}.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn grant(lease: &FencedLease, claim: &str, token: i64) -> FencedLeaseStatus {
    let now = k8s_openapi::jiff::Timestamp::now();
    FencedLeaseStatus {
        holder: Some(LeaseHolder {
            claim: claim.into(),
            claim_uid: "0b0e5f7e-1111-2222-3333-444455556666".into(),
            identity: claim.into(),
            ..LeaseHolder::default()
        }),
        fencing_token: token,
        acquire_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(lease.spec.lease_duration_seconds),
        lease_transitions: token,
        waiting: 0,
        conditions: vec![Condition {
            type_: "Held".into(),
            status: "True".into(),
            reason: "Held".into(),
            message: format!("held by {claim} with token {token}"),
            last_transition_time: Time(now),
            observed_generation: lease.metadata.generation,
        }],
        observed_generation: lease.metadata.generation,
    }
}

async fn measure<F, Fut>(what: &str, idle_per_s: (f64, f64), f: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (a, e) = (pid("kube-apiserver"), pid("etcd"));
    let (a0, e0, t0) = (cpu_seconds(a), cpu_seconds(e), Instant::now());
    stream::iter(0..N)
        .map(&f)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let wrote = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let dt = t0.elapsed().as_secs_f64();
    let (da, de) = (cpu_seconds(a) - a0, cpu_seconds(e) - e0);
    let per = |d: f64, idle: f64| (d - idle * dt) / N as f64 * 1000.0;
    println!(
        "{what:28} writes took {:6.2} s; per write: apiserver {:5.2} ms, etcd {:5.2} ms (raw {:.2} / {:.2} cpu-s over {dt:.1} s)",
        wrote.as_secs_f64(),
        per(da, idle_per_s.0),
        per(de, idle_per_s.1),
        da,
        de
    );
}

/// The three ways of writing a grant into the lease's status that were compared.
#[derive(Clone, Copy)]
enum Grant {
    Put,
    PutWithoutManagedFields,
    Merge,
}

/// Reads lease `name`, then writes the next grant into its status, as `how` says.
async fn write_grant(leases: &Api<FencedLease>, name: String, how: Grant) {
    let mut l = leases.get(&name).await.unwrap();
    let token = l.status.as_ref().map_or(0, |s| s.fencing_token) + 1;
    let status = grant(&l, &name, token);
    match how {
        Grant::Merge => {
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": l.resource_version()},
                "status": status});
            let params = PatchParams::default();
            leases
                .patch_status(&name, &params, &Patch::Merge(&patch))
                .await
                .unwrap();
        }
        Grant::Put | Grant::PutWithoutManagedFields => {
            l.status = Some(status);
            if let Grant::PutWithoutManagedFields = how {
                l.metadata.managed_fields = None;
            }
            leases
                .replace_status(&name, &PostParams::default(), &l)
                .await
                .unwrap();
        }
    }
}

#[tokio::main]
async fn main() -> Res<()> {
    let client = client().await?;
    let ns = namespace(&client, "wc").await?;
    let leases = Api::<FencedLease>::namespaced(client.clone(), &ns);
    let claims = Api::<FencedLeaseClaim>::namespaced(client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    // Watchers as the operator keeps them (leases, claims, pods' metadata), all draining.
    let w = WatchParams::default();
    for s in [
        leases.watch(&w, "0").await?.map_ok(|_| ()).boxed(),
        claims.watch(&w, "0").await?.map_ok(|_| ()).boxed(),
        pods.watch_metadata(&w, "0").await?.map_ok(|_| ()).boxed(),
    ] {
        tokio::spawn(s.for_each(|_| async {}));
    }
    println!("namespace {ns}: creating {N} leases, claims and pods");
    let names: Vec<String> = (0..N).map(|i| format!("l{i:05}")).collect();
    create_all(
        &leases,
        names.iter().map(|n| lease(n, 15)).collect(),
        IN_FLIGHT,
    )
    .await?;
    create_all(
        &claims,
        names.iter().map(|n| claim(n, n)).collect(),
        IN_FLIGHT,
    )
    .await?;
    create_all(&pods, names.iter().map(|n| pod(n)).collect(), IN_FLIGHT).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (a, e) = (pid("kube-apiserver"), pid("etcd"));
    let (a0, e0, t0) = (cpu_seconds(a), cpu_seconds(e), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let dt = t0.elapsed().as_secs_f64();
    let idle = ((cpu_seconds(a) - a0) / dt, (cpu_seconds(e) - e0) / dt);
    println!("idle: apiserver {:.3} cores, etcd {:.3}", idle.0, idle.1);
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        println!("-- round {}", round + 1);
        let name = |i: usize| format!("l{i:05}");
        if round == 0 {
            measure("lease finalizer (merge)", idle, |i| {
                let leases = &leases;
                async move {
                    let l = leases.get(&name(i)).await.unwrap();
                    let patch = serde_json::json!({"metadata": {
                        "finalizers": ["fencing.dev/token-high-water-mark"],
                        "resourceVersion": l.resource_version()}});
                    leases
                        .patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                }
            })
            .await;
        }
        // Reads alone, for the gets the next rows make before each write.
        measure("lease get (to subtract)", idle, |i| {
            let leases = &leases;
            async move {
                leases.get(&name(i)).await.unwrap();
            }
        })
        .await;
        for (what, how) in [
            ("lease status PUT (+get)", Grant::Put),
            (
                "lease status PUT, no mf (+get)",
                Grant::PutWithoutManagedFields,
            ),
            ("lease status merge (+get)", Grant::Merge),
        ] {
            measure(what, idle, |i| write_grant(&leases, name(i), how)).await;
        }
        measure("claim status merge patch", idle, |i| {
            let claims = &claims;
            async move {
                let now = k8s_openapi::jiff::Timestamp::now();
                let status = FencedLeaseClaimStatus {
                    phase: Some(if round % 2 == 0 {
                        ClaimPhase::Granted
                    } else {
                        ClaimPhase::Pending
                    }),
                    fencing_token: Some(round as i64 + 1),
                    grant_time: Some(MicroTime(now)),
                    lease_duration_seconds: Some(15),
                    queue_position: None,
                    message: Some(format!("granted token {}", round + 1)),
                    conditions: vec![Condition {
                        type_: "Granted".into(),
                        status: "True".into(),
                        reason: "Granted".into(),
                        message: format!("round {round}"),
                        last_transition_time: Time(now),
                        observed_generation: None,
                    }],
                    observed_generation: None,
                };
                let patch = serde_json::json!({"status": status.merge_patch()});
                claims
                    .patch_status(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        })
        .await;
        measure("pod annotation (metadata)", idle, |i| {
            let pods = &pods;
            async move {
                let patch = serde_json::json!({"metadata": {"annotations": {
                    format!("fencing.dev/token.l{i:05}"): format!("{}", 1_700_000_000_000i64 + round as i64)}}});
                pods.patch_metadata(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        })
        .await;
        measure("Event create (core v1)", idle, |i| {
            let (events, events_ns) = (&events, ns.clone());
            async move {
                let now = k8s_openapi::jiff::Timestamp::now();
                let ev = Event {
                    metadata: kube::api::ObjectMeta {
                        generate_name: Some("l.".into()),
                        ..Default::default()
                    },
                    involved_object: ObjectReference {
                        kind: Some("FencedLease".into()),
                        api_version: Some("fencing.dev/v1alpha1".into()),
                        name: Some(name(i)),
                        namespace: Some(events_ns.clone()),
                        ..Default::default()
                    },
                    reason: Some("Granted".into()),
                    message: Some(format!("granted to {} with token {round}", name(i))),
                    type_: Some("Normal".into()),
                    first_timestamp: Some(Time(now)),
                    last_timestamp: Some(Time(now)),
                    count: Some(1),
                    ..Default::default()
                };
                events.create(&PostParams::default(), &ev).await.unwrap();
            }
        })
        .await;
    }
    println!("namespace {ns} left in place");
    Ok(())
}
