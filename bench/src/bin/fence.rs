//! Measures the resource side and prints medians, p99 and worst cases:
//!
//! - the lease rule's window: a lease's new token written (its status write answered) -> a
//!   write carrying the previous token refused by the apiserver. The lease rule reads the
//!   lease from the apiserver's informer cache, so for this long a stale holder's write to an
//!   object the new holder has not written yet still passes. (The per-object rule has no
//!   window: it compares with the stored object.) The token is raised by a status write as
//!   the admin, exactly the write a grant is, so the figure is the apiserver's own lag, not
//!   the operator's; probes are dry-run creates, which admission checks like real ones.
//! - the identity rule's window: a grant that moves the lease from pod A to pod B written (its
//!   status write answered) -> a write by pod A (a client with a token bound to pod A, as the
//!   pod mounts) refused by the apiserver. For this long after a grant the old holder's pod
//!   can still write what the lease fences. The grant is written as the admin, as above, and
//!   goes from A to B and back, so every sample is a hand-over; probes are dry-run creates of
//!   a ConfigMap, a kind the lease fences. The pods stay Pending (no kubelet needed);
//! - the cost of a guarded PostgreSQL write against the same write unguarded (one UPDATE by
//!   primary key), and of a guarded transaction against an unguarded one;
//! - the cost of a guarded Redis SET against a plain SET.
//!
//! ```console
//! $ eval "$(hack/control-plane up)" && eval "$(hack/datastores up)"
//! $ kubectl apply -f crds/ -f deploy/admission/
//! $ cargo run --release --all-features --example bench-fence
//! ```
//!
//! Every sample of the two windows is written to `--log-dir` (one TSV file per run).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use fenced_lease::api::FencedResource;
use fenced_lease::api::{FenceSpec, FencedLease, LEASE_LABEL, TOKEN_ANNOTATION};
use fenced_lease::fence::kube::LEASE_POLICY;
use fenced_lease::fence::postgres::FencedTable;
use fenced_lease_operator::admission::shipped::{self, Assignment};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Config};
use serde_json::json;

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

use fenced_lease_bench::common;

use common::Results;

/// Benchmark the fences against the control plane KUBECONFIG points at, and the PostgreSQL and
/// Redis of FL_POSTGRES_URL and FL_REDIS_URL.
#[derive(Parser)]
struct Args {
    /// Samples of the lease rule's window.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// Samples of the identity rule's window (hand-overs between two pods).
    #[arg(long, default_value_t = 600)]
    identity_samples: usize,
    /// Writes of each kind to PostgreSQL and Redis.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// Directory for every sample of the two windows.
    #[arg(long, default_value = "/tmp/fenced-lease-bench")]
    log_dir: PathBuf,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<PathBuf>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints `samples` of `system`'s figure `what` (median, p99, worst) and adds its row.
fn report(results: &Results, system: &str, what: &str, samples: &[Duration], note: &str) {
    let samples: Vec<f64> = samples.iter().map(|d| ms(*d)).collect();
    results.samples("fence", system, what, &samples, "ms", note);
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let results = Results::new(args.results.clone());
    let client = Client::try_default().await?;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    if policies.get_opt(LEASE_POLICY).await?.is_none() {
        return Err(
            "the fence policies are not installed: kubectl apply -f deploy/admission/".into(),
        );
    }
    std::fs::create_dir_all(&args.log_dir)?;
    let path = args.log_dir.join(format!(
        "fence-windows-{}.tsv",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ")
    ));
    let mut log = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(
        log,
        "rule\tsample\twindow_ms\tprobes\tgrant_write_ms\tprobe_before_ms"
    )?;
    lease_window(&client, args.samples, &mut log, &results).await?;
    identity_window(&client, args.identity_samples, &mut log, &results).await?;
    log.flush()?;
    println!("  (every sample: {})", path.display());
    postgres_cost(args.writes, &results).await?;
    redis_cost(args.writes, &results).await?;
    Ok(())
}

type Log = std::io::BufWriter<std::fs::File>;

/// A namespace of its own for `run`, deleted afterwards with the lease bindings of its leases
/// (cluster-scoped, labelled with the lease's namespace).
async fn in_namespace<F, Fut>(client: &Client, run: F) -> Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
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
    let result = run(ns.clone()).await;
    let _ = unlist(client, &ns).await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    result
}

/// Lists namespace `ns` for `kind` in a kinds slot: the one of the kind, or a free one.
async fn list(client: &Client, ns: &str, kind: &FencedResource) -> Result<()> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let mut free = None;
    for (i, name) in shipped::slot_names().iter().enumerate() {
        let policy = policies.get(name).await?;
        match shipped::assignment(&policy) {
            Ok(Some(mut a)) if a.kind == *kind => {
                a.namespaces.insert(ns.to_string());
                return write_slot(&policies, i, policy, Some(&a)).await;
            }
            Ok(None) => free = free.or(Some((i, policy))),
            _ => {}
        }
    }
    let (i, policy) = free.ok_or("no free kinds slot (deploy/admission/fence-kinds.yaml)")?;
    let a = Assignment {
        kind: kind.clone(),
        namespaces: [ns.to_string()].into(),
    };
    write_slot(&policies, i, policy, Some(&a)).await
}

