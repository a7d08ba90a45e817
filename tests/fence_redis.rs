//! Redis keys fenced by the server (feature `redis`), against a real redis-server started by
//! hack/datastores.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::fence::datastores;
use fenced_lease::fence::Error;
use fenced_lease::fence::redis::{call, fence_key, set};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

async fn connect() -> MultiplexedConnection {
    redis::Client::open(datastores().redis.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
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
                highest: 7
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
    let big = 9_007_199_254_740_993; // 2^53 + 1: a double would round it to 2^53
    set(&mut conn, &payout, "d", big).await.unwrap();
    let just_below = set(&mut conn, &payout, "stale", big - 1).await;
    assert!(
        matches!(just_below, Err(Error::Fenced { .. })),
        "{just_below:?}"
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
