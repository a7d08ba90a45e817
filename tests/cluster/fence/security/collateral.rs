//! No collateral: a lease deleted with its finalizer stripped leaves nothing that refuses.

use super::*;

/// Deletes lease books with its finalizer stripped, stripped again until it is gone (the
/// operator may put it back between the strip and the delete: a live lease always has it), as
/// a user would. Returns when the delete was sent.
async fn delete_stripped_of_its_finalizer(ns: &TestNamespace) -> Instant {
    let leases = ns.api::<FencedLease>();
    leases
        .patch(
            "books",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip the finalizers");
    leases
        .delete("books", &DeleteParams::default())
        .await
        .expect("delete lease books");
    let deleted = Instant::now();
    wait_for("lease books gone", Duration::from_secs(10), || async {
        let lease = leases.get_opt("books").await.unwrap();
        if lease.is_some_and(|l| l.metadata.finalizers.is_some_and(|f| !f.is_empty())) {
            let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            let _ = leases.patch("books", &PatchParams::default(), &strip).await;
        }
        leases
            .get_opt("books")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    deleted
}

/// The admin writes ConfigMaps, 10 over 5 s: each must be accepted.
async fn the_admins_writes_are_accepted(ns: &TestNamespace, findings: &mut Findings) {
    let admin = ns.api::<ConfigMap>();
    let mut refused = Vec::new();
    for i in 0..10 {
        let result = admin
            .create(
                &PostParams::default(),
                &config_map(&format!("admin-{i}"), "admin"),
            )
            .await;
        if result.is_err() {
            refused.push(describe(&result));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    findings.check(refused.is_empty(), || {
        format!(
            "the admin's ConfigMap creates after the lease was gone were refused {} of 10 times: {}",
            refused.len(),
            refused.first().cloned().unwrap_or_default()
        )
    });
}

/// Whether no kinds slot lists `ns` any more by `deadline`.
async fn no_slot_lists_the_namespace_by(ns: &TestNamespace, deadline: Instant) -> bool {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ns.client.clone());
    let listing = || async {
        let mut listing = vec![];
        for name in shipped::slot_names() {
            let policy = policies.get(&name).await.ok()?;
            if let Ok(Some(a)) = shipped::assignment(&policy)
                && a.namespaces.contains(&ns.name)
            {
                listing.push(name);
            }
        }
        Some(listing)
    };
    poll(
        deadline.saturating_duration_since(Instant::now()),
        || async { listing().await.filter(|l| l.is_empty()) },
    )
    .await
    .is_some()
}

/// Issue 38, item 5 (I12): a lease deleted with its finalizer stripped leaves nothing that
/// refuses. After the lease that fenced ConfigMaps (granted to pa) is deleted that way, the
/// admin's ConfigMap writes are all accepted, so is a pod's, and the kinds slot of ConfigMaps
/// no longer lists the namespace within 10 s (not at the 5-minute sweep), so that nothing
/// refuses there even while the apiserver cannot read FencedLeases.
#[tokio::test]
async fn a_lease_deleted_with_its_finalizer_stripped_leaves_nothing_that_refuses() {
    let ns = TestNamespace::new("sec-stripped").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    let _beat = books_held_by(&ns, pa, fencing_configmaps()).await;
    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    // The fence is in force: the holder writes, pb is refused.
    accepted_within(WAIT, || create_config_map(&as_pa, config_map("pa", "pa")))
        .await
        .unwrap_or_else(|last| panic!("the holder pa's ConfigMap was refused: {last}"));
    wait_fence_refuses_pb(&as_pb).await;

    let deleted = delete_stripped_of_its_finalizer(&ns).await;
    let mut findings = Findings::default();
    the_admins_writes_are_accepted(&ns, &mut findings).await;
    // A pod's write too: no lease fences ConfigMaps any more.
    let result = as_pb
        .create(&PostParams::default(), &config_map("pb-after", "pb"))
        .await;
    findings.check(result.is_ok(), || {
        format!(
            "pb's ConfigMap create after the lease was gone: {}",
            describe(&result)
        )
    });
    // The namespace leaves the kinds slot with the lease's delete event.
    let gone = no_slot_lists_the_namespace_by(&ns, deleted + Duration::from_secs(10)).await;
    findings.check(gone, || {
        "10 s after the lease's delete, a kinds slot still lists the namespace".to_string()
    });
    findings.finish();
}

// ---- 6 ----
