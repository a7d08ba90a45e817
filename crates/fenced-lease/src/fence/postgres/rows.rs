//! Per-row fences (migration 001): each row carries the highest token that wrote it, in the
//! column [`FENCE_COLUMN`], and a trigger installed by `fenced_lease.enable(table)` refuses a
//! write presenting a lower token than the row's. A write here is one statement,
//!
//! ```sql
//! UPDATE t SET fence_token = fenced_lease.accept(fence_token, $t), c1 = $1, ... WHERE key = $k
//! ```
//!
//! so the check runs on the locked row and the check and the write are one atomic step. A
//! write that is more than one statement starts its transaction with that statement
//! ([`FencedTable::begin`]): the row lock it takes holds until commit.
//!
//! A row's mark fences only that row: an insert of another row, a delete and a re-insert, a
//! statement that presents no token all pass. New tables are bound to a scope instead
//! ([`super::Scope`]); this mode stays for tables that have it until their owner moves them
//! (`fenced_lease.enable(table, scope)` takes over their marks).
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client, token: i64) -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::postgres::FencedTable;
//! let payouts = FencedTable::new("payouts", &["account"]);
//! payouts.add_fence_column(&*client).await?; // installs the migrations if missing, enables the table
//! payouts.update(&*client, &[&42_i64], &[("paid_by", &"worker-a")], token).await?;
//!
//! let tx = payouts.begin(client, &[&42_i64], token).await?; // row locked, token checked and recorded
//! tx.execute("UPDATE payouts SET amount = amount + 10 WHERE account = $1", &[&42_i64]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Transaction};

use super::{install_if_missing, quote, quote_path};
use crate::fence::{Error, check_token};

/// The column holding the highest token accepted for a row.
pub const FENCE_COLUMN: &str = "fence_token";

/// A value to bind to a statement parameter.
pub type Value<'a> = &'a (dyn ToSql + Sync);

/// A table whose rows are fenced, identified by `key_columns`. Names are quoted as SQL
/// identifiers (so they are case-sensitive); `table` may be `schema.table`.
#[derive(Clone, Debug)]
pub struct FencedTable {
    table: String,
    key_columns: Vec<String>,
    /// Whether this table's first write found (or installed) the migration.
    installed: Arc<AtomicBool>,
}

impl FencedTable {
    /// The rows of `table`, each identified by the values of `key_columns`.
    pub fn new(table: &str, key_columns: &[&str]) -> Self {
        FencedTable {
            table: quote_path(table),
            key_columns: key_columns.iter().map(|c| quote(c)).collect(),
            installed: Arc::default(),
        }
    }

    /// Fences the table for every client: installs the migrations if they are missing, then
    /// `fenced_lease.enable(table)` adds the fence column (`BIGINT NOT NULL DEFAULT 0`) if it
    /// is missing and the trigger that refuses lower tokens. Idempotent.
    pub async fn add_fence_column(&self, client: &impl GenericClient) -> Result<(), Error> {
        self.ensure_installed(client).await?;
        client
            .execute(
                "SELECT fenced_lease.enable($1::text::regclass)",
                &[&self.table],
            )
            .await?;
        Ok(())
    }

