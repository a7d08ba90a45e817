//! A FencedLease that follows a coordination Lease (`spec.follow`), as an unmodified
//! controller's leader election writes it: the test writes the Lease as client-go's elector
//! does (`holderIdentity` `<pod>_<uuid>`, `leaseTransitions` counting changes of hands), and
//! two pods write what the lease fences with their own pod-bound tokens.
//! - the Lease's holder's pod, and only it, may write what the lease fences; its pod carries
//!   the token (I5);
//! - every change of holder (another identity, the same one in a new term, the Lease deleted
//!   and created again, the FencedLease deleted and created again) takes a higher token (I1);
//! - nobody holds while the Lease is missing, released, or names no pod (fail closed, with a
//!   condition and a Warning Event naming the identity);
//! - claims of a following lease are refused, with the reason; once it stops following, claims
//!   are granted again above every token it issued.

use crate::common;

use std::time::Duration;

use common::cli::both;
use common::operator::OperatorProcess;
use common::pods::TestPod;
use common::{TestNamespace, wait_for};
use fenced_lease::api::{FencedLease, FencedLeaseClaim, token_annotation_key};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// `fenced` follows Lease `ctrl` and fences the namespace's ConfigMaps.
const FENCED: &str = r#"
apiVersion: fencing.dev/v1alpha1
kind: FencedLease
metadata: {name: fenced}
spec:
  follow: {lease: ctrl}
  fence:
    resources:
      - {resource: configmaps}
"#;

/// Writes Lease `ctrl` as client-go's elector does: `holder` (`""`: released) in term
/// `transitions`.
async fn elect(ns: &TestNamespace, holder: &str, transitions: i32) {
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ctrl"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "leaseTransitions": transitions},
    });
    let params = PatchParams::apply("test-elector").force();
    ns.api::<Lease>()
        .patch("ctrl", &params, &Patch::Apply(&lease))
        .await
        .expect("write Lease ctrl");
}

/// Whether `client` may create a ConfigMap (dry run: admission runs, nothing is stored), or
/// the refusal's message.
async fn write(client: &Client, ns: &str) -> Result<(), String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("w-".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&params, &cm).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(e.message),
        Err(e) => Err(e.to_string()),
    }
}

/// Waits until `writer` may write and `other` may not (the apiserver's informer has the
/// lease's status), and returns the refusal of `other`.
async fn only_writer(ns: &TestNamespace, writer: &Client, other: &Client, what: &str) -> String {
    wait_for(what, WAIT, || async {
        match (write(writer, &ns.name).await, write(other, &ns.name).await) {
            (Ok(()), Err(refused)) if refused.contains("does not hold") => Some(refused),
            _ => None,
        }
    })
    .await
}

/// Waits until neither pod may write.
async fn nobody_writes(ns: &TestNamespace, a: &Client, b: &Client, what: &str) {
    wait_for(what, WAIT, || async {
        let (a, b) = (write(a, &ns.name).await, write(b, &ns.name).await);
        (a.is_err() && b.is_err()).then_some(())
    })
    .await
}

/// The lease's status once `check` holds on it.
async fn lease_when(
    ns: &TestNamespace,
    what: &str,
    check: impl Fn(&FencedLease) -> bool,
) -> FencedLease {
    let api = ns.api::<FencedLease>();
    wait_for(what, WAIT, || async {
        api.get_opt("fenced").await.ok().flatten().filter(&check)
    })
    .await
}

fn held_by(lease: &FencedLease) -> Option<(String, i64)> {
    let status = lease.status.as_ref()?;
    let holder = status.holder.as_ref()?;
    Some((holder.pod_name.clone()?, status.fencing_token))
}

fn held_reason(lease: &FencedLease) -> String {
    let conditions = lease.status.as_ref().map(|s| s.conditions.clone());
    conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Held")
        .map(|c| c.reason)
        .unwrap_or_default()
}

