//! The candidates the bench runs itself as (`bench-peers fenced|floor|klm`), each its own
//! process so that a SIGKILL is a real one: each prints `ready <unix ns>` once set up, waits
//! for a line on stdin, and prints `leading <unix ns>` once it holds.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fenced_lease::api::{FencedLease, FencedLeaseClaim, FencedLeaseStatus, LeaseHolder};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::{Candidate, Target};
use crate::Res;
use crate::objects::claim;

/// Now, in nanoseconds since the epoch: the stamps the bench compares across processes.
pub(super) fn unix_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

fn say(what: &str) {
    println!("{what} {}", unix_ns());
    let _ = std::io::stdout().flush();
}

fn wait_for_go() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Runs as `candidate` until SIGTERM.
pub async fn run_candidate(candidate: Candidate) -> Res<()> {
    let client = fenced_lease::client::infer().await?;
    let term = signal(SignalKind::terminate())?;
    match candidate {
        Candidate::Fenced(target) => fenced(client, target, term).await,
        Candidate::Floor(target) => floor(client, target, term).await,
        Candidate::Klm {
            target,
            duration,
            grace,
        } => klm(client, target, (duration, grace), term).await,
    }
}

/// Takes the FencedLease with the fenced-lease library; SIGTERM releases it.
async fn fenced(client: Client, target: Target, mut term: Signal) -> Res<()> {
    let Target {
        namespace,
        lease,
        identity,
    } = target;
    let _ = Api::<FencedLease>::namespaced(client.clone(), &namespace)
        .get_opt(&lease)
        .await;
    say("ready");
    tokio::task::spawn_blocking(wait_for_go).await?;
    let options = fenced_lease::holder::AcquireOptions::default()
        .identity(identity)
        .wait(Duration::from_secs(600));
    let guard = fenced_lease::holder::acquire(client, &namespace, &lease, options).await?;
    say("leading");
    tokio::select! {
        _ = term.recv() => guard.release().await?,
        reason = guard.lost() => { say("stopped"); eprintln!("lost: {reason:?}"); }
    }
    Ok(())
}

/// The floor: creates a claim, then writes its grant into the lease's status itself.
async fn floor(client: Client, target: Target, mut term: Signal) -> Res<()> {
    let Target {
        namespace,
        lease,
        identity,
    } = target;
    let leases = Api::<FencedLease>::namespaced(client.clone(), &namespace);
    let claims = Api::<FencedLeaseClaim>::namespaced(client, &namespace);
    let mut object = leases.get(&lease).await?;
    say("ready");
    tokio::task::spawn_blocking(wait_for_go).await?;
    let made = claims
        .create(&PostParams::default(), &claim(&identity, &lease))
        .await?;
    object.status = Some(floor_grant(&object, &made));
    leases
        .replace_status(&lease, &PostParams::default(), &object)
        .await?;
    say("leading");
    term.recv().await;
    Ok(())
}

/// Takes a coordination.k8s.io Lease with kube-lease-manager; SIGTERM releases it.
async fn klm(
    client: Client,
    target: Target,
    (duration, grace): (u64, u64),
    mut term: Signal,
) -> Res<()> {
    use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
    let manager = LeaseManagerBuilder::new(client, target.lease)
        .with_namespace(target.namespace)
        .with_identity(target.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_create_mode(LeaseCreateMode::AutoCreate)
        .build()
        .await?;
    say("ready");
    tokio::task::spawn_blocking(wait_for_go).await?;
    let hold = async {
        loop {
            match manager.changed().await {
                Ok(true) => say("leading"),
                Ok(false) => say("stopped"),
                Err(e) => {
                    eprintln!("kube-lease-manager: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    };
    tokio::select! {
        () = hold => {}
        _ = term.recv() => {}
    }
    manager.release().await?;
    Ok(())
}

/// The status the operator writes when it grants a free `lease` to `claim`: the next token,
/// the holder, the term, and the `Held` condition.
fn floor_grant(lease: &FencedLease, claim: &FencedLeaseClaim) -> FencedLeaseStatus {
    let old = lease.status.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    FencedLeaseStatus {
        holder: Some(LeaseHolder {
            claim: claim.name_any(),
            claim_uid: claim.uid().unwrap_or_default(),
            identity: claim.spec.holder_identity.clone(),
            ..LeaseHolder::default()
        }),
        fencing_token: old.fencing_token + 1,
        acquire_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(lease.spec.lease_duration_seconds),
        lease_transitions: old.lease_transitions + 1,
        waiting: 0,
        conditions: vec![Condition {
            type_: "Held".into(),
            status: "True".into(),
            reason: "Held".into(),
            message: format!(
                "held by {} with token {}",
                claim.spec.holder_identity,
                old.fencing_token + 1
            ),
            last_transition_time: Time(now),
            observed_generation: lease.metadata.generation,
        }],
        observed_generation: lease.metadata.generation,
    }
}
