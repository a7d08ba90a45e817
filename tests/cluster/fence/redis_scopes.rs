//! A scope's keys fenced by one mark in Redis: the stale holder's write to another key of the
//! account refused, batches, bad input, and what an ACL can and cannot keep a client to.

use fenced_lease::fence::Error;
use fenced_lease::fence::redis::Scope;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use super::{connect, connect_to, datastores, redis_cli};

fn scope() -> Scope {
    Scope::new(&format!("acct-{:08x}", rand::random::<u32>())).unwrap()
}

fn refused<T: std::fmt::Debug>(
    result: Result<T, Error>,
    scope: &Scope,
    presented: i64,
    highest: i64,
) {
    match result {
        Err(Error::Fenced {
            scope: Some(fence),
            presented: p,
            highest: h,
        }) if fence == scope.fence_key() && (p, h) == (presented, highest) => {}
        other => panic!("expected {scope:?} to refuse {presented} below {highest}: {other:?}"),
    }
}

#[tokio::test]
async fn a_stale_write_to_another_key_of_the_scope_is_refused() {
    let mut conn = connect().await;
    let account = scope();
    let (payouts, receipt) = (account.key("payouts"), account.key("receipt"));
    account
        .call(&mut conn, &payouts, 8, &["RPUSH", "paid by B"])
        .await
        .unwrap();
    refused(
        account.set(&mut conn, &receipt, "paid by A", 7).await,
        &account,
        7,
        8,
    );
    refused(
        account
            .call(&mut conn, &payouts, 7, &["RPUSH", "paid by A"])
            .await,
        &account,
        7,
        8,
    );
    // Any client: redis-cli, with the scope's fence key.
    let cli = redis_cli(
        &[
            "FCALL",
            "fenced_set",
            "2",
            &receipt,
            account.fence_key(),
            "7",
            "paid by A",
        ],
        None,
    )
    .await;
    assert_eq!(cli, "FENCED 7 8");
    let written: Vec<String> = conn.lrange(&payouts, 0, -1).await.unwrap();
    assert_eq!(written, ["paid by B"]);
    assert!(!conn.exists::<_, bool>(&receipt).await.unwrap());
    account
        .set(&mut conn, &receipt, "paid by B", 8)
        .await
        .expect("the current holder writes another key of the scope");
}

/// `FCALL_RO fenced_refusals 1 <fence key>`: the scope's count of refusals and the last one's
/// (token, highest, at ms).
async fn refusals(conn: &mut MultiplexedConnection, scope: &Scope) -> (i64, Vec<String>) {
    let reply: Vec<redis::Value> = redis::cmd("FCALL_RO")
        .arg("fenced_refusals")
        .arg(1)
        .arg(scope.fence_key())
        .query_async(conn)
        .await
        .expect("fenced_refusals");
    let count = redis::from_redis_value_ref(&reply[0]).expect("count");
    let last = reply[1..]
        .iter()
        .map(|v| redis::from_redis_value_ref(v).expect("a string"))
        .collect();
    (count, last)
}

#[tokio::test]
async fn refused_calls_are_counted_per_scope_in_the_server() {
    let mut conn = connect().await;
    let (account, other) = (scope(), scope());
    assert_eq!(refusals(&mut conn, &account).await, (0, vec![]));
    let receipt = account.key("receipt");
    account.set(&mut conn, &receipt, "B", 8).await.unwrap();
    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for stale in [7, 5] {
        refused(
            account.set(&mut conn, &receipt, "A", stale).await,
            &account,
            stale,
            8,
        );
    }
    let (count, last) = refusals(&mut conn, &account).await;
    assert_eq!((count, &last[..2]), (2, &["5".to_string(), "8".into()][..]));
    let at: u128 = last[2].parse().expect("at: Unix ms");
    assert!(
        at + 1_000 >= before_ms,
        "at {at} is before the refusals ({before_ms})"
    );
    assert_eq!(
        refusals(&mut conn, &other).await.0,
        0,
        "another scope's count"
    );
    let stored: Option<String> = conn.get(&receipt).await.unwrap();
    assert_eq!(stored.as_deref(), Some("B"));
}

#[tokio::test]
async fn a_batch_runs_after_one_check_and_a_refused_or_malformed_one_writes_nothing() {
    let mut conn = connect().await;
    let account = scope();
    let (payouts, receipt) = (account.key("payouts"), account.key("receipt"));
    let replies = account
        .batch(
            &mut conn,
            8,
            &[
                &["RPUSH", &payouts, "b"],
                &["SET", &receipt, "paid"],
                &["LLEN", &payouts],
            ],
        )
        .await
        .unwrap();
    assert_eq!(replies.len(), 3);
    refused(
        account
            .batch(
                &mut conn,
                7,
                &[&["RPUSH", &payouts, "a"], &["DEL", &receipt]],
            )
            .await,
        &account,
        7,
        8,
    );
    let elsewhere = scope().key("x");
    let outside = account
        .batch(
            &mut conn,
            9,
            &[&["RPUSH", &payouts, "a"], &["SET", &elsewhere, "x"]],
        )
        .await;
    assert!(matches!(outside, Err(Error::InvalidName(_))), "{outside:?}");
    malformed_batches_get_their_own_error_code(&account, &payouts, &receipt).await;
    let written: Vec<String> = conn.lrange(&payouts, 0, -1).await.unwrap();
    assert_eq!(written, ["b"]);
    let mark: String = conn.get(account.fence_key()).await.unwrap();
    assert_eq!(mark, "8");
}

