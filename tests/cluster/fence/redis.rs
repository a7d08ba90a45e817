//! Redis keys fenced by the server (feature `redis`), against a real redis-server started by
//! hack/datastores: through the Rust guard, and through redis-cli, the client of any
//! language, calling the Redis Function library of fence/redis/.

use crate::common;
#[path = "redis_scopes.rs"]
mod scopes;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::fence::datastores;
use common::repo_root;
use fenced_lease::fence::Error;
use fenced_lease::fence::redis::{FENCED_CODE, call, fence_key, load, set};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

async fn connect_to(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

async fn connect() -> MultiplexedConnection {
    let mut conn = connect_to(&datastores().redis).await;
    // The library as it is in the repository now, not as an earlier run left it.
    load(&mut conn).await.unwrap();
    conn
}

fn key(what: &str) -> String {
    format!("{what}:{:08x}", rand::random::<u32>())
}

#[tokio::test]
async fn stale_token_is_refused_and_equal_token_accepted() {
    let mut conn = connect().await;
    let payout = key("payout");
    set(&mut conn, &payout, "a", 5).await.unwrap();
    set(&mut conn, &payout, "a again", 5)
        .await
        .expect("an equal token is accepted");
    set(&mut conn, &payout, "b", 7).await.unwrap();
    let stale = set(&mut conn, &payout, "a, stale", 6).await;
    assert!(
        matches!(
            stale,
            Err(Error::Fenced {
                presented: 6,
                highest: 7,
                ..
            })
        ),
        "{stale:?}"
    );
    let value: String = conn.get(&payout).await.unwrap();
    assert_eq!(value, "b");
    let token: String = conn.get(fence_key(&payout).unwrap()).await.unwrap();
    assert_eq!(token, "7");

    // Tokens compare as integers, not as text ("10" > "9") and exactly past 2^53.
    set(&mut conn, &payout, "c", 10).await.unwrap();
    assert!(set(&mut conn, &payout, "stale", 9).await.is_err());
    let top = fenced_lease::api::MAX_TOKEN; // 2^53 - 1, the largest token a lease issues
    set(&mut conn, &payout, "d", top).await.unwrap();
    let just_below = set(&mut conn, &payout, "stale", top - 1).await;
    assert!(
        matches!(just_below, Err(Error::Fenced { .. })),
        "{just_below:?}"
    );
    let beyond = set(&mut conn, &payout, "e", top + 1).await;
    assert!(
        matches!(beyond, Err(Error::InvalidToken(_))),
        "a token no lease issues is refused before any write: {beyond:?}"
    );
    // The library itself compares exactly past 2^53 (as text, not as doubles), for clients
    // that send larger tokens: 2^53 + 1 and 2^53 + 2, which one double cannot tell apart.
    let other = key("beyond");
    let fcall = |token: &str| {
        redis::cmd("FCALL")
            .arg("fenced_set")
            .arg(2)
            .arg(&other)
            .arg(fence_key(&other).unwrap())
            .arg(token)
            .arg("v")
            .clone()
    };
    let _: () = fcall("9007199254740994")
        .query_async(&mut conn)
        .await
        .unwrap();
    let lower: Result<(), _> = fcall("9007199254740993").query_async(&mut conn).await;
    assert!(
        lower
            .as_ref()
            .is_err_and(|e| e.to_string().contains("FENCED")),
        "{lower:?}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_before_any_write() {
    let mut conn = connect().await;
    let payout = key("payout");
    let negative = set(&mut conn, &payout, "x", -1).await;
    assert!(
        matches!(negative, Err(Error::InvalidToken(-1))),
        "{negative:?}"
    );
    let exists: bool = conn.exists(&payout).await.unwrap();
    assert!(!exists);
    let untaggable = set(&mut conn, "a{}b", "x", 1).await;
    assert!(
        matches!(&untaggable, Err(Error::InvalidName(m)) if m.contains("hash tag")),
        "{untaggable:?}"
    );
    // A command that fails records no token.
    let list = key("{list}");
    call(&mut conn, &list, 3, &["RPUSH", "x"]).await.unwrap();
    assert!(call(&mut conn, &list, 9, &["INCR"]).await.is_err());
    call(&mut conn, &list, 4, &["RPUSH", "y"])
        .await
        .expect("the failed command did not raise the token to 9");
}

#[tokio::test]
async fn concurrent_writers_never_leave_a_lower_token_after_a_higher_one() {
    // Each accepted write appends its token to a list, in the order Redis ran the scripts.
    let history = key("{history}");
    let refused = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (history, refused) = (history.clone(), refused.clone());
            tokio::spawn(async move {
                let mut conn = connect().await;
                for _ in 0..10 {
                    let token: i64 = rand::random_range(0..1000);
                    let value = token.to_string();
                    match call(&mut conn, &history, token, &["RPUSH", &value]).await {
                        Ok(_) => {}
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
    let mut conn = connect().await;
    let accepted: Vec<i64> = conn.lrange(&history, 0, -1).await.unwrap();
    assert!(
        accepted.windows(2).all(|w| w[0] <= w[1]),
        "a lower token was accepted after a higher one: {accepted:?}"
    );
    let refused = refused.load(Ordering::Relaxed);
    assert!(refused > 0, "no write was refused, so nothing was tested");
    assert_eq!(accepted.len() + refused, 100);
}

/// Runs redis-cli against the test server; returns what it printed (redis-cli exits 0 on an
/// error reply, and prints it as the reply).
async fn redis_cli(args: &[&str], stdin: Option<&str>) -> String {
    let file = stdin.map(|path| std::fs::File::open(repo_root().join(path)).unwrap());
    let out = tokio::process::Command::new("redis-cli")
        .args(["-u", &datastores().redis])
        .args(args)
        .stdin(file.map_or_else(std::process::Stdio::null, Into::into))
        .output()
        .await
        .expect("run redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `FCALL <function> 2 <key> <fence key> <args...>` with redis-cli.
async fn fcall_cli(function: &str, key: &str, args: &[&str]) -> String {
    let fence = fence_key(key).unwrap();
    let mut all = vec!["FCALL", function, "2", key, &fence];
    all.extend_from_slice(args);
    redis_cli(&all, None).await
}

/// The Rust guard, and a plain FCALL from this client, refuse token 6 of `payout` (at 7) as
/// redis-cli's FCALL did.
async fn the_rust_guard_and_a_plain_fcall_refuse_alike(
    conn: &mut MultiplexedConnection,
    payout: &str,
) {
    let guard = set(conn, payout, "stale", 6).await;
    assert!(
        matches!(
            guard,
            Err(Error::Fenced {
                presented: 6,
                highest: 7,
                ..
            })
        ),
        "{guard:?}"
    );
    let raw = redis::cmd("FCALL")
        .arg(&[
            "fenced_set",
            "2",
            payout,
            &fence_key(payout).unwrap(),
            "6",
            "x",
        ])
        .query_async::<redis::Value>(conn)
        .await
        .expect_err("a plain FCALL with a stale token");
    assert_eq!(
        format!("{} {}", raw.code().unwrap(), raw.detail().unwrap()),
        format!("{FENCED_CODE} 6 7")
    );
}

/// The guard writes 8; redis-cli, still at 7, is now the stale one. A fence key of the
/// caller's own invention is refused: every client shares one.
async fn after_the_guard_redis_cli_is_the_stale_one(conn: &mut MultiplexedConnection) {
    let list = key("{payouts}");
    call(conn, &list, 8, &["RPUSH", "by the guard"])
        .await
        .unwrap();
    assert_eq!(
        fcall_cli("fenced_call", &list, &["7", "RPUSH", "stale"]).await,
        "FENCED 7 8"
    );
    assert_eq!(
        fcall_cli("fenced_call", &list, &["8", "RPUSH", "by redis-cli"]).await,
        "2"
    );
    let wrong = redis_cli(
        &["FCALL", "fenced_call", "2", &list, "elsewhere", "9", "DEL"],
        None,
    )
    .await;
    assert!(
        wrong.starts_with("BADFENCEKEY elsewhere is not a fence key of"),
        "{wrong}"
    );
    let written: Vec<String> = conn.lrange(&list, 0, -1).await.unwrap();
    assert_eq!(written, ["by the guard", "by redis-cli"]);
}

#[tokio::test]
async fn redis_cli_loads_the_library_and_gets_the_same_refusal_as_the_rust_guard() {
    let loaded = redis_cli(
        &["-x", "FUNCTION", "LOAD", "REPLACE"],
        Some("fence/redis/fenced_lease.lua"),
    )
    .await;
    assert_eq!(loaded, "fenced_lease");
    let mut conn = connect_to(&datastores().redis).await;
    let payout = key("payout");
    assert_eq!(fcall_cli("fenced_set", &payout, &["5", "a"]).await, "OK");
    assert_eq!(
        fcall_cli("fenced_set", &payout, &["5", "a again"]).await,
        "OK"
    );
    assert_eq!(fcall_cli("fenced_set", &payout, &["7", "b"]).await, "OK");
    assert_eq!(
        fcall_cli("fenced_set", &payout, &["6", "stale"]).await,
        "FENCED 6 7"
    );
    let malformed = fcall_cli("fenced_set", &payout, &["06", "stale"]).await;
    assert!(
        malformed.starts_with("BADTOKEN invalid fencing token 06"),
        "{malformed}"
    );
    assert_eq!(
        fcall_cli("fenced_call", &payout, &["6", "DEL"]).await,
        "FENCED 6 7"
    );
    let value: String = conn.get(&payout).await.unwrap();
    assert_eq!(value, "b");
    the_rust_guard_and_a_plain_fcall_refuse_alike(&mut conn, &payout).await;
    after_the_guard_redis_cli_is_the_stale_one(&mut conn).await;
}

#[tokio::test]
async fn the_rust_guard_loads_the_library_where_it_is_missing() {
    // A server of this test's own: functions are server-wide.
    let dir = std::env::temp_dir().join(format!("fence-redis-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let mut server = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--save",
            "",
            "--appendonly",
            "no",
            "--unixsocket",
        ])
        .arg(&socket)
        .arg("--dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start redis-server");
    let url = format!("unix://{}", socket.display());
    let mut conn = None;
    for _ in 0..100 {
        if let Ok(client) = redis::Client::open(url.as_str())
            && let Ok(c) = client.get_multiplexed_async_connection().await
        {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut conn = conn.expect("the test's redis-server answers");
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(libraries, redis::Value::Array(vec![]));

    set(&mut conn, "payout:42", "b", 7)
        .await
        .expect("the first write loads the library");
    let stale = set(&mut conn, "payout:42", "stale", 6).await;
    assert!(
        matches!(
            stale,
            Err(Error::Fenced {
                presented: 6,
                highest: 7,
                ..
            })
        ),
        "{stale:?}"
    );
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    call(&mut conn, "payout:42", 8, &["APPEND", "c"])
        .await
        .expect("the write loads the library again");
    let value: String = conn.get("payout:42").await.unwrap();
    assert_eq!(value, "bc");
    server.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
