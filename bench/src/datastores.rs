//! `hack/datastores`' PostgreSQL and Redis, at FL_POSTGRES_URL and FL_REDIS_URL.

use crate::Res;

/// A connection to PostgreSQL at `url`, its connection task spawned.
pub async fn postgres(url: &str) -> Res<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// FL_POSTGRES_URL.
pub fn postgres_url() -> Res<String> {
    Ok(std::env::var("FL_POSTGRES_URL").map_err(|_| "FL_POSTGRES_URL is not set")?)
}

/// A connection to the Redis at FL_REDIS_URL.
pub async fn redis_connection() -> Res<redis::aio::MultiplexedConnection> {
    let url = std::env::var("FL_REDIS_URL").map_err(|_| "FL_REDIS_URL is not set")?;
    Ok(redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?)
}
