//! The apiserver's own request counters (`apiserver_request_total`): how many writes a
//! measurement cost, and of what.

use std::collections::BTreeMap;

use kube::Client;

use crate::Res;

/// `apiserver_request_total` of the write verbs, by "VERB resource[/subresource]".
pub async fn apiserver_writes(client: &Client) -> Res<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(vec![])?;
    let text = client.request_text(request).await?;
    let mut writes = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let verb = label("verb");
        if !matches!(
            verb.as_str(),
            "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY" | "DELETECOLLECTION"
        ) {
            continue;
        }
        let (resource, sub) = (label("resource"), label("subresource"));
        let what = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        *writes.entry(what).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(writes)
}

/// `after - before`, dropping what did not change.
pub fn diff(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

pub fn total(writes: &BTreeMap<String, f64>) -> f64 {
    writes.values().sum()
}

/// The `top` largest of `writes`, each divided by `per`: "VERB resource 1.23, ...".
pub fn top_writes(writes: &BTreeMap<String, f64>, per: f64, top: usize) -> String {
    let mut all: Vec<(&String, &f64)> = writes.iter().collect();
    all.sort_by(|a, b| b.1.total_cmp(a.1));
    all.iter()
        .take(top)
        .map(|(w, c)| format!("{w} {:.2}", *c / per))
        .collect::<Vec<_>>()
        .join(", ")
}
