//! Fail closed: a bad selector is refused at admission, and a lease whose fence cannot be put in
//! place is not granted (a condition, a Warning Event, a metric).

use super::*;

/// Issue 38, item 6a (I8, I12): a bad fence selector is refused at admission, 422 naming
/// `spec.fence.selector` (operator `in` for `In`), instead of a lease granted with no fence.
#[tokio::test]
async fn a_lease_with_a_bad_fence_selector_is_refused_at_admission() {
    let ns = TestNamespace::new("sec-selector").await;
    ns.with_fence_policies().await;
    let created = create_lease_as(
        &ns.client,
        &ns.name,
        "books",
        json!({"fence": {
            "resources": [{"resource": "configmaps"}],
            "selector": {"matchExpressions": [{"key": "app", "operator": "in", "values": ["x"]}]},
        }}),
    )
    .await;
    let (code, message) = refusal(&created).unwrap_or_else(|| {
        panic!(
            "a lease with selector operator `in` was {}",
            describe(&created)
        )
    });
    assert!(
        code == 422 && message.contains("spec.fence.selector"),
        "{code} {message}"
    );
}

/// ServiceAccount `operator` of `ns` with the operator's documented RBAC but without
/// `fenced-lease-operator-fences`: its ClusterRole bound cluster-wide (removed with `cleanup`)
/// and its Role in `ns`, once both are in force.
async fn an_operator_identity_without_the_fences_role(
    ns: &TestNamespace,
    cleanup: &mut ClusterObjects,
) {
    ns.create_service_account("operator").await;
    bind_operator_cluster_roles(ns, "operator", &["fenced-lease-operator"], cleanup);
    apply(
        ns,
        &operator_rbac_document("Role", "fenced-lease-operator").to_string(),
    );
    apply(
        ns,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "fenced-lease-operator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fenced-lease-operator"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns.name}],
        })
        .to_string(),
    );
    let as_operator = ns.client_as("operator", None).await;
    for (kind, role) in [
        ("ClusterRole", "fenced-lease-operator"),
        ("Role", "fenced-lease-operator"),
    ] {
        wait_role_in_force(&as_operator, &ns.name, &operator_rbac_document(kind, role)).await;
    }
}

/// Lease fenced (fencing ConfigMaps) and lease plain (no fence), each with a claim that
/// heartbeats every second while the returned beats live.
async fn a_fenced_and_a_plain_lease_claimed(ns: &TestNamespace) -> [Beating; 2] {
    create_lease_as(&ns.client, &ns.name, "fenced", fencing_configmaps())
        .await
        .expect("create lease fenced");
    create_lease_as(
        &ns.client,
        &ns.name,
        "plain",
        json!({"leaseDurationSeconds": 30}),
    )
    .await
    .expect("create lease plain");
    ns.create_claim("c-fenced", "fenced", None).await;
    ns.create_claim("c-plain", "plain", None).await;
    [
        ns.keep_beating("c-fenced", Duration::from_secs(1)),
        ns.keep_beating("c-plain", Duration::from_secs(1)),
    ]
}

/// Lease fenced says, within 15 s each, that its fence is not in force: its condition
/// Held=False reason FenceNotInForce, a Warning Event, and the operator's error metric.
async fn the_fence_not_in_force_is_told(
    ns: &TestNamespace,
    op: &OperatorProcess,
    findings: &mut Findings,
) {
    let leases = ns.api::<FencedLease>();
    let condition = poll(Duration::from_secs(15), || async {
        let lease = leases.get("fenced").await.ok()?;
        lease
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Held" && c.status == "False" && c.reason == "FenceNotInForce")
    })
    .await;
    let conditions = leases
        .get("fenced")
        .await
        .ok()
        .and_then(|l| l.status)
        .map(|s| s.conditions);
    findings.check(condition.is_some(), || {
        format!("lease fenced has no condition Held=False reason FenceNotInForce: {conditions:?}")
    });
    let events = ns.api::<Event>();
    let event = poll(Duration::from_secs(15), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("FenceNotInForce")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("fenced")
        })
    })
    .await;
    findings.check(event.is_some(), || {
        "no Warning Event FenceNotInForce on lease fenced".into()
    });
    let errors = poll(Duration::from_secs(15), || async {
        metric_with_label(op, "fenced_lease_reconcile_errors_total", "error=\"fence\"")
            .await
            .filter(|v| *v > 0.0)
    })
    .await;
    findings.check(errors.is_some(), || {
        "fenced_lease_reconcile_errors_total{error=\"fence\"} is not > 0".into()
    });
}

/// Claim c-fenced is never granted, over at least 5 s of the operator running (since
/// `started`), and stays Pending.
async fn the_fenced_claim_stays_pending(
    ns: &TestNamespace,
    op: &OperatorProcess,
    started: Instant,
    findings: &mut Findings,
) {
    let claims = ns.api::<FencedLeaseClaim>();
    let mut phase = None;
    loop {
        let claim = claims.get("c-fenced").await.expect("claim c-fenced");
        phase = claim.status.and_then(|s| s.phase).or(phase);
        if phase == Some(ClaimPhase::Granted) || started.elapsed() >= Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    findings.check(phase != Some(ClaimPhase::Granted), || {
        format!(
            "claim c-fenced was granted though the operator cannot put lease fenced's fence in place (its log: {})",
            op.log_text()
                .lines()
                .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
                .take(1)
                .collect::<String>()
        )
    });
    findings.check(phase == Some(ClaimPhase::Pending), || {
        format!("claim c-fenced is {phase:?}, not Pending")
    });
}

/// Issue 38, item 6b (I12): fail closed, loudly. An operator running with its documented RBAC
/// but without `fenced-lease-operator-fences` cannot put a lease's fence in place, so it does
/// not grant that lease: its claim stays Pending, the lease's condition `Held` is `False` with
/// reason `FenceNotInForce`, a Warning Event `FenceNotInForce` is on the lease, and
/// `fenced_lease_reconcile_errors_total{error="fence"}` counts it. A lease without a fence in
/// the same namespace is granted as usual.
#[tokio::test]
async fn a_lease_whose_fence_cannot_be_put_in_place_is_not_granted() {
    let ns = TestNamespace::new("sec-closed").await;
    ns.with_fence_policies().await;
    let mut cleanup = ClusterObjects::default();
    an_operator_identity_without_the_fences_role(&ns, &mut cleanup).await;
    let _beats = a_fenced_and_a_plain_lease_claimed(&ns).await;

    let kubeconfig = ns.service_account_kubeconfig("operator");
    let op = OperatorProcess::start_as(&ns.name, &[], &kubeconfig);
    let started = Instant::now();
    // No collateral: the lease without a fence is granted.
    wait_for("c-plain granted", WAIT, || ns.granted_token("c-plain")).await;

    let mut findings = Findings::default();
    the_fence_not_in_force_is_told(&ns, &op, &mut findings).await;
    the_fenced_claim_stays_pending(&ns, &op, started, &mut findings).await;
    findings.finish();
}

// ---- 7 ----
