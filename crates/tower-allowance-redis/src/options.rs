//! How a [`RedisStore`](crate::RedisStore) behaves: timeouts, TTLs, the failure policy and
//! (feature `tls`) the certificates to trust and to present.
//!
//! ```
//! use std::{num::NonZeroU32, time::Duration};
//! use tower_allowance_redis::{FailurePolicy, RedisStoreOptions};
//!
//! let options = RedisStoreOptions::new()
//!     .timeout(Duration::from_millis(100))
//!     .failure_policy(FailurePolicy::LocalFallback {
//!         expected_processes: NonZeroU32::new(4).expect("non-zero"),
//!     });
//! assert_eq!(options.get_timeout(), Duration::from_millis(100));
//! ```

use std::{num::NonZeroU32, time::Duration};

/// Default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// What a store call does when Redis does not answer (an error that may pass, a timeout, or
/// a recent failure). A refusal (a wrong password, a missing permission) is never an outage:
/// it is reported at once, whatever the policy.
///
/// # Why a choice
///
/// Reporting the outage lets the allowance keep every promise (the rate, the shared cooldown,
/// the exact budget): its [`OutagePolicy`](tower_allowance::OutagePolicy) waits for Redis
/// (the default: work is delayed, not lost) or fails fast; nothing is sent without Redis. The
/// local fallback keeps requests flowing at a rate that cannot exceed the shared one in total,
/// as long as no more than `expected_processes` processes share the allowance, and loses only
/// what cannot be known without Redis: other processes' cooldowns raised during the outage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Report the outage as [`StoreErrorKind::Unavailable`](tower_allowance::store::StoreErrorKind::Unavailable):
    /// the allowance waits for Redis or fails fast, as its outage policy says.
    #[default]
    Report,
    /// Decide in this process with a conservative in-memory allowance while Redis fails:
    /// the configured rate divided by `expected_processes` (burst too, at least 1), a
    /// replenishing budget's floor divided likewise, and no retries from a fixed budget
    /// (what the other processes spent is unknown, and the budget must stay exact).
    /// A `tracing` warning is emitted when switching to it, an info event when back.
    LocalFallback {
        /// How many processes share the allowance.
        expected_processes: NonZeroU32,
    },
}

/// Options for [`RedisStore::connect`](crate::RedisStore::connect) and the other
/// constructors.
///
/// All have defaults; see each setter.
///
/// With the `serde` feature, the options deserialize from configuration files: durations as
/// `"250ms"`, `"2s"`, `"1h"`, TLS certificates as PEM file paths (read when the options are
/// loaded, so a missing file is an error at start-up that names the field), unknown fields
/// refused, zero timeouts refused with an error naming the field:
///
/// ```toml
/// timeout = "100ms"
/// connect_timeout = "2s"
/// probe_interval = "500ms"
/// idle_ttl = "1h"
/// failure_policy = { local_fallback = { expected_processes = 4 } }   # or "report"
/// tls = { ca_cert_file = "/etc/redis/tls/ca.crt" }                   # feature `tls`
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "serde_impl::RawOptions"))]
pub struct RedisStoreOptions {
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) idle_ttl: Duration,
    pub(crate) failure_policy: FailurePolicy,
    #[cfg(feature = "tls")]
    pub(crate) tls: TlsOptions,
    pub(crate) pin_config: bool,
    pub(crate) reauth_interval: Option<Duration>,
}

/// The certificates of a `rediss://` connection (feature `tls`).
#[cfg(feature = "tls")]
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    /// PEM: the CA certificates the server's certificate must chain to.
    pub(crate) ca: Option<Vec<u8>>,
    /// PEM: the client's certificate chain and private key (mutual TLS).
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl TlsOptions {
    /// The redis client's form, when anything was set.
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        })
    }
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Certificates are public but long; the private key is never printed.
        f.debug_struct("TlsOptions")
            .field(
                "ca",
                &self
                    .ca
                    .as_ref()
                    .map(|pem| format!("<{} bytes of PEM>", pem.len())),
            )
            .field(
                "client",
                &self.client.as_ref().map(|_| "<certificate and key>"),
            )
            .finish()
    }
}

