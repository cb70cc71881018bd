//! The one seam between the layers and an allowance's state, and the contract a store keeps.
//!
//! A [`Store`] keeps one allowance's [`State`] and applies the rule to it atomically against
//! its own clock. The layers never ask which store they talk to: everything goes through
//! [`Store::apply`] (and its synchronous twin, [`Store::try_apply`]). [`MemoryStore`] keeps
//! the state in this process and is what [`Allowance::new`](crate::Allowance::new) uses; a
//! shared store (the `tower-allowance-redis` crate) lets several processes spend one allowance.
//!
//! # The contract
//!
//! Everything a store needs is here: the [`Op`] to apply, the [`Params`] of the allowance's
//! configuration, the [`State`] to keep, the [`Reply`] to return, the [`Event`] to publish to
//! other processes, and the rule itself as [`State::apply`] (plus [`State::is_settled`], for a
//! store that holds its state in the handle). A store that can hold a [`State`] under a lock
//! or in a transaction calls [`State::apply`] and is done; the values pass through it unread. A store that
//! re-implements the rule elsewhere (the Redis crate's Lua script) needs the rule's insides:
//! they are the `rule` module, public with the `rule` feature and outside semver.
//!
//! ```
//! use std::sync::Mutex;
//! use tokio::time::Instant;
//! use tower_allowance::{
//!     store::{Op, Params, Reply, State, Store, StoreFuture},
//!     Allowance, AllowanceConfig,
//! };
//!
//! /// A store that keeps the state under a lock, on tokio's clock.
//! #[derive(Debug)]
//! struct Locked {
//!     state: Mutex<State>,
//!     epoch: Instant,
//! }
//!
//! impl Store for Locked {
//!     fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
//!         // The store's clock, in microseconds since its epoch.
//!         let now = self.epoch.elapsed().as_micros() as u64;
//!         let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
//!         let reply = state.apply(now, params, &op);
//!         Box::pin(std::future::ready(Ok(reply)))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let store = Locked { state: Mutex::new(State::default()), epoch: Instant::now() };
//! let allowance = Allowance::with_store(AllowanceConfig::per_second(2, 1)?, store);
//! allowance.acquire().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Run the conformance suite (the `tower-allowance-conformance` crate, a dev-dependency)
//! against your store: it replays the same operations against any store and checks the
//! replies.
//!
//! # Why one method and a synchronous twin
//!
//! Every operation is one atomic step of the rule, so one method, `apply(op)`, is the whole
//! contract. I/O stores return a boxed future (one allocation on an I/O path).
//!
//! A store that decides without I/O also answers [`Store::try_apply`] synchronously; the
//! layers call it first, so the in-memory fast path allocates nothing and creates no future.
//! The default returns `None` ("ask [`Store::apply`]"). Such a store also answers
//! [`Store::is_settled`] from the state it holds ([`State::is_settled`]), which the `keyed` (feature
//! `keyed`) registry asks before dropping a state that dies with its store. Nothing else
//! distinguishes stores.
//!
//! # Time
//!
//! Times cross the boundary as durations measured on the store's clock ("wait 300 ms"),
//! never as instants, so no two machines' clocks are ever compared. Reservations and events
//! carry the store's own instants only as opaque numbers that are compared with each other.

use std::{fmt, future::Future, pin::Pin, sync::Arc};

use tokio::time::Instant;

use crate::{rule, BoxError};

pub(crate) mod cell;
mod memory;
// The contract types' insides, for stores that mirror the rule (feature `rule`).
#[cfg(feature = "rule")]
mod rule_view;

pub use memory::MemoryStore;

/// One operation of the rule, for a store to apply atomically ([`State::apply`]).
///
/// Opaque: a store passes it through. Its insides are the `rule` module's (feature `rule`,
/// outside semver), for a store that mirrors the rule elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op(pub(crate) rule::Op);

/// The rule's answer to an [`Op`], for a store to return. Opaque, like [`Op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply(pub(crate) rule::Reply);

