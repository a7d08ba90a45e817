//! Measures the resource side and prints medians, p99 and worst cases:
//!
//! - the lease rule's window: a lease's new token written (its status write answered) -> a
//!   write carrying the previous token refused by the apiserver. The lease rule reads the
//!   lease from the apiserver's informer cache, so for this long a stale holder's write to an
//!   object the new holder has not written yet still passes. (The per-object rule has no
//!   window: it compares with the stored object.) The token is raised by a status write as
//!   the admin, exactly the write a grant is, so the figure is the apiserver's own lag, not
//!   the operator's; probes are dry-run creates, which admission checks like real ones.
//! - the cost of a guarded PostgreSQL write against the same write unguarded (one UPDATE by
//!   primary key), and of a guarded transaction against an unguarded one;
//! - the cost of a guarded Redis SET against a plain SET.
//!
//! ```console
//! $ eval "$(hack/control-plane up)" && eval "$(hack/datastores up)"
//! $ kubectl apply -f crds/ -f deploy/admission/
//! $ cargo run --release --all-features --example bench-fence
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use fenced_lease::api::{FencedLease, LEASE_LABEL, TOKEN_ANNOTATION};
use fenced_lease::fence::kube::LEASE_POLICY;
use fenced_lease::fence::postgres::FencedTable;
use fenced_lease::operator::fence_binding::desired_binding;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Benchmark the fences against the control plane KUBECONFIG points at, and the PostgreSQL and
/// Redis of FL_POSTGRES_URL and FL_REDIS_URL.
#[derive(Parser)]
struct Args {
    /// Samples of the lease rule's window.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// Writes of each kind to PostgreSQL and Redis.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let n = samples.len();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what:<44} n={n:<5} median {:>7.3} ms   p99 {:>7.3} ms   worst {:>7.3} ms",
        ms(samples[n / 2]),
        ms(samples[(n * 99).div_ceil(100).saturating_sub(1)]),
        ms(samples[n - 1]),
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let client = Client::try_default().await?;
    lease_window(&client, args.samples).await?;
    postgres_cost(args.writes).await?;
    redis_cost(args.writes).await?;
    Ok(())
}

async fn lease_window(client: &Client, samples: usize) -> Result<()> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    if policies.get_opt(LEASE_POLICY).await?.is_none() {
        return Err(
            "the fence policies are not installed: kubectl apply -f deploy/admission/".into(),
        );
    }
    let ns = format!("bench-fence-{:08x}", rand::random::<u32>());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await?;
    let result = measure_window(client, &ns, samples).await;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let binding = desired_binding(&ns, "bench");
    let name = binding.metadata.name.clone().unwrap_or_default();
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    result
}

