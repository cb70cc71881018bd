//! Errors: connecting ([`ConnectError`], [`InvalidName`]) and one call ([`CallError`]).
//!
//! The Redis client's own errors are kept as the `source()` of these, never exposed as
//! types of this crate's API, and never carry the connection URL's password.
//!
//! ```
//! use tower_allowance_redis::{error::InvalidName, validate_name};
//!
//! let err: InvalidName = validate_name("a}b").unwrap_err();
//! assert_eq!(err.to_string(), "invalid allowance name: only A-Z, a-z, 0-9 and _ . : - are allowed");
//! ```

use std::{error::Error, fmt, time::Duration};

use redis::{ErrorKind, RedisError, ServerErrorKind};
use tower_allowance::BoxError;

/// An allowance name that could break the key's hash tag or reach another allowance's keys.
///
/// Names are 1 to 64 characters from `A-Z a-z 0-9 _ . : -`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidName {
    reason: &'static str,
}

impl InvalidName {
    pub(crate) const fn new(reason: &'static str) -> Self {
        Self { reason }
    }

    /// The rule that was broken.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid allowance name: {}", self.reason)
    }
}

impl Error for InvalidName {}

/// [`RedisStoreOptions`](crate::RedisStoreOptions) from a configuration file that cannot be
/// used (feature `serde`): the field, and why.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use tower_allowance_redis::RedisStoreOptions;
///
/// let err = serde_json::from_str::<RedisStoreOptions>(r#"{ "timeout": "0s" }"#).unwrap_err();
/// assert!(err.to_string().contains("timeout: must be longer than zero"));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidOptions {
    field: &'static str,
    reason: String,
}

impl InvalidOptions {
    #[cfg_attr(
        not(feature = "serde"),
        allow(dead_code, reason = "only the file form fails")
    )]
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }

    /// The field, as written in the file (`tls.ca_cert_file`).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why it cannot be used.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for InvalidOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl Error for InvalidOptions {}

/// What went wrong in [`RedisStore::connect`](crate::RedisStore::connect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectErrorKind {
    /// The allowance name was refused (the source is an [`InvalidName`]).
    InvalidName,
    /// The URL could not be used (or a `rediss://` URL without the `tls` feature).
    InvalidUrl,
    /// The TLS options could not be used: a malformed PEM certificate or key, or TLS options
    /// with a plain `redis://` URL.
    InvalidTls,
    /// Redis did not answer within the connect timeout (unless the policy is
    /// [`FailurePolicy::LocalFallback`](crate::FailurePolicy::LocalFallback)).
    Unreachable,
    /// Redis answered and refused: a wrong password, a bad database index, a server
    /// certificate that the trusted roots do not vouch for (or a client certificate the
    /// server does not accept). Never masked by the local fallback.
    Refused,
    /// The ACL user lacks a command or a channel the store needs (`SCRIPT LOAD`, `PUBLISH`
    /// or `SUBSCRIBE` and the allowance's channel): the source is a [`MissingPermission`]
    /// naming it and the `ACL SETUSER` that grants it. Without it the cross-process cooldown
    /// would break silently, so the store refuses to start. (`EVALSHA` and the keys are
    /// tried by the first decision, which then fails, and every later one at once, with
    /// [`CallErrorKind::Refused`] and a `MissingPermission` as the cause.)
    MissingPermission,
}

/// The Redis ACL user may not run a command, or use a key or channel, that the store needs
/// (the source of a [`ConnectErrorKind::MissingPermission`]).
///
/// ```
/// # async fn connect() {
/// use tower_allowance_redis::{
///     error::{ConnectErrorKind, MissingPermission},
///     RedisStore, RedisStoreOptions,
/// };
///
/// let url = "redis://nopub:secret@127.0.0.1:6379/";
/// match RedisStore::connect(url, "odds-api", RedisStoreOptions::new()).await {
///     Err(e) if e.kind() == ConnectErrorKind::MissingPermission => {
///         let missing = std::error::Error::source(&e)
///             .and_then(|s| s.downcast_ref::<MissingPermission>());
///         if let Some(m) = missing {
///             eprintln!("{}; fix: {}", m.permission(), m.fix());
///         }
///     }
///     _ => {}
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingPermission {
    permission: String,
    fix: String,
    said: String,
}

