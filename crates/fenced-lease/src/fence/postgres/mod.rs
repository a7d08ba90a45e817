//! PostgreSQL fenced by the database itself (feature `postgres`, on `tokio-postgres`).
//!
//! The check is SQL shipped in this repository, [`MIGRATIONS`] (`fence/postgres/`), so that
//! every client gets it, whatever its language. Two modes:
//!
//! - [`scope`] (migration 002, for new tables): one mark per *scope*, the resource a lease
//!   protects (by default the lease, `<namespace>/<name>`). A table bound to a scope is
//!   strict: every insert, update, delete, upsert, `MERGE`, `COPY` and `TRUNCATE` presents a
//!   token (`SET LOCAL fenced_lease.token`, which [`Scope::begin`] does, or an inserted row's
//!   `fence_token`), checked against the scope's mark in the same transaction; a write with no
//!   token is refused ([`Error::NoToken`]).
//! - [`rows`] (migration 001): one mark per row, the recipe most documents show; it fences
//!   only what the holder already wrote, and stays for tables that use it.
//!
//! The database refuses a lower token with SQLSTATE `FL001` ([`FENCED_SQLSTATE`]), which
//! becomes [`Error::Fenced`] (so does the same refusal of any statement of yours converted with
//! `?`), naming the scope and both tokens.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client, token: i64) -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::postgres::Scope;
//! let scope = Scope::new("account-42")?;
//! scope.enable(&*client, "payouts").await?; // installs the migrations if missing
//! let tx = scope.begin(client, token).await?; // every write in it presents `token`
//! tx.execute("INSERT INTO payouts (account, amount) VALUES (42, 10)", &[]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

pub mod rows;
pub mod scope;

pub use rows::{FENCE_COLUMN, FencedTable, FencedTransaction, Value};
pub use scope::{Scope, begin, enable_by_column};

use tokio_postgres::GenericClient;

use super::Error;

/// The SQL that fences tables in the database, in order: `fence/postgres/001_fenced_lease.sql`
/// (the schema, per-row marks) and `fence/postgres/002_scopes.sql` (scopes). Each is idempotent
/// and runs in one transaction ([`install`] does).
pub const MIGRATIONS: [&str; 2] = [
    include_str!("../../../../../fence/postgres/001_fenced_lease.sql"),
    include_str!("../../../../../fence/postgres/002_scopes.sql"),
];

/// The SQLSTATE of a refused token; its DETAIL reads `scope=<scope> presented=<token>
/// highest=<token>` (`presented=<token> highest=<token>` for a row of migration 001).
pub const FENCED_SQLSTATE: &str = "FL001";

/// The SQLSTATE of a write to a table bound to a scope that presented no token.
pub const NO_TOKEN_SQLSTATE: &str = "FL003";

/// Installs (or upgrades) the schema `fenced_lease`: runs each of [`MIGRATIONS`] as one
/// transaction (or within the caller's). Needs the privileges to create a schema and a role
/// (`fenced_lease_exempt`).
pub async fn install(client: &impl GenericClient) -> Result<(), Error> {
    for migration in MIGRATIONS {
        client.batch_execute(migration).await?;
    }
    Ok(())
}

/// Installs [`MIGRATIONS`] unless the newest is there.
pub(crate) async fn install_if_missing(client: &impl GenericClient) -> Result<(), Error> {
    let installed: bool = client
        .query_one(
            "SELECT to_regclass('fenced_lease.refusals') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !installed {
        install(client).await?;
    }
    Ok(())
}

/// `name` as a quoted SQL identifier (`schema.table` quoted part by part).
pub(crate) fn quote_path(name: &str) -> String {
    name.split('.').map(quote).collect::<Vec<_>>().join(".")
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The scope and tokens of a refusal's DETAIL: `scope=<scope> presented=<t> highest=<h>`
/// (a scope may hold spaces: it runs to the last ` presented=`), or 001's `presented=<t>
/// highest=<h>`.
fn refused_tokens(detail: &str) -> Option<(Option<String>, i64, i64)> {
    let (scope, tokens) = match detail.strip_prefix("scope=") {
        Some(rest) => {
            let at = rest.rfind(" presented=")?;
            (Some(rest[..at].to_string()), &rest[at + 1..])
        }
        None => (None, detail),
    };
    let (mut presented, mut highest) = (None, None);
    for field in tokens.split_whitespace() {
        match field.split_once('=') {
            Some(("presented", value)) => presented = value.parse().ok(),
            Some(("highest", value)) => highest = value.parse().ok(),
            _ => {}
        }
    }
    Some((scope, presented?, highest?))
}

/// A refusal by the database (SQLSTATE `FL001`) is [`Error::Fenced`], a write that presented
/// no token (`FL003`) [`Error::NoToken`]; anything else is [`Error::Postgres`].
impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        let Some(db) = error.as_db_error() else {
            return Error::Postgres(error);
        };
        match db.code().code() {
            FENCED_SQLSTATE => match db.detail().and_then(refused_tokens) {
                Some((scope, presented, highest)) => Error::Fenced {
                    scope,
                    presented,
                    highest,
                },
                None => Error::Postgres(error),
            },
            NO_TOKEN_SQLSTATE => Error::NoToken(db.message().to_string()),
            _ => Error::Postgres(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_detail_names_the_scope_and_both_tokens() {
        assert_eq!(
            refused_tokens("scope=account-42 presented=7 highest=8"),
            Some((Some("account-42".into()), 7, 8))
        );
        assert_eq!(
            refused_tokens("scope=a presented=b presented=7 highest=8"),
            Some((Some("a presented=b".into()), 7, 8))
        );
        assert_eq!(refused_tokens("presented=6 highest=7"), Some((None, 6, 7)));
        assert_eq!(refused_tokens("highest=9 presented=0"), Some((None, 0, 9)));
        assert_eq!(refused_tokens("presented=6"), None);
        assert_eq!(refused_tokens("presented=x highest=7"), None);
        assert_eq!(refused_tokens("scope=x"), None);
    }

    #[test]
    fn names_are_quoted_identifiers() {
        assert_eq!(quote_path("app.pay\"outs"), "\"app\".\"pay\"\"outs\"");
    }
}
