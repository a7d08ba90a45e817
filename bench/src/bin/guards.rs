//! What a guard that fences a scope costs, side by side with the same write unguarded, against
//! `hack/datastores`' PostgreSQL and Redis (no cluster needed):
//!
//! - PostgreSQL, a table bound to a scope against an unbound twin: an INSERT carrying its token
//!   in the row (one statement); a transaction presenting its token (`SET LOCAL`) then
//!   inserting; `COPY` of 10,000 rows in such a transaction; 16 writers of the current holder
//!   inserting at once on one scope (throughput); how long a new holder's first write waits
//!   after the old holder's open transaction commits.
//! - Redis: `FCALL fenced_call ... RPUSH` on a key of a scope against a plain `RPUSH`.
//!
//! Each pair is interleaved, so that drift of the machine's load hits both alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use fenced_lease::fence::postgres::{Scope, begin};
use fenced_lease_bench::Res;
use fenced_lease_bench::datastores::{postgres, postgres_url, redis_connection};
use fenced_lease_bench::figures::{Results, ms_each};
use futures::SinkExt;
use tokio_postgres::Client;

#[derive(Parser)]
struct Args {
    /// Samples of each single write.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// COPYs of 10,000 rows, each way.
    #[arg(long, default_value_t = 20)]
    copies: usize,
    /// Seconds each way of the 16 concurrent writers.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Hand-overs from an old holder's open transaction to a new holder's first write.
    #[arg(long, default_value_t = 100)]
    handovers: usize,
    /// Append result rows here (tab-separated; hack/bench renders them).
    #[arg(long)]
    results: Option<std::path::PathBuf>,
}

const SECTION: &str = "guards";

/// Two ledgers: `<name>_fenced` bound to a scope of its own, `<name>_plain` not.
async fn ledgers(db: &Client) -> Res<(String, String, Scope)> {
    let name = format!("bench_{:08x}", rand::random::<u32>());
    let (fenced, plain) = (format!("{name}_fenced"), format!("{name}_plain"));
    for t in [&fenced, &plain] {
        db.batch_execute(&format!(
            "CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, account BIGINT NOT NULL, amount BIGINT NOT NULL, fence_token BIGINT)"
        ))
        .await?;
    }
    let scope = Scope::new(&name)?;
    scope.enable(db, &fenced).await?;
    Ok((fenced, plain, scope))
}

#[tokio::main]
async fn main() -> Res<()> {
    let args = Args::parse();
    let results = Results::new(args.results.clone());
    let url = postgres_url()?;
    let mut db = postgres(&url).await?;
    let (fenced, plain, scope) = ledgers(&db).await?;
    single_writes(&mut db, &fenced, &plain, args.writes, &results).await?;
    copies(&mut db, &fenced, &plain, args.copies, &results).await?;
    concurrent(&url, &fenced, &plain, args.seconds, &results).await?;
    handovers(&url, &fenced, &scope, args.handovers, &results).await?;
    db.batch_execute(&format!("DROP TABLE {fenced}; DROP TABLE {plain}"))
        .await?;
    redis_writes(args.writes, &results).await
}

async fn single_writes(
    db: &mut Client,
    fenced: &str,
    plain: &str,
    writes: usize,
    results: &Results,
) -> Res<()> {
    let token = 1_i64;
    let insert =
        |t: &str| format!("INSERT INTO {t} (account, amount, fence_token) VALUES ($1, 1, $2)");
    let (fenced_insert, plain_insert) = (
        db.prepare(&insert(fenced)).await?,
        db.prepare(&insert(plain)).await?,
    );
    let (mut guarded, mut unguarded, mut guarded_tx, mut unguarded_tx) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..writes as i64 {
        let started = Instant::now();
        db.execute(&fenced_insert, &[&i, &token]).await?;
        guarded.push(started.elapsed());
        let started = Instant::now();
        db.execute(&plain_insert, &[&i, &token]).await?;
        unguarded.push(started.elapsed());

        let started = Instant::now();
        let tx = begin(db, token).await?;
        tx.execute(&fenced_insert, &[&i, &token]).await?;
        tx.commit().await?;
        guarded_tx.push(started.elapsed());
        let started = Instant::now();
        let tx = db.transaction().await?;
        tx.execute(&plain_insert, &[&i, &token]).await?;
        tx.commit().await?;
        unguarded_tx.push(started.elapsed());
    }
    let pg = "PostgreSQL";
    results.samples(
        SECTION,
        pg,
        "INSERT, the token in the row, guarded",
        &ms_each(&guarded),
        "ms",
        "a table bound to a scope",
    );
    results.samples(
        SECTION,
        pg,
        "INSERT, unguarded",
        &ms_each(&unguarded),
        "ms",
        "",
    );
    results.samples(
        SECTION,
        pg,
        "transaction of one INSERT, guarded",
        &ms_each(&guarded_tx),
        "ms",
        "BEGIN, SET LOCAL fenced_lease.token, INSERT, COMMIT",
    );
    results.samples(
        SECTION,
        pg,
        "transaction of one INSERT, unguarded",
        &ms_each(&unguarded_tx),
        "ms",
        "BEGIN, INSERT, COMMIT",
    );
    Ok(())
}