impl MissingPermission {
    pub(crate) fn new(permission: String, fix: String, said: String) -> Self {
        Self {
            permission,
            fix,
            said,
        }
    }

    /// What the user may not do, as `PUBLISH to ta:{odds-api}:ev`.
    pub fn permission(&self) -> &str {
        &self.permission
    }

    /// The command that grants it, as `ACL SETUSER app +publish &ta:{odds-api}:ev`.
    pub fn fix(&self) -> &str {
        &self.fix
    }
}

impl fmt::Display for MissingPermission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the redis user may not {} (redis said: {}); grant it with `{}`",
            self.permission, self.said, self.fix
        )
    }
}

impl Error for MissingPermission {}

/// [`RedisStore::connect`](crate::RedisStore::connect) failed.
#[derive(Debug)]
pub struct ConnectError {
    kind: ConnectErrorKind,
    source: BoxError,
}

impl ConnectError {
    pub(crate) fn new(kind: ConnectErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: source.into(),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ConnectErrorKind {
        self.kind
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            ConnectErrorKind::InvalidName => "cannot use this allowance name",
            ConnectErrorKind::InvalidUrl => "cannot use this redis url",
            ConnectErrorKind::InvalidTls => "cannot use these tls certificates",
            ConnectErrorKind::Unreachable => "redis is unreachable",
            ConnectErrorKind::Refused => "redis refused the connection or the script",
            ConnectErrorKind::MissingPermission => "redis refused a permission the store needs",
        })
    }
}

impl Error for ConnectError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// Why one store call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallErrorKind {
    /// No answer within the per-call timeout.
    Timeout,
    /// A recent call failed, and the next probe of Redis is not due yet: failed at once.
    Unavailable,
    /// Redis (or the connection to it) failed in a way that may pass: a dropped or refused
    /// connection, a server loading its data, a cluster failing over.
    Redis,
    /// Redis answered and refused: authentication, ACL permission, database index, a script
    /// it cannot run, a TLS certificate that is not trusted. Waiting will not help.
    Refused,
    /// The script answered something other than its documented reply.
    UnexpectedReply,
    /// A cooldown longer than [`MAX_DELAY`](tower_allowance::MAX_DELAY) was asked for.
    UnrepresentableDelay,
    /// The local fallback allowance could not be built for this configuration.
    Fallback,
    /// This process pins its configuration
    /// ([`RedisStoreOptions::pin_config`](crate::RedisStoreOptions::pin_config)) and a newer,
    /// different one decides for the name (limits, retry budget, longest cooldown, adaptive
    /// rate): the source names both, in the units configured. (Unpinned, a process adopts the
    /// newest configuration instead.)
    ConfigMismatch,
}

/// One store call failed; wrapped in a [`StoreError`](tower_allowance::store::StoreError),
/// which the layers turn into [`StoreUnavailable`](tower_allowance::error::StoreUnavailable).
///
/// Find it with `StoreError::source()` and `downcast_ref::<CallError>()`.
#[derive(Debug)]
pub struct CallError {
    kind: CallErrorKind,
    timeout: Option<Duration>,
    source: Option<BoxError>,
}

impl CallError {
    pub(crate) fn new(kind: CallErrorKind) -> Self {
        Self {
            kind,
            timeout: None,
            source: None,
        }
    }

    pub(crate) fn timeout(after: Duration) -> Self {
        Self {
            kind: CallErrorKind::Timeout,
            timeout: Some(after),
            source: None,
        }
    }

