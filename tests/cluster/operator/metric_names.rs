//! Every metric and label name that the alerts (`deploy/monitoring/alerts.yaml`) and the Grafana
//! dashboard (`deploy/monitoring/dashboard.json`) use of the operator's metrics is one a live
//! operator exports (an alert on the apiserver's metrics is tests/chart/alerts.rs's): the names
//! are read from those two files, and checked against the `/metrics` of an operator that serves
//! a granted lease, a waiting claim and a Degraded lease.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::operator::OperatorProcess;
use common::{TestNamespace, http_get, repo_root, wait_for};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// What one PromQL expression uses: `fenced_lease_*` metric names with the label names of
/// their matchers (`{…}`), and the label names it groups or matches by (`by`, `without`, `on`,
/// `ignoring`, `group_left`, `group_right`, and Grafana's `label_values(…, label)`).
#[derive(Debug, Default, PartialEq)]
struct Uses {
    metrics: BTreeMap<String, BTreeSet<String>>,
    grouping: BTreeSet<String>,
}

/// Reads PromQL loosely: identifiers, `{…}` after a metric name, and `(…)` after a grouping
/// keyword; string literals are skipped.
fn promql_uses(expr: &str) -> Uses {
    let chars: Vec<char> = expr.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_string = |i: &mut usize| {
        let quote = chars[*i];
        *i += 1;
        while *i < chars.len() && chars[*i] != quote {
            *i += if chars[*i] == '\\' { 2 } else { 1 };
        }
        *i += 1;
    };
    let read_ident = |i: &mut usize| {
        let start = *i;
        while *i < chars.len() && ident_char(chars[*i]) {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    let skip_space = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            skip_string(&mut i);
        } else if ident_start(c) {
            let ident = read_ident(&mut i);
            skip_space(&mut i);
            let next = chars.get(i).copied();
            if ident.starts_with("fenced_lease_") {
                let labels = uses.metrics.entry(ident).or_default();
                if next == Some('{') {
                    i += 1;
                    while i < chars.len() && chars[i] != '}' {
                        if matches!(chars[i], '"' | '\'' | '`') {
                            skip_string(&mut i);
                        } else if ident_start(chars[i]) {
                            labels.insert(read_ident(&mut i));
                        } else {
                            i += 1;
                        }
                    }
                }
            } else if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&ident.as_str())
                && next == Some('(')
            {
                while i < chars.len() && chars[i] != ')' {
                    if ident_start(chars[i]) {
                        uses.grouping.insert(read_ident(&mut i));
                    } else {
                        i += 1;
                    }
                }
            } else if ident == "label_values" && next == Some('(') {
                // label_values(selector, label): the label is the last argument.
                let close = chars[i..].iter().rposition(|c| *c == ')').map(|p| i + p);
                let args: String = chars[i + 1..close.unwrap_or(chars.len())].iter().collect();
                if let Some((_, label)) = args.rsplit_once(',') {
                    uses.grouping.insert(label.trim().to_string());
                }
            }
        } else {
            i += 1;
        }
    }
    uses
}

/// The clauses of `expr` joined by a top-level `or`: each is checked on its own, so that an
/// alert on both the operator's and the apiserver's metrics (FencedLeaseWriteRefused) is held
/// to the operator's names only where it reads the operator's.
fn clauses(expr: &str) -> Vec<String> {
    let (mut out, mut current, mut depth) = (vec![], String::new(), 0i32);
    let mut quote: Option<char> = None;
    let words: Vec<&str> = expr.split_inclusive(char::is_whitespace).collect();
    for word in words {
        if quote.is_none() && depth == 0 && word.trim() == "or" {
            out.push(std::mem::take(&mut current));
            continue;
        }
        for c in word.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'' | '`') => quote = Some(c),
                (None, '(') => depth += 1,
                (None, ')') => depth -= 1,
                _ => {}
            }
        }
        current.push_str(word);
    }
    out.push(current);
    out.into_iter().filter(|c| !c.trim().is_empty()).collect()
}