/// Something every holder of a reservation must hear of (a cooldown, a closure), published by
/// a store that several processes share ([`Store::watch`], [`Watcher::notify`]). Opaque,
/// like [`Op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event(pub(crate) rule::Event);

/// Every number the rule needs, derived once from an
/// [`AllowanceConfig`](crate::AllowanceConfig) ([`params`](crate::AllowanceConfig::params))
/// and passed to the store with every call, so that no store re-derives (or drifts from)
/// them. Opaque, like [`Op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct Params(pub(crate) rule::Params);

/// One allowance's state, as a store keeps it: a fresh one is [`State::default`].
///
/// Opaque, like [`Op`]: [`State::apply`] is the whole rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct State(pub(crate) rule::State);

impl State {
    /// Applies `op` at `now` (the store's clock, in microseconds): the one step a store
    /// makes atomically. The state changes as the rule says; the reply is for the caller.
    pub fn apply(&mut self, now: u64, params: &Params, op: &Op) -> Reply {
        Reply(rule::apply(&mut self.0, now, &params.0, &op.0))
    }

    /// Whether the state is settled at `now`: as good as a fresh one (see
    /// [`Store::is_settled`]).
    pub fn is_settled(&self, now: u64, params: &Params) -> bool {
        rule::is_settled(&self.0, now, &params.0)
    }
}

/// A boxed future returned by a [`Store`]; stores that do I/O box their futures.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// A place to keep one allowance's state and apply the rule to it atomically.
///
/// Implement [`Store::apply`] as one atomic step: load the state, call
/// [`State::apply`] with the store's current time in microseconds, save
/// the state, return the reply. Run the conformance suite (the `tower-allowance-conformance`
/// crate) against your store. The [`Params`] are passed with every call, so the store holds no copy of the
/// configuration that could drift from the layers' view.
///
/// A store that keeps the state in the handle (dropped with it) should also answer
/// [`Store::is_settled`] with [`State::is_settled`]; until it does,
/// a `keyed` (feature `keyed`) registry never evicts its allowances.
///
/// Stores shared by several processes should also publish the [`Event`] carried by replies
/// (cooldowns, closures) and deliver other processes' events through [`Store::watch`], so that
/// callers holding reservations there hear of them without asking.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Applies one operation atomically, on the store's clock.
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply>;

    /// The same, decided synchronously when the store can do so without I/O; `now` is the
    /// caller's reading of tokio's clock (a store with its own clock ignores it).
    ///
    /// The default is `None`: "call [`Store::apply`]".
    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        let _ = (now, params, op);
        None
    }

    /// Whether the state is settled at `now` (the caller's reading of tokio's clock):
    /// [`State::is_settled`] of the state it holds, on its own clock.
    /// Dropping a settled state and starting over from a fresh one lets nothing through that
    /// keeping it would not: no cooldown or closure running, every bucket full, no
    /// reservation pending, no retry budget spent, nothing learned by an adaptive rate.
    ///
    /// The `keyed` (feature `keyed`) registry asks it, synchronously and under its lock, before
    /// evicting an allowance whose state dies with its store (see
    /// `keyed::StoreFactory::state_outlives_store` (feature `keyed`)).
    /// A store that holds its state in the handle answers it from that state with
    /// [`State::is_settled`]; it never says `true` of a state the rule would not call settled.
    ///
    /// The default is `false` ("cannot tell without I/O"): the registry then never evicts the
    /// allowance for being settled, only because its factory says the state outlives the
    /// store (a store over Redis).
    fn is_settled(&self, now: Instant, params: &Params) -> bool {
        let _ = (now, params);
        false
    }

    /// Starts delivering events published by other processes sharing this state to
    /// `watcher`, until [`Watcher::notify`] returns `false` (the allowance is gone).
    ///
    /// The default does nothing: a store used by one process hears everything in the replies.
    fn watch(&self, watcher: Watcher) {
        let _ = watcher;
    }

    /// The name the state has in the store (a Redis store's allowance name), which an
    /// [`Allowance`](crate::Allowance) built over it takes for its logs and metrics unless
    /// its builder names it. The default is `None` (the allowance is `"default"`).
    fn name(&self) -> Option<&str> {
        None
    }
}

