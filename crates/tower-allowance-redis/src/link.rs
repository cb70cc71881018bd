//! The connection a store talks over: one server or a cluster, plain or TLS, made here or
//! brought by the caller, and shared by every allowance made from it.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use redis::{
    aio::{ConnectionLike, ConnectionManager},
    Cmd, RedisFuture, Value,
};
use tower_allowance::BoxError;

use crate::{
    error::{CallError, ConnectError, ConnectErrorKind, RedisCause},
    events::Events,
    RedisStoreOptions,
};

/// What the allowances made from one constructor call share: the command connection, the
/// event subscription, the options and the round-trip count.
pub(crate) struct Link {
    pub(crate) conn: Conn,
    pub(crate) events: Arc<Events>,
    /// The URL (or the cluster's seed URLs) with any password replaced by `***`.
    pub(crate) redacted: String,
    pub(crate) options: RedisStoreOptions,
    pub(crate) round_trips: AtomicU64,
    /// Whether the periodic re-authentication runs (`reauth`).
    pub(crate) reauth_started: AtomicBool,
}

impl Link {
    /// A link over `conn`, its events heard through `events` (none: no events are heard).
    pub(crate) fn new(
        conn: Conn,
        events: Vec<redis::Client>,
        redacted: String,
        options: RedisStoreOptions,
    ) -> Self {
        Self {
            conn,
            events: Events::new(events, options.connect_timeout),
            redacted,
            round_trips: AtomicU64::new(0),
            reauth_started: AtomicBool::new(false),
            options,
        }
    }

    /// The command connection, counting what it sends.
    pub(crate) fn connection(&self) -> CountingConnection<'_> {
        CountingConnection {
            conn: self.conn.clone(),
            round_trips: &self.round_trips,
        }
    }

    /// The server's `TIME` in microseconds, uncounted, from the node whose clock the scripts
    /// on `key` read: on a cluster the primary of its slot (`TIME` has no key, and the
    /// cluster connection would send it to any node, another host's clock).
    pub(crate) async fn time(&self, key: &str) -> redis::RedisResult<u64> {
        let cmd = redis::cmd("TIME");
        let (secs, micros): (u64, u64) = match &self.conn {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await?,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let node =
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                let reply = c
                    .clone()
                    .route_command(cmd, RoutingInfo::SingleNode(node))
                    .await?;
                redis::from_redis_value(reply)?
            }
        };
        #[cfg(not(feature = "cluster"))]
        let _ = key;
        Ok(secs.saturating_mul(1_000_000).saturating_add(micros))
    }
}

/// The command connection: one multiplexed connection to a server, or a cluster connection
/// that routes each command to the node owning its key's slot. Both reconnect by themselves.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A connection that counts what it sends.
pub(crate) struct CountingConnection<'a> {
    conn: Conn,
    round_trips: &'a AtomicU64,
}

impl ConnectionLike for CountingConnection<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// A client for `url`, with the TLS options when there are any.
///
/// # Errors
///
/// [`ConnectErrorKind::InvalidUrl`] for a URL the client refuses (a `rediss://` one
/// without the `tls` feature, say); [`ConnectErrorKind::InvalidTls`] for certificates that
/// cannot be parsed, or TLS options with a plain URL.
pub(crate) fn client(
    url: &str,
    options: &RedisStoreOptions,
) -> Result<redis::Client, ConnectError> {
    let client = redis::Client::open(url).map_err(|e| {
        if cfg!(not(feature = "tls")) && is_tls_url(url) {
            let why: BoxError =
                "rediss:// urls need the `tls` feature of tower-allowance-redis".into();
            ConnectError::new(ConnectErrorKind::InvalidUrl, why)
        } else {
            ConnectError::new(ConnectErrorKind::InvalidUrl, RedisCause(e))
        }
    })?;
    #[cfg(feature = "tls")]
    {
        ensure_crypto_provider();
        if let Some(certificates) = options.tls.certificates() {
            if !is_tls_url(url) {
                let why: BoxError = "tls options need a rediss:// url".into();
                return Err(ConnectError::new(ConnectErrorKind::InvalidTls, why));
            }
            if let Some(ca) = &options.tls.ca {
                use rustls::pki_types::{pem::PemObject, CertificateDer};
                // The client accepts a PEM without any certificate (and then trusts nothing).
                if CertificateDer::pem_slice_iter(ca).next().is_none() {
                    let why: BoxError = "no certificate in the CA PEM".into();
                    return Err(ConnectError::new(ConnectErrorKind::InvalidTls, why));
                }
            }
            return redis::Client::build_with_tls(
                client.get_connection_info().clone(),
                certificates,
            )
            .map_err(|e| ConnectError::new(ConnectErrorKind::InvalidTls, RedisCause(e)));
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = options;
    Ok(client)
}

/// `fut`, or a [`CallError::timeout`] after `timeout`.
pub(crate) async fn with_timeout<T>(
    timeout: Duration,
    fut: impl Future<Output = T>,
) -> Result<T, CallError> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| CallError::timeout(timeout))
}

/// A duration in whole milliseconds, as Redis takes TTLs.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A cluster client seeded with `nodes` (clients made by [`client`]), with the options'
/// connect timeout and TLS certificates (which the cluster applies to every node it finds).
#[cfg(feature = "cluster")]
pub(crate) fn cluster_client(
    nodes: &[redis::Client],
    options: &RedisStoreOptions,
) -> redis::RedisResult<redis::cluster::ClusterClient> {
    let seeds = nodes.iter().map(|c| c.get_connection_info().clone());
    #[allow(unused_mut)]
    let mut builder = redis::cluster::ClusterClient::builder(seeds)
        .connection_timeout(options.timeout.max(options.connect_timeout));
    #[cfg(feature = "tls")]
    if let Some(certificates) = options.tls.certificates() {
        builder = builder.certs(certificates);
    }
    builder.build()
}

fn is_tls_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
}

/// The redis client builds its rustls configuration on the process-wide default crypto
/// provider. rustls picks one by itself only when exactly one provider feature is enabled
/// in the whole program, and panics otherwise (aws-lc-rs enabled by another crate, say); so
/// unless the application installed one, ring is installed as the default.
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: then that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A URL with any password (userinfo or query string) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, _)) => (before, "?***"),
        None => (rest, ""),
    };
    let authority_end = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{path}{query}"),
        None => format!("{authority}{path}{query}"),
    }
}

/// The redacted form of a connection the caller brought: its address, without credentials.
pub(crate) fn describe(info: &redis::ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{host}:{port}"),
        other => format!("{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        let cases = [
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://:hunter2@h:1/", "redis://:***@h:1/"),
            ("redis://user:hunter2@h:1/2", "redis://user:***@h:1/2"),
            ("rediss://hunter2@h", "rediss://***@h"),
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "redis+unix:///tmp/r.sock?***",
            ),
            ("redis://u:p@ss:w@rd@h/", "redis://u:***@h/"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want);
        }
    }

    #[test]
    fn tls_urls_are_recognised() {
        assert!(is_tls_url("rediss://h:1/"));
        assert!(is_tls_url("REDISS://h"));
        assert!(!is_tls_url("redis://h"));
        assert!(!is_tls_url("h:6379"));
    }
}