impl Default for RedisStoreOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisStoreOptions {
    /// The defaults: 250 ms per call, 2 s to connect, a probe every 500 ms while Redis
    /// fails, state kept one hour past what it must cover, [`FailurePolicy::Report`].
    pub fn new() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(2),
            probe_interval: Duration::from_millis(500),
            idle_ttl: Duration::from_secs(3600),
            failure_policy: FailurePolicy::Report,
            #[cfg(feature = "tls")]
            tls: TlsOptions::default(),
            pin_config: false,
            reauth_interval: Some(Duration::from_secs(60)),
        }
    }

    /// The longest one call may take, round trip included (default 250 ms). Past it the
    /// call fails (or falls back), and the script may or may not have run on the server:
    /// a token (or a unit of retry budget) may then be spent that nobody uses, which errs
    /// on the side of sending less. Under [`FailurePolicy::LocalFallback`] the same call is
    /// then also decided locally.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest [`connect`](crate::RedisStore::connect) waits for Redis (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// After a failure, calls skip Redis (answering "unavailable" or falling back at once)
    /// until this much time has passed; then one call probes it (default 500 ms).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// How long the state outlives what it must remember (default one hour). Every write
    /// sets the key's TTL to the longest of the token bucket's lead, the cooldown and a
    /// replenishing budget's window, plus this. A fixed budget's spend count is forgotten
    /// after this long without any admission: until then the next run on the same name
    /// starts with what the last one left (call `Allowance::clear()` before a batch to give
    /// it the whole budget).
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl = ttl;
        self
    }

    /// What to do when Redis does not answer (default [`FailurePolicy::Report`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// Trusts the CA certificates in `pem` (one or more PEM blocks) for `rediss://`
    /// connections, instead of the operating system's roots: for servers whose certificate a
    /// private CA signed (self-managed Redis, test servers). Without it, the system's trusted
    /// roots are used (managed Redis services).
    ///
    /// The PEM is parsed when the store is built: a malformed one fails
    /// [`connect`](crate::RedisStore::connect) with
    /// [`ConnectErrorKind::InvalidTls`](crate::error::ConnectErrorKind::InvalidTls), as
    /// does a TLS option on a plain `redis://` URL.
    ///
    /// ```
    /// use tower_allowance_redis::RedisStoreOptions;
    ///
    /// # let ca_pem = "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n";
    /// // let ca_pem = std::fs::read("/etc/redis/tls/ca.crt")?;
    /// let options = RedisStoreOptions::new().tls_ca_cert(ca_pem);
    /// assert!(format!("{options:?}").contains("bytes of PEM"));
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS: a server started with
    /// `--tls-auth-clients yes`). Both in PEM: the certificate chain and its private key
    /// (PKCS#8, PKCS#1 or SEC1). The key never appears in `Debug` output.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Refuses to decide with another configuration (default off). Off, the newest
    /// configuration on the allowance's name decides for every process on it: a process
    /// started later with other limits takes over, and the processes started before decide
    /// with its configuration from their next call on (logging it once at INFO), so that a
    /// rolling deploy changes a limit without refusing anyone. Pinned, this process is
    /// refused instead ([`CallErrorKind::ConfigMismatch`](crate::error::CallErrorKind::ConfigMismatch),
    /// naming both configurations) once a newer, different one took over.
    ///
    /// ```
    /// use tower_allowance_redis::RedisStoreOptions;
    ///
    /// let options = RedisStoreOptions::new().pin_config(true);
    /// assert!(format!("{options:?}").contains("pin_config: true"));
    /// ```
    pub fn pin_config(mut self, pin: bool) -> Self {
        self.pin_config = pin;
        self
    }

    /// How often a fresh connection authenticates again while the store is in use (default
    /// every 60 s; `None`: never): a password rotated on the server is then a WARN within
    /// this long, naming the cause, not an outage at the next reconnect hours later. Cheap:
    /// one connection, `AUTH` (from the URL) and `PING`, off the request path.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_allowance_redis::RedisStoreOptions;
    ///
    /// let options = RedisStoreOptions::new().reauth_interval(Some(Duration::from_secs(300)));
    /// assert!(format!("{options:?}").contains("300s"));
    /// ```
    pub fn reauth_interval(mut self, interval: Option<Duration>) -> Self {
        self.reauth_interval = interval;
        self
    }

    /// The per-call timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The failure policy.
    pub fn get_failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }
}

#[cfg(feature = "serde")]
mod serde_impl {
    use std::path::PathBuf;

