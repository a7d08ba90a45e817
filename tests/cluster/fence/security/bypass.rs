//! No way around the fence: a scale through the `scale` subresource of a Deployment fenced with
//! a selector, a pod of another namespace naming a local pod in its claim, a `*` verb standing in
//! for the `override` exemption.

use super::*;

/// Lease books fencing Deployments labelled `app: books`, and such a Deployment, web, of one
/// replica, both created by the admin.
async fn deployment_web_fenced_by_selector(ns: &TestNamespace) {
    create_lease_as(
        &ns.client,
        &ns.name,
        "books",
        json!({
            "leaseDurationSeconds": 30,
            "fence": {
                "resources": [{"group": "apps", "resource": "deployments"}],
                "selector": {"matchLabels": {"app": "books"}},
            },
        }),
    )
    .await
    .expect("create lease books");
    let web: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "books"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]},
            },
        },
    }))
    .unwrap();
    ns.api::<Deployment>()
        .create(&PostParams::default(), &web)
        .await
        .expect("the admin creates Deployment web");
}

/// pb, which does not hold the lease, scales web to 0: a PATCH, then a PUT of the Scale; each
/// must be refused by the fence, and web keep the holder's 2 replicas.
async fn pbs_scales_are_refused(
    ns: &TestNamespace,
    as_pb: &Api<Deployment>,
    findings: &mut Findings,
) {
    let patch = refused_within(Duration::from_secs(10), || scale(as_pb, "web", 0)).await;
    let put = refused_within(Duration::from_secs(10), || async {
        let mut scale = ns.api::<Deployment>().get_scale("web").await?;
        scale.spec.get_or_insert_default().replicas = Some(0);
        as_pb
            .replace_scale("web", &PostParams::default(), &scale)
            .await
    })
    .await;
    for (what, outcome) in [("PATCH", patch), ("PUT", put)] {
        match outcome {
            Ok((code, message)) => findings.check(
                code == 403 && message.contains("does not hold"),
                || format!("pb's scale ({what}) was refused, but not by the fence: {code} {message}"),
            ),
            Err(last) => findings.check(false, || {
                format!("pb, not the holder, scaled web through deployments/scale ({what}) for 10 s: {last}")
            }),
        }
    }
    let replicas = ns
        .api::<Deployment>()
        .get("web")
        .await
        .unwrap()
        .spec
        .replicas;
    findings.check(replicas == Some(2), || {
        format!("web has {replicas:?} replicas, not the holder's 2: pb's scale got through")
    });
}

/// Issue 38, item 1 (I11): a lease that fences Deployments with a selector fences their
/// `scale` subresource too, though a Scale carries no labels. A pod that does not hold the
/// lease is refused its scale (PATCH and PUT) with 403 "does not hold"; the holder's pod
/// scales.
#[tokio::test]
async fn a_scale_of_a_deployment_fenced_with_a_selector_is_refused_to_a_pod_that_does_not_hold() {
    let ns = TestNamespace::new("sec-scale").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    deployment_web_fenced_by_selector(&ns).await;
    claim_as_pod(&ns, pa, "books").await;
    wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    let _beat = ns.keep_beating("pa", Duration::from_secs(1));
    let as_pa: Api<Deployment> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<Deployment> = Api::namespaced(ns.client_as_pod(pb).await, &ns.name);
    wait_allowed(
        &ns.client_as_pod(pb).await,
        &ns.name,
        "patch",
        "apps",
        "deployments/scale",
        None,
    )
    .await;

    // The holder scales (once the apiserver's cache shows it as the holder).
    accepted_within(WAIT, || scale(&as_pa, "web", 2))
        .await
        .unwrap_or_else(|last| panic!("the holder pa's scale of web was refused: {last}"));

    let mut findings = Findings::default();
    pbs_scales_are_refused(&ns, &as_pb, &mut findings).await;
    findings.finish();

    // The holder's scale still passes.
    scale(&as_pa, "web", 3)
        .await
        .expect("the holder scales again");
}

// ---- 2 ----