/// Waits until the lease is held by `pod` with a token above `above`; returns the token.
async fn granted(ns: &TestNamespace, pod: &TestPod, above: i64) -> i64 {
    let lease = lease_when(ns, &format!("{} granted above {above}", pod.name), |l| {
        held_by(l).is_some_and(|(p, t)| p == pod.name && t > above)
    })
    .await;
    let holder = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.clone())
        .unwrap();
    assert_eq!(holder.pod_uid.as_deref(), Some(pod.uid.as_str()));
    assert_eq!(holder.claim, "", "no claim holds a followed lease");
    lease.status.unwrap().fencing_token
}

/// Waits until `pod` carries token `token` of the lease (I5).
async fn annotated(ns: &TestNamespace, pod: &TestPod, token: Option<i64>) {
    let key = token_annotation_key("fenced");
    let want = token.map(|t| t.to_string());
    wait_for(
        &format!("{} annotated {want:?}", pod.name),
        WAIT,
        || async {
            let read = ns.api::<Pod>().get(&pod.name).await.ok()?;
            let has = read.metadata.annotations.and_then(|a| a.get(&key).cloned());
            (has == want).then_some(())
        },
    )
    .await;
}

/// The identity pa leads under, as controller-runtime names it: `<hostname>_<uuid>`.
const PA: &str = "pa_2f9c6d4e-0b1a-4c8e-9d11-5e7f00a1b2c3";

/// The namespace, its two pods and a client as each.
struct Pods<'a> {
    ns: &'a TestNamespace,
    pa: &'a TestPod,
    pb: &'a TestPod,
    ca: Client,
    cb: Client,
}

/// pa leads, then pb takes over by client-go's rules (a new identity, one more transition):
/// each is the only writer and carries the token. Returns pb's token.
async fn pa_leads_then_pb(p: &Pods<'_>) -> i64 {
    let ns = p.ns;
    elect(ns, PA, 0).await;
    let t1 = granted(ns, p.pa, 0).await;
    annotated(ns, p.pa, Some(t1)).await;
    let refused = only_writer(ns, &p.ca, &p.cb, "only pa writes").await;
    assert!(
        refused.contains("pod pb does not hold FencedLease"),
        "{refused}"
    );

    elect(ns, "pb_7a0e1f2d-3c4b-4a5d-8e6f-708192a3b4c5", 1).await;
    let t2 = granted(ns, p.pb, t1).await;
    only_writer(ns, &p.cb, &p.ca, "only pb writes").await;
    annotated(ns, p.pb, Some(t2)).await;
    annotated(ns, p.pa, None).await;
    t2
}

/// An identity that names no pod: nobody holds, and a Warning names the identity.
async fn an_identity_naming_no_pod_holds_nothing(p: &Pods<'_>) {
    let ns = p.ns;
    elect(ns, "node-7.example.internal", 2).await;
    let lost = lease_when(ns, "HolderPodNotFound", |l| {
        held_reason(l) == "HolderPodNotFound"
    })
    .await;
    assert!(held_by(&lost).is_none());
    nobody_writes(ns, &p.ca, &p.cb, "no write while the holder names no pod").await;
    wait_for("a HolderPodNotFound Event", WAIT, || async {
        let events = ns.api::<Event>().list(&Default::default()).await.ok()?;
        events
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("HolderPodNotFound")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("node-7.example.internal"))
            })
            .then_some(())
    })
    .await;
}

/// The Lease deleted, then created again under the same holder and count: another object,
/// another term, a token above `above`, which this returns. Nobody writes in between.
async fn a_recreated_lease_is_a_new_term(p: &Pods<'_>, above: i64) -> i64 {
    let ns = p.ns;
    ns.api::<Lease>()
        .delete("ctrl", &DeleteParams::default())
        .await
        .expect("delete Lease");
    lease_when(ns, "LeaseNotFound after the deletion", |l| {
        held_reason(l) == "LeaseNotFound"
    })
    .await;
    nobody_writes(ns, &p.ca, &p.cb, "no write while the Lease is gone").await;
    elect(ns, PA, 3).await;
    granted(ns, p.pa, above).await
}

