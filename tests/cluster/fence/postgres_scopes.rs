//! Tables bound to a scope (migration 002): the double dividend in every form a stale holder
//! can write it, refused by PostgreSQL itself; bad input; the exemption; the move from 001;
//! who waits for whom.

use std::time::Duration;

use fenced_lease::fence::Error;
use fenced_lease::fence::postgres::{Scope, begin, enable_by_column, install};
use tokio_postgres::Client;

use super::{connect, connect_to, datastores};

/// A fresh ledger table `payouts_<random>` (id, account, amount), bound to a fresh scope.
async fn ledger(client: &Client) -> (String, Scope) {
    install(client).await.unwrap();
    let name = format!("payouts_{:08x}", rand::random::<u32>());
    client
        .batch_execute(&format!(
            "CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, account BIGINT NOT NULL, amount BIGINT NOT NULL)"
        ))
        .await
        .unwrap();
    let scope = Scope::new(&format!("account-{name}")).unwrap();
    scope.enable(client, &name).await.unwrap();
    scope.enable(client, &name).await.expect("idempotent");
    (name, scope)
}

async fn count(client: &Client, table: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// Runs `sql` in a transaction presenting `token`, committed.
async fn write(client: &mut Client, token: i64, sql: &str) -> Result<(), Error> {
    let tx = begin(client, token).await?;
    tx.batch_execute(sql).await?;
    tx.commit().await
}

/// The SQLSTATE of a failed statement.
fn sqlstate(result: Result<impl std::fmt::Debug, tokio_postgres::Error>) -> String {
    let e = result.expect_err("the statement must fail");
    e.as_db_error()
        .map_or(String::new(), |db| db.code().code().to_string())
}

fn refused(result: Result<(), Error>, scope: &Scope, presented: i64, highest: i64) {
    match result {
        Err(Error::Fenced {
            scope: Some(s),
            presented: p,
            highest: h,
        }) if s == scope.as_str() && (p, h) == (presented, highest) => {}
        other => panic!(
            "expected a refusal of {presented} by scope {scope}'s mark {highest}, got {other:?}"
        ),
    }
}

#[tokio::test]
async fn a_stale_holders_insert_of_a_second_payout_is_refused() {
    let mut client = connect().await;
    let (t, scope) = ledger(&client).await;
    // Holder B (token 8) pays account 42; stale holder A (token 7) pays again.
    let insert = |token: i64| {
        format!("INSERT INTO {t} (account, amount, fence_token) VALUES (42, 100, {token})")
    };
    client.batch_execute(&insert(8)).await.expect("B pays");
    let row_token = client.batch_execute(&insert(7)).await.map_err(Error::from);
    refused(row_token, &scope, 7, 8);
    let setting = write(
        &mut client,
        7,
        &format!("INSERT INTO {t} (account, amount) VALUES (42, 100)"),
    )
    .await;
    refused(setting, &scope, 7, 8);
    assert_eq!(count(&client, &t).await, 1, "one payout");
    write(
        &mut client,
        8,
        &format!("INSERT INTO {t} (account, amount) VALUES (43, 5)"),
    )
    .await
    .expect("B writes again with its token");
    assert_eq!(scope.highest(&client).await.unwrap(), Some(8));
}

#[tokio::test]
async fn a_write_that_presents_no_token_is_refused() {
    let mut client = connect().await;
    let (t, scope) = ledger(&client).await;
    write(
        &mut client,
        8,
        &format!("INSERT INTO {t} (account, amount) VALUES (42, 100)"),
    )
    .await
    .unwrap();
    for sql in [
        format!("UPDATE {t} SET amount = 0"),
        format!("INSERT INTO {t} (account, amount) VALUES (42, 100)"),
        format!("DELETE FROM {t}"),
        format!("TRUNCATE {t}"),
    ] {
        let e = client.batch_execute(&sql).await.map_err(Error::from);
        match e {
            Err(Error::NoToken(message)) => assert!(
                message.contains("presents no fencing token") && message.contains(scope.as_str()),
                "{message}"
            ),
            other => panic!("{sql}: expected NoToken, got {other:?}"),
        }
    }
    // An UPDATE that sets fence_token presents it; the same token as the row's is accepted.
    client
        .batch_execute(&format!("UPDATE {t} SET amount = 1, fence_token = 8"))
        .await
        .expect("an update presenting the current token in the row");
    let stale = client
        .batch_execute(&format!("UPDATE {t} SET amount = 2, fence_token = 7"))
        .await
        .map_err(Error::from);
    refused(stale, &scope, 7, 8);
    let amounts: Vec<i64> = client
        .query(&format!("SELECT amount FROM {t}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(amounts, [1]);
}

#[tokio::test]
async fn rows_deleted_by_the_new_holder_are_not_recreated_by_the_stale_one() {
    let mut client = connect().await;
    let (t, scope) = ledger(&client).await;
    let pay = format!("INSERT INTO {t} (account, amount) VALUES (42, 100)");
    write(&mut client, 7, &pay).await.unwrap();
    write(&mut client, 8, &format!("DELETE FROM {t}"))
        .await
        .unwrap();
    refused(write(&mut client, 7, &pay).await, &scope, 7, 8);
    refused(
        write(&mut client, 7, &format!("TRUNCATE {t}")).await,
        &scope,
        7,
        8,
    );
    assert_eq!(count(&client, &t).await, 0);
    write(&mut client, 9, &format!("{pay}; TRUNCATE {t}"))
        .await
        .expect("a newer holder truncates");
}

/// `COPY` of 100 rows (accounts from `token` * 1000) in a transaction presenting `token`.
async fn copy_rows(client: &mut Client, t: &str, token: i64) -> Result<(), Error> {
    use futures::SinkExt;
    let tx = begin(client, token).await?;
    let sink = tx
        .copy_in::<_, bytes::Bytes>(&format!("COPY {t} (account, amount) FROM STDIN"))
        .await?;
    futures::pin_mut!(sink);
    let rows: String = (0..100)
        .map(|i| format!("{}\t1\n", i + token * 1000))
        .collect();
    sink.send(bytes::Bytes::from(rows)).await?;
    sink.as_mut().finish().await?;
    tx.commit().await
}

#[tokio::test]
async fn copy_upsert_and_merge_present_the_transactions_token() {
    let mut client = connect().await;
    let (t, scope) = ledger(&client).await;
    client
        .batch_execute(&format!("CREATE UNIQUE INDEX ON {t} (account)"))
        .await
        .unwrap();
    copy_rows(&mut client, &t, 8)
        .await
        .expect("COPY with the current token");
    // The stale COPY through psql: tokio-postgres reports an error during COPY IN as an
    // unexpected message, psql prints the database's.
    let file = std::env::temp_dir().join(format!("{t}.sql"));
    std::fs::write(
        &file,
        format!("BEGIN;\nSET LOCAL fenced_lease.token = '7';\nCOPY {t} (account, amount) FROM STDIN;\n1\t1\n2\t1\n\\.\nCOMMIT;\n"),
    )
    .unwrap();
    let stale = super::psql(&datastores().postgres, &["-f", &file.display().to_string()]).await;
    assert!(
        !stale.ok && stale.stderr.contains("FL001"),
        "{}",
        stale.stderr
    );

    let upsert = format!(
        "INSERT INTO {t} (account, amount) VALUES (8000, 5) ON CONFLICT (account) DO UPDATE SET amount = EXCLUDED.amount"
    );
    refused(write(&mut client, 7, &upsert).await, &scope, 7, 8);
    write(&mut client, 8, &upsert).await.unwrap();
    let merge = format!(
        "MERGE INTO {t} p USING (VALUES (8001)) v(a) ON p.account = v.a WHEN MATCHED THEN UPDATE SET amount = 9 WHEN NOT MATCHED THEN INSERT (account, amount) VALUES (v.a, 9)"
    );
    refused(write(&mut client, 7, &merge).await, &scope, 7, 8);
    write(&mut client, 8, &merge).await.unwrap();
    let sum: i64 = client
        .query_one(&format!("SELECT sum(amount)::bigint FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        sum,
        100 - 2 + 5 + 9,
        "COPY's 100 rows, the upsert's and the merge's"
    );
}

#[tokio::test]
async fn one_table_of_many_scopes_keeps_each_scopes_mark() {
    let mut client = connect().await;
    install(&client).await.unwrap();
    let t = format!("ledger_{:08x}", rand::random::<u32>());
    let (a, b) = (format!("{t}-a"), format!("{t}-b"));
    client
        .batch_execute(&format!(
            "CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, scope TEXT, amount BIGINT, fence_token BIGINT);
             INSERT INTO {t} (scope, amount, fence_token) VALUES ('{a}', 1, 3)"
        ))
        .await
        .unwrap();
    enable_by_column(&client, &t, "scope").await.unwrap();
    let (sa, sb) = (Scope::new(&a).unwrap(), Scope::new(&b).unwrap());
    assert_eq!(
        sa.highest(&client).await.unwrap(),
        Some(3),
        "the rows' highest"
    );
    let insert = |scope: &str| format!("INSERT INTO {t} (scope, amount) VALUES ('{scope}', 1)");
    write(&mut client, 9, &insert(&a)).await.unwrap();
    write(&mut client, 5, &insert(&b))
        .await
        .expect("scope b's mark is its own");
    refused(write(&mut client, 8, &insert(&a)).await, &sa, 8, 9);
    // A row moved from b to a is checked against both marks.
    let moved = write(
        &mut client,
        5,
        &format!("UPDATE {t} SET scope = '{a}' WHERE scope = '{b}'"),
    )
    .await;
    refused(moved, &sa, 5, 9);
    refused(
        write(
            &mut client,
            4,
            &format!("DELETE FROM {t} WHERE scope = '{b}'"),
        )
        .await,
        &sb,
        4,
        5,
    );
    let truncate = client.batch_execute(&format!("TRUNCATE {t}")).await;
    assert_eq!(sqlstate(truncate), "FL003", "a table of many scopes");
    let no_scope = write(
        &mut client,
        9,
        &format!("INSERT INTO {t} (amount) VALUES (1)"),
    )
    .await;
    assert!(
        matches!(&no_scope, Err(Error::Postgres(e)) if e.code().map(|c| c.code()) == Some("FL005")),
        "a row with no scope: {no_scope:?}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_its_own_code_and_nothing_is_written() {
    let client = connect().await;
    let (t, scope) = ledger(&client).await;
    let cases = [
        (
            format!(
                "BEGIN; SET LOCAL fenced_lease.token = 'x'; INSERT INTO {t} (account, amount) VALUES (1, 1); COMMIT"
            ),
            "FL002",
        ),
        (
            format!(
                "BEGIN; SET LOCAL fenced_lease.token = '-1'; INSERT INTO {t} (account, amount) VALUES (1, 1); COMMIT"
            ),
            "FL002",
        ),
        (
            format!("INSERT INTO {t} (account, amount, fence_token) VALUES (1, 1, -5)"),
            "FL002",
        ),
        (
            format!("SELECT fenced_lease.enable('{t}', 'another')"),
            "FL007",
        ),
        (format!("SELECT fenced_lease.enable('{t}', '')"), "FL005"),
        (
            format!("SELECT fenced_lease.enable('{t}', repeat('x', 513))"),
            "FL005",
        ),
        (
            format!("SELECT fenced_lease.enable_by_column('{t}', 'nope')"),
            "FL007",
        ),
        ("SELECT fenced_lease.highest('never-named')".into(), "FL004"),
    ];
    for (sql, code) in cases {
        assert_eq!(sqlstate(client.batch_execute(&sql).await), code, "{sql}");
        client.batch_execute("ROLLBACK").await.ok();
    }
    assert_eq!(count(&client, &t).await, 0);
    assert_eq!(scope.highest(&client).await.unwrap(), Some(0));
}

#[tokio::test]
async fn maintenance_without_a_token_needs_the_explicit_exemption_and_is_recorded() {
    let admin = connect().await;
    let (t, scope) = ledger(&admin).await;
    let role = format!("holder_{:08x}", rand::random::<u32>());
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT ALL ON {t}, {t}_id_seq TO {role};
             GRANT USAGE ON SCHEMA fenced_lease TO {role};"
        ))
        .await
        .unwrap();
    let holder = connect_to(&format!("{} user={role}", datastores().postgres)).await;
    let exempt = |reason: &str| {
        format!(
            "BEGIN; SET LOCAL fenced_lease.exempt = '{reason}'; INSERT INTO {t} (account, amount) VALUES (1, 1); COMMIT"
        )
    };
    assert_eq!(
        sqlstate(holder.batch_execute(&exempt("sneaky")).await),
        "FL006"
    );
    holder.batch_execute("ROLLBACK").await.ok();
    let reset = holder
        .batch_execute(&format!(
            "SELECT fenced_lease.reset('{scope}', 0, 'sneaky')"
        ))
        .await;
    assert_eq!(sqlstate(reset), "FL006", "a holder cannot lower a mark");
    let direct = holder
        .batch_execute("UPDATE fenced_lease.scopes SET highest = 0")
        .await;
    assert_eq!(sqlstate(direct), "42501", "nor write the marks");
    assert_eq!(count(&admin, &t).await, 0);

    admin
        .batch_execute(&format!("GRANT fenced_lease_exempt TO {role}"))
        .await
        .unwrap();
    holder
        .batch_execute(&exempt("backfill, ticket 123"))
        .await
        .expect("a member of fenced_lease_exempt, with a reason");
    let recorded = admin
        .query_one(
            "SELECT role::text, statement, reason FROM fenced_lease.exemptions WHERE tbl = $1",
            &[&t],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            recorded.get::<_, String>(0),
            recorded.get::<_, String>(1),
            recorded.get::<_, String>(2)
        ),
        (role.clone(), "INSERT".into(), "backfill, ticket 123".into())
    );
    holder
        .batch_execute(&format!(
            "SELECT fenced_lease.reset('{scope}', 3, 'restored from backup')"
        ))
        .await
        .expect("a member resets a mark");
    assert_eq!(scope.highest(&admin).await.unwrap(), Some(3));
    let logged: i64 = admin
        .query_one(
            "SELECT count(*) FROM fenced_lease.resets WHERE scope = $1 AND to_highest = 3",
            &[&scope.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, 1);
}

#[tokio::test]
async fn a_table_of_migration_001_moves_to_a_scope_with_its_highest_row_token() {
    let mut client = connect().await;
    install(&client).await.unwrap();
    let t = format!("legacy_{:08x}", rand::random::<u32>());
    client
        .batch_execute(&format!(
            "CREATE TABLE {t} (account BIGINT PRIMARY KEY, paid_by TEXT);
             SELECT fenced_lease.enable('{t}'::regclass);
             INSERT INTO {t} VALUES (1, 'a', 5), (2, 'b', 9);
             UPDATE {t} SET paid_by = 'b2', fence_token = 9 WHERE account = 2;"
        ))
        .await
        .expect("001's per-row fence works beside 002");
    let scope = Scope::new(&t).unwrap();
    scope.enable(&client, &t).await.unwrap();
    assert_eq!(scope.highest(&client).await.unwrap(), Some(9));
    refused(
        write(
            &mut client,
            8,
            &format!("INSERT INTO {t} VALUES (3, 'stale')"),
        )
        .await,
        &scope,
        8,
        9,
    );
    refused(
        write(
            &mut client,
            6,
            &format!("UPDATE {t} SET paid_by = 'x' WHERE account = 1"),
        )
        .await,
        &scope,
        6,
        9,
    );
    write(&mut client, 9, &format!("INSERT INTO {t} VALUES (3, 'c')"))
        .await
        .unwrap();
    // A table of 001 left as it was keeps its per-row fence beside 002.
    let kept = format!("{t}_kept");
    client
        .batch_execute(&format!(
            "CREATE TABLE {kept} (account BIGINT PRIMARY KEY, paid_by TEXT);
             SELECT fenced_lease.enable('{kept}'::regclass);
             INSERT INTO {kept} VALUES (1, 'a', 5);"
        ))
        .await
        .unwrap();
    let stale = client
        .batch_execute(&format!("UPDATE {kept} SET paid_by = 'x', fence_token = 4"))
        .await
        .map_err(Error::from);
    assert!(
        matches!(
            stale,
            Err(Error::Fenced {
                scope: None,
                presented: 4,
                highest: 5
            })
        ),
        "{stale:?}"
    );
    client
        .batch_execute(&format!("UPDATE {kept} SET paid_by = 'y'"))
        .await
        .expect("001 does not ask for a token");
}

/// Waits until `future` is done, at most `within`; whether it was.
async fn done_within<F: std::future::Future>(within: Duration, future: F) -> Option<F::Output> {
    tokio::time::timeout(within, future).await.ok()
}

#[tokio::test]
async fn the_current_holders_transactions_run_side_by_side_and_a_new_holder_waits_for_them() {
    let (mut c1, mut c2, mut c3) = (connect().await, connect().await, connect().await);
    let (t, scope) = ledger(&c1).await;
    let pay = format!("INSERT INTO {t} (account, amount) VALUES (42, 1)");
    write(&mut c1, 8, &pay).await.unwrap();
    // Two open transactions of the current holder: the second is not held back by the first.
    let first = begin(&mut c1, 8).await.unwrap();
    first.batch_execute(&pay).await.unwrap();
    let second = begin(&mut c2, 8).await.unwrap();
    done_within(Duration::from_secs(10), second.batch_execute(&pay))
        .await
        .expect("an equal token does not wait for the holder's other transaction")
        .unwrap();
    second.commit().await.unwrap();
    // A new holder's first write waits for the transaction that checked the old mark.
    let table = t.clone();
    let newer = tokio::spawn(async move {
        let tx = begin(&mut c3, 9).await?;
        tx.batch_execute(&format!(
            "INSERT INTO {table} (account, amount) VALUES (42, 2)"
        ))
        .await?;
        tx.commit().await
    });
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT%'";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = c2.query_one(waiting, &[]).await.unwrap().get(0);
        if n > 0 {
            break;
        }
        assert!(
            !newer.is_finished(),
            "the new holder's write did not wait for the old transaction"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the new holder's write never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first
        .commit()
        .await
        .expect("the old transaction commits first");
    done_within(Duration::from_secs(10), newer)
        .await
        .expect("then the new holder writes")
        .unwrap()
        .unwrap();
    // After it, no write of the old token commits.
    refused(
        write(
            &mut c1,
            8,
            &format!("INSERT INTO {t} (account, amount) VALUES (42, 3)"),
        )
        .await,
        &scope,
        8,
        9,
    );
}

#[tokio::test]
async fn an_idle_stale_transaction_holds_the_new_holder_back_only_until_its_timeout() {
    let (mut c1, mut c2) = (connect().await, connect().await);
    let (t, scope) = ledger(&c1).await;
    c1.batch_execute("SET idle_in_transaction_session_timeout = '1s'")
        .await
        .unwrap();
    let stale = begin(&mut c1, 8).await.unwrap();
    stale
        .batch_execute(&format!("INSERT INTO {t} (account, amount) VALUES (42, 1)"))
        .await
        .unwrap();
    // The stale holder stalls inside its transaction; the new one's write comes through once
    // the server ends the idle session, and the stale one's commit fails.
    done_within(
        Duration::from_secs(20),
        write(
            &mut c2,
            9,
            &format!("INSERT INTO {t} (account, amount) VALUES (42, 2)"),
        ),
    )
    .await
    .expect("the new holder's write is not held back forever")
    .unwrap();
    assert!(
        stale.commit().await.is_err(),
        "the stale transaction was ended"
    );
    assert_eq!(count(&c2, &t).await, 1);
    assert_eq!(scope.highest(&c2).await.unwrap(), Some(9));
}

#[tokio::test]
async fn under_repeatable_read_a_snapshot_older_than_the_mark_writes_nothing() {
    let (mut c1, mut c2) = (connect().await, connect().await);
    let (t, _) = ledger(&c1).await;
    write(
        &mut c1,
        7,
        &format!("INSERT INTO {t} (account, amount) VALUES (1, 1)"),
    )
    .await
    .unwrap();
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        let stale = c1.transaction().await.unwrap();
        stale
            .batch_execute(&format!(
                "SET TRANSACTION ISOLATION LEVEL {isolation}; SET LOCAL fenced_lease.token = '7'; SELECT count(*) FROM {t}"
            ))
            .await
            .unwrap();
        let newer = if isolation == "SERIALIZABLE" { 9 } else { 8 };
        write(
            &mut c2,
            newer,
            &format!("INSERT INTO {t} (account, amount) VALUES (2, 2)"),
        )
        .await
        .unwrap();
        let late = stale
            .batch_execute(&format!("INSERT INTO {t} (account, amount) VALUES (3, 3)"))
            .await;
        assert_eq!(
            sqlstate(late),
            "40001",
            "{isolation}: a serialization failure"
        );
        drop(stale);
        let again = write(
            &mut c1,
            7,
            &format!("INSERT INTO {t} (account, amount) VALUES (3, 3)"),
        )
        .await;
        assert!(
            matches!(again, Err(Error::Fenced { presented: 7, highest: h, .. }) if h == newer),
            "{isolation}: retried, it is refused by the new mark: {again:?}"
        );
    }
    assert_eq!(count(&c1, &t).await, 3);
}

/// One holder's writer in the race: from `round` × 400 ms on, for 0.3 to 1.2 s, transactions of
/// `round` (its token) each inserting one row of `scope`, with a pause inside the transaction
/// after its check; how many were accepted and refused.
async fn race_writer(t: String, scope: String, round: i64, w: u32) -> (usize, usize) {
    tokio::time::sleep(Duration::from_millis(400 * (round as u64 - 1))).await;
    let mut client = connect().await;
    let until =
        std::time::Instant::now() + Duration::from_millis(300 + rand::random::<u64>() % 900);
    let insert = format!("INSERT INTO {t} (scope, writer, fence_token) VALUES ($1, $2, $3)");
    let (mut accepted, mut refused) = (0, 0);
    while std::time::Instant::now() < until {
        let tx = begin(&mut client, round).await.unwrap();
        let written = tx
            .execute(&insert, &[&scope, &format!("{round}.{w}"), &round])
            .await
            .map_err(Error::from);
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 40)).await;
        let outcome = match written {
            Ok(_) => tx.commit().await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => accepted += 1,
            Err(e) if e.is_fenced() => refused += 1,
            // A deadlock victim wrote nothing.
            Err(Error::Postgres(e)) if e.code().map(|c| c.code()) == Some("40P01") => refused += 1,
            Err(e) => panic!("writer {round}.{w} of {scope}: {e}"),
        }
    }
    (accepted, refused)
}

/// The (scope, token) of every row inserted into `t`, in the order the database committed
/// them: what the logical replication `slot` (test_decoding) decodes, read and dropped.
async fn commit_order(admin: &Client, slot: &str, t: &str) -> Vec<(String, i64)> {
    // Decoded up to the WAL flushed (the test server commits asynchronously: a checkpoint
    // flushes it all).
    admin.batch_execute("CHECKPOINT").await.unwrap();
    let changes = admin
        .query(
            "SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)",
            &[&slot],
        )
        .await
        .unwrap();
    admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .unwrap();
    // `table public.t: INSERT: id[bigint]:1 scope[text]:'s' ... fence_token[bigint]:7`
    let field = |data: &str, name: &str| -> Option<String> {
        let value = &data[data.find(&format!(" {name}["))?..];
        let value = &value[value.find("]:")? + 2..];
        Some(
            value
                .trim_start_matches('\'')
                .split(['\'', ' '])
                .next()?
                .to_string(),
        )
    };
    let prefix = format!("table public.{t}: INSERT:");
    changes
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|data| data.starts_with(&prefix))
        .map(|data| {
            let token = field(&data, "fence_token").and_then(|v| v.parse().ok());
            (
                field(&data, "scope").expect("scope"),
                token.expect("a token"),
            )
        })
        .collect()
}

