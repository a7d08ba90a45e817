//! Fenced leader election against the real operator: one leader at a time, each term with a
//! larger token stamped on what it writes, the term's cancellation fired on loss, and the
//! loser queueing again.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::operator::OperatorProcess;
use common::{TestNamespace, wait_for};
use fenced_lease::api::FencedLeaseClaim;
use fenced_lease::holder::{AcquireOptions, ElectOptions, elect};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum Term {
    Began { who: &'static str, token: i64 },
    Cancelled { who: &'static str },
}

#[tokio::test]
async fn leaders_take_turns_with_growing_tokens_and_the_loser_queues_again() {
    let ns = TestNamespace::new("holder-elect").await;
    let _operator = OperatorProcess::start(&ns.name, &[]);
    ns.create_lease("batch", 15);
    let client = ns.holder_client().await;
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();

    let candidate = |who: &'static str| {
        let (client, ns, terms, shutdown) = (
            client.clone(),
            ns.name.clone(),
            terms_tx.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            let options = ElectOptions {
                acquire: AcquireOptions::default().identity(who),
                shutdown,
            };
            let lead = |leader: fenced_lease::holder::LeaseHandle| {
                let (client, terms) = (client.clone(), terms.clone());
                async move {
                    let token = leader.token().expect("a new leader holds the lease");
                    // Stamp the token on what this term writes.
                    let stamped = ConfigMap {
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
                    };
                    Api::<ConfigMap>::namespaced(client, leader.namespace())
                        .create(&PostParams::default(), &stamped)
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
                    std::future::pending::<()>().await;
                }
            };
            elect(client.clone(), &ns, "batch", options, lead).await
        })
    };
    let a = candidate("a");
    let first = recv(&mut terms).await;
    let Term::Began { who: "a", token } = first else {
        panic!("expected a to lead first: {first:?}");
    };
    let b = candidate("b");
    let claims: Api<FencedLeaseClaim> = ns.api();
    wait_for("b to queue", WAIT, || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|c| c.spec.holder_identity == "b")
            .then_some(())
    })
    .await;

    // Take the lease from a (as its pod's deletion would): a's term is cancelled, b leads
    // with the next token, and a queues again.
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
        match recv(&mut terms).await {
            Term::Cancelled { who: "a" } => a_cancelled = true,
            Term::Began { who: "b", token } => b_token = Some(token),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(b_token, Some(token + 1));
    wait_for("a to queue again", WAIT, || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|c| c.spec.holder_identity == "a")
            .then_some(())
    })
    .await;

    // The stamped objects carry each term's token.
    let cms: Api<ConfigMap> = ns.api();
    for (who, t) in [("a", token), ("b", token + 1)] {
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

async fn recv(terms: &mut mpsc::UnboundedReceiver<Term>) -> Term {
    tokio::time::timeout(WAIT, terms.recv())
        .await
        .expect("a term in time")
        .expect("candidates alive")
}