/// The expressions of the alert rules.
fn rule_exprs() -> Vec<(String, String)> {
    let path = repo_root().join("deploy/monitoring/alerts.yaml");
    let rules: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("alerts.yaml is YAML");
    let mut exprs = vec![];
    for group in rules["groups"].as_array().expect("rule groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            exprs.push((
                format!("alert {name}"),
                rule["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    exprs
}

/// The queries of the dashboard's panels and template variables.
fn dashboard_exprs() -> Vec<(String, String)> {
    let path = repo_root().join("deploy/monitoring/dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("dashboard.json is JSON");
    let mut exprs = vec![];
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                format!("panel {}", panel["title"]),
                target["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if var["type"] == "query" {
            let query = var["query"]["query"].as_str().or(var["query"].as_str());
            exprs.push((
                format!("variable {}", var["name"]),
                query.expect("a query").to_string(),
            ));
        }
    }
    exprs
}

/// Sample names of a text exposition, each with the label names its samples carry.
fn exported(body: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = names.entry(line[..end].to_string()).or_default();
        let Some(rest) = line[end..].strip_prefix('{') else {
            continue;
        };
        // k="v",k="v"} value: values may hold commas and escaped quotes.
        let mut rest = rest;
        while let Some((key, after)) = rest.split_once("=\"") {
            labels.insert(key.trim_start_matches(',').to_string());
            let mut escaped = false;
            let close = after
                .char_indices()
                .find(|(_, c)| {
                    let end = *c == '"' && !escaped;
                    escaped = *c == '\\' && !escaped;
                    end
                })
                .map_or(after.len(), |(i, _)| i);
            rest = &after[close + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    names
}

/// What `uses` (from `source`) asks for that `exported` does not have.
fn missing(
    source: &str,
    uses: &Uses,
    exported: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut missing = vec![];
    // The labels Prometheus gives every series of a scrape target.
    let mut labels_of_expr = BTreeSet::from(["job".to_string(), "instance".to_string()]);
    for (metric, labels) in &uses.metrics {
        let Some(has) = exported.get(metric) else {
            missing.push(format!("{source}: metric {metric}"));
            continue;
        };
        labels_of_expr.extend(has.iter().cloned());
        for label in labels.difference(has) {
            missing.push(format!("{source}: label {label} of {metric}"));
        }
    }
    for label in uses.grouping.difference(&labels_of_expr) {
        missing.push(format!(
            "{source}: label {label} (by, on, label_values) of none of its metrics"
        ));
    }
    missing
}

#[test]
fn an_expression_is_checked_clause_by_clause() {
    assert_eq!(
        clauses("sum by (a) (x or y) > 0\nor\nmax by (b) (z{l=\"p or q\"}) or w"),
        [
            "sum by (a) (x or y) > 0\n",
            "max by (b) (z{l=\"p or q\"}) ",
            "w"
        ]
    );
}

#[test]
fn promql_is_read_for_metric_and_label_names() {
    let uses = promql_uses(
        r#"histogram_quantile(0.9, sum by (le) (rate(fenced_lease_x_bucket{namespace=~"a,b}",lease!="x"}[5m])))
           / on(namespace) group_left fenced_lease_y and ignoring (pod) time() - fenced_lease_z"#,
    );
    let labels = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        uses.metrics,
        BTreeMap::from([
            (
                "fenced_lease_x_bucket".into(),
                labels(&["namespace", "lease"])
            ),
            ("fenced_lease_y".into(), labels(&[])),
            ("fenced_lease_z".into(), labels(&[])),
        ])
    );
    assert_eq!(uses.grouping, labels(&["le", "namespace", "pod"]));
    let grafana = promql_uses(r#"label_values(fenced_lease_h{namespace=~"$namespace"}, lease)"#);
    assert_eq!(grafana.grouping, labels(&["lease"]));

    let body = "# TYPE fenced_lease_x histogram\nfenced_lease_x_bucket{le=\"0.5\",namespace=\"a,\\\"b\",lease=\"l\"} 1\nfenced_lease_y 0\n# EOF\n";
    let found = exported(body);
    assert_eq!(
        found["fenced_lease_x_bucket"],
        labels(&["le", "namespace", "lease"])
    );
    assert_eq!(found["fenced_lease_y"], labels(&[]));
    assert_eq!(
        missing("e", &uses, &found),
        [
            "e: metric fenced_lease_z",
            "e: label pod (by, on, label_values) of none of its metrics"
        ]
    );
}

#[tokio::test]
async fn the_alerts_and_the_dashboard_use_only_names_the_operator_exports() {
    // An expression of none of the operator's metrics reads another exporter's (the
    // apiserver's refusal counter: tests/chart/alerts.rs runs that one against the real one).
    let used: Vec<(String, Uses)> = rule_exprs()
        .into_iter()
        .chain(dashboard_exprs())
        .flat_map(|(source, expr)| clauses(&expr).into_iter().map(move |c| (source.clone(), c)))
        .map(|(source, expr)| (source, promql_uses(&expr)))
        .filter(|(_, uses)| !uses.metrics.is_empty())
        .collect();
    let metrics: BTreeSet<&String> = used.iter().flat_map(|(_, u)| u.metrics.keys()).collect();
    assert!(
        metrics.len() >= 12,
        "only {} metric names read from the rules and the dashboard: {metrics:?}",
        metrics.len()
    );

    let ns = TestNamespace::new("metric-names").await;
    let op = OperatorProcess::start(
        &ns.name,
        &[
            "--leader-election=true",
            "--leader-election-lease-seconds",
            "3",
        ],
    );
    let port = op.http_port().await;
    // A lease whose token record is unreadable: Degraded, and its reconciles fail.
    ns.kubectl_apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fenced-lease-tokens.{}}}\ndata: {{broken: \"1152921504606846976\\n\"}}\n",
        ns.name
    ));
    ns.create_lease("broken", 15);
    ns.create_claim("b", "broken", None).await;
    // A lease held, with a claim waiting; both heartbeat, so neither is expired meanwhile.
    ns.create_lease("l", 15);
    ns.create_claim("c", "l", None).await;
    let _holder = ns.keep_beating("c", Duration::from_secs(2));
    wait_for("the grant", WAIT, || ns.granted_token("c")).await;
    ns.create_claim("c2", "l", None).await;
    let _waiter = ns.keep_beating("c2", Duration::from_secs(2));
    // A holder reports a refused write of lease l (the per-lease count of reported refusals).
    let kubeconfig = ns.holder_service_account_kubeconfig("reporter", true).await;
    let reporter = common::client_from_kubeconfig(&kubeconfig).await;
    let user = format!("system:serviceaccount:{}:reporter", ns.name);
    let lease = fenced_lease::holder::refusals::lease_reference(&ns.name, "l");
    let report = fenced_lease::holder::refusals::refusal_event(&lease, &user, 1, "refused");
    kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(reporter, &ns.name)
        .create(&Default::default(), &report)
        .await
        .expect("the holder's report");

    // The series appear as the operator gets there: wait until every name is exported.
    let started = Instant::now();
    let mut last = (vec![], String::new());
    while started.elapsed() < WAIT {
        if let Some((_, body)) = http_get(port, "/metrics").await {
            let found = exported(&body);
            let gaps: Vec<String> = used
                .iter()
                .flat_map(|(source, uses)| missing(source, uses, &found))
                .collect();
            if gaps.is_empty() {
                return;
            }
            last = (gaps, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "after {WAIT:?}, the operator does not export what the alerts and the dashboard use:\n  {}\n/metrics:\n{}",
        last.0.join("\n  "),
        last.1
    );
}