/// Paused stale holders racing the current holder's concurrent transactions on several scopes of
/// one table, checked in the database's own commit order (logical decoding): no row with a
/// lower token commits after a row with a higher token in its scope. `FL_GUARD_RACE=<duration>`
/// lengthens it (default 6s; `make soak` runs it for its DURATION).
#[tokio::test]
async fn in_commit_order_no_lower_token_commits_after_a_higher_one_in_its_scope() {
    let admin = connect().await;
    install(&admin).await.unwrap();
    let level: String = admin.query_one("SHOW wal_level", &[]).await.unwrap().get(0);
    assert_eq!(
        level, "logical",
        "hack/datastores starts PostgreSQL with wal_level=logical"
    );
    let t = format!("race_{:08x}", rand::random::<u32>());
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, scope TEXT NOT NULL, writer TEXT NOT NULL, fence_token BIGINT)"
        ))
        .await
        .unwrap();
    enable_by_column(&admin, &t, "scope").await.unwrap();
    let slot = format!("slot_{t}");
    admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
            &[&slot],
        )
        .await
        .unwrap();

    let secs = std::env::var("FL_GUARD_RACE")
        .ok()
        .and_then(|s| humantime::parse_duration(&s).ok())
        .map_or(6, |d| d.as_secs());
    // Each of 3 scopes: a new holder every 400 ms, whose 3 writers go on after the next took over.
    let mut writers = Vec::new();
    for scope in (0..3).map(|i| format!("{t}-{i}")) {
        for round in 1..=(secs * 1000 / 400).max(2) as i64 {
            for w in 0..3 {
                writers.push(tokio::spawn(race_writer(
                    t.clone(),
                    scope.clone(),
                    round,
                    w,
                )));
            }
        }
    }
    let (mut accepted, mut refused) = (0, 0);
    for writer in writers {
        let (a, r) = writer.await.unwrap();
        (accepted, refused) = (accepted + a, refused + r);
    }

    let committed = commit_order(&admin, &slot, &t).await;
    let mut highest: std::collections::HashMap<&str, i64> = Default::default();
    for (scope, token) in &committed {
        let seen = highest.entry(scope).or_default();
        assert!(
            *token >= *seen,
            "in commit order, a row of token {token} of scope {scope} committed after one of token {seen}"
        );
        *seen = *token;
    }
    assert_eq!(
        committed.len(),
        accepted,
        "every accepted insert, and no other, committed"
    );
    assert!(
        refused > 0 && accepted > 0,
        "the race ran: {accepted} accepted, {refused} refused"
    );
    eprintln!(
        "{} inserts committed in order over 3 scopes, {refused} refused",
        committed.len()
    );
}
