//! Scopes (migration 002): one mark per resource a lease protects, whatever rows its writes
//! touch. A table bound to a scope ([`Scope::enable`]) refuses every write that presents a
//! token lower than the scope's mark, and every write that presents none; a table bound by a
//! column ([`enable_by_column`]) takes each row's scope from that column. A transaction
//! presents its token once ([`Scope::begin`]: `SET LOCAL fenced_lease.token`), and every
//! statement in it is checked; the check holds the scope's mark until commit, so in the
//! database's commit order no write of a lower token follows one of a higher token.

use tokio_postgres::{Client, GenericClient};

use super::rows::FencedTransaction;
use super::{install_if_missing, quote_path};
use crate::fence::{Error, check_scope, check_token};

/// The name of a resource a lease protects: 1 to [`MAX_SCOPE_LEN`](crate::fence::MAX_SCOPE_LEN) characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope(String);

impl Scope {
    /// `name` as a scope; [`Error::InvalidName`] if it is empty or longer than
    /// [`MAX_SCOPE_LEN`](crate::fence::MAX_SCOPE_LEN) characters.
    pub fn new(name: &str) -> Result<Self, Error> {
        check_scope(name)?;
        Ok(Scope(name.to_string()))
    }

    /// The default scope of a lease: `<namespace>/<name>`.
    pub fn of_lease(namespace: &str, name: &str) -> Self {
        Scope(format!("{namespace}/{name}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Binds `table` (`schema.table` allowed) to this scope, installing the migrations if they
    /// are missing: every write of the table then presents a token checked against this
    /// scope's mark, which starts at the highest `fence_token` of the table's rows (a table of
    /// migration 001 moves so). Idempotent; refused if the table is bound to another scope.
    pub async fn enable(&self, client: &impl GenericClient, table: &str) -> Result<(), Error> {
        install_if_missing(client).await?;
        client
            .execute(
                "SELECT fenced_lease.enable($1::text::regclass, $2)",
                &[&quote_path(table), &self.0],
            )
            .await?;
        Ok(())
    }

    /// The scope's mark, the highest token its writes presented; `None` if no write and no
    /// binding has named it.
    pub async fn highest(&self, client: &impl GenericClient) -> Result<Option<i64>, Error> {
        let row = client
            .query_opt(
                "SELECT highest FROM fenced_lease.scopes WHERE scope = $1",
                &[&self.0],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Starts a transaction whose writes present `token` (`SET LOCAL fenced_lease.token`).
    /// Each write is checked against the mark of its scope (this one for a table bound to
    /// it); the first raises the mark if `token` is higher, and holds it until the
    /// transaction ends. Commit with [`FencedTransaction::commit`]; dropping it rolls back.
    pub async fn begin<'c>(
        &self,
        client: &'c mut Client,
        token: i64,
    ) -> Result<FencedTransaction<'c>, Error> {
        begin(client, token).await
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Starts a transaction whose writes present `token`, whatever their scopes (tables bound
/// by a column, or to several scopes). One round trip besides `BEGIN`; the tables are bound
/// (and the migrations installed) beforehand, by [`Scope::enable`] or [`enable_by_column`].
pub async fn begin(client: &mut Client, token: i64) -> Result<FencedTransaction<'_>, Error> {
    check_token(token)?;
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT set_config('fenced_lease.token', $1, true)",
        &[&token.to_string()],
    )
    .await?;
    Ok(FencedTransaction::new(tx, token))
}

/// Binds `table` by its column `scope_column`: each row's write presents a token checked
/// against the mark of the scope the row names (both scopes when an update moves it), so one
/// table holds the data of many leases. Installs the migrations if they are missing.
pub async fn enable_by_column(
    client: &impl GenericClient,
    table: &str,
    scope_column: &str,
) -> Result<(), Error> {
    install_if_missing(client).await?;
    client
        .execute(
            "SELECT fenced_lease.enable_by_column($1::text::regclass, $2)",
            &[&quote_path(table), &scope_column],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::MAX_SCOPE_LEN;

    #[test]
    fn a_scope_is_a_name_of_1_to_512_characters() {
        assert!(Scope::new("").is_err());
        assert!(Scope::new(&"a".repeat(MAX_SCOPE_LEN)).is_ok());
        assert!(Scope::new(&"é".repeat(MAX_SCOPE_LEN)).is_ok());
        assert!(Scope::new(&"a".repeat(MAX_SCOPE_LEN + 1)).is_err());
        assert_eq!(Scope::of_lease("shop", "payouts").as_str(), "shop/payouts");
    }
}
