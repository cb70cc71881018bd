//! Where an allowance's state lives: in this process, or in a shared authority.
//!
//! The decision rules live in one place (the crate's pure algorithm); a store only applies
//! them atomically against its own clock. [`MemoryStore`] keeps the state in atomics (and
//! the retry budget behind a mutex) in this process and is what
//! [`Allowance::new`](crate::Allowance::new) uses. A shared store (the
//! `tower-allowance-redis` crate) implements [`Store`] so that several processes spend
//! one allowance; it plugs into the same layers unchanged through
//! [`Allowance::with_store`](crate::Allowance::with_store).
//!
//! Every method is one decision and one atomic step: `admit` checks the cooldown, spends a
//! retry from the budget when asked to, and takes a token, all at once. Times cross the
//! boundary as durations measured on the store's clock, never as instants, so no two
//! clocks are ever compared.
//!
//! ```
//! use std::time::Duration;
//! use tower_allowance::{AllowanceConfig, store::{Admit, Decision, MemoryStore, Store}};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let config = AllowanceConfig::per_second(2, 1)?;
//! let store = MemoryStore::new();
//! assert!(matches!(store.admit(&config, Admit::first()).await?, Decision::Admitted { .. }));
//! assert!(matches!(store.admit(&config, Admit::first()).await?, Decision::Wait { .. }));
//! # Ok(())
//! # }
//! ```

use std::{fmt, future::Future, pin::Pin, time::Duration};

use crate::{AllowanceConfig, BoxError};

pub(crate) mod cell;
mod memory;

pub use memory::MemoryStore;

/// A boxed future returned by a [`Store`]; stores that do I/O box their futures.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// What an admission asks of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admit {
    /// The attempt is a retry: spend one unit of the retry budget in the same atomic step,
    /// or refuse with [`Decision::BudgetExhausted`] when none is left.
    pub spend_retry: bool,
}

impl Admit {
    /// A first attempt.
    pub const fn first() -> Self {
        Self { spend_retry: false }
    }

    /// A retry that spends from the budget.
    pub const fn retry() -> Self {
        Self { spend_retry: true }
    }
}

/// The answer to one admission request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admitted: a token (and, for a retry, a unit of budget) was spent.
    Admitted {
        /// When the next token becomes available, from now. Zero while burst remains.
        next_in: Duration,
    },
    /// Not yet; nothing was spent. Ask again after `wait`.
    Wait {
        /// How long until an admission could succeed.
        wait: Duration,
        /// The wait is the shared cooldown (a server asked everyone to back off).
        cooldown: bool,
    },
    /// A retry was refused because the shared retry budget is spent; nothing was spent.
    BudgetExhausted,
}

/// The result of raising the cooldown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deferred {
    /// Whether the deadline moved later (it never moves earlier).
    pub extended: bool,
    /// Time from now until the (possibly unchanged) deadline.
    pub blocked_for: Duration,
}

/// A read of a store's shared state, for snapshots and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreState {
    /// Time from now until the cooldown deadline; zero when not cooling down.
    pub blocked_for: Duration,
    /// Retries that could be spent right now; `None` for an unlimited budget.
    pub retries_remaining: Option<u64>,
}

/// A shared place to keep one allowance's state and apply its decisions atomically.
///
/// Implement it to coordinate through something other than this process's memory. Each
/// method must be a single atomic step against the store's own clock: `admit` in particular
/// must check the cooldown, spend the retry budget (when `ask.spend_retry`) and take a
/// token together, or do none of them.
///
/// The configuration is passed with every call, so the store holds no copy that could
/// drift from the layers' view.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Decides one admission.
    fn admit(&self, config: &AllowanceConfig, ask: Admit) -> StoreFuture<Decision>;

    /// Raises the cooldown deadline to at least `delay` from now (max semantics).
    fn defer(&self, config: &AllowanceConfig, delay: Duration) -> StoreFuture<Deferred>;

    /// Records a successful request for a replenishing retry budget.
    fn deposit(&self, config: &AllowanceConfig) -> StoreFuture<()>;

    /// Reads the shared state.
    fn state(&self, config: &AllowanceConfig) -> StoreFuture<StoreState>;
}

/// A store could not be reached or answered something unusable.
#[derive(Debug)]
pub struct StoreError {
    source: BoxError,
}

impl StoreError {
    /// Wraps the store's own error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("allowance store failed")
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
