//! Fenced leader election against the real operator: one leader at a time, each term with a
//! larger token stamped on what it writes, the term's cancellation fired on loss, the loser
//! campaigning again after every loss (also when its term ends because it saw the loss) and
//! after a failed term, leadership reported on a watch channel, and the lease released at
//! shutdown.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::FencedLeaseClaim;
use fenced_lease::holder::{ElectOptions, Leadership, LeaseHandle, elect};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum Term {
    Began { who: &'static str, token: i64 },
    Cancelled { who: &'static str },
}

/// ConfigMap `written-by-<who>-<token>`, labelled with lease batch and stamped with `token`,
/// as a term of `who` writes it.
fn stamped(who: &str, token: i64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("written-by-{who}-{token}")),
            labels: Some(BTreeMap::from([(
                "fencing.dev/lease".into(),
                "batch".into(),
            )])),
            annotations: Some(BTreeMap::from([(
                "fencing.dev/token".into(),
                token.to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Candidate `who` for lease batch of `ns`, until `shutdown`: each term stamps its token on
/// what it writes, says so on `terms`, and says when its cancellation fires.
fn candidate(
    client: &Client,
    ns: &str,
    terms: &mpsc::UnboundedSender<Term>,
    shutdown: &CancellationToken,
    who: &'static str,
) -> JoinHandle<Result<(), fenced_lease::holder::Error>> {
    let (client, ns, terms, shutdown) = (
        client.clone(),
        ns.to_string(),
        terms.clone(),
        shutdown.clone(),
    );
    tokio::spawn(async move {
        let options = ElectOptions::new(shutdown).identity(who);
        let lead = |leader: LeaseHandle| {
            let (client, terms) = (client.clone(), terms.clone());
            async move {
                let token = leader.token().expect("a new leader holds the lease");
                Api::<ConfigMap>::namespaced(client, leader.namespace())
                    .create(&PostParams::default(), &stamped(who, token))
                    .await
                    .expect("write stamped object");
                let _ = terms.send(Term::Began { who, token });
                // Background work of the term is tied to its cancellation (the term's
                // own future is dropped when the lease is lost).
                let cancelled = leader.cancellation();
                tokio::spawn(async move {
                    cancelled.cancelled().await;
                    let _ = terms.send(Term::Cancelled { who });
                });
                std::future::pending::<Result<(), String>>().await
            }
        };
        elect(client.clone(), &ns, "batch", options, lead).await
    })
}

/// Waits until `who` has a claim on the lease.
async fn wait_claimed(claims: &Api<FencedLeaseClaim>, what: &str, who: &str) {
    wait_for(what, WAIT, || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|c| c.spec.holder_identity == who)
            .then_some(())
    })
    .await;
}

/// Takes the lease from a (as its pod's deletion would): a's term is cancelled, b leads with
/// a token above a's `token`, which this returns, and a queues again.
async fn take_the_lease_from_a(
    claims: &Api<FencedLeaseClaim>,
    terms: &mut mpsc::UnboundedReceiver<Term>,
    token: i64,
) -> i64 {
    let a_claim = claims
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .find(|c| c.spec.holder_identity == "a")
        .expect("a's claim");
    claims
        .delete(
            &kube::ResourceExt::name_any(&a_claim),
            &DeleteParams::default(),
        )
        .await
        .expect("delete a's claim");
    let mut a_cancelled = false;
    let mut b_token = None;
    while !(a_cancelled && b_token.is_some()) {
        match recv(terms).await {
            Term::Cancelled { who: "a" } => a_cancelled = true,
            Term::Began { who: "b", token } => b_token = Some(token),
            other => panic!("unexpected {other:?}"),
        }
    }
    let b_token = b_token.expect("b leads");
    assert!(b_token > token, "b's token {b_token} after a's {token}");
    wait_claimed(claims, "a to queue again", "a").await;
    b_token
}

#[tokio::test]
async fn leaders_take_turns_with_growing_tokens_and_the_loser_queues_again() {
    let ns = TestNamespace::new("holder-elect").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("batch", 15);
    let client = ns.holder_client().await;
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();

    let a = candidate(&client, &ns.name, &terms_tx, &shutdown, "a");
    let first = recv(&mut terms).await;
    let Term::Began { who: "a", token } = first else {
        panic!("expected a to lead first: {first:?}");
    };
    let b = candidate(&client, &ns.name, &terms_tx, &shutdown, "b");
    let claims: Api<FencedLeaseClaim> = ns.api();
    wait_claimed(&claims, "b to queue", "b").await;
    let b_token = take_the_lease_from_a(&claims, &mut terms, token).await;

    // The stamped objects carry each term's token.
    let cms: Api<ConfigMap> = ns.api();
    for (who, t) in [("a", token), ("b", b_token)] {
        let cm = cms
            .get(&format!("written-by-{who}-{t}"))
            .await
            .expect("stamped object");
        let annotations = cm.metadata.annotations.unwrap_or_default();
        assert_eq!(annotations.get("fencing.dev/token"), Some(&t.to_string()));
    }

    shutdown.cancel();
    for handle in [a, b] {
        tokio::time::timeout(WAIT, handle)
            .await
            .expect("elect returns on shutdown")
            .expect("join")
            .expect("elect ok");
    }
    wait_for("every claim to be released on shutdown", WAIT, || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
}

/// The claim `who` holds or waits with.
async fn claim_of(claims: &Api<FencedLeaseClaim>, who: &str) -> Option<FencedLeaseClaim> {
    claims
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|c| c.spec.holder_identity == who)
}

/// The leader solo loses the lease: its claim `deleted` (heartbeats then find nothing), or
/// made `expired` (the apiserver then refuses its heartbeats, I9).
async fn lose(claims: &Api<FencedLeaseClaim>, loss: &str) {
    let held = claim_of(claims, "solo").await.expect("the leader's claim");
    if loss == "deleted" {
        claims
            .delete(&held.name_any(), &DeleteParams::default())
            .await
            .expect("delete the leader's claim");
    } else {
        claims
            .patch_status(
                &held.name_any(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"phase": "Expired"}})),
            )
            .await
            .expect("expire the leader's claim");
    }
}

/// A leader whose term ends when it sees the lease go (as `examples/batch_controller.rs`
/// does: its work stops on `handle.cancellation()`), and whose first term fails: every loss,
/// and the failed term, lead back to campaigning; shutdown releases and returns.
#[tokio::test]
async fn a_leader_campaigns_again_after_every_loss_and_after_a_failed_term() {
    let ns = TestNamespace::new("holder-elect-again").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("batch", 15);
    let client = ns.holder_client().await;
    let claims: Api<FencedLeaseClaim> = ns.api();
    let shutdown = CancellationToken::new();
    let (leadership, mut changes) = watch::channel(Leadership::default());
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let options = ElectOptions::new(shutdown.clone())
        .identity("solo")
        .leadership(leadership);
    let mut term = 0u32;
    let lead = move |leader: LeaseHandle| {
        term += 1;
        let (terms, this_term) = (terms_tx.clone(), term);
        async move {
            let token = leader.token().map_err(|e| e.to_string())?;
            let _ = terms.send(token);
            if this_term == 1 {
                return Err(format!("term {this_term} failed"));
            }
            // Work until the lease goes, then end the term quietly.
            leader.cancellation().cancelled().await;
            Ok(())
        }
    };
    let election = tokio::spawn({
        let ns = ns.name.clone();
        async move { elect(client, &ns, "batch", options, lead).await }
    });

    // Term 1 fails at once: a step-down, and the candidate leads again.
    let mut last = recv_token(&mut terms).await;
    let mut tokens = vec![last];
    let next = recv_token(&mut terms).await;
    assert!(next > last, "{next} after {last}");
    last = next;
    tokens.push(last);

    // Losses: the claim deleted (heartbeats then find nothing), then the claim made Expired
    // (the apiserver then refuses its heartbeats, I9), then deleted again.
    for loss in ["deleted", "expired", "deleted"] {
        wait_for_leading(&mut changes, Some(last)).await;
        lose(&claims, loss).await;
        let next = recv_token(&mut terms).await;
        assert!(
            next > last,
            "after the claim was {loss}: {next} after {last}"
        );
        last = next;
        tokens.push(last);
    }
    assert!(!election.is_finished(), "elect returned: {tokens:?}");
    wait_for_leading(&mut changes, Some(last)).await;
    assert_eq!(changes.borrow().leader.as_deref(), Some("solo"));

    shutdown.cancel();
    tokio::time::timeout(WAIT, election)
        .await
        .expect("elect returns on shutdown")
        .expect("join")
        .expect("elect ok");
    assert_eq!(changes.borrow().leading, None);
    wait_for("the claim to be released on shutdown", WAIT, || async {
        claim_of(&claims, "solo").await.is_none().then_some(())
    })
    .await;
    eprintln!("MEASURED terms led: tokens {tokens:?}");
}

async fn recv_token(terms: &mut mpsc::UnboundedReceiver<i64>) -> i64 {
    tokio::time::timeout(WAIT, terms.recv())
        .await
        .expect("a new term in time")
        .expect("the election runs")
}

async fn wait_for_leading(changes: &mut watch::Receiver<Leadership>, token: Option<i64>) {
    tokio::time::timeout(WAIT, changes.wait_for(|l| l.leading == token))
        .await
        .expect("leadership reported in time")
        .expect("the election runs");
}

async fn recv(terms: &mut mpsc::UnboundedReceiver<Term>) -> Term {
    tokio::time::timeout(WAIT, terms.recv())
        .await
        .expect("a term in time")
        .expect("candidates alive")
}
