//! Test support (feature `test-util`, off by default): the store deciding on tokio's clock
//! instead of the server's `TIME`, through a blocking connection, and the clock steps and the
//! `EVALSHA` path the tests ask for. Nothing here is built without the feature; the store
//! asks it for the script's clock (`script_clock`), whether to subscribe, and a synchronous
//! answer (`Store::try_apply`).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::rule::{Op, Params, Reply};

use super::{missing_function, Inner, RedisStore};
use crate::{
    error::{CallError, CallErrorKind},
    link::{millis, Conn},
    scripts::{self, BadReply},
};

// === impl RedisStore ===

impl RedisStore {
    /// Test support: decide on tokio's clock instead of `TIME`, with a blocking connection
    /// that answers [`Store::try_apply`](tower_allowance::store::Store::try_apply)
    /// synchronously. Under a paused tokio clock (`start_paused`) the store then decides
    /// exactly as a [`MemoryStore`](tower_allowance::store::MemoryStore) created at the same
    /// instant, and the runtime cannot auto-advance while a call is in flight; that is how the
    /// conformance suite (`tower-allowance-conformance`) runs the seed's scenarios through the
    /// real layers on Redis.
    ///
    /// The blocking connection is made like the store's own (TLS included; on a cluster, a
    /// blocking cluster connection). A store [`from_connection`](Self::from_connection)
    /// needs its `events` client for it.
    ///
    /// # Errors
    ///
    /// When the blocking connection cannot be made.
    pub fn follow_tokio_clock(&self) -> Result<(), CallError> {
        let conn = self.inner.blocking_connection()?;
        self.inner.test.follow(conn);
        Ok(())
    }

    /// Test support: moves the clock the scripts decide on back by `step` (a backward step of
    /// the Redis host's clock); only with [`RedisStore::follow_tokio_clock`].
    pub fn step_clock_back(&self, step: Duration) {
        self.inner.test.step(step, false);
    }

    /// Test support: calls are `EVALSHA`s from now on, as against a server without Functions
    /// (for this store and every store over its connection), so that the conformance suite
    /// runs over both paths.
    pub fn without_functions(&self) {
        self.inner.functions.store(false, Ordering::Relaxed);
    }

    /// Test support: moves the clock the scripts decide on forward by `step` (a forward step
    /// of the Redis host's clock, which this process's clock does not make); only with
    /// [`RedisStore::follow_tokio_clock`].
    pub fn step_clock_forward(&self, step: Duration) {
        self.inner.test.step(step, true);
    }
}

// === impl Inner ===

impl Inner {
    /// A blocking connection to where the store's events come from (the server, or the
    /// cluster those nodes seed), made as the store's own.
    fn blocking_connection(&self) -> Result<Box<dyn redis::ConnectionLike + Send>, CallError> {
        let sources = self.link.events.sources();
        let Some(client) = sources.first() else {
            let why: tower_allowance::BoxError =
                "no client to open a blocking connection with (from_connection without events)"
                    .into();
            return Err(CallError::with_source(CallErrorKind::Refused, why));
        };
        Ok(match self.link.conn {
            Conn::Single(_) => Box::new(client.get_connection().map_err(CallError::redis)?),
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => {
                let cluster = crate::link::cluster_client(sources, &self.link.options)
                    .map_err(CallError::redis)?;
                Box::new(cluster.get_connection().map_err(CallError::redis)?)
            }
        })
    }
}

/// The clock the script decides on when it follows tokio's, and the blocking connection that
/// answers synchronously then.
#[derive(Default)]
pub(super) struct TestClock {
    follow: Mutex<Option<(Instant, Box<dyn redis::ConnectionLike + Send>)>>,
    step_back_us: AtomicU64,
    step_forward_us: AtomicU64,
}

// === impl TestClock ===

impl TestClock {
    fn follow(&self, conn: Box<dyn redis::ConnectionLike + Send>) {
        *self.follow.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), conn));
    }

    fn step(&self, step: Duration, forward: bool) {
        let total = if forward {
            &self.step_forward_us
        } else {
            &self.step_back_us
        };
        total.fetch_add(
            u64::try_from(step.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Microseconds on tokio's clock since following began, plus the steps forward, minus
    /// the steps back.
    pub(super) fn now_us(&self) -> Option<u64> {
        let guard = self.follow.lock().unwrap_or_else(PoisonError::into_inner);
        let (epoch, _) = guard.as_ref()?;
        Some(self.clock_at(*epoch))
    }

    /// Microseconds since following began, as a `MemoryStore` created then counts them.
    fn clock_at(&self, epoch: Instant) -> u64 {
        let since = u64::try_from(Instant::now().saturating_duration_since(epoch).as_micros())
            .unwrap_or(u64::MAX);
        since
            .saturating_add(self.step_forward_us.load(Ordering::Relaxed))
            .saturating_sub(self.step_back_us.load(Ordering::Relaxed))
    }

    /// Whether the store follows tokio's clock (then it hears no events: a subscription
    /// would only add real I/O to a paused runtime).
    pub(super) fn following(&self) -> bool {
        self.follow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// One operation over the blocking connection, as `Inner::eval` over the store's own;
    /// `None` unless following tokio's clock.
    pub(super) fn eval_blocking(
        &self,
        inner: &Inner,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, CallError>> {
        let mut guard = self.follow.lock().unwrap_or_else(PoisonError::into_inner);
        let (epoch, conn) = guard.as_mut()?;
        let now = self.clock_at(*epoch);
        let argv = scripts::argv(
            op,
            params,
            millis(inner.link.options.idle_ttl),
            &inner.channel,
            Some(now),
        );
        inner.link.round_trips.fetch_add(1, Ordering::Relaxed);
        let conn = &mut **conn;
        let reply = if inner.functions.load(Ordering::Relaxed) {
            // As `Inner::eval`: the function, loaded again if it is missing.
            let mut fcall = redis::cmd("FCALL");
            fcall
                .arg(inner.script.function())
                .arg(1)
                .arg(&inner.key)
                .arg(&argv[..]);
            match fcall.query::<Vec<i64>>(conn) {
                Err(e) if missing_function(&e) => inner
                    .script
                    .load_library()
                    .query::<String>(conn)
                    .and_then(|_| fcall.query::<Vec<i64>>(conn)),
                other => other,
            }
        } else {
            inner
                .script
                .script()
                .key(&inner.key)
                .arg(&argv[..])
                .invoke::<Vec<i64>>(conn)
        }
        .map_err(CallError::redis);
        // No stamp: the call blocks, the clock waits for it, it cannot arrive late.
        Some(reply.and_then(|r| {
            scripts::split(&r)
                .ok()
                .and_then(|(_, answer)| answer)
                .ok_or(BadReply)
                .and_then(|answer| scripts::decode(op, answer))
                .map_err(|BadReply| CallError::new(CallErrorKind::UnexpectedReply))
        }))
    }
}
