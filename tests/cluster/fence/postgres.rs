//! PostgreSQL rows and transactions fenced by the database (feature `postgres`), against a
//! real PostgreSQL started by hack/datastores: through the Rust guard, and through psql, the
//! client of any language, running the SQL of fence/postgres/.

use crate::common;
#[path = "postgres_refusals.rs"]
mod refusals;
#[path = "postgres_scopes.rs"]
mod scopes;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::fence::datastores;
use common::repo_root;
use fenced_lease::fence::Error;
use fenced_lease::fence::postgres::{FENCED_SQLSTATE, FencedTable, install};
use tokio_postgres::{Client, NoTls};

async fn connect_to(conninfo: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

async fn connect() -> Client {
    connect_to(&datastores().postgres).await
}

/// A fresh table `payouts_<random>` (account BIGINT PRIMARY KEY, paid_by TEXT) fenced by
/// `fenced_lease.enable` (the fence column and the trigger), and a history table a trigger appends every token written to the row to, in the
/// order the row was written (row locks serialize the writes of one row).
async fn table(client: &Client) -> (String, FencedTable) {
    let name = format!("payouts_{:08x}", rand::random::<u32>());
    client
        .batch_execute(&format!(
            "CREATE TABLE {name} (account BIGINT PRIMARY KEY, paid_by TEXT);
             CREATE TABLE {name}_history (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL);
             CREATE FUNCTION {name}_log() RETURNS trigger AS $$
               BEGIN INSERT INTO {name}_history (token) VALUES (NEW.fence_token); RETURN NEW; END
             $$ LANGUAGE plpgsql;"
        ))
        .await
        .unwrap();
    // The migration as it is in the repository now, not as an earlier run left it.
    install(client).await.unwrap();
    let fenced = FencedTable::new(&name, &["account"]);
    fenced.add_fence_column(client).await.unwrap();
    fenced.add_fence_column(client).await.expect("idempotent");
    client
        .batch_execute(&format!(
            "CREATE TRIGGER {name}_log AFTER INSERT OR UPDATE OF fence_token ON {name}
               FOR EACH ROW EXECUTE FUNCTION {name}_log();"
        ))
        .await
        .unwrap();
    (name, fenced)
}

async fn stored(client: &Client, table: &str) -> (i64, String) {
    let row = client
        .query_one(
            &format!("SELECT fence_token, paid_by FROM {table} WHERE account = 42"),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

async fn history(client: &Client, table: &str) -> Vec<i64> {
    client
        .query(
            &format!("SELECT token FROM {table}_history ORDER BY id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn fenced(result: Result<(), Error>) -> (i64, i64) {
    match result {
        Err(Error::Fenced {
            presented, highest, ..
        }) => (presented, highest),
        other => panic!("expected Fenced, got {other:?}"),
    }
}

#[tokio::test]
async fn row_guard_refuses_a_lower_token_and_accepts_an_equal_one() {
    let client = connect().await;
    let (name, payouts) = table(&client).await;
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&42_i64];

    let missing = payouts.update(&client, &key, &[("paid_by", &"a")], 5).await;
    assert!(matches!(missing, Err(Error::Missing(_))), "{missing:?}");
    payouts
        .upsert(&client, &key, &[("paid_by", &"a")], 5)
        .await
        .expect("upsert creates the row");
    payouts
        .update(&client, &key, &[("paid_by", &"a again")], 5)
        .await
        .expect("an equal token is accepted");
    payouts
        .update(&client, &key, &[("paid_by", &"b")], 7)
        .await
        .expect("a higher token is accepted");
    assert_eq!(
        fenced(
            payouts
                .update(&client, &key, &[("paid_by", &"a, stale")], 6)
                .await
        ),
        (6, 7)
    );
    assert_eq!(
        fenced(
            payouts
                .upsert(&client, &key, &[("paid_by", &"a, stale")], 6)
                .await
        ),
        (6, 7)
    );
    assert_eq!(stored(&client, &name).await, (7, "b".to_string()));

    let negative = payouts
        .update(&client, &key, &[("paid_by", &"x")], -1)
        .await;
    assert!(
        matches!(negative, Err(Error::InvalidToken(-1))),
        "{negative:?}"
    );
    assert_eq!(
        negative.unwrap_err().to_string(),
        "invalid fencing token -1: tokens are integers from 0 to 9007199254740991 (2^53 - 1)"
    );
}

#[tokio::test]
async fn transaction_guard_refuses_a_lower_token_and_accepts_an_equal_one() {
    let mut client = connect().await;
    let (name, payouts) = table(&client).await;
    payouts
        .upsert(&client, &[&42_i64], &[("paid_by", &"a")], 5)
        .await
        .unwrap();
    for (token, who) in [(5, "a again"), (7, "b")] {
        let tx = payouts.begin(&mut client, &[&42_i64], token).await.unwrap();
        tx.execute(
            &format!("UPDATE {name} SET paid_by = $1 WHERE account = 42"),
            &[&who],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let stale = payouts.begin(&mut client, &[&42_i64], 6).await.map(drop);
    assert_eq!(fenced(stale), (6, 7));
    assert_eq!(stored(&client, &name).await, (7, "b".to_string()));
    let missing = payouts.begin(&mut client, &[&7_i64], 9).await.map(drop);
    assert!(matches!(missing, Err(Error::Missing(_))), "{missing:?}");
    let negative = payouts.begin(&mut client, &[&42_i64], -3).await.map(drop);
    assert!(matches!(negative, Err(Error::InvalidToken(-3))));
}

/// Runs `writers` tasks that each write 10 times with random tokens through `write`, and
/// checks that the row's history never goes down and that some writes were refused.
async fn race<F, Fut>(name: &str, write: F)
where
    F: Fn(i64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    let refused = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (write, refused) = (write.clone(), refused.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let token = rand::random_range(0..1000);
                    match write(token).await {
                        Ok(()) => {}
                        Err(Error::Fenced {
                            presented, highest, ..
                        }) => {
                            assert!(presented == token && highest > token);
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let client = connect().await;
    let accepted = history(&client, name).await;
    assert!(
        accepted.windows(2).all(|w| w[0] <= w[1]),
        "a lower token was written after a higher one: {accepted:?}"
    );
    let refused = refused.load(Ordering::Relaxed);
    assert!(refused > 0, "no write was refused, so nothing was tested");
    assert_eq!(
        accepted.len() - 1 + refused,
        100,
        "the first entry is the insert"
    );
    assert_eq!(stored(&client, name).await.0, *accepted.last().unwrap());
}

#[tokio::test]
async fn concurrent_row_writers_never_leave_a_lower_token_after_a_higher_one() {
    let client = connect().await;
    let (name, payouts) = table(&client).await;
    payouts
        .upsert(&client, &[&42_i64], &[("paid_by", &"nobody")], 0)
        .await
        .unwrap();
    let clients = Arc::new(futures::future::join_all((0..10).map(|_| connect())).await);
    let next = Arc::new(AtomicUsize::new(0));
    race(&name, move |token| {
        let (payouts, clients, next) = (payouts.clone(), clients.clone(), next.clone());
        async move {
            let client = &clients[next.fetch_add(1, Ordering::Relaxed) % clients.len()];
            let who = format!("writer with token {token}");
            payouts
                .update(client, &[&42_i64], &[("paid_by", &who)], token)
                .await
        }
    })
    .await;
}

#[tokio::test]
async fn concurrent_transactions_never_leave_a_lower_token_after_a_higher_one() {
    let client = connect().await;
    let (name, payouts) = table(&client).await;
    payouts
        .upsert(&client, &[&42_i64], &[("paid_by", &"nobody")], 0)
        .await
        .unwrap();
    let table_name = name.clone();
    race(&name, move |token| {
        let (payouts, name) = (payouts.clone(), table_name.clone());
        async move {
            let mut client = connect().await;
            let tx = payouts.begin(&mut client, &[&42_i64], token).await?;
            // More than one statement, all under the row's lock and token.
            let who = format!("transaction with token {token}");
            tx.execute(
                &format!("UPDATE {name} SET paid_by = $1 WHERE account = 42"),
                &[&who],
            )
            .await?;
            tokio::task::yield_now().await;
            tx.commit().await
        }
    })
    .await;
}

/// fence/postgres/001_fenced_lease.sql
fn migration() -> PathBuf {
    repo_root().join("fence/postgres/001_fenced_lease.sql")
}

/// What psql printed, and whether it succeeded.
struct Psql {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs psql (the newest of /usr/lib/postgresql/*/bin, else the one on PATH) on `conninfo`,
/// stopping at the first error and printing errors with their SQLSTATE.
async fn psql(conninfo: &str, args: &[&str]) -> Psql {
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|version| version.path().join("bin/psql"))
        .filter(|psql| psql.exists())
        .max_by_key(|psql| {
            let version = psql.parent().and_then(|bin| bin.parent());
            version
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap_or(0)
        });
    let binary = installed.unwrap_or_else(|| PathBuf::from("psql"));
    let out = tokio::process::Command::new(&binary)
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
        ])
        .args(["-d", conninfo])
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    Psql {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `sql` with psql, which must succeed; returns what it printed (unaligned, no headers).
async fn psql_ok(conninfo: &str, sql: &str) -> String {
    let out = psql(conninfo, &["-At", "-c", sql]).await;
    assert!(out.ok, "psql -c {sql:?} failed:\n{}", out.stderr);
    out.stdout.trim().to_string()
}

/// Runs `sql` with psql, which must be refused as a stale token; returns psql's error output.
async fn psql_refused(conninfo: &str, sql: &str) -> String {
    let out = psql(conninfo, &["-c", sql]).await;
    assert!(!out.ok, "psql -c {sql:?} was accepted:\n{}", out.stdout);
    out.stderr
}

/// The error psql prints for a token refused by the database, and the Rust guard's error
/// for the same refusal, side by side.
fn psql_refusal(presented: i64, highest: i64) -> String {
    let rust = Error::Fenced {
        scope: None,
        presented,
        highest,
    };
    format!("ERROR:  {FENCED_SQLSTATE}: {rust}\nDETAIL:  presented={presented} highest={highest}\n")
}

/// A new, empty database; returns its name and a connection string for it.
async fn empty_database(admin: &Client) -> (String, String) {
    let name = format!("fenced_any_client_{:08x}", rand::random::<u32>());
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let conninfo = format!("{} dbname={name}", datastores().postgres);
    (name, conninfo)
}

#[tokio::test]
async fn psql_installs_the_migration_and_its_writes_are_checked_by_the_database() {
    let admin = connect().await;
    let (db, conninfo) = empty_database(&admin).await;
    let migration = migration();
    let migration = migration.to_str().unwrap();
    for _ in 0..2 {
        let out = psql(&conninfo, &["--single-transaction", "-f", migration]).await;
        assert!(out.ok, "the migration did not install:\n{}", out.stderr);
    }
    psql_ok(
        &conninfo,
        "CREATE TABLE payouts (account BIGINT PRIMARY KEY, paid_by TEXT);
         SELECT fenced_lease.enable('payouts');",
    )
    .await;
    psql_ok(&conninfo, "SELECT fenced_lease.enable('payouts')").await;

    psql_ok(&conninfo, "INSERT INTO payouts VALUES (42, 'a', 5)").await;
    psql_ok(
        &conninfo,
        "UPDATE payouts SET paid_by = 'a again', fence_token = 5 WHERE account = 42",
    )
    .await;
    psql_ok(
        &conninfo,
        "UPDATE payouts SET paid_by = 'b', fence_token = 7 WHERE account = 42",
    )
    .await;
    // No `AND fence_token <= 6` in these: the database checks the token all the same.
    for stale in [
        "UPDATE payouts SET paid_by = 'stale', fence_token = 6 WHERE account = 42",
        "INSERT INTO payouts VALUES (42, 'stale', 6)
           ON CONFLICT (account) DO UPDATE SET paid_by = EXCLUDED.paid_by, fence_token = EXCLUDED.fence_token",
        "BEGIN; SET LOCAL fenced_lease.token = '6'; UPDATE payouts SET paid_by = 'stale' WHERE account = 42; COMMIT;",
        "BEGIN; SET LOCAL fenced_lease.token = '6'; DELETE FROM payouts WHERE account = 42; COMMIT;",
    ] {
        let refused = psql_refused(&conninfo, stale).await;
        assert!(
            refused.contains(&psql_refusal(6, 7)),
            "{stale}\nrefused with:\n{refused}"
        );
    }
    assert_eq!(
        psql_ok(&conninfo, "SELECT fence_token, paid_by FROM payouts").await,
        "7|b"
    );

    // A transaction's token raises the row's; a current token deletes.
    psql_ok(
        &conninfo,
        "BEGIN; SET LOCAL fenced_lease.token = '8'; UPDATE payouts SET paid_by = 'c' WHERE account = 42; COMMIT;",
    )
    .await;
    assert_eq!(
        psql_ok(&conninfo, "SELECT fence_token, paid_by FROM payouts").await,
        "8|c"
    );
    psql_ok(
        &conninfo,
        "BEGIN; SET LOCAL fenced_lease.token = '8'; DELETE FROM payouts WHERE account = 42; COMMIT;",
    )
    .await;
    assert_eq!(
        psql_ok(&conninfo, "SELECT count(*) FROM payouts").await,
        "0"
    );
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap();
}

#[tokio::test]
async fn psql_and_the_rust_guard_get_the_same_refusal() {
    let client = connect().await;
    let (name, payouts) = table(&client).await;
    let conninfo = &datastores().postgres;
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&42_i64];
    psql_ok(conninfo, &format!("INSERT INTO {name} VALUES (42, 'a', 7)")).await;

    // Stale: psql, a plain statement from this client, and the guard are refused alike.
    let from_psql = psql_refused(
        conninfo,
        &format!("UPDATE {name} SET paid_by = 'stale', fence_token = 6 WHERE account = 42"),
    )
    .await;
    let raw = client
        .execute(
            &format!("UPDATE {name} SET paid_by = 'stale', fence_token = 6 WHERE account = 42"),
            &[],
        )
        .await
        .expect_err("a plain UPDATE with a stale token");
    let db = raw.as_db_error().expect("an error from the database");
    assert_eq!(
        (db.code().code(), db.message(), db.detail()),
        (
            FENCED_SQLSTATE,
            "fenced out: token 6 is lower than 7, the highest token the resource has accepted",
            Some("presented=6 highest=7")
        )
    );
    assert!(matches!(
        Error::from(raw),
        Error::Fenced {
            presented: 6,
            highest: 7,
            ..
        }
    ));
    let from_guard = payouts
        .update(&client, &key, &[("paid_by", &"stale")], 6)
        .await;
    assert_eq!(fenced(from_guard), (6, 7));
    assert!(
        from_psql.contains(&psql_refusal(6, 7)),
        "psql was refused with:\n{from_psql}"
    );

    // Current: the guard writes 8, and psql, still at 7, is now the stale one.
    payouts
        .update(&client, &key, &[("paid_by", &"b")], 8)
        .await
        .unwrap();
    let from_psql = psql_refused(
        conninfo,
        &format!("UPDATE {name} SET paid_by = 'stale', fence_token = 7 WHERE account = 42"),
    )
    .await;
    assert!(
        from_psql.contains(&psql_refusal(7, 8)),
        "psql was refused with:\n{from_psql}"
    );
    psql_ok(
        conninfo,
        &format!("UPDATE {name} SET paid_by = 'c', fence_token = 8 WHERE account = 42"),
    )
    .await;
    assert_eq!(stored(&client, &name).await, (8, "c".to_string()));
    assert_eq!(history(&client, &name).await, [7, 8, 8]);
}

#[tokio::test]
async fn the_rust_guard_installs_the_migration_where_it_is_missing() {
    let admin = connect().await;
    let (db, conninfo) = empty_database(&admin).await;
    let client = connect_to(&conninfo).await;
    // A table fenced by hand, as before the migration: the column, no trigger.
    client
        .batch_execute(
            "CREATE TABLE ledger (account BIGINT PRIMARY KEY, paid_by TEXT, fence_token BIGINT NOT NULL DEFAULT 0);
             INSERT INTO ledger (account) SELECT generate_series(1, 8);",
        )
        .await
        .unwrap();
    // Eight first writes at once, each from its own guard and connection, install it once.
    let writes = (1..=8_i64).map(|account| {
        let conninfo = conninfo.clone();
        async move {
            let client = connect_to(&conninfo).await;
            FencedTable::new("ledger", &["account"])
                .update(&client, &[&account], &[("paid_by", &"a")], 7)
                .await
        }
    });
    for write in futures::future::join_all(writes).await {
        write.expect("the first write installs the migration");
    }
    let ledger = FencedTable::new("ledger", &["account"]);
    let stale = ledger
        .update(&client, &[&1_i64], &[("paid_by", &"stale")], 6)
        .await;
    assert_eq!(fenced(stale), (6, 7));
    let installed: bool = client
        .query_one(
            "SELECT to_regprocedure('fenced_lease.enable(regclass)') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(installed);
    drop(client);
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap();
}
