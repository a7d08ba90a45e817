//! The chart's alerts in a real Prometheus (tests/common/prometheus.rs), loaded as the chart
//! renders its PrometheusRule, scraping the test control plane's apiserver and the operator.
//!
//! FencedLeaseWriteRefused: a holder pod stops heartbeating (paused past its term), the lease
//! goes to the next pod, and the first pod resumes and writes with its old token. The apiserver
//! refuses it; the critical alert must then be firing in Prometheus's alerts API within
//! [`BOUND`], naming the policy, and the audit log's event of the write must name the pod, and
//! its validation failure the lease and both tokens. Before that, with the holder writing and Prometheus evaluating, it
//! must not fire (the apiserver already carries the refusals of the tests run before: a new
//! Prometheus must not take them for new ones). The dashboard's panel of refusals shows it too.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::audit;
use crate::common::fence::fenced_config_map;
use crate::common::operator::OperatorProcess;
use crate::common::prometheus::{INTERVAL, Prometheus};
use crate::common::{TestNamespace, wait_for};
use crate::helm::render_with;

const WAIT: Duration = Duration::from_secs(30);

/// From the refused write to the alert firing in Prometheus: a scrape and an evaluation
/// (2 s each here) and the apiserver's answer, with room for a 2-core machine under load.
const BOUND: Duration = Duration::from_secs(20);

const ALERT: &str = "FencedLeaseWriteRefused";

/// The rule groups of the chart's PrometheusRule, as `helm template` renders it.
pub(crate) fn chart_rule_groups(namespace: &str) -> Value {
    let objects = render_with(
        namespace,
        &[
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
            "--set",
            "monitoring.prometheusRule.enabled=true",
        ],
    );
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("the chart renders a PrometheusRule");
    rule["spec"]["groups"].clone()
}

/// The query of the dashboard's panel whose title starts with `title`.
pub(crate) fn dashboard_query(title: &str) -> String {
    let path = crate::common::repo_root().join("deploy/monitoring/dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"].as_str().is_some_and(|t| t.starts_with(title)))
        .unwrap_or_else(|| panic!("the dashboard's panel {title:?}"));
    panel["targets"][0]["expr"].as_str().unwrap().to_string()
}

/// The alert `ALERT` for `policy`, if Prometheus has it firing now.
async fn firing(prometheus: &Prometheus, policy: &str) -> Option<Value> {
    prometheus.alerts().await.into_iter().find(|a| {
        a["labels"]["alertname"] == ALERT
            && a["labels"]["policy"] == policy
            && a["state"] == "firing"
    })
}

/// `pod`'s write of ConfigMap ledger's data, stamped with `token`: the status of the answer.
async fn write_as(api: &Api<ConfigMap>, token: i64, data: &str) -> Result<(), (u16, String)> {
    let patch = json!({
        "metadata": {"annotations": {"fencing.dev/token": token.to_string()}},
        "data": {"data": data},
    });
    match api
        .patch("ledger", &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err((e.code, e.message)),
        Err(e) => Err((0, e.to_string())),
    }
}

/// The requests in `namespace` the audit log records a fence policy's refusal of, as it has
/// them now: the writer's pod, and the annotation
/// `validation.policy.admission.k8s.io/validation_failure` (the bindings' `Audit` action).
fn refusals_in_audit_log(namespace: &str) -> Vec<(String, String)> {
    let key = "validation.policy.admission.k8s.io/validation_failure";
    audit::events()
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter_map(|e| {
            let pod = e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0].as_str();
            let failure = e["annotations"][key].as_str()?;
            Some((pod.unwrap_or_default().to_string(), failure.to_string()))
        })
        .collect()
}

