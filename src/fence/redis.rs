//! Redis (and Valkey) keys fenced by the server itself (feature `redis`).
//!
//! The highest token accepted for a key lives beside it, in [`fence_key`]: a key with the same
//! hash tag, so both are in one Redis Cluster slot. One Lua script — which the server runs
//! atomically — compares the write's token with it, records the token and runs the write; a
//! lower token is refused without touching the key ([`Error::Fenced`]).
//!
//! ```no_run
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection, token: i64) -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::redis::{call, set};
//! set(conn, "payout:42", "paid by worker-a", token).await?;
//! call(conn, "payouts:{42}", token, &["RPUSH", "worker-a"]).await?; // any command on one key
//! # Ok(()) }
//! ```

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::{Error, check_token};

/// KEYS[1] fence key, KEYS[2] data key; ARGV[1] token, ARGV[2] command, ARGV[3..] its
/// arguments after the key. The command runs before the token is recorded, so a command
/// that fails (a wrong type, say) records nothing. Tokens are compared as decimal strings (length, then digits),
/// which is exact for every i64 where Lua's numbers (doubles) are not.
const FENCED_CALL: &str = r"
local highest = redis.call('GET', KEYS[1])
local token = ARGV[1]
if highest and (#token < #highest or (#token == #highest and token < highest)) then
  return {0, highest}
end
local reply = redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
redis.call('SET', KEYS[1], token)
return {1, reply}
";

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
/// on `key`, if `token` is not lower than the highest token accepted for `key`; records
/// `token`. Returns the command's reply.
pub async fn call<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: i64,
    command: &[&str],
) -> Result<Value, Error> {
    check_token(token)?;
    let fence = fence_key(key)?;
    let Some((name, args)) = command.split_first() else {
        return Err(Error::InvalidName("an empty Redis command".into()));
    };
    let script = Script::new(FENCED_CALL);
    let mut invocation = script.key(&fence);
    invocation.key(key).arg(token).arg(*name);
    for arg in args {
        invocation.arg(*arg);
    }
    let reply: (i64, Value) = invocation.invoke_async(conn).await?;
    match reply {
        (1, value) => Ok(value),
        (_, Value::BulkString(highest)) => {
            match std::str::from_utf8(&highest)
                .ok()
                .and_then(|h| h.parse().ok())
            {
                Some(highest) => Err(Error::Fenced {
                    presented: token,
                    highest,
                }),
                None => Err(Error::InvalidName(format!(
                    "{fence} holds {:?}, not a token",
                    String::from_utf8_lossy(&highest)
                ))),
            }
        }
        (_, other) => Err(Error::InvalidName(format!(
            "unexpected reply of the fencing script: {other:?}"
        ))),
    }
}

/// `SET key value`, fenced by `token`.
pub async fn set<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    value: &str,
    token: i64,
) -> Result<(), Error> {
    call(conn, key, token, &["SET", value]).await.map(drop)
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
    fn keys_without_a_usable_tag_are_refused() {
        assert!(fence_key("a{}b").is_err());
        assert!(fence_key("a}b").is_err());
        assert!(fence_key("x{}y{z}").is_err()); // Redis reads only the first `{`
    }
}
