//! Redis (and Valkey) keys fenced by the server itself (feature `redis`).
//!
//! The check is a Redis Function library shipped in this repository, [`LIBRARY`]
//! (`fence/redis/fenced_lease.lua`, Redis 7+), so that any client can call it with `FCALL`:
//! `fenced_call` runs one command on one key, `fenced_set` a SET, `fenced_batch` several
//! commands after one check, each only if the token is not lower than the mark in the fence
//! key. A [`Scope`]'s keys share one fence key, `{<scope>}:fence`: every key of the scope
//! carries the hash tag `{<scope>}` ([`Scope::key`]), so the scope lives in one Redis Cluster
//! slot. The server runs a function atomically; a lower token is refused without touching a
//! key, with the error reply `FENCED <presented> <highest>` ([`Error::Fenced`], naming the
//! fence key). The guards here load the library when the server lacks it.
//!
//! ```no_run
//! # async fn demo(conn: &mut redis::aio::MultiplexedConnection, token: i64) -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::redis::Scope;
//! let account = Scope::new("42")?; // fence key {42}:fence
//! account.call(conn, &account.key("payouts"), token, &["RPUSH", "worker-a"]).await?;
//! account.set(conn, &account.key("receipt"), "paid", token).await?; // the same mark
//! let (payouts, receipt) = (account.key("payouts"), account.key("receipt"));
//! account.batch(conn, token, &[&["RPUSH", &payouts, "b"], &["SET", &receipt, "paid"]]).await?;
//! # Ok(()) }
//! ```
//!
//! [`call`] and [`set`] fence a key by a mark of its own ([`fence_key`]), the compatible form.

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Value};

use super::{Error, check_token};

/// The Redis Function library `fenced_lease`: `fence/redis/fenced_lease.lua`. Load it with
/// [`load`] or `redis-cli -x FUNCTION LOAD REPLACE < fence/redis/fenced_lease.lua`.
pub const LIBRARY: &str = include_str!("../../../../fence/redis/fenced_lease.lua");

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
            Some((presented, highest)) => Error::Fenced {
                scope: None,
                presented,
                highest,
            },
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

/// Runs `FCALL`, loading the library first if the server does not have it; a refusal names
/// the fence key.
async fn fcall<C: ConnectionLike>(conn: &mut C, fcall: &Cmd, fence: &str) -> Result<Value, Error> {
    let reply = match fcall.query_async(conn).await {
        Err(e) if function_missing(&e) => {
            load(conn).await?;
            fcall.query_async(conn).await
        }
        reply => reply,
    };
    reply.map_err(|e| match Error::from(e) {
        Error::Fenced {
            presented, highest, ..
        } => Error::Fenced {
            scope: Some(fence.to_string()),
            presented,
            highest,
        },
        other => other,
    })
}

/// `FCALL <function> 2 <key> <fence key> <token> <args...>`
fn fenced(function: &str, key: &str, fence: &str, token: i64, args: &[&str]) -> Result<Cmd, Error> {
    check_token(token)?;
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function)
        .arg(2)
        .arg(key)
        .arg(fence)
        .arg(token)
        .arg(args);
    Ok(cmd)
}

/// The keys of one scope, fenced by one mark in `{<scope>}:fence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    name: String,
    fence: String,
}

impl Scope {
    /// The scope `name` (the hash tag its keys carry); [`Error::InvalidName`] if it is empty
    /// or holds a brace.
    pub fn new(name: &str) -> Result<Self, Error> {
        if name.is_empty() || name.contains(['{', '}']) {
            return Err(Error::InvalidName(format!(
                "invalid Redis scope {name:?}: a scope is a non-empty hash tag without braces"
            )));
        }
        Ok(Scope {
            name: name.to_string(),
            fence: format!("{{{name}}}:fence"),
        })
    }

    /// The fence key holding the scope's mark: `{<scope>}:fence`.
    pub fn fence_key(&self) -> &str {
        &self.fence
    }

    /// A key of the scope: `<prefix>:{<scope>}`.
    pub fn key(&self, prefix: &str) -> String {
        format!("{prefix}:{{{}}}", self.name)
    }

    /// Refuses a key outside the scope (another hash tag) before any I/O.
    fn check_key(&self, key: &str) -> Result<(), Error> {
        if hash_tag(key) != self.name {
            return Err(Error::InvalidName(format!(
                "Redis key {key:?} is not in scope {:?}: its keys carry the hash tag {{{}}}",
                self.name, self.name
            )));
        }
        Ok(())
    }

