//! PostgreSQL rows fenced by the database itself (feature `postgres`, on `tokio-postgres`).
//!
//! Each fenced row carries the highest token that wrote it, in the column [`FENCE_COLUMN`]
//! (added by [`FencedTable::add_fence_column`]). A write is one conditional statement,
//!
//! ```sql
//! UPDATE t SET c1 = $1, ..., fence_token = $t WHERE key = $k AND fence_token <= $t
//! ```
//!
//! so the check and the write are one atomic step; zero rows means a higher token wrote
//! first ([`Error::Fenced`]). A write that is more than one statement starts its transaction
//! with that statement ([`FencedTable::begin`]): the row lock it takes holds until commit, so
//! every other writer of the row waits, and the whole transaction is fenced by one check.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client, token: i64) -> Result<(), fenced_lease::fence::Error> {
//! use fenced_lease::fence::postgres::FencedTable;
//! let payouts = FencedTable::new("payouts", &["account"]);
//! payouts.add_fence_column(&*client).await?;
//! payouts.update(&*client, &[&42_i64], &[("paid_by", &"worker-a")], token).await?;
//!
//! let tx = payouts.begin(client, &[&42_i64], token).await?; // row locked, token checked and recorded
//! tx.execute("UPDATE payouts SET amount = amount + 10 WHERE account = $1", &[&42_i64]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use std::ops::Deref;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Transaction};

use super::{Error, check_token};

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
}

/// `name` as a quoted SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl FencedTable {
    /// The rows of `table`, each identified by the values of `key_columns`.
    pub fn new(table: &str, key_columns: &[&str]) -> Self {
        FencedTable {
            table: table.split('.').map(quote).collect::<Vec<_>>().join("."),
            key_columns: key_columns.iter().map(|c| quote(c)).collect(),
        }
    }

    /// Adds the fence column (`BIGINT NOT NULL DEFAULT 0`) to the table, if it is missing.
    pub async fn add_fence_column(&self, client: &impl GenericClient) -> Result<(), Error> {
        let sql = format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} BIGINT NOT NULL DEFAULT 0",
            self.table,
            quote(FENCE_COLUMN)
        );
        client.batch_execute(&sql).await?;
        Ok(())
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
    /// row's: one `UPDATE ... WHERE key AND fence_token <= token`. The row must exist.
    pub async fn update(
        &self,
        client: &impl GenericClient,
        key: &[Value<'_>],
        set: &[(&str, Value<'_>)],
        token: i64,
    ) -> Result<(), Error> {
        check_token(token)?;
        self.check_key(key)?;
        let fence = quote(FENCE_COLUMN);
        let mut sql = format!("UPDATE {} SET {fence} = $1", self.table);
        let mut params: Vec<Value<'_>> = vec![&token];
        for (column, value) in set {
            params.push(*value);
            sql.push_str(&format!(", {} = ${}", quote(column), params.len()));
        }
        sql.push_str(&format!(
            " WHERE {} AND {fence} <= $1",
            self.key_predicate(params.len() + 1)
        ));
        params.extend_from_slice(key);
        if client.execute(&sql, &params).await? == 1 {
            return Ok(());
        }
        Err(self.refused(client, key, token).await)
    }

    /// Inserts the row with `key` and the columns of `set`, or updates it if `token` is not
    /// lower than the row's: one `INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
    /// fence_token <= token`. The key columns need a unique index.
    pub async fn upsert(
        &self,
        client: &impl GenericClient,
        key: &[Value<'_>],
        set: &[(&str, Value<'_>)],
        token: i64,
    ) -> Result<(), Error> {
        check_token(token)?;
        self.check_key(key)?;
        let fence = quote(FENCE_COLUMN);
        let mut columns: Vec<String> = self.key_columns.clone();
        columns.push(fence.clone());
        columns.extend(set.iter().map(|(c, _)| quote(c)));
        let mut params: Vec<Value<'_>> = key.to_vec();
        params.push(&token);
        params.extend(set.iter().map(|(_, v)| *v));
        let placeholders: Vec<String> = (1..=params.len()).map(|i| format!("${i}")).collect();
        let updates: Vec<String> = columns[self.key_columns.len()..]
            .iter()
            .map(|c| format!("{c} = EXCLUDED.{c}"))
            .collect();
        let sql = format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({keys}) DO UPDATE SET {updates} WHERE {table}.{fence} <= EXCLUDED.{fence}",
            table = self.table,
            columns = columns.join(", "),
            values = placeholders.join(", "),
            keys = self.key_columns.join(", "),
            updates = updates.join(", "),
        );
        if client.execute(&sql, &params).await? == 1 {
            return Ok(());
        }
        Err(self.refused(client, key, token).await)
    }

    /// Why a conditional write matched no row: a higher token (the usual case), or no row.
    /// The decision was the write's; this read only fills in the error.
    async fn refused(&self, client: &impl GenericClient, key: &[Value<'_>], token: i64) -> Error {
        let sql = format!(
            "SELECT {} FROM {} WHERE {}",
            quote(FENCE_COLUMN),
            self.table,
            self.key_predicate(1)
        );
        match client.query_opt(&sql, key).await {
            // Tokens on a row only grow, so a row at or below `token` now did not exist
            // when the write ran.
            Ok(Some(row)) => match row.try_get::<_, i64>(0) {
                Ok(highest) if highest > token => Error::Fenced {
                    presented: token,
                    highest,
                },
                Ok(_) => Error::Missing(self.describe(key)),
                Err(e) => Error::Postgres(e),
            },
            Ok(None) => Error::Missing(self.describe(key)),
            Err(e) => Error::Postgres(e),
        }
    }

    /// Starts a transaction guarded by the row with `key`: one conditional
    /// `UPDATE ... SET fence_token = token WHERE key AND fence_token <= token` locks the row,
    /// checks the token and records it, like [`update`](Self::update). The row stays locked
    /// until the transaction ends, so every statement run in it is fenced by that one check,
    /// and a writer with a higher token waits for it rather than interleaving. Commit with
    /// [`FencedTransaction::commit`]; dropping it rolls back.
    pub async fn begin<'c>(
        &self,
        client: &'c mut Client,
        key: &[Value<'_>],
        token: i64,
    ) -> Result<FencedTransaction<'c>, Error> {
        check_token(token)?;
        self.check_key(key)?;
        let tx = client.transaction().await?;
        let fence = quote(FENCE_COLUMN);
        let claim = format!(
            "UPDATE {} SET {fence} = $1 WHERE {} AND {fence} <= $1",
            self.table,
            self.key_predicate(2)
        );
        let mut params: Vec<Value<'_>> = vec![&token];
        params.extend_from_slice(key);
        if tx.execute(&claim, &params).await? == 1 {
            return Ok(FencedTransaction { tx, token });
        }
        Err(self.refused(&tx, key, token).await)
    }
}

/// A transaction holding the lock of a fenced row, opened by [`FencedTable::begin`]. Use it
/// as a [`Transaction`] (it derefs to one), then [`commit`](Self::commit).
pub struct FencedTransaction<'c> {
    tx: Transaction<'c>,
    token: i64,
}

impl<'c> FencedTransaction<'c> {
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