/// B/twin, a pod of namespace `b` whose ServiceAccount is bound in `a` to the holder Role:
/// a client as that pod, once it may create claims in `a`.
async fn a_pod_of_b_that_may_claim_in_a(a: &TestNamespace, b: &TestNamespace) -> Client {
    let b_twin = b.create_pod_as("twin", "app").await;
    apply(
        a,
        &std::fs::read_to_string(repo_root().join("deploy/rbac/holder-role.yaml")).unwrap(),
    );
    apply(
        a,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "b-app-holder"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fenced-lease-holder"},
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": b.name}],
        })
        .to_string(),
    );
    let as_b_twin = b.client_as_pod(&b_twin).await;
    wait_allowed(
        &as_b_twin,
        &a.name,
        "create",
        "fencing.dev",
        "fencedleaseclaims",
        None,
    )
    .await;
    as_b_twin
}

/// Whether A/twin (`a_twin`) is made the holder of books, for a few seconds of the operator
/// running: its annotation `key` and the lease's holder podUid, as found.
async fn made_holder(
    a: &TestNamespace,
    a_twin: &TestPod,
    key: &str,
) -> Option<(Option<String>, Option<String>)> {
    let leases = a.api::<FencedLease>();
    let pods = a.api::<Pod>();
    poll(Duration::from_secs(5), || async {
        let annotated = pods
            .get("twin")
            .await
            .ok()
            .and_then(|p| p.metadata.annotations?.get(key).cloned());
        let named = leases
            .get("books")
            .await
            .ok()
            .and_then(|l| l.status?.holder?.pod_uid)
            .filter(|uid| *uid == a_twin.uid);
        match (annotated, named) {
            (None, None) => None,
            found => Some(found),
        }
    })
    .await
}

/// Issue 38, item 2 (I7, I5): a pod of another namespace cannot make a local pod of the same
/// name the holder. `B/twin`, allowed to make claims in A, creates there a claim naming
/// `podName: twin`: refused 403 (the claim may name only the pod its creator runs in, and
/// `B/twin` is not `A/twin`); `A/twin` never gets the token annotation and the lease never
/// names its UID, while a pod of A that claims for itself is granted.
#[tokio::test]
async fn a_pod_of_another_namespace_cannot_make_a_local_pod_the_holder() {
    let a = TestNamespace::new("sec-twin-a").await;
    let b = TestNamespace::new("sec-twin-b").await;
    a.with_fence_policies().await;
    let _op = OperatorProcess::start(&a.name, &[]);
    a.create_lease("books", 30);
    // A/twin and a pod of A that will claim for itself (SA app of A, with the holder Role).
    let local = a.app_pods(&["twin", "own"]).await;
    let (a_twin, own) = (&local[0], &local[1]);
    let as_b_twin = a_pod_of_b_that_may_claim_in_a(&a, &b).await;

    let claim: FencedLeaseClaim = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
        "metadata": {"name": "twin"},
        "spec": {"leaseName": "books", "holderIdentity": "twin", "podName": "twin"},
    }))
    .unwrap();
    let created = Api::<FencedLeaseClaim>::namespaced(as_b_twin.clone(), &a.name)
        .create(&PostParams::default(), &claim)
        .await;

    let mut findings = Findings::default();
    match refusal(&created) {
        Some((code, message)) => findings.check(
            code == 403 && message.contains("only the pod its creator runs in"),
            || format!("B/twin's claim in A was refused, but not as naming another pod: {code} {message}"),
        ),
        None => findings.check(false, || {
            format!(
                "B/twin created in {} a claim naming pod twin: {}",
                a.name,
                describe(&created)
            )
        }),
    }
    // Whatever came of the create: A/twin is never made the holder, for a few seconds of the
    // operator running.
    let key = token_annotation_key("books");
    let made_holder = made_holder(&a, a_twin, &key).await;
    findings.check(made_holder.is_none(), || {
        format!("A/twin, which never asked, was made the holder of books by B/twin's claim: (annotation {key}, lease holder podUid) = {made_holder:?}")
    });
    findings.finish();

    // The operator was serving A all along: a pod of A that claims for itself is granted.
    claim_as_pod(&a, own, "books").await;
    wait_for("A/own granted", WAIT, || a.granted_token("own")).await;
    let twin = a.api::<Pod>().get("twin").await.unwrap();
    assert!(
        !twin
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(&key),
        "A/twin carries {key}"
    );
}