/// Where a store delivers events published by other processes; see [`Store::watch`].
///
/// # Clone
///
/// Cheap: a shared handle that holds the allowance only weakly.
#[derive(Clone)]
pub struct Watcher {
    sink: Arc<dyn EventSink>,
}

/// What a watcher delivers to.
pub(crate) trait EventSink: Send + Sync {
    fn event(&self, event: Event);
    fn resync(&self);
    fn is_alive(&self) -> bool;
}

impl Watcher {
    pub(crate) fn new(sink: Arc<dyn EventSink>) -> Self {
        Self { sink }
    }

    /// Delivers one event. Returns `false` once the allowance is gone (stop watching).
    pub fn notify(&self, event: Event) -> bool {
        self.sink.event(event);
        self.sink.is_alive()
    }

    /// Says that events may have been missed (a dropped subscription): the allowance
    /// re-reads the state. Returns `false` once the allowance is gone.
    pub fn resync(&self) -> bool {
        self.sink.resync();
        self.sink.is_alive()
    }

    /// Whether the allowance is still there.
    pub fn is_alive(&self) -> bool {
        self.sink.is_alive()
    }
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let alive = self.is_alive();
        f.debug_struct("Watcher").field("alive", &alive).finish()
    }
}

// A store behind a `Box` or an `Arc` is that store.
macro_rules! forward {
    ($($ptr:ident),*) => {$(
        impl<S: Store + ?Sized> Store for $ptr<S> {
            fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
                (**self).apply(params, op)
            }

            fn try_apply(
                &self,
                now: Instant,
                params: &Params,
                op: &Op,
            ) -> Option<Result<Reply, StoreError>> {
                (**self).try_apply(now, params, op)
            }

            fn is_settled(&self, now: Instant, params: &Params) -> bool {
                (**self).is_settled(now, params)
            }

            fn watch(&self, watcher: Watcher) {
                (**self).watch(watcher);
            }

            fn name(&self) -> Option<&str> {
                (**self).name()
            }
        }
    )*};
}

forward!(Box, Arc);

/// What kind of failure a [`StoreError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer (down, paused, timed out, restarting): it may answer later.
    /// Admissions wait for it, as the [`OutagePolicy`](crate::OutagePolicy) says.
    Unavailable,
    /// The store answered and refused (wrong password, a missing permission, a bad database,
    /// an invalid name, a script it cannot load): waiting will not help, so it surfaces at once.
    Rejected,
    /// The store answered something that breaks the contract.
    Protocol,
}

/// A store could not decide.
///
/// `Display` names the kind only; the cause is its [`source()`](std::error::Error::source).
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: BoxError,
}

impl StoreError {
    /// A store that did not answer (it may later).
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::of(StoreErrorKind::Unavailable, source.into())
    }

    /// A store that refused for a reason waiting will not fix.
    pub fn rejected(source: impl Into<BoxError>) -> Self {
        Self::of(StoreErrorKind::Rejected, source.into())
    }

    /// A reply that breaks the contract.
    pub fn protocol(source: impl Into<BoxError>) -> Self {
        Self::of(StoreErrorKind::Protocol, source.into())
    }

    fn of(kind: StoreErrorKind, source: BoxError) -> Self {
        Self { kind, source }
    }

    /// What kind of failure.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether waiting might help.
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Unavailable => "allowance store unavailable",
            StoreErrorKind::Rejected => "allowance store refused the operation",
            StoreErrorKind::Protocol => "allowance store answered out of contract",
        })
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// A reply of the wrong kind for the operation (a store broke the contract).
#[derive(Debug)]
pub(crate) struct WrongReply;

impl fmt::Display for WrongReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the reply does not match the operation")
    }
}

impl std::error::Error for WrongReply {}
