//! The objects a run writes before it starts: the leases, what they fence, the PostgreSQL
//! table.

use super::*;

/// Each lease of the run with its workloads (the object it fences by kind and a scratch one)
/// and its labelled ConfigMap; and the lease that fences objects only.
pub(super) async fn create_leases_and_fenced_objects(ns: &TestNamespace) {
    for (lease, duration) in LEASES {
        create_lease(ns, lease, duration).await;
        let workloads = workload::api(ns.client.clone(), &ns.name, lease);
        for name in [workload::object_name(lease), workload::scratch_name(lease)] {
            let object: DynamicObject =
                serde_json::from_value(workload::manifest(lease, &name)).expect("a workload");
            workloads
                .create(&PostParams::default(), &object)
                .await
                .expect("create a fenced workload");
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(config_map_name(lease)),
                labels: Some(BTreeMap::from([(LEASE_LABEL.into(), lease.into())])),
                annotations: Some(BTreeMap::from([(TOKEN_ANNOTATION.into(), "0".into())])),
                ..Default::default()
            },
            ..Default::default()
        };
        ns.api::<ConfigMap>()
            .create(&PostParams::default(), &cm)
            .await
            .expect("create the fenced ConfigMap");
    }
    create_lease(ns, FENCE_ONLY, 3).await;
}

/// The run's PostgreSQL table, one row per lease, and its log of accepted writes (a trigger
/// writes it in commit order).
pub(super) async fn create_postgres_table(ns: &TestNamespace, postgres_url: &str) {
    let pg = postgres(postgres_url).await;
    let table = pg_table(&ns.name);
    pg.batch_execute(&format!(
        "CREATE TABLE {table} (lease TEXT PRIMARY KEY, last_write TEXT, fence_token BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE {table}_log (id BIGSERIAL PRIMARY KEY, lease TEXT NOT NULL, token BIGINT NOT NULL, write TEXT);
         CREATE FUNCTION {table}_log() RETURNS trigger AS $$
           BEGIN INSERT INTO {table}_log (lease, token, write) VALUES (NEW.lease, NEW.fence_token, NEW.last_write); RETURN NEW; END
         $$ LANGUAGE plpgsql;
         CREATE TRIGGER {table}_log AFTER UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_log();"
    ))
    .await
    .expect("create the PostgreSQL table");
    for (lease, _) in LEASES {
        pg.execute(
            &format!("INSERT INTO {table} (lease) VALUES ($1)"),
            &[&lease],
        )
        .await
        .expect("insert row");
    }
}

/// The holder slots of `lease`: the followed lease's client-go leaders, or the library,
/// `kubectl fence run`, Go and Go-lock holders.
pub(super) fn slot_kinds(lease: &str) -> Vec<Kind> {
    if lease == FOLLOWING {
        vec![Kind::Follow; FOLLOW_HOLDERS]
    } else {
        (0..LIBRARY_HOLDERS)
            .map(|_| Kind::Library)
            .chain((0..CLI_HOLDERS).map(|_| Kind::Cli))
            .chain((0..GO_HOLDERS).map(|_| Kind::Go))
            .chain((0..GO_LOCK_HOLDERS).map(|_| Kind::GoLock))
            .collect()
    }
}

/// `spec.fence` of lease `name`: its workload kind ([`FENCE_ONLY`]: Secrets, with a selector).
pub fn fence_of(name: &str) -> serde_json::Value {
    if name == FENCE_ONLY {
        collateral::fence_only_fence()
    } else {
        workload::fence_spec(name)
    }
}

/// Every lease of a run: those held, and [`FENCE_ONLY`].
pub fn all_leases() -> Vec<(&'static str, i32)> {
    LEASES.into_iter().chain([(FENCE_ONLY, 3)]).collect()
}

/// Creates (or re-creates) lease `name` with `duration`, fencing the objects labelled with it
/// and its kind ([`fence_of`]); [`FOLLOWING`] follows [`FOLLOWED`].
pub async fn create_lease(ns: &TestNamespace, name: &str, duration: i32) {
    let mut spec = serde_json::json!({
        "leaseDurationSeconds": duration,
        "fenceObjects": true,
        "fence": fence_of(name),
    });
    if name == FOLLOWING {
        spec["follow"] = serde_json::json!({"lease": FOLLOWED});
    }
    let lease: FencedLease = serde_json::from_value(serde_json::json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("lease object");
    let api = ns.api::<FencedLease>();
    for _ in 0..100 {
        match api.create(&PostParams::default(), &lease).await {
            Ok(_) => return,
            // Still being deleted (its finalizer), or the API is restarting: try again.
            Err(e) => {
                tracing_log(&format!("create lease {name}: {e}"));
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    panic!("could not create lease {name}");
}
