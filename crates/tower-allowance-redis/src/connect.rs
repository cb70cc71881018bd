//! The ways to a store: a URL, a Redis Cluster's seed nodes, or a connection the
//! application already has. Each makes the store's `Link` (the command connection, the
//! clients to subscribe with, the options) and hands it to the store, which loads the script
//! and checks its permissions (`RedisStore::start`).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::{
    error::{ConnectError, ConnectErrorKind, RedisCause},
    link::{self, Conn, Link},
    store::validate_name,
    RedisStore, RedisStoreOptions,
};

// === impl RedisStore ===

impl RedisStore {
    /// Connects to the Redis server at `url` for the allowance called `name`, and loads the
    /// script.
    ///
    /// `url` is `redis://[user][:password@]host[:port][/db]`, or `rediss://...` for TLS
    /// (feature `tls`; see `RedisStoreOptions::tls_ca_cert` for a private CA). The
    /// connection is a multiplexed [`ConnectionManager`] that reconnects by itself; this
    /// store never needs to be rebuilt after an outage. A second connection carries the
    /// event subscription.
    ///
    /// # Errors
    ///
    /// A [`ConnectError`]: `name` refused by [`validate_name`]; a URL that cannot be used
    /// ([`ConnectErrorKind::InvalidUrl`]) or TLS options that cannot
    /// ([`ConnectErrorKind::InvalidTls`]); Redis refusing us (a wrong password, a missing ACL
    /// permission, a bad database index, an untrusted certificate:
    /// [`ConnectErrorKind::Refused`], never masked by the local fallback); or, unless the
    /// policy is [`FailurePolicy::LocalFallback`](crate::FailurePolicy::LocalFallback), Redis not answering within the connect
    /// timeout ([`ConnectErrorKind::Unreachable`]).
    pub async fn connect(
        url: &str,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let client = link::client(url, &options)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout.max(options.connect_timeout)))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e)))?;
        let link = Link::new(Conn::Single(conn), vec![client], link::redact(url), options);
        Self::start(link, name).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`urls`: one or more seed
    /// nodes, `redis://` or `rediss://` alike), for the allowance called `name`, and loads
    /// the script on every primary.
    ///
    /// The allowance's keys share one hash slot (`ta:{name}:...`), so each script call goes
    /// to the primary that owns the slot, in one round trip; the connection follows slot
    /// migrations and failovers (`MOVED`, `ASK`) by itself. Events are published with plain
    /// `PUBLISH`, which the cluster bus forwards to every node: the subscription sits on the
    /// first seed node that answers.
    ///
    /// Unlike [`connect`](Self::connect), the cluster must answer here once (its slot map is
    /// read), whatever the failure policy; after that the failure policy applies as usual.
    ///
    /// ```no_run
    /// use tower_allowance::{Allowance, AllowanceConfig};
    /// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/", "redis://10.0.0.3:7000/"];
    /// let store = RedisStore::connect_cluster(nodes, "billing-api", RedisStoreOptions::new()).await?;
    /// let allowance = Allowance::with_store(AllowanceConfig::per_second(10, 5)?, store);
    /// allowance.acquire().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); [`ConnectErrorKind::InvalidUrl`] also for an empty
    /// list, or seed nodes with different passwords or TLS modes; and
    /// [`ConnectErrorKind::Unreachable`] when no seed node answers within the connect
    /// timeout, whatever the failure policy.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn connect_cluster<I, U>(
        urls: I,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let urls: Vec<U> = urls.into_iter().collect();
        let nodes = urls
            .iter()
            .map(|url| link::client(url.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        let client = link::cluster_client(&nodes, &options)
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e)))?;
        let conn = link::with_timeout(options.connect_timeout, client.get_async_connection())
            .await
            .map_err(|e| ConnectError::new(ConnectErrorKind::Unreachable, e))?
            .map_err(|e| {
                let kind = if crate::error::is_outage(&e) {
                    ConnectErrorKind::Unreachable
                } else {
                    ConnectErrorKind::Refused
                };
                ConnectError::new(kind, RedisCause(e))
            })?;
        let redacted = urls
            .iter()
            .map(|u| link::redact(u.as_ref()))
            .collect::<Vec<_>>()
            .join(", ");
        let link = Link::new(Conn::Cluster(conn), nodes, redacted, options);
        Self::start(link, name).await
    }

    /// A store over a connection the application already has: a [`ConnectionManager`] it
    /// built (with its own TLS, credentials, timeouts, RESP3...) and shares with the rest of
    /// the program. This store, and every one made from it by
    /// [`for_allowance`](Self::for_allowance), sends its script calls over that connection.
    ///
    /// `events` is the client to subscribe to the allowance's events with (a subscribed
    /// connection cannot send commands in RESP2, so it is a connection of its own, shared by
    /// every allowance made from this store). With `None`, this process hears no other
    /// process's cooldowns while it holds reserved slots: its holders still send at their
    /// slots, and the next admission after a cooldown sees it. Give one unless every
    /// process of the allowance is this one.
    ///
    /// ```no_run
    /// use redis::aio::ConnectionManager;
    /// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let conn = ConnectionManager::new(client.clone()).await?;
    /// // The application keeps using `conn` for its own commands.
    /// let store =
    ///     RedisStore::from_connection(conn, Some(client), "billing-api", RedisStoreOptions::new())
    ///         .await?;
    /// let search = store.for_allowance("search-api")?; // same connection
    /// # drop(search);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The options' timeouts, probe interval, TTL and failure policy apply; its TLS options
    /// do not (the connection is made already).
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect): an invalid name, Redis refusing the script load, or
    /// (unless the policy is [`FailurePolicy::LocalFallback`](crate::FailurePolicy::LocalFallback)) not answering within the
    /// connect timeout.
    pub async fn from_connection(
        conn: ConnectionManager,
        events: Option<redis::Client>,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let redacted = events.as_ref().map_or_else(
            || "(connection brought by the caller)".to_owned(),
            |c| link::describe(c.get_connection_info()),
        );
        let link = Link::new(
            Conn::Single(conn),
            events.into_iter().collect(),
            redacted,
            options,
        );
        Self::start(link, name).await
    }

    /// A store over a cluster connection the application already has, as
    /// [`from_connection`](Self::from_connection) for a single server. `events` is a client
    /// for any node of the cluster (plain `PUBLISH` reaches every node).
    ///
    /// ```no_run
    /// use redis::cluster::ClusterClient;
    /// use tower_allowance_redis::{RedisStore, RedisStoreOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_allowance::BoxError> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let conn = ClusterClient::new(nodes)?.get_async_connection().await?;
    /// let events = redis::Client::open(nodes[0])?;
    /// let store =
    ///     RedisStore::from_cluster_connection(conn, Some(events), "billing-api", RedisStoreOptions::new())
    ///         .await?;
    /// # drop(store);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_connection`](Self::from_connection).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn from_cluster_connection(
        conn: redis::cluster_async::ClusterConnection,
        events: Option<redis::Client>,
        name: &str,
        options: RedisStoreOptions,
    ) -> Result<Self, ConnectError> {
        validate_name(name).map_err(|e| ConnectError::new(ConnectErrorKind::InvalidName, e))?;
        let redacted = events.as_ref().map_or_else(
            || "(cluster connection brought by the caller)".to_owned(),
            |c| link::describe(c.get_connection_info()),
        );
        let link = Link::new(
            Conn::Cluster(conn),
            events.into_iter().collect(),
            redacted,
            options,
        );
        Self::start(link, name).await
    }
}