/// Takes namespace `ns` out of every kinds slot.
async fn unlist(client: &Client, ns: &str) -> Result<()> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for (i, name) in shipped::slot_names().iter().enumerate() {
        let policy = policies.get(name).await?;
        if let Ok(Some(mut a)) = shipped::assignment(&policy)
            && a.namespaces.remove(ns)
        {
            let a = Some(&a).filter(|a| !a.namespaces.is_empty());
            write_slot(&policies, i, policy, a).await?;
        }
    }
    Ok(())
}

async fn write_slot(
    policies: &Api<ValidatingAdmissionPolicy>,
    i: usize,
    mut stored: ValidatingAdmissionPolicy,
    assigned: Option<&Assignment>,
) -> Result<()> {
    stored.spec = shipped::slot_policy(i, assigned)?.spec;
    let name = shipped::slot_name(i);
    policies
        .replace(&name, &PostParams::default(), &stored)
        .await?;
    Ok(())
}

/// Probes with `refused` (true: the write was refused) from `written` on until one is
/// refused: the window, and how many probes it took.
async fn until_refused<F, Fut>(written: Instant, mut refused: F) -> Result<(Duration, usize)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    for probes in 1.. {
        if refused().await? {
            return Ok((written.elapsed(), probes));
        }
        if written.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    Err("a write was still accepted 30s after the grant".into())
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

async fn lease_window(
    client: &Client,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Result<()> {
    in_namespace(client, |ns| async move {
        measure_window(client, &ns, samples, log, results).await
    })
    .await
}

async fn measure_window(
    client: &Client,
    ns: &str,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Result<()> {
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": "bench"}, "spec": {"fenceObjects": true},
    }))?;
    // Labelled objects are fenced by deploy/admission/'s binding fenced-lease-objects.
    leases.create(&PostParams::default(), &lease).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
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
    let refused = |token: i64| {
        let (configmaps, probe) = (configmaps.clone(), probe(token));
        async move {
            match configmaps.create(&dry_run(), &probe).await {
                Ok(_) => Ok(false),
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(true),
                Err(e) => Err(e.into()),
            }
        }
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
    while !refused(0).await? {
        if warm.elapsed() > Duration::from_secs(30) {
            return Err("the lease rule was not in force within 30s".into());
        }
    }
    let mut windows = Vec::with_capacity(samples);
    let mut first_probe_refused = 0usize;
    for token in 2..2 + samples as i64 {
        let before = Instant::now();
        if refused(token - 1).await? {
            return Err(format!("token {} refused before the lease moved on", token - 1).into());
        }
        let sent = Instant::now();
        set_token(token).await?;
        let written = Instant::now();
        let (window, probes) = until_refused(written, || refused(token - 1)).await?;
        first_probe_refused += usize::from(probes == 1);
        writeln!(
            log,
            "lease\t{}\t{:.3}\t{probes}\t{:.3}\t{:.3}",
            token - 1,
            ms(window),
            ms(written - sent),
            ms(sent - before)
        )?;
        windows.push(window);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let note = format!(
        "the first probe sent after the grant's write was answered was already refused in {first_probe_refused} of {samples}"
    );
    let what = "lease rule: grant written -> lower token refused";
    report(results, "token rule", what, &windows, &note);
    Ok(())
}

/// ServiceAccount `writer` may create ConfigMaps; pods `writer-a` and `writer-b` run as it.
const WRITERS: [&str; 2] = ["writer-a", "writer-b"];

/// A pod the bench writes as: its name, its UID, and a client with a token bound to it.
struct WriterPod {
    name: String,
    uid: String,
    configmaps: Api<ConfigMap>,
}

async fn writer_pods(client: &Client, ns: &str) -> Result<Vec<WriterPod>> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "writer"}}))?,
        )
        .await?;
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "writer"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
            }))?,
        )
        .await?;
    let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    role_bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "writer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "writer"},
                "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": ns}],
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut writers = Vec::new();
    for name in WRITERS {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": "writer",
                "containers": [{"name": "main", "image": "example.invalid/writer:1"}],
            },
        }))?;
        let uid = pods
            .create(&PostParams::default(), &pod)
            .await?
            .metadata
            .uid
            .ok_or("a pod without a UID")?;
        // The token a pod mounts: bound to the pod, so the apiserver sees its name and UID.
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.into()),
                    uid: Some(uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let issued: TokenRequest = accounts
            .create_subresource("token", "writer", &PostParams::default(), &request)
            .await?;
        let token = issued
            .status
            .map(|s| s.token)
            .ok_or("a TokenRequest without a token")?;
        let mut config = Config::infer().await?;
        config.auth_info = serde_json::from_value::<AuthInfo>(json!({ "token": token }))?;
        writers.push(WriterPod {
            name: name.into(),
            uid,
            configmaps: Api::namespaced(Client::try_from(config)?, ns),
        });
    }
    Ok(writers)
}