// ---- 3 ----

/// Role lease-admin, `verbs: ["*"]` on fencedleases and fencedleaseclaims, for ServiceAccount
/// app; Role fence-exempt, `override` by name and ConfigMap writes, for ServiceAccount scaler.
fn grant_star_and_override(ns: &TestNamespace) {
    grant(
        ns,
        "lease-admin",
        "app",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases", "fencedleaseclaims"]
    verbs: ["*"]
"#,
    );
    grant(
        ns,
        "fence-exempt",
        "scaler",
        r#"
  - apiGroups: ["fencing.dev"]
    resources: ["fencedleases"]
    verbs: ["override"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "create", "update", "patch", "delete"]
"#,
    );
}

/// pb, not the holder but allowed `*` on fencedleases, creates and updates ConfigMaps: each
/// must be refused by the fence.
async fn pbs_writes_are_refused(as_pb: &Api<ConfigMap>, findings: &mut Findings) {
    let mut n = 0;
    let create = refused_within(Duration::from_secs(10), || {
        n += 1;
        create_config_map(as_pb, config_map(&format!("pb-{n}"), "pb"))
    })
    .await;
    let update = refused_within(Duration::from_secs(10), || {
        merge_patch(as_pb, "ledger", json!({"data": {"x": "pb"}}))
    })
    .await;
    for (what, outcome) in [("create", create), ("update", update)] {
        match outcome {
            Ok((code, message)) => findings.check(
                code == 403 && message.contains("does not hold"),
                || format!("pb's ConfigMap {what} was refused, but not by the fence: {code} {message}"),
            ),
            Err(last) => findings.check(false, || {
                format!("pb, not the holder but allowed verbs [\"*\"] on fencedleases, had its ConfigMap {what} accepted for 10 s: {last}")
            }),
        }
    }
}

/// Issue 38, item 3 (I12): the exemption from the identity fence is explicit. A Role granting
/// `verbs: ["*"]` on fencedleases and fencedleaseclaims ("manage our leases") does not exempt
/// its pods: a pod that does not hold the lease is refused its ConfigMap create and update
/// (403 "does not hold"); a pod whose Role names `override` explicitly writes.
#[tokio::test]
async fn a_star_verb_on_fencedleases_does_not_exempt_from_the_fence_but_override_named_does() {
    let ns = TestNamespace::new("sec-star").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa", "pb"]).await;
    let (pa, pb) = (&pods[0], &pods[1]);
    grant_star_and_override(&ns);
    let scaler = ns.create_pod_as("scaler", "scaler").await;
    let _beat = books_held_by(&ns, pa, fencing_configmaps()).await;

    let pb_client = ns.client_as_pod(pb).await;
    let scaler_client = ns.client_as_pod(&scaler).await;
    // The `*` Role is in force for pb, and the explicit one for scaler, before anything is
    // judged: the authorizer answers `override` for both.
    for client in [&pb_client, &scaler_client] {
        wait_allowed(
            client,
            &ns.name,
            "override",
            "fencing.dev",
            "fencedleases",
            Some("books"),
        )
        .await;
    }
    wait_allowed(&scaler_client, &ns.name, "create", "", "configmaps", None).await;
    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let as_pb: Api<ConfigMap> = Api::namespaced(pb_client, &ns.name);
    let as_scaler: Api<ConfigMap> = Api::namespaced(scaler_client, &ns.name);
    // The holder writes, once the apiserver's cache shows it as the holder.
    accepted_within(WAIT, || {
        create_config_map(&as_pa, config_map("ledger", "pa"))
    })
    .await
    .unwrap_or_else(|last| panic!("the holder pa's ConfigMap was refused: {last}"));

    let mut findings = Findings::default();
    pbs_writes_are_refused(&as_pb, &mut findings).await;
    // A Role that names `override` is an exemption.
    let exempt = accepted_within(WAIT, || {
        create_config_map(&as_scaler, config_map("scaler", "scaler"))
    })
    .await;
    findings.check(exempt.is_ok(), || {
        format!(
            "scaler, allowed override by name, was refused: {}",
            exempt.as_ref().err().unwrap()
        )
    });
    findings.finish();
}

// ---- 4 ----