/// The FencedLease deleted and created again: its tokens continue above `above`; returns the
/// new one.
async fn a_recreated_fenced_lease_continues_its_tokens(p: &Pods<'_>, above: i64) -> i64 {
    let leases = p.ns.api::<FencedLease>();
    leases
        .delete("fenced", &DeleteParams::default())
        .await
        .expect("delete FencedLease");
    wait_for("the FencedLease gone", WAIT, || async {
        leases.get_opt("fenced").await.ok()?.is_none().then_some(())
    })
    .await;
    let out = p.ns.kubectl_apply(FENCED);
    assert!(out.status.success(), "{}", both(&out));
    granted(p.ns, p.pa, above).await
}

/// Claims of a following lease are refused, and say why; once following stops, pa's hold
/// ends and a claim is granted above `last`, every token issued.
async fn claims_wait_until_it_stops_following(ns: &TestNamespace, last: i64) {
    let claim: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": "c1", "annotations": {"fencing.dev/created-by": "admin"}},
        "spec": {"leaseName": "fenced", "holderIdentity": "c1"},
    }))
    .unwrap();
    let claims = ns.api::<FencedLeaseClaim>();
    let refused = wait_for("the claim refused", WAIT, || async {
        match claims.create(&PostParams::default(), &claim).await {
            Err(kube::Error::Api(e)) if e.message.contains("follows Lease ctrl") => Some(e),
            Ok(_) => {
                let _ = claims.delete("c1", &DeleteParams::default()).await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    assert_eq!(refused.code, 403, "{refused:?}");

    let unfollow = json!({"spec": {"follow": null}});
    ns.api::<FencedLease>()
        .patch("fenced", &PatchParams::default(), &Patch::Merge(&unfollow))
        .await
        .expect("stop following");
    lease_when(ns, "pa's hold ended", |l| held_by(l).is_none()).await;
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("a claim of a lease that no longer follows");
    let lease = lease_when(ns, "the claim granted", |l| {
        let status = l.status.as_ref();
        status
            .and_then(|s| s.holder.as_ref())
            .is_some_and(|h| h.claim == "c1")
    })
    .await;
    let t6 = lease.status.unwrap().fencing_token;
    assert!(t6 > last, "token {t6} after {last}");
}

#[tokio::test]
async fn the_holder_of_a_followed_lease_is_its_leases_holder_and_nobody_else() {
    let ns = TestNamespace::new("follow").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let (ca, cb) = (ns.client_as_pod(pa).await, ns.client_as_pod(pb).await);
    let p = Pods {
        ns: &ns,
        pa,
        pb,
        ca,
        cb,
    };
    let out = ns.kubectl_apply(FENCED);
    assert!(out.status.success(), "{}", both(&out));

    // No Lease yet: nobody holds, and the condition says which Lease is awaited.
    let waiting = lease_when(&ns, "LeaseNotFound", |l| held_reason(l) == "LeaseNotFound").await;
    assert!(held_by(&waiting).is_none());
    nobody_writes(&ns, &p.ca, &p.cb, "no write before the Lease exists").await;

    let t2 = pa_leads_then_pb(&p).await;
    an_identity_naming_no_pod_holds_nothing(&p).await;

    // Released (client-go's ReleaseOnCancel writes an empty identity): nobody holds.
    elect(&ns, "", 2).await;
    lease_when(&ns, "Free", |l| {
        held_reason(l) == "Free" && held_by(l).is_none()
    })
    .await;

    // pa again, a new term: a new token above every earlier one.
    elect(&ns, PA, 3).await;
    let t3 = granted(&ns, pa, t2).await;
    only_writer(&ns, &p.ca, &p.cb, "pa writes again").await;

    let t4 = a_recreated_lease_is_a_new_term(&p, t3).await;
    let t5 = a_recreated_fenced_lease_continues_its_tokens(&p, t4).await;
    claims_wait_until_it_stops_following(&ns, t5).await;
}