impl WriterPod {
    /// A dry-run create of a ConfigMap as this pod: whether the identity rule refused it.
    async fn refused(&self) -> Result<bool> {
        let probe = ConfigMap {
            metadata: ObjectMeta {
                name: Some("probe".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match self.configmaps.create(&dry_run(), &probe).await {
            Ok(_) => Ok(false),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("does not hold") => {
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    }
}

async fn identity_window(
    client: &Client,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Result<()> {
    in_namespace(client, |ns| async move {
        measure_identity_window(client, &ns, samples, log, results).await
    })
    .await
}

async fn measure_identity_window(
    client: &Client,
    ns: &str,
    samples: usize,
    log: &mut Log,
    results: &Results,
) -> Result<()> {
    let writers = writer_pods(client, ns).await?;
    let fence: FenceSpec =
        serde_json::from_value(json!({"resources": [{"resource": "configmaps"}]}))?;
    let leases: Api<FencedLease> = Api::namespaced(client.clone(), ns);
    let lease: FencedLease = serde_json::from_value(json!({
        "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
        "metadata": {"name": "ident"}, "spec": {"fence": fence},
    }))?;
    leases.create(&PostParams::default(), &lease).await?;
    // The kinds slot the operator would list the namespace in, listed here so no operator is
    // needed (and unlisted when done).
    list(client, ns, &fence.resources[0]).await?;
    // The status write a grant to `pod` is: holder and token.
    let grant = |pod: &WriterPod, token: i64| {
        let leases = leases.clone();
        let status = json!({"status": {
            "fencingToken": token,
            "holder": {
                "claim": pod.name, "claimUid": format!("claim-{token}"),
                "identity": pod.name, "podName": pod.name, "podUid": pod.uid,
            },
        }});
        async move {
            leases
                .patch_status("ident", &PatchParams::default(), &Patch::Merge(status))
                .await
        }
    };
    // Warm up: the binding and the lease reach admission through informers, RBAC reaches the
    // authorizer; then the holder may write and the other pod may not.
    grant(&writers[0], 1).await?;
    let warm = Instant::now();
    loop {
        let holder_writes = matches!(writers[0].refused().await, Ok(false));
        if holder_writes && writers[1].refused().await? {
            break;
        }
        if warm.elapsed() > Duration::from_secs(30) {
            return Err("the identity rule was not in force within 30s".into());
        }
    }
    let (mut windows, mut from_sent, mut round_trips) = (vec![], vec![], vec![]);
    let mut first_probe_refused = 0usize;
    for sample in 0..samples {
        let (old, new) = (&writers[sample % 2], &writers[(sample + 1) % 2]);
        let before = Instant::now();
        if old.refused().await? {
            return Err(format!("pod {} refused before the lease moved on", old.name).into());
        }
        let sent = Instant::now();
        grant(new, sample as i64 + 2).await?;
        let written = Instant::now();
        let (window, probes) = until_refused(written, || old.refused()).await?;
        first_probe_refused += usize::from(probes == 1);
        writeln!(
            log,
            "identity\t{sample}\t{:.3}\t{probes}\t{:.3}\t{:.3}",
            ms(window),
            ms(written - sent),
            ms(sent - before)
        )?;
        windows.push(window);
        from_sent.push(window + (written - sent));
        round_trips.push(sent - before);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let note = format!(
        "hand-overs between two pods, each way in turn; the first probe sent after the grant's write was answered was already refused in {first_probe_refused} of {samples}"
    );
    let system = "identity rule";
    report(
        results,
        system,
        "grant written -> old holder's pod refused",
        &windows,
        &note,
    );
    report(
        results,
        system,
        "grant sent -> old holder's pod refused",
        &from_sent,
        "",
    );
    report(
        results,
        system,
        "one write by the holder's pod",
        &round_trips,
        "for scale",
    );
    Ok(())
}

async fn postgres_cost(writes: usize, results: &Results) -> Result<()> {
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
    let pg = "PostgreSQL";
    report(
        results,
        pg,
        "UPDATE, guarded",
        &guarded,
        "fence_token <= $t in the WHERE",
    );
    report(results, pg, "UPDATE, unguarded", &unguarded, "");
    report(
        results,
        pg,
        "transaction, guarded",
        &guarded_tx,
        "the row locked first",
    );
    report(results, pg, "transaction, unguarded", &unguarded_tx, "");
    Ok(())
}

async fn redis_cost(writes: usize, results: &Results) -> Result<()> {
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
    report(results, "Redis", "SET, guarded", &guarded, "the Lua script");
    report(results, "Redis", "SET, unguarded", &unguarded, "");
    Ok(())
}
