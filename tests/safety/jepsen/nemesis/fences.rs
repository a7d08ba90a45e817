//! Edits of a lease's `spec.fence`: invalid ones, which the apiserver must refuse, and the
//! largest valid selector, which the operator must put in place.

use super::*;

impl Nemesis<'_> {
    /// Edits a lease's `spec.fence` (as cluster-admin) to values the schema refuses (issue 38,
    /// item 6, and kinds that may never be fenced), each of which must be refused at
    /// admission; and lease `d`'s selector to the largest the schema admits, which must be
    /// accepted and, by the operator, put in place (or its lease not granted: `d` has no
    /// claims, so what is watched is its kinds policy taking the new selector). Then both
    /// fences are put back. Every answer is recorded ([`Event::FenceEdit`]).
    pub(super) async fn invalid_fence(&mut self) {
        let kind = FaultKind::InvalidFence;
        let leases = all_leases();
        let (lease, _) = leases[self.rng.random_range(0..leases.len())];
        self.start_on(
            kind,
            format!(
                "lease {lease}: spec.fence edited to invalid values; lease {FENCE_ONLY}: its selector to the largest the schema admits; then both put back"
            ),
            None,
            Some(lease.to_string()),
        );
        let api = self.cluster.ns.api::<FencedLease>();
        let invalid = invalid_fences(&fence_of(lease)["resources"]);
        let mut refused = 0;
        for (edit, value) in &invalid {
            let (accepted, answer) = replace_fence(&api, lease, &["fence"], value).await;
            refused += usize::from(!accepted);
            self.rec.record(Event::FenceEdit {
                lease: lease.to_string(),
                edit: format!("spec.fence: {edit}"),
                invalid: true,
                accepted,
                answer,
                in_force: None,
            });
        }
        let (accepted, in_force) = self.largest_selector_on_d(&api).await;
        // The collateral writer writes meanwhile, under the big selector's condition.
        tokio::time::sleep(self.secs(2.0, 3.0)).await;

        let mut healed = vec![];
        for name in [lease, FENCE_ONLY] {
            healed.push(put_fence_back(&api, name).await);
        }
        let back = self.fence_in_place(FENCE_ONLY).await;
        self.end(
            kind,
            format!(
                "{refused} of {} invalid edits of lease {lease} refused; the largest selector on {FENCE_ONLY}: accepted {accepted}, its kind listed in a kinds slot: {in_force:?}; {}; {FENCE_ONLY}'s kind listed after: {back}",
                invalid.len(),
                healed.join(", "),
            ),
        );
    }

    /// Valid: the largest selector the schema admits, on lease d; recorded. Whether it was
    /// accepted, and then whether it is in force.
    async fn largest_selector_on_d(&mut self, api: &Api<FencedLease>) -> (bool, Option<bool>) {
        let big = largest_selector();
        let (accepted, answer) = replace_fence(api, FENCE_ONLY, &["fence", "selector"], &big).await;
        // The selector is read from the lease itself, by the apiserver: in force while a kinds
        // slot lists the namespace for the lease's kind.
        let in_force = if accepted {
            Some(self.fence_in_place(FENCE_ONLY).await)
        } else {
            None
        };
        self.rec.record(Event::FenceEdit {
            lease: FENCE_ONLY.to_string(),
            edit: "spec.fence.selector: the largest the schema admits (16 matchLabels, 16 matchExpressions of 64 values, keys of 317 and values of 63 characters)".into(),
            invalid: false,
            accepted,
            answer: answer.chars().take(300).collect(),
            in_force,
        });
        (accepted, in_force)
    }

    /// Whether a kinds slot lists the run's namespace for lease `lease`'s kinds (waits up to
    /// 10 s for it).
    async fn fence_in_place(&self, lease: &str) -> bool {
        let fence = fence_of(lease);
        let kinds: Vec<(String, String)> = (fence["resources"].as_array().into_iter().flatten())
            .map(|r| {
                let field = |f: &str| r[f].as_str().unwrap_or_default().to_string();
                (field("group"), field("resource"))
            })
            .collect();
        let started = tokio::time::Instant::now();
        loop {
            let listed = !self.slots_listing(&kinds).await.is_empty();
            if listed || started.elapsed() > Duration::from_secs(10) {
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The invalid values of a `spec.fence` whose kinds are `resources`, each with what is wrong.
fn invalid_fences(resources: &serde_json::Value) -> [(&'static str, serde_json::Value); 4] {
    [
        (
            "selector operator \"in\" (for In)",
            json!({"resources": resources, "selector": {"matchExpressions": [{"key": "app", "operator": "in", "values": ["x"]}]}}),
        ),
        (
            "selector value \"not a label value\"",
            json!({"resources": resources, "selector": {"matchLabels": {"app": "not a label value"}}}),
        ),
        (
            "kind coordination.k8s.io/leases",
            json!({"resources": [{"group": "coordination.k8s.io", "resource": "leases"}]}),
        ),
        (
            "kind events (core)",
            json!({"resources": [{"group": "", "resource": "events"}]}),
        ),
    ]
}

/// Puts lease `name`'s own `spec.fence` back (tried 20 times, 500 ms apart): what came of it.
async fn put_fence_back(api: &Api<FencedLease>, name: &str) -> String {
    let mut ok = false;
    for _ in 0..20 {
        if replace_fence(api, name, &["fence"], &fence_of(name))
            .await
            .0
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    format!("{name}: {}", if ok { "put back" } else { "NOT put back" })
}

/// Sets `spec.<path>` of lease `lease` to `value`, exactly (a read, then a replace on its
/// resourceVersion; read again on a conflict): whether the apiserver accepted it, and its
/// answer. Raw JSON, so that what the schema refuses reaches the apiserver as it is.
async fn replace_fence(
    api: &Api<FencedLease>,
    lease: &str,
    path: &[&str],
    value: &serde_json::Value,
) -> (bool, String) {
    let resource = ApiResource::erase::<FencedLease>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        api.namespace().unwrap_or_default(),
        &resource,
    );
    let mut answer = String::new();
    for _ in 0..5 {
        let mut object = match raw.get(lease).await {
            Ok(object) => object,
            Err(e) => return (false, format!("cannot read the lease: {e}")),
        };
        let mut at = &mut object.data["spec"];
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value.clone();
        match raw.replace(lease, &PostParams::default(), &object).await {
            Ok(l) => {
                return (
                    true,
                    format!(
                        "accepted (resourceVersion {})",
                        l.metadata.resource_version.unwrap_or_default()
                    ),
                );
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                answer = format!("{} {}: {}", e.code, e.reason, e.message);
            }
            Err(kube::Error::Api(e)) => {
                let text = format!("{} {}: {}", e.code, e.reason, e.message);
                return (false, text.chars().take(400).collect());
            }
            Err(e) => return (false, format!("no answer: {e}")),
        }
    }
    (false, answer)
}

/// The largest `spec.fence.selector` the CRD's schema admits: 16 matchLabels and 16
/// matchExpressions (In, 64 values each), keys of 317 characters (a 253-character prefix),
/// values of 63. It selects none of the run's objects.
fn largest_selector() -> serde_json::Value {
    let prefix = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let key = |tag: &str, i: usize| format!("{prefix}/{tag}{i:02}{}", "x".repeat(60));
    let value = |i: usize| format!("v{i:02}{}", "v".repeat(60));
    let labels: serde_json::Map<String, serde_json::Value> =
        (0..16).map(|i| (key("k", i), json!(value(i)))).collect();
    let expressions: Vec<serde_json::Value> = (0..16)
        .map(|i| {
            json!({
                "key": key("e", i),
                "operator": "In",
                "values": (0..64).map(value).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"matchLabels": labels, "matchExpressions": expressions})
}
