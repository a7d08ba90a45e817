//! Redis (and Valkey) keys fenced by the server itself (feature `redis`).
//!
//! The check is a Redis Function library shipped in this repository, [`LIBRARY`]
//! (`fence/redis/fenced_lease.lua`, Redis 7+), so that any client can call it with `FCALL`:
//! `fenced_call` runs one command on one key and `fenced_set` a SET, each only if the token
//! is not lower than the highest accepted for the key. That token lives beside the key, in
//! [`fence_key`]: a key with the same hash tag, so both are in one Redis Cluster slot. The
//! server runs a function atomically; a lower token is refused without touching the key,
//! with the error reply `FENCED <presented> <highest>` ([`Error::Fenced`]). The guards here
//! load the library when the server lacks it.
//!
//! ```no_run
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection, token: i64) -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::redis::{call, set};
//! set(conn, "payout:42", "paid by worker-a", token).await?;
//! call(conn, "payouts:{42}", token, &["RPUSH", "worker-a"]).await?; // any command on one key
//! # Ok(()) }
//! ```

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Value};

use super::{Error, check_token};

/// The Redis Function library `fenced_lease`: `fence/redis/fenced_lease.lua`. Load it with
/// [`load`] or `redis-cli -x FUNCTION LOAD REPLACE < fence/redis/fenced_lease.lua`.
pub const LIBRARY: &str = include_str!("../../fence/redis/fenced_lease.lua");

/// The error code of a refused token: the reply reads `FENCED <presented> <highest>`.
pub const FENCED_CODE: &str = "FENCED";

/// Loads (or replaces) [`LIBRARY`] on the server.
pub async fn load<C: ConnectionLike>(conn: &mut C) -> Result<(), Error> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(LIBRARY)
        .query_async::<String>(conn)
        .await?;
    Ok(())
}

/// A refusal by the library (`FENCED <presented> <highest>`) is [`Error::Fenced`]; anything
/// else is [`Error::Redis`].
impl From<RedisError> for Error {
    fn from(error: RedisError) -> Self {
        let refused = (error.code() == Some(FENCED_CODE))
            .then(|| error.detail())
            .flatten()
            .and_then(|detail| {
                let (presented, highest) = detail.split_once(' ')?;
                Some((presented.parse().ok()?, highest.parse().ok()?))
            });
        match refused {
            Some((presented, highest)) => Error::Fenced { presented, highest },
            None => Error::Redis(error),
        }
    }
}

/// Is this the reply to an `FCALL` of a function the server does not have?
fn function_missing(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// Runs `FCALL`, loading the library first if the server does not have it.
async fn fcall<C: ConnectionLike>(conn: &mut C, fcall: &Cmd) -> Result<Value, Error> {
    match fcall.query_async(conn).await {
        Err(e) if function_missing(&e) => {
            load(conn).await?;
            Ok(fcall.query_async(conn).await?)
        }
        reply => Ok(reply?),
    }
}

/// `FCALL <function> 2 <key> <fence key> <token> <args...>`
fn fenced(function: &str, key: &str, token: i64, args: &[&str]) -> Result<Cmd, Error> {
    check_token(token)?;
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function)
        .arg(2)
        .arg(key)
        .arg(fence_key(key)?)
        .arg(token)
        .arg(args);
    Ok(cmd)
}

/// The part of `key` Redis Cluster hashes: the first non-empty `{...}`, else the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The key holding the highest token accepted for `key`, in the same cluster slot: `key:fence`
/// when `key` has a hash tag, else `{key}:fence`.
pub fn fence_key(key: &str) -> Result<String, Error> {
    if hash_tag(key) != key {
        return Ok(format!("{key}:fence"));
    }
    if key.contains('}') || key.contains('{') {
        return Err(Error::InvalidName(format!(
            "Redis key {key:?} has braces but no hash tag; give it one, e.g. \"{{name}}:rest\""
        )));
    }
    Ok(format!("{{{key}}}:fence"))
}

/// Runs `command` (a command name and its arguments after the key, e.g. `["HSET", "f", "v"]`)
/// on `key`, if `token` is not lower than the highest token accepted for `key`, and records
/// `token` (`FCALL fenced_call`). Returns the command's reply.
pub async fn call<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: i64,
    command: &[&str],
) -> Result<Value, Error> {
    if command.is_empty() {
        return Err(Error::InvalidName("an empty Redis command".into()));
    }
    fcall(conn, &fenced("fenced_call", key, token, command)?).await
}

/// `SET key value`, fenced by `token` (`FCALL fenced_set`).
pub async fn set<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    value: &str,
    token: i64,
) -> Result<(), Error> {
    fcall(conn, &fenced("fenced_set", key, token, &[value])?)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_key_shares_the_hash_tag() {
        for key in ["payout:42", "{user1}:balance", "a{b}c", "{x}{}"] {
            let fence = fence_key(key).unwrap();
            assert_eq!(hash_tag(&fence), hash_tag(key), "{key} -> {fence}");
        }
        assert_eq!(fence_key("payout:42").unwrap(), "{payout:42}:fence");
        assert_eq!(
            fence_key("{user1}:balance").unwrap(),
            "{user1}:balance:fence"
        );
    }

    #[test]
    fn the_fenced_reply_is_a_fenced_error() {
        let reply = |detail: &str| {
            Error::from(redis::make_extension_error(
                FENCED_CODE.into(),
                Some(detail.into()),
            ))
        };
        assert!(matches!(
            reply("6 7"),
            Error::Fenced {
                presented: 6,
                highest: 7
            }
        ));
        assert!(matches!(reply("6"), Error::Redis(_)));
        let other = redis::make_extension_error("WRONGTYPE".into(), Some("6 7".into()));
        assert!(matches!(Error::from(other), Error::Redis(_)));
    }

    #[test]
    fn keys_without_a_usable_tag_are_refused() {
        assert!(fence_key("a{}b").is_err());
        assert!(fence_key("a}b").is_err());
        assert!(fence_key("x{}y{z}").is_err()); // Redis reads only the first `{`
    }
}
