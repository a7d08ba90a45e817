//! The cost of a guarded PostgreSQL write against the same write unguarded (one UPDATE by
//! primary key), and of a guarded transaction against an unguarded one; the cost of a guarded
//! Redis SET against a plain SET. Interleaved, so that drift of the machine's load hits both
//! alike.

use std::time::Instant;

use fenced_lease::fence::postgres::FencedTable;

use super::report;
use crate::Res;
use crate::datastores::{postgres, postgres_url, redis_connection};
use crate::figures::Results;

pub(super) async fn postgres_cost(writes: usize, results: &Results) -> Res<()> {
    let mut db = postgres(&postgres_url()?).await?;
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

pub(super) async fn redis_cost(writes: usize, results: &Results) -> Res<()> {
    let mut conn = redis_connection().await?;
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