    /// Runs `command` (a command name and its arguments after the key) on `key`, a key of
    /// this scope, if `token` is not lower than the scope's mark, and raises the mark
    /// (`FCALL fenced_call`). Returns the command's reply.
    pub async fn call<C: ConnectionLike>(
        &self,
        conn: &mut C,
        key: &str,
        token: i64,
        command: &[&str],
    ) -> Result<Value, Error> {
        self.check_key(key)?;
        if command.is_empty() {
            return Err(Error::InvalidName("an empty Redis command".into()));
        }
        let cmd = fenced("fenced_call", key, &self.fence, token, command)?;
        fcall(conn, &cmd, &self.fence).await
    }

    /// `SET key value` on a key of this scope, fenced by `token` (`FCALL fenced_set`).
    pub async fn set<C: ConnectionLike>(
        &self,
        conn: &mut C,
        key: &str,
        value: &str,
        token: i64,
    ) -> Result<(), Error> {
        self.check_key(key)?;
        let cmd = fenced("fenced_set", key, &self.fence, token, &[value])?;
        fcall(conn, &cmd, &self.fence).await.map(drop)
    }

    /// Runs `commands` in order after one check of `token` (`FCALL fenced_batch`): each a
    /// command name, a key of this scope, then its arguments. Returns their replies. A
    /// command that fails stops the batch; the ones before it stay (as in MULTI/EXEC).
    pub async fn batch<C: ConnectionLike>(
        &self,
        conn: &mut C,
        token: i64,
        commands: &[&[&str]],
    ) -> Result<Vec<Value>, Error> {
        check_token(token)?;
        let mut keys: Vec<&str> = Vec::new();
        for command in commands {
            let [_, key, ..] = command else {
                return Err(Error::InvalidName(
                    "a batched Redis command is a name and a key, then its arguments".into(),
                ));
            };
            self.check_key(key)?;
            if !keys.contains(key) {
                keys.push(*key);
            }
        }
        if keys.is_empty() {
            return Err(Error::InvalidName("an empty Redis batch".into()));
        }
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("fenced_batch")
            .arg(keys.len() + 1)
            .arg(&self.fence)
            .arg(&keys)
            .arg(token);
        for command in commands {
            cmd.arg(command.len()).arg(*command);
        }
        match fcall(conn, &cmd, &self.fence).await? {
            Value::Array(replies) => Ok(replies),
            other => Ok(vec![other]),
        }
    }
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
/// on `key`, if `token` is not lower than the highest token accepted for `key` (a mark of the
/// key's own, [`fence_key`]), and records `token` (`FCALL fenced_call`). Returns the command's
/// reply. To fence several keys by one mark, use a [`Scope`].
pub async fn call<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: i64,
    command: &[&str],
) -> Result<Value, Error> {
    if command.is_empty() {
        return Err(Error::InvalidName("an empty Redis command".into()));
    }
    let fence = fence_key(key)?;
    fcall(
        conn,
        &fenced("fenced_call", key, &fence, token, command)?,
        &fence,
    )
    .await
}

/// `SET key value`, fenced by `token` (`FCALL fenced_set`).
pub async fn set<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    value: &str,
    token: i64,
) -> Result<(), Error> {
    let fence = fence_key(key)?;
    fcall(
        conn,
        &fenced("fenced_set", key, &fence, token, &[value])?,
        &fence,
    )
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
                highest: 7,
                ..
            }
        ));
        assert!(matches!(reply("6"), Error::Redis(_)));
        let other = redis::make_extension_error("WRONGTYPE".into(), Some("6 7".into()));
        assert!(matches!(Error::from(other), Error::Redis(_)));
    }

    #[test]
    fn a_scopes_keys_share_its_fence_keys_hash_tag() {
        let scope = Scope::new("42").unwrap();
        assert_eq!(scope.fence_key(), "{42}:fence");
        assert_eq!(scope.key("payouts"), "payouts:{42}");
        assert_eq!(hash_tag(&scope.key("receipt")), hash_tag(scope.fence_key()));
        assert!(scope.check_key("receipt:{42}").is_ok());
        assert!(scope.check_key("receipt:{43}").is_err());
        assert!(scope.check_key("receipt:42").is_err());
        assert!(Scope::new("").is_err());
        assert!(Scope::new("a{b").is_err());
    }

    #[test]
    fn keys_without_a_usable_tag_are_refused() {
        assert!(fence_key("a{}b").is_err());
        assert!(fence_key("a}b").is_err());
        assert!(fence_key("x{}y{z}").is_err()); // Redis reads only the first `{`
    }
}