    pub(crate) fn with_source(kind: CallErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            timeout: None,
            source: Some(source.into()),
        }
    }

    /// Why the call failed.
    pub fn kind(&self) -> CallErrorKind {
        self.kind
    }

    /// A Redis client error: an outage, or a refusal.
    pub(crate) fn redis(e: redis::RedisError) -> Self {
        let kind = if is_outage(&e) {
            CallErrorKind::Redis
        } else {
            CallErrorKind::Refused
        };
        Self::with_source(kind, RedisCause(e))
    }

    /// What the allowance should make of it.
    pub(crate) fn store_kind(&self) -> tower_allowance::store::StoreErrorKind {
        use tower_allowance::store::StoreErrorKind;
        match self.kind {
            CallErrorKind::Timeout | CallErrorKind::Unavailable | CallErrorKind::Redis => {
                StoreErrorKind::Unavailable
            }
            CallErrorKind::UnexpectedReply => StoreErrorKind::Protocol,
            _ => StoreErrorKind::Rejected,
        }
    }

    /// Wrapped for the allowance, with its kind.
    pub(crate) fn into_store_error(self) -> tower_allowance::store::StoreError {
        use tower_allowance::store::{StoreError, StoreErrorKind};
        match self.store_kind() {
            StoreErrorKind::Unavailable => StoreError::unavailable(self),
            StoreErrorKind::Protocol => StoreError::protocol(self),
            _ => StoreError::rejected(self),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.timeout) {
            (CallErrorKind::Timeout, Some(after)) => {
                write!(f, "redis did not answer within {after:?}")
            }
            (CallErrorKind::Timeout, None) => f.write_str("redis did not answer in time"),
            (CallErrorKind::Unavailable, _) => {
                f.write_str("redis unavailable after a recent failure; next probe not yet due")
            }
            (CallErrorKind::Redis, _) => f.write_str("redis call failed"),
            (CallErrorKind::Refused, _) => f.write_str("redis refused the call"),
            (CallErrorKind::UnexpectedReply, _) => {
                f.write_str("unexpected reply from the allowance script")
            }
            (CallErrorKind::UnrepresentableDelay, _) => {
                f.write_str("cooldown delay too long to represent")
            }
            (CallErrorKind::Fallback, _) => {
                f.write_str("cannot build the local fallback allowance")
            }
            (CallErrorKind::ConfigMismatch, _) => {
                f.write_str("a newer configuration decides for this allowance name, and this process pins its own")
            }
        }
    }
}

impl Error for CallError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// The Redis client's error, kept as a source without exposing its type.
#[derive(Debug)]
pub(crate) struct RedisCause(pub(crate) redis::RedisError);

impl fmt::Display for RedisCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Error for RedisCause {
    // Under the client's error: an I/O error, a TLS verification failure (`UnknownIssuer`).
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// Whether a Redis error is an outage (it may answer later) or a refusal.
pub(crate) fn is_outage(e: &RedisError) -> bool {
    // An untrusted certificate is an I/O error to the client, but waiting will not help.
    if is_tls_refusal(e) {
        return false;
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        return true;
    }
    match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(k) => {
            matches!(
                k,
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            ) || e.code() == Some("BUSY")
        }
        _ => false,
    }
}

/// Whether a Redis error is a TLS verification failure: a certificate that the trusted roots
/// do not vouch for, a name mismatch, a client certificate refused. Waiting will not help.
pub(crate) fn is_tls_refusal(e: &RedisError) -> bool {
    #[cfg(feature = "tls")]
    {
        use std::sync::Arc;
        type Shared = Arc<dyn Error + Send + Sync>;
        let mut cause: Option<&(dyn Error + 'static)> = Error::source(e);
        while let Some(c) = cause {
            // The client keeps causes behind an `Arc`, and `io::Error::source` skips the
            // error it wraps: look through both.
            let unshared = c
                .downcast_ref::<Shared>()
                .map(|a| &**a as &(dyn Error + 'static));
            let layers = [Some(c), unshared];
            let wrapped = layers.iter().flatten().find_map(|l| {
                l.downcast_ref::<std::io::Error>()
                    .and_then(|io| io.get_ref())
                    .map(|i| i as &(dyn Error + 'static))
            });
            for candidate in layers.into_iter().chain([wrapped]).flatten() {
                if let Some(tls) = candidate.downcast_ref::<rustls::Error>() {
                    return matches!(
                        tls,
                        rustls::Error::InvalidCertificate(_)
                            | rustls::Error::NoCertificatesPresented
                            | rustls::Error::AlertReceived(_)
                            | rustls::Error::PeerIncompatible(_)
                    );
                }
            }
            cause = c.source();
        }
        false
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = e;
        false
    }
}