/// `COPY` of 10,000 rows into `table` in one transaction (presenting `token` if some).
async fn copy(db: &mut Client, table: &str, token: Option<i64>) -> Res<Duration> {
    let rows: String = (0..10_000).map(|i| format!("{i}\t1\n")).collect();
    let started = Instant::now();
    let tx = db.transaction().await?;
    if let Some(token) = token {
        // What `begin` does: the token presented for the transaction.
        tx.execute(
            "SELECT set_config('fenced_lease.token', $1, true)",
            &[&token.to_string()],
        )
        .await?;
    }
    let sink = tx
        .copy_in::<_, bytes::Bytes>(&format!("COPY {table} (account, amount) FROM STDIN"))
        .await?;
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(rows)).await?;
    sink.as_mut().finish().await?;
    tx.commit().await?;
    Ok(started.elapsed())
}

async fn copies(
    db: &mut Client,
    fenced: &str,
    plain: &str,
    n: usize,
    results: &Results,
) -> Res<()> {
    let (mut guarded, mut unguarded) = (Vec::new(), Vec::new());
    for _ in 0..n {
        guarded.push(copy(db, fenced, Some(1)).await?);
        unguarded.push(copy(db, plain, None).await?);
    }
    let pg = "PostgreSQL";
    results.samples(
        SECTION,
        pg,
        "COPY of 10,000 rows, guarded",
        &ms_each(&guarded),
        "ms",
        "one check for the statement",
    );
    results.samples(
        SECTION,
        pg,
        "COPY of 10,000 rows, unguarded",
        &ms_each(&unguarded),
        "ms",
        "",
    );
    Ok(())
}

/// Inserts per second of 16 connections inserting into `table` for `seconds`, each write
/// carrying `token` in the row.
async fn throughput(url: &str, table: &str, seconds: u64) -> Res<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..16_i64 {
        let db = postgres(url).await?;
        let (stop, done) = (stop.clone(), done.clone());
        let insert = db
            .prepare(&format!(
                "INSERT INTO {table} (account, amount, fence_token) VALUES ($1, 1, 2)"
            ))
            .await?;
        writers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                db.execute(&insert, &[&w]).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, tokio_postgres::Error>(())
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for writer in writers {
        writer.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64())
}

async fn concurrent(
    url: &str,
    fenced: &str,
    plain: &str,
    seconds: u64,
    results: &Results,
) -> Res<()> {
    // Two rounds each way, alternated.
    let (mut guarded, mut unguarded) = (0.0, 0.0);
    for _ in 0..2 {
        guarded += throughput(url, fenced, seconds).await? / 2.0;
        unguarded += throughput(url, plain, seconds).await? / 2.0;
    }
    let pg = "PostgreSQL";
    results.value(
        SECTION,
        pg,
        "16 writers of one holder, one scope, guarded",
        guarded,
        "inserts/s",
        "the token in the row; the mark shared",
    );
    results.value(
        SECTION,
        pg,
        "16 writers, unguarded",
        unguarded,
        "inserts/s",
        "",
    );
    results.value(
        SECTION,
        pg,
        "16 writers: guarded / unguarded",
        guarded / unguarded * 100.0,
        "%",
        "",
    );
    Ok(())
}

/// A new holder's first write, started while the old holder's transaction is open past its
/// check: how long after the old transaction commits the new write completes.
async fn handovers(url: &str, fenced: &str, scope: &Scope, n: usize, results: &Results) -> Res<()> {
    let (mut old, mut new) = (postgres(url).await?, postgres(url).await?);
    let mut token = scope.highest(&old).await?.unwrap_or(0) + 1;
    let insert = format!("INSERT INTO {fenced} (account, amount) VALUES (0, 1)");
    let mut after_commit = Vec::new();
    for _ in 0..n {
        let tx = begin(&mut old, token).await?;
        tx.execute(&insert, &[]).await?;
        let (sql, next) = (insert.clone(), token + 1);
        let newer = async {
            let tx = begin(&mut new, next).await?;
            tx.execute(&sql, &[]).await?;
            let written = Instant::now();
            tx.commit().await?;
            Ok::<_, fenced_lease::fence::Error>(written)
        };
        let old_commit = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.commit().await?;
            Ok::<_, fenced_lease::fence::Error>(Instant::now())
        };
        let (written, committed) = tokio::join!(newer, old_commit);
        after_commit.push(written?.saturating_duration_since(committed?));
        token += 2;
    }
    results.samples(
        SECTION,
        "PostgreSQL",
        "new holder's first write, after the old holder's commit",
        &ms_each(&after_commit),
        "ms",
        "it waits for the old holder's open transaction (held 20 ms), then writes",
    );
    Ok(())
}

async fn redis_writes(writes: usize, results: &Results) -> Res<()> {
    let mut conn = redis_connection().await?;
    let scope =
        fenced_lease::fence::redis::Scope::new(&format!("bench-{:08x}", rand::random::<u32>()))?;
    let (key, plain) = (scope.key("payouts"), scope.key("plain"));
    let (mut guarded, mut unguarded) = (Vec::new(), Vec::new());
    for _ in 0..writes {
        let started = Instant::now();
        scope.call(&mut conn, &key, 1, &["RPUSH", "x"]).await?;
        guarded.push(started.elapsed());
        let started = Instant::now();
        redis::cmd("RPUSH")
            .arg(&plain)
            .arg("x")
            .exec_async(&mut conn)
            .await?;
        unguarded.push(started.elapsed());
    }
    redis::cmd("DEL")
        .arg(&key)
        .arg(&plain)
        .arg(scope.fence_key())
        .exec_async(&mut conn)
        .await?;
    results.samples(
        SECTION,
        "Redis",
        "RPUSH on a key of a scope, guarded",
        &ms_each(&guarded),
        "ms",
        "FCALL fenced_call",
    );
    results.samples(
        SECTION,
        "Redis",
        "RPUSH, unguarded",
        &ms_each(&unguarded),
        "ms",
        "",
    );
    Ok(())
}
