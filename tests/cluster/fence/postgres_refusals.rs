//! Refusals recorded by PostgreSQL (migration 002, `fenced_lease.refusals`): a refused write's
//! transaction is rolled back, and the record of its refusal is not.

use fenced_lease::fence::Error;
use fenced_lease::fence::postgres::{Scope, begin, install};
use tokio_postgres::Client;

use super::{connect, connect_to};

/// A database of its own (the refusals are counted per database, and the other tests of
/// this binary refuse writes too), with the migrations and a ledger bound to `scope`.
async fn own_database(scope: &Scope) -> (Client, String) {
    let admin = connect().await;
    let db = format!("refusals_{:08x}", rand::random::<u32>());
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let conninfo = format!("{} dbname={db}", super::datastores().postgres);
    let client = connect_to(&conninfo).await;
    install(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, amount BIGINT NOT NULL)")
        .await
        .unwrap();
    scope.enable(&client, "ledger").await.unwrap();
    (client, db)
}

/// `fenced_lease.refusals`: (refused, last_scope, last_token, last_highest, last_at is set).
async fn refusals(client: &Client) -> (i64, Option<String>, Option<i64>, Option<i64>, bool) {
    let row = client
        .query_one(
            "SELECT refused, last_scope, last_token, last_highest, last_at IS NOT NULL FROM fenced_lease.refusals",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

async fn pay(client: &mut Client, token: i64) -> Result<(), Error> {
    let tx = begin(client, token).await?;
    tx.batch_execute("INSERT INTO ledger (amount) VALUES (100)")
        .await?;
    tx.commit().await
}

#[tokio::test]
async fn a_refused_write_is_recorded_where_its_rollback_cannot_erase_it() {
    let scope = Scope::new("account-42").unwrap();
    let (mut client, db) = own_database(&scope).await;
    assert_eq!(refusals(&client).await, (0, None, None, None, false));
    pay(&mut client, 8).await.expect("the holder pays");
    for stale in [7, 5] {
        let refused = pay(&mut client, stale).await;
        assert!(
            matches!(refused, Err(Error::Fenced { presented, highest: 8, .. }) if presented == stale),
            "{refused:?}"
        );
    }
    let paid: i64 = client
        .query_one("SELECT count(*) FROM ledger", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(paid, 1, "a refused payout was written");
    assert_eq!(
        refusals(&client).await,
        (2, Some("account-42".into()), Some(5), Some(8), true),
        "the two refusals, the last one's scope and tokens"
    );
    // Read by a role that may only write the ledger, as the holders' is.
    let role = format!("holder_{db}");
    client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT USAGE ON SCHEMA fenced_lease TO {role}; SET ROLE {role}"
        ))
        .await
        .unwrap();
    assert_eq!(
        refusals(&client).await.0,
        2,
        "the holders' role reads the count"
    );
    let forged = client
        .batch_execute("SELECT fenced_lease.fenced_out('account-42', 1, 2)")
        .await;
    assert!(forged.is_err(), "a client recorded a refusal of its own");
    client.batch_execute("RESET ROLE").await.unwrap();
    assert_eq!(refusals(&client).await.0, 2);
    drop(client);
    let admin = connect().await;
    for cleanup in [
        format!("DROP DATABASE {db} WITH (FORCE)"),
        format!("DROP ROLE {role}"),
    ] {
        let _ = admin.batch_execute(&cleanup).await;
    }
}
