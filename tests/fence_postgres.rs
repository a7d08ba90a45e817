//! PostgreSQL rows and transactions fenced by the database (feature `postgres`), against a
//! real PostgreSQL started by hack/datastores.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::fence::datastores;
use fenced_lease::fence::Error;
use fenced_lease::fence::postgres::FencedTable;
use tokio_postgres::{Client, NoTls};

async fn connect() -> Client {
    let (client, connection) = tokio_postgres::connect(&datastores().postgres, NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A fresh table `payouts_<random>` (account BIGINT PRIMARY KEY, paid_by TEXT) with the fence
/// column, and a history table a trigger appends every token written to the row to, in the
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
        Err(Error::Fenced { presented, highest }) => (presented, highest),
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
        "invalid fencing token -1: tokens are non-negative integers"
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
                        Err(Error::Fenced { presented, highest }) => {
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