/// Malformed batches of `account` sent as any client would: each gets its own error code
/// (and, the caller checks, writes nothing).
async fn malformed_batches_get_their_own_error_code(account: &Scope, payouts: &str, receipt: &str) {
    for (args, code) in [
        (
            vec![
                "3",
                account.fence_key(),
                payouts,
                receipt,
                "9",
                "3",
                "RPUSH",
                payouts,
                "x",
                "5",
                "SET",
            ],
            "BADCALL",
        ),
        (
            vec![
                "2",
                account.fence_key(),
                payouts,
                "9",
                "3",
                "RPUSH",
                receipt,
                "x",
            ],
            "BADCALL",
        ),
        (
            vec![
                "2",
                account.fence_key(),
                payouts,
                "x9",
                "3",
                "RPUSH",
                payouts,
                "x",
            ],
            "BADTOKEN",
        ),
        (
            vec![
                "2",
                "{other}:fence",
                payouts,
                "9",
                "3",
                "RPUSH",
                payouts,
                "x",
            ],
            "BADFENCEKEY",
        ),
    ] {
        let mut all = vec!["FCALL", "fenced_batch"];
        all.extend(args);
        let reply = redis_cli(&all, None).await;
        assert!(reply.starts_with(code), "{all:?}: {reply}");
    }
}

/// A connection as Redis user `user`, its ACL (re)set to `acl` first.
async fn connect_as(user: &str, acl: &[&str]) -> MultiplexedConnection {
    let mut admin = connect_to(&datastores().redis).await;
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">pw")
        .arg(acl);
    cmd.query_async::<()>(&mut admin).await.unwrap();
    let url = datastores()
        .redis
        .replacen("redis://", &format!("redis://{user}:pw@"), 1);
    connect_to(&url).await
}

/// fence/README.md's ACL: FCALL, the reads, the commands the writes run; nothing that
/// erases, expires, renames or replaces a key or the library. The first 9 leave out the
/// commands that count refusals.
const HOLDER_ACL: [&str; 12] = [
    "~*",
    "-@all",
    "+fcall",
    "+fcall_ro",
    "+get",
    "+lrange",
    "+exists",
    "+rpush",
    "+set",
    "+hincrby",
    "+hset",
    "+time",
];

/// Under [`HOLDER_ACL`], `user` writes `payouts` through the function; its refusal is
/// counted, and without the commands that count it, it is still the refusal.
async fn under_the_holder_acl_refusals_are_counted(
    admin: &mut MultiplexedConnection,
    user: &str,
    account: &Scope,
    payouts: &str,
) {
    let mut holder = connect_as(user, &HOLDER_ACL).await;
    account
        .call(&mut holder, payouts, 8, &["RPUSH", "by B"])
        .await
        .expect("the holder writes through the function");
    let stale = account
        .call(&mut holder, payouts, 7, &["RPUSH", "by A"])
        .await;
    refused(stale, account, 7, 8);
    assert_eq!(refusals(admin, account).await.0, 1, "counted under the ACL");
    let mut uncounting = connect_as(user, &HOLDER_ACL[..9]).await;
    let stale = account
        .call(&mut uncounting, payouts, 6, &["RPUSH", "by A"])
        .await;
    refused(stale, account, 6, 8);
    assert_eq!(refusals(admin, account).await.0, 1);
}

/// Redis cannot keep a client to the functions: since Redis 7 the commands a function runs
/// are checked against its caller's ACL, so an ACL that refuses plain writes refuses the
/// function's too. What an ACL does: keep holders from the commands that would erase or
/// replace a mark or the library, and to their scopes' keys.
#[tokio::test]
async fn an_acl_cannot_keep_a_holder_to_fcall_but_keeps_it_from_erasing_marks() {
    let mut admin = connect().await;
    let account = scope();
    let user = format!("holder-{:08x}", rand::random::<u32>());
    let payouts = account.key("payouts");
    // FCALL alone: plain writes refused, and so are the function's.
    let mut fcall_only = connect_as(&user, &["~*", "-@all", "+fcall", "+fcall_ro"]).await;
    let plain: Result<(), _> = fcall_only.set(&payouts, "x").await;
    assert_eq!(plain.unwrap_err().code(), Some("NOPERM"));
    let fenced = account
        .call(&mut fcall_only, &payouts, 8, &["RPUSH", "x"])
        .await;
    assert!(
        matches!(&fenced, Err(Error::Redis(e)) if e.to_string().contains("can't run this command")),
        "the function runs its commands as the caller: {fenced:?}"
    );
    under_the_holder_acl_refusals_are_counted(&mut admin, &user, &account, &payouts).await;
    let mut holder = connect_as(&user, &HOLDER_ACL).await;
    for command in [
        vec!["DEL", account.fence_key()],
        vec!["EXPIRE", account.fence_key(), "1"],
        vec!["RENAME", account.fence_key(), "x"],
        vec!["FUNCTION", "DELETE", "fenced_lease"],
        vec!["FLUSHALL"],
        vec!["EVAL", "return 1", "0"],
    ] {
        let e = redis::cmd(command[0])
            .arg(&command[1..])
            .query_async::<redis::Value>(&mut holder)
            .await
            .expect_err("refused by the ACL");
        assert_eq!(e.code(), Some("NOPERM"), "{command:?}: {e}");
    }
    // What it cannot stop: a plain write of a data key, or of the fence key, by SET.
    let _: () = holder
        .rpush(&payouts, "plain")
        .await
        .expect("Redis cannot refuse it");
    let _: () = holder
        .set(account.fence_key(), "0")
        .await
        .expect("nor this");
    let _: () = admin.del(&payouts).await.unwrap();
}