/// The holder pa writes ConfigMap ledger with its token `first`, as often as it likes: no
/// alert, pending or firing, over 8 scrapes.
async fn the_holders_writes_fire_nothing(
    prometheus: &Prometheus,
    as_pa: &Api<ConfigMap>,
    first: i64,
) {
    let ledger = fenced_config_map("ledger", "books", &first.to_string(), "pa 1");
    wait_for("the holder pa's first write", WAIT, || async {
        as_pa.create(&PostParams::default(), &ledger).await.ok()
    })
    .await;
    let evaluations = |n: u32| format!("count_over_time(up{{job=\"apiserver\"}}[1h]) >= {n}");
    for i in 0..5 {
        write_as(as_pa, first, &format!("pa {i}"))
            .await
            .expect("the holder's write");
        tokio::time::sleep(INTERVAL).await;
    }
    wait_for("Prometheus to scrape 8 times", WAIT, || async {
        (!prometheus
            .query(&evaluations(8))
            .await?
            .as_array()?
            .is_empty())
        .then_some(())
    })
    .await;
    let quiet = prometheus
        .query(&format!("ALERTS{{alertname=\"{ALERT}\"}}[1h]"))
        .await
        .expect("query ALERTS");
    assert_eq!(
        quiet,
        json!([]),
        "{ALERT} was pending or firing with no write refused"
    );
}

/// pa's write with token `first`, refused at `refused_at` while pb holds `second`: the
/// critical alert fires within [`BOUND`] naming the policy, the audit log names the pod, the
/// lease and both tokens, and the dashboard's panel shows it.
async fn assert_alerted_and_audited(
    prometheus: &Prometheus,
    ns: &TestNamespace,
    (first, second): (i64, i64),
    refused_at: Instant,
) {
    let policy = "fenced-lease-lease-token";
    let alert = wait_for(&format!("{ALERT} firing"), BOUND, || {
        firing(prometheus, policy)
    })
    .await;
    eprintln!(
        "{ALERT} firing {:.1} s after the refused write: {alert}",
        refused_at.elapsed().as_secs_f64()
    );
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    let expected = format!(
        "pod pa does not hold FencedLease {}/books (pod pb holds it, token {second}; this write carries token {first})",
        ns.name
    );
    let recorded = wait_for("the refusal in the audit log", WAIT, || async {
        refusals_in_audit_log(&ns.name)
            .into_iter()
            .find(|(pod, failure)| {
                pod == "pa" && failure.contains(&expected) && failure.contains(policy)
            })
    })
    .await;
    eprintln!(
        "audit log: pod {}, validation failure {}",
        recorded.0, recorded.1
    );
    let panel = dashboard_query("Writes the fence refused");
    assert!(
        prometheus.shows(&panel, "policy", policy).await,
        "the dashboard's panel does not show the refusal: {:?}",
        prometheus.query(&panel).await
    );
}

#[tokio::test]
async fn a_paused_holders_refused_write_fires_the_critical_alert_in_a_real_prometheus() {
    let _serial = crate::OPERATORS.lock().await;
    let ns = TestNamespace::new("alert").await;
    audit::log_path(); // the audit log on before anything of this test is written
    ns.with_fence_policies().await;
    let op = OperatorProcess::start(&ns.name, &[]);
    let groups = chart_rule_groups(&ns.name);
    let prometheus = Prometheus::start(&ns.name, &groups, Some(op.http_port().await)).await;
    let pods = ns.app_pods(&["pa", "pb"]).await;
    ns.kubectl_apply("apiVersion: fencing.dev/v1alpha1\nkind: FencedLease\nmetadata: {name: books}\nspec: {leaseDurationSeconds: 3, fenceObjects: true}\n");
    ns.create_claim("pa", "books", Some("pa")).await;
    let first = wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    let beat = ns.keep_beating("pa", Duration::from_secs(1));
    ns.create_claim("pb", "books", Some("pb")).await;
    let _waiting = ns.keep_beating("pb", Duration::from_secs(1));

    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(&pods[0]).await, &ns.name);
    the_holders_writes_fire_nothing(&prometheus, &as_pa, first).await;

    // pa pauses past its term: pb is granted.
    drop(beat);
    let second = wait_for("pb granted after pa's term", WAIT, || {
        ns.granted_token("pb")
    })
    .await;
    // pa resumes and writes with its old token until the apiserver, whose cache of the lease
    // may lag the grant a moment (I11), refuses it.
    let refusal = wait_for("pa's stale write refused", WAIT, || async {
        write_as(&as_pa, first, "pa stale").await.err()
    })
    .await;
    let refused_at = Instant::now();
    assert_eq!(refusal.0, 403, "pa's stale write: {refusal:?}");
    assert_alerted_and_audited(&prometheus, &ns, (first, second), refused_at).await;
    drop(prometheus);
}