async fn measure_window(client: &Client, ns: &str, samples: usize) -> Result<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": "bench"}, "spec": {"fenceObjects": true},
    }))?;
    leases.create(&PostParams::default(), &lease).await?;
    // The binding the operator keeps for such a lease, applied here so no operator is needed.
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    bindings
        .create(&PostParams::default(), &desired_binding(ns, "bench"))
        .await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = |token: i64| ConfigMap {
        metadata: ObjectMeta {
            name: Some("probe".into()),
            labels: Some(BTreeMap::from([(LEASE_LABEL.into(), "bench".into())])),
            annotations: Some(BTreeMap::from([(
                TOKEN_ANNOTATION.into(),
                token.to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    };
    let set_token = |token: i64| {
        let leases = leases.clone();
        async move {
            leases
                .patch_status(
                    "bench",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"fencingToken": token}})),
                )
                .await
        }
    };
    // Warm up: the binding and the lease reach admission through informers.
    set_token(1).await?;
    let warm = Instant::now();
    while configmaps.create(&dry_run, &probe(0)).await.is_ok() {
        if warm.elapsed() > Duration::from_secs(30) {
            return Err("the lease rule was not in force within 30s".into());
        }
    }
    let mut windows = Vec::with_capacity(samples);
    let mut first_probe_refused = 0usize;
    for token in 2..2 + samples as i64 {
        if configmaps
            .create(&dry_run, &probe(token - 1))
            .await
            .is_err()
        {
            return Err(format!("token {} refused before the lease moved on", token - 1).into());
        }
        set_token(token).await?;
        let written = Instant::now();
        for attempt in 0.. {
            match configmaps.create(&dry_run, &probe(token - 1)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    first_probe_refused += usize::from(attempt == 0);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
            if written.elapsed() > Duration::from_secs(30) {
                return Err("a lower token was still accepted 30s after the grant".into());
            }
        }
        windows.push(written.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report(
        "lease rule: grant written -> lower token refused",
        &mut windows,
    );
    println!(
        "  (the first probe sent after the write was answered was already refused in {first_probe_refused} of {samples}: the window is shorter than one probe's round trip)"
    );
    Ok(())
}

async fn postgres_cost(writes: usize) -> Result<()> {
    let url = std::env::var("FL_POSTGRES_URL").map_err(|_| "FL_POSTGRES_URL is not set")?;
    let (mut db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let table = format!("bench_{:08x}", rand::random::<u32>());
    db.batch_execute(&format!(
        "CREATE TABLE {table} (account BIGINT PRIMARY KEY, paid_by TEXT);
         INSERT INTO {table} (account) SELECT generate_series(1, 100);"
    ))
    .await?;
    let fenced = FencedTable::new(&table, &["account"]);
    fenced.add_fence_column(&db).await?;
    let plain = format!("UPDATE {table} SET paid_by = $1 WHERE account = $2");
    let (mut guarded, mut unguarded) = (Vec::new(), Vec::new());
    let (mut guarded_tx, mut unguarded_tx) = (Vec::new(), Vec::new());
    // Interleaved, so that drift of the machine's load hits both alike.
    for i in 0..writes {
        let (account, token, who) = ((i % 100) as i64 + 1, i as i64, format!("writer-{i}"));
        let started = Instant::now();
        fenced
            .update(&db, &[&account], &[("paid_by", &who)], token)
            .await?;
        guarded.push(started.elapsed());

        let started = Instant::now();
        db.execute(&plain, &[&who, &account]).await?;
        unguarded.push(started.elapsed());

        let started = Instant::now();
        let tx = fenced.begin(&mut db, &[&account], token).await?;
        tx.execute(&plain, &[&who, &account]).await?;
        tx.commit().await?;
        guarded_tx.push(started.elapsed());

        let started = Instant::now();
        let tx = db.transaction().await?;
        tx.execute(&plain, &[&who, &account]).await?;
        tx.commit().await?;
        unguarded_tx.push(started.elapsed());
    }
    db.batch_execute(&format!("DROP TABLE {table}")).await?;
    report(
        "PostgreSQL UPDATE, guarded (fence_token <= $t)",
        &mut guarded,
    );
    report("PostgreSQL UPDATE, unguarded", &mut unguarded);
    report(
        "PostgreSQL transaction, guarded (row locked)",
        &mut guarded_tx,
    );
    report("PostgreSQL transaction, unguarded", &mut unguarded_tx);
    Ok(())
}

async fn redis_cost(writes: usize) -> Result<()> {
    let url = std::env::var("FL_REDIS_URL").map_err(|_| "FL_REDIS_URL is not set")?;
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let key = format!("bench:{:08x}", rand::random::<u32>());
    let (mut guarded, mut unguarded) = (Vec::new(), Vec::new());
    for i in 0..writes {
        let value = format!("writer-{i}");
        let started = Instant::now();
        fenced_lease::fence::redis::set(&mut conn, &key, &value, i as i64).await?;
        guarded.push(started.elapsed());
        let started = Instant::now();
        redis::cmd("SET")
            .arg(format!("{key}:plain"))
            .arg(&value)
            .exec_async(&mut conn)
            .await?;
        unguarded.push(started.elapsed());
    }
    let fence_key = fenced_lease::fence::redis::fence_key(&key)?;
    redis::cmd("DEL")
        .arg(&key)
        .arg(format!("{key}:plain"))
        .arg(fence_key)
        .exec_async(&mut conn)
        .await?;
    report("Redis SET, guarded (Lua script)", &mut guarded);
    report("Redis SET, unguarded", &mut unguarded);
    Ok(())
}