    /// Installs the migration if it is missing, on this table's first use.
    async fn ensure_installed(&self, client: &impl GenericClient) -> Result<(), Error> {
        if !self.installed.load(Ordering::Relaxed) {
            install_if_missing(client).await?;
            self.installed.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `fence_token = fenced_lease.accept(fence_token, $token)`
    fn accept(token_param: usize) -> String {
        let fence = quote(FENCE_COLUMN);
        format!("{fence} = fenced_lease.accept({fence}, ${token_param})")
    }

    /// `key1 = $first AND key2 = $first+1 ...`
    fn key_predicate(&self, first: usize) -> String {
        self.key_columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = ${}", first + i))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    fn describe(&self, key: &[Value<'_>]) -> String {
        format!("row {:?} of {}", key, self.table)
    }

    fn check_key(&self, key: &[Value<'_>]) -> Result<(), Error> {
        if key.len() != self.key_columns.len() {
            return Err(Error::InvalidName(format!(
                "{} is keyed by {} column(s), got {} value(s)",
                self.table,
                self.key_columns.len(),
                key.len()
            )));
        }
        Ok(())
    }

    /// Sets the columns of `set` on the row with `key`, if `token` is not lower than the
    /// row's: one `UPDATE ... SET fence_token = fenced_lease.accept(fence_token, token), ...
    /// WHERE key`. The row must exist.
    pub async fn update(
        &self,
        client: &impl GenericClient,
        key: &[Value<'_>],
        set: &[(&str, Value<'_>)],
        token: i64,
    ) -> Result<(), Error> {
        check_token(token)?;
        self.check_key(key)?;
        self.ensure_installed(client).await?;
        let mut sql = format!("UPDATE {} SET {}", self.table, Self::accept(1));
        let mut params: Vec<Value<'_>> = vec![&token];
        for (column, value) in set {
            params.push(*value);
            sql.push_str(&format!(", {} = ${}", quote(column), params.len()));
        }
        sql.push_str(&format!(" WHERE {}", self.key_predicate(params.len() + 1)));
        params.extend_from_slice(key);
        match client.execute(&sql, &params).await? {
            0 => Err(Error::Missing(self.describe(key))),
            _ => Ok(()),
        }
    }

    /// Inserts the row with `key` and the columns of `set`, or updates it if `token` is not
    /// lower than the row's: one `INSERT ... ON CONFLICT (key) DO UPDATE SET fence_token =
    /// fenced_lease.accept(fence_token, token), ...`. The key columns need a unique index.
    pub async fn upsert(
        &self,
        client: &impl GenericClient,
        key: &[Value<'_>],
        set: &[(&str, Value<'_>)],
        token: i64,
    ) -> Result<(), Error> {
        check_token(token)?;
        self.check_key(key)?;
        self.ensure_installed(client).await?;
        let fence = quote(FENCE_COLUMN);
        let mut columns: Vec<String> = self.key_columns.clone();
        columns.push(fence.clone());
        columns.extend(set.iter().map(|(c, _)| quote(c)));
        let mut params: Vec<Value<'_>> = key.to_vec();
        params.push(&token);
        params.extend(set.iter().map(|(_, v)| *v));
        let placeholders: Vec<String> = (1..=params.len()).map(|i| format!("${i}")).collect();
        let mut updates = vec![format!(
            "{fence} = fenced_lease.accept({table}.{fence}, EXCLUDED.{fence})",
            table = self.table
        )];
        updates.extend(
            columns[self.key_columns.len() + 1..]
                .iter()
                .map(|c| format!("{c} = EXCLUDED.{c}")),
        );
        let sql = format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({keys}) DO UPDATE SET {updates}",
            table = self.table,
            columns = columns.join(", "),
            values = placeholders.join(", "),
            keys = self.key_columns.join(", "),
            updates = updates.join(", "),
        );
        client.execute(&sql, &params).await?;
        Ok(())
    }

    /// Starts a transaction guarded by the row with `key`: one
    /// `UPDATE ... SET fence_token = fenced_lease.accept(fence_token, token) WHERE key` locks
    /// the row, checks the token and records it, like [`update`](Self::update). The row stays
    /// locked until the transaction ends, so every statement run in it is fenced by that one
    /// check, and a writer with a higher token waits for it rather than interleaving. Commit
    /// with [`FencedTransaction::commit`]; dropping it rolls back.
    pub async fn begin<'c>(
        &self,
        client: &'c mut Client,
        key: &[Value<'_>],
        token: i64,
    ) -> Result<FencedTransaction<'c>, Error> {
        check_token(token)?;
        self.check_key(key)?;
        self.ensure_installed(&*client).await?;
        let tx = client.transaction().await?;
        let claim = format!(
            "UPDATE {} SET {} WHERE {}",
            self.table,
            Self::accept(1),
            self.key_predicate(2)
        );
        let mut params: Vec<Value<'_>> = vec![&token];
        params.extend_from_slice(key);
        match tx.execute(&claim, &params).await? {
            0 => Err(Error::Missing(self.describe(key))),
            _ => Ok(FencedTransaction { tx, token }),
        }
    }
}

/// A fenced transaction: one holding the lock of a fenced row ([`FencedTable::begin`]), or one
/// whose writes present a token to their scopes ([`super::Scope::begin`]). Use it as a
/// [`Transaction`] (it derefs to one), then [`commit`](Self::commit).
pub struct FencedTransaction<'c> {
    tx: Transaction<'c>,
    token: i64,
}

impl<'c> FencedTransaction<'c> {
    pub(crate) fn new(tx: Transaction<'c>, token: i64) -> Self {
        FencedTransaction { tx, token }
    }

    /// The token this transaction writes with.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Commits every statement of the transaction, with the row's new token.
    pub async fn commit(self) -> Result<(), Error> {
        self.tx.commit().await?;
        Ok(())
    }

    /// Rolls the transaction back.
    pub async fn rollback(self) -> Result<(), Error> {
        self.tx.rollback().await?;
        Ok(())
    }
}

impl<'c> Deref for FencedTransaction<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_identifiers() {
        let t = FencedTable::new("app.pay\"outs", &["Account", "day"]);
        assert_eq!(t.table, "\"app\".\"pay\"\"outs\"");
        assert_eq!(t.key_predicate(3), "\"Account\" = $3 AND \"day\" = $4");
    }
}