    use super::*;
    use crate::error::InvalidOptions;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct RawOptions {
        #[serde(default, with = "humantime_serde")]
        timeout: Option<Duration>,
        #[serde(default, with = "humantime_serde")]
        connect_timeout: Option<Duration>,
        #[serde(default, with = "humantime_serde")]
        probe_interval: Option<Duration>,
        #[serde(default, with = "humantime_serde")]
        idle_ttl: Option<Duration>,
        #[serde(default)]
        pin_config: bool,
        /// `"0s"`: never.
        #[serde(default, with = "humantime_serde")]
        reauth_interval: Option<Duration>,
        #[serde(default)]
        failure_policy: Option<RawFailurePolicy>,
        #[serde(default)]
        tls: Option<RawTls>,
    }

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "snake_case", deny_unknown_fields)]
    enum RawFailurePolicy {
        /// `"report"`
        Report,
        /// `{ local_fallback = { expected_processes = 4 } }`
        LocalFallback { expected_processes: NonZeroU32 },
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[cfg_attr(
        not(feature = "tls"),
        allow(dead_code, reason = "refused without `tls`")
    )]
    struct RawTls {
        #[serde(default)]
        ca_cert_file: Option<PathBuf>,
        #[serde(default)]
        client_cert_file: Option<PathBuf>,
        #[serde(default)]
        client_key_file: Option<PathBuf>,
    }

    fn positive(
        value: Option<Duration>,
        field: &'static str,
    ) -> Result<Option<Duration>, InvalidOptions> {
        match value {
            Some(d) if d.is_zero() => Err(InvalidOptions::new(field, "must be longer than zero")),
            v => Ok(v),
        }
    }

    #[cfg(feature = "tls")]
    fn read(path: &std::path::Path, field: &'static str) -> Result<Vec<u8>, InvalidOptions> {
        std::fs::read(path)
            .map_err(|e| InvalidOptions::new(field, format!("cannot read {}: {e}", path.display())))
    }

    impl TryFrom<RawOptions> for RedisStoreOptions {
        type Error = InvalidOptions;

        fn try_from(raw: RawOptions) -> Result<Self, InvalidOptions> {
            let mut options = RedisStoreOptions::new();
            if let Some(d) = positive(raw.timeout, "timeout")? {
                options = options.timeout(d);
            }
            if let Some(d) = positive(raw.connect_timeout, "connect_timeout")? {
                options = options.connect_timeout(d);
            }
            if let Some(d) = positive(raw.probe_interval, "probe_interval")? {
                options = options.probe_interval(d);
            }
            if let Some(d) = raw.idle_ttl {
                options = options.idle_ttl(d);
            }
            match raw.failure_policy {
                None | Some(RawFailurePolicy::Report) => {}
                Some(RawFailurePolicy::LocalFallback { expected_processes }) => {
                    options =
                        options.failure_policy(FailurePolicy::LocalFallback { expected_processes });
                }
            }
            options = options.pin_config(raw.pin_config);
            if let Some(d) = raw.reauth_interval {
                options = options.reauth_interval(Some(d).filter(|d| !d.is_zero()));
            }
            if let Some(tls) = raw.tls {
                options = with_tls(options, tls)?;
            }
            Ok(options)
        }
    }

    #[cfg(feature = "tls")]
    fn with_tls(
        mut options: RedisStoreOptions,
        tls: RawTls,
    ) -> Result<RedisStoreOptions, InvalidOptions> {
        if let Some(path) = &tls.ca_cert_file {
            options = options.tls_ca_cert(read(path, "tls.ca_cert_file")?);
        }
        match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => {
                options = options.tls_client_cert(
                    read(cert, "tls.client_cert_file")?,
                    read(key, "tls.client_key_file")?,
                );
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(InvalidOptions::new(
                    "tls.client_key_file",
                    "a client certificate needs its key",
                ))
            }
            (None, Some(_)) => {
                return Err(InvalidOptions::new(
                    "tls.client_cert_file",
                    "a client key needs its certificate",
                ))
            }
        }
        Ok(options)
    }

    #[cfg(not(feature = "tls"))]
    fn with_tls(_: RedisStoreOptions, _: RawTls) -> Result<RedisStoreOptions, InvalidOptions> {
        Err(InvalidOptions::new(
            "tls",
            "TLS options need the crate's `tls` feature",
        ))
    }
}
