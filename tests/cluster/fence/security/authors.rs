//! No power beyond a lease's author's: a lease fences only what its author may write, and never
//! what the cluster needs to run (leader elections, Events).

use super::*;

/// ServiceAccount tenant, allowed only to create and read FencedLeases: a client as it, once
/// it may create them.
async fn a_tenant_that_may_only_create_leases(ns: &TestNamespace) -> Client {
    grant(
        ns,
        "lease-author",
        "tenant",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases"]
    verbs: ["create", "get", "list", "watch"]
"#,
    );
    let tenant = ns.client_as("tenant", None).await;
    wait_allowed(
        &tenant,
        &ns.name,
        "create",
        "fencing.dev",
        "fencedleases",
        None,
    )
    .await;
    tenant
}

/// Anyone, the admin too: what the cluster needs to run (coordination.k8s.io Leases, Events)
/// is never fenced, refused 422 naming `spec.fence.resources`.
async fn nobody_fences_leases_or_events(ns: &TestNamespace, findings: &mut Findings) {
    for (what, resource) in [
        (
            "coordination.k8s.io leases",
            json!({"group": "coordination.k8s.io", "resource": "leases"}),
        ),
        ("events", json!({"resource": "events"})),
    ] {
        let name = format!("fences-{}", what.split(' ').next_back().unwrap());
        let created = create_lease_as(
            &ns.client,
            &ns.name,
            &name,
            json!({"fence": {"resources": [resource]}}),
        )
        .await;
        match refusal(&created) {
            Some((code, message)) => findings.check(
                code == 422 && message.contains("spec.fence.resources"),
                || format!("the admin's lease fencing {what} was refused, but not as an invalid spec.fence.resources: {code} {message}"),
            ),
            None => findings.check(false, || {
                format!("the admin created a lease fencing {what}: {}", describe(&created))
            }),
        }
    }
}

/// Once the tenant may write ConfigMaps, it may fence them.
async fn once_allowed_to_write_configmaps_the_tenant_fences_them(
    ns: &TestNamespace,
    tenant: &Client,
    spec: &serde_json::Value,
) {
    grant(
        ns,
        "configmap-writer",
        "tenant",
        r#"
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["create", "update", "patch", "delete"]
"#,
    );
    for verb in ["create", "update", "patch", "delete"] {
        wait_allowed(tenant, &ns.name, verb, "", "configmaps", None).await;
    }
    accepted_within(WAIT, || {
        create_lease_as(tenant, &ns.name, "books", spec.clone())
    })
    .await
    .unwrap_or_else(|last| {
        panic!("tenant, now allowed to write ConfigMaps, cannot fence them: {last}")
    });
}

/// Following a coordination Lease reveals its holder: only an author who may read it.
async fn only_who_may_get_a_lease_follows_it(ns: &TestNamespace, tenant: &Client) {
    let following = json!({"follow": {"lease": "ctrl"}});
    let created = create_lease_as(tenant, &ns.name, "follower", following.clone()).await;
    match refusal(&created) {
        Some((code, message)) => assert!(
            code == 403 && message.contains("may not get Lease ctrl"),
            "tenant's lease following Lease ctrl was refused, but not for want of get: {code} {message}"
        ),
        None => panic!(
            "tenant, who may not read Leases, created a lease following one: {}",
            describe(&created)
        ),
    }
    grant(
        ns,
        "lease-reader",
        "tenant",
        r#"
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get"]
"#,
    );
    wait_allowed(
        tenant,
        &ns.name,
        "get",
        "coordination.k8s.io",
        "leases",
        None,
    )
    .await;
    accepted_within(WAIT, || {
        create_lease_as(tenant, &ns.name, "follower", following.clone())
    })
    .await
    .unwrap_or_else(|last| panic!("tenant, now allowed to get Leases, cannot follow one: {last}"));
}

/// Issue 38, item 4 (I12): a lease fences only what its author may write. A user allowed only
/// to create and read FencedLeases is refused a lease fencing ConfigMaps (the message names
/// `configmaps`); once allowed to write ConfigMaps, the same user creates it. No one, the
/// admin included, may fence coordination.k8s.io Leases (leader elections) or Events: 422
/// naming `spec.fence.resources`. A lease following a coordination Lease (`spec.follow`) is
/// refused until its author may `get` that Lease.
#[tokio::test]
async fn a_lease_fences_only_what_its_author_may_write_and_never_leases_or_events() {
    let ns = TestNamespace::new("sec-author").await;
    ns.with_fence_policies().await;
    let tenant = a_tenant_that_may_only_create_leases(&ns).await;
    let fencing_configmaps = fencing_configmaps();

    let mut findings = Findings::default();
    let created = create_lease_as(&tenant, &ns.name, "books", fencing_configmaps.clone()).await;
    match refusal(&created) {
        Some((code, message)) => findings.check(
            (code == 403 || code == 422) && message.contains("configmaps"),
            || format!("tenant's lease fencing configmaps was refused, but the message does not name configmaps: {code} {message}"),
        ),
        None => findings.check(false, || {
            format!(
                "tenant, who may not write ConfigMaps, created a lease fencing configmaps: {}",
                describe(&created)
            )
        }),
    }
    nobody_fences_leases_or_events(&ns, &mut findings).await;
    findings.finish();

    once_allowed_to_write_configmaps_the_tenant_fences_them(&ns, &tenant, &fencing_configmaps)
        .await;
    only_who_may_get_a_lease_follows_it(&ns, &tenant).await;
}

// ---- 5 ----
