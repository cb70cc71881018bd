//! The rule: every decision an allowance makes, as a pure function of
//! `(state, now, params, request) -> (reply, new state)`.
//!
//! Nothing here reads a clock, locks, allocates or does I/O. Time is a count of microseconds
//! on the store's own clock (`now`). A [`Store`](crate::store::Store) only applies these
//! functions atomically: [`MemoryStore`](crate::store::MemoryStore) under a compare-and-swap
//! or a lock, the Redis store in a Lua script that transcribes these decisions. [`apply`] is
//! the one entry point; a third-party store that can hold a [`State`] under a lock or in a
//! transaction calls it ([`State::apply`]) and is done.
//!
//! One file per concern, and the Lua script (`tower-allowance-redis`, `src/lua/`) has the
//! same files under the same names, each transcribing its Rust file's functions under the
//! Rust names (in an order Lua's locals allow; `schedule_one` and `is_settled`, memory-only,
//! have no Lua twin). The differential property test holds the two to identical answers.
//!
//! | file | Lua | what |
//! | --- | --- | --- |
//! | `params.rs`, `state.rs` | `state.lua` | the parameters and the state; when a state is settled |
//! | `ops.rs` | (the reply encoding in `scripts.rs`) | the operations, replies, events, reservations |
//! | `wire.rs` | (`scripts.rs`, `events.rs`) | reservations and events as integers, for stores that carry them between processes (feature `rule`) |
//! | `gcra.rs` | `gcra.lua` | the token buckets: GCRA with reservations |
//! | `cooldown.rs` | `cooldown.lua` | the cooldown and the closed state |
//! | `budget.rs` | `budget.lua` | the retry budget |
//! | `probe.rs` | `probe.lua` | the quota probe's lease |
//! | `grant.rs` | `grant.lua` | leases of the shared bucket (feature `lease`): tokens taken up front, the tail given back, stale calls refused, holders counted |
//! | `adaptive.rs` | `adaptive.lua` | the adaptive rate, and the re-timing of a schedule at a cut (`Stretch`) |
//! | `clock.rs` | `clock.lua` | clock steps rebased away; a lost state recreated |
//! | `settle.rs` | `settle.lua` | reserve, then settle (feature `settle`): settlements, the learned refund share |
//! | `mod.rs` | `apply.lua` | `apply` (dispatch) and `read` |
//!
#![cfg_attr(feature = "rule", doc = "```")]
#![cfg_attr(not(feature = "rule"), doc = "```ignore")]
//! use std::time::Duration;
//! use tower_allowance::{rule::{self, Admission, AdmitRequest, Op, Reply, State}, AllowanceConfig};
//!
//! // Exact: the rule decides with the configured numbers (no headroom; see `Limit::exact`).
//! let config = AllowanceConfig::per_second(2, 1)?.exact();
//! let params = config.params().rule();
//! let mut state = State::default();
//! let first = rule::apply(&mut state, 0, params, &Op::Admit(AdmitRequest::first()));
//! assert!(matches!(first, Reply::Admit(Admission::Admitted)));
//! // The burst is spent: the next caller is given a reserved slot one interval later.
//! let Reply::Admit(Admission::Reserved { wait, .. }) =
//!     rule::apply(&mut state, 0, params, &Op::Admit(AdmitRequest::first()))
//! else { unreachable!() };
//! assert_eq!(wait, Duration::from_millis(500));
//! # Ok::<(), tower_allowance::ConfigError>(())
//! ```
//!
//! # The token buckets: GCRA with reservations
//!
//! Each limit is a GCRA (generic cell rate algorithm) in integer microseconds: one number,
//! the theoretical arrival time `tat`, advanced by `cost * interval` per admission. An
//! admission at `t` conforms when `max(tat, t) + cost * interval - t <= tolerance`, where
//! `tolerance = burst * interval`. No floating point is involved, so nothing drifts.
//!
//! An admission that does not conform now is not refused: its slot is **reserved** in the
//! same step. The rule computes the earliest instant `T` at which every limit conforms (and
//! the cooldown is over), advances every limit as if the admission happened at `T`, and
//! answers "yours in `T - now`". The caller sleeps and sends without asking again, so one
//! admission costs one store call however many callers (in however many processes) wait,
//! and callers are admitted in the order they reached the store. Only when the caller set a
//! `max_wait` shorter than that (its deadline, or "never wait") is nothing reserved.
//!
//! # Cooldowns and the reservations already made
//!
//! A cooldown raised to `U` at `now` moves every pending reservation by the part of the
//! cooldown that was added, `U - max(now, previous deadline)`: the schedule after the
//! cooldown is the schedule before it, translated. Order and spacing are kept (so the
//! restart stays metered: never the whole queue at once), and no holder has to ask the store
//! again: the store moves each limit's `tat` by that shift and publishes it as an [`Event`];
//! every holder applies the same shift to its own reservation ([`Reservation::apply`]).
//! Callers arriving during or after the cooldown are scheduled from its end, behind the
//! translated queue; when nothing was pending they get the burst that recovered meanwhile.
//!
//! The translation is conservative: tokens that would have accrued during the cooldown are not
//! credited to reservations already pending (the store cannot tell which of them the bucket
//! scheduled and which a `not_before` did), so a cooldown never lets anything through early.
//!
//! # Time steps
//!
//! The clock of a shared store (Redis `TIME`) is a wall clock and can step backwards. Every
//! operation first compares `now` with the latest time the state has seen; after a backward
//! step every stored instant is moved back by the step ([`rebase`]), so the remaining waits
//! are what they were at the state's last operation.
//!
//! What the rule cannot see is the time that passed between that last operation and the
//! step: it counts as zero, so every wait grows by it. On an allowance in use that gap is
//! short (at most about one interval between calls); on an idle one it is the idle time: a
//! 2 s cooldown, 1.5 s without calls, then a 1 h step back, is waited 3.5 s in all. Redis
//! gives scripts no monotonic clock, so this bound is the best a wall-clock store can do,
//! and it errs long, never short.

// Public with the `rule` feature (for stores that mirror the rule); otherwise the `store`
// module re-exports the part of it every store needs, and the rest is crate-private.
#![cfg_attr(not(feature = "rule"), allow(unreachable_pub))]

use std::time::Duration;

// The adaptive rate, or (without the feature) its fixed twin: the configured rate.
#[cfg_attr(not(feature = "adaptive"), path = "fixed.rs")]
mod adaptive;
mod budget;
mod clock;
mod cooldown;
// `apply`'s dispatch of the features' operations, in a file the default build does not read.
#[cfg(any(feature = "shares", feature = "settle", feature = "lease"))]
mod features;
mod gcra;
#[cfg(feature = "lease")]
mod grant;
mod ops;
mod params;
#[cfg(feature = "quota")]
mod probe;
#[cfg(feature = "serde")]
mod ser;
#[cfg(feature = "settle")]
pub mod settle;
#[cfg(feature = "shares")]
mod shares;
mod state;
#[cfg(any(feature = "rule", test))]
mod wire;

// The rule's values read from outside: the accessors a mirroring store needs.
#[cfg(any(feature = "rule", test))]
mod view;

// The values a store handles, and the steps the crate's own code calls by these paths.
pub use self::{
    adaptive::Stretch,
    budget::BUDGET_SLOTS,
    clock::rebase,
    ops::{
        Admission, AdmitRequest, Applied, ClosedBy, Deferred, Event, EventKind, Op, Reply,
        Reservation, StoreState,
    },
    params::{BudgetParams, LimitParams, Params, Unit},
    state::{is_settled, BudgetState, State},
};
// What only a store that mirrors the rule elsewhere needs (feature `rule`): the steps and
// constants its own code reproduces or checks against, and the wire forms (see view.rs).
#[cfg(all(feature = "rule", feature = "adaptive"))]
pub use self::adaptive::{
    ADDITIVE_INCREASE_PERIOD_US, CUT_PER_MILLE, FAST_CUT_PER_MILLE, FAST_CUT_WINDOW_US,
    ROUND_GRACE_US, SLOW_START_DOUBLING_US,
};
#[cfg(feature = "lease")]
pub use self::grant::{lease_slots, Grant, GrantRequest, Granted, HOLDER_WINDOW_US};
#[cfg(any(feature = "rule", feature = "adaptive", test))]
pub use self::params::AdaptiveParams;
#[cfg(feature = "quota")]
pub use self::probe::ProbeOutcome;
#[cfg(feature = "shares")]
#[cfg_attr(not(feature = "rule"), allow(unused_imports))]
pub use self::shares::{
    share_step, ClassState, ShareReply, ShareRequest, HIGH_LEAD, MAX_CLASSES, SHARE_SCALE,
};
#[cfg(feature = "rule")]
pub use self::{cooldown::cooldown_shift, wire::EVENT_WORDS};
#[cfg(any(feature = "rule", test))]
pub use self::{gcra::schedule, wire::ReservationParts};
// The steps only `apply` and this crate's stores call.
#[cfg(feature = "shares")]
pub(crate) use self::shares::{admit_share, ClassKey};
pub(crate) use self::{
    adaptive::{adaptive_rate, advertise, cut_rate, effective_limits},
    budget::{advance, deposit, refund, remaining, spend},
    clock::recreated,
    cooldown::{clear, close, closed, extend_cooldown, pending, throttle},
    gcra::{admit, release, schedule_one},
};

/// The largest delay any store accepts: 2^53 microseconds (about 285 years).
///
/// Every store keeps time as whole microseconds, and Lua numbers (the Redis store's scripts)
/// are exact integers only up to 2^53; a longer delay cannot be represented faithfully.
pub const MAX_DELAY: Duration = Duration::from_micros(MAX_DELAY_US);

/// [`MAX_DELAY`] in microseconds.
pub const MAX_DELAY_US: u64 = 1 << 53;

/// The most limits one allowance holds (a rate, a per-minute and a per-day limit, and a
/// weighted one such as tokens per minute).
pub const MAX_LIMITS: usize = 4;

/// Reserved slots fall on whole multiples of this many microseconds of the store's clock (a
/// millisecond: the granularity of tokio's timers); see [`schedule`].
pub const SLOT_GRANULARITY_US: u64 = 1_000;

/// How long after its slot a reservation still counts as pending when a cooldown is raised
/// (100 ms: well beyond a timer's granularity or a store's round trip).
pub const PENDING_GRACE_US: u64 = 100_000;

/// `closed_until` for a state closed until an operator clears it.
pub const FOREVER: u64 = u64::MAX;

/// Converts a duration to microseconds, rounding up so a wait is never shortened.
///
/// `None` when the duration exceeds [`MAX_DELAY`].
pub fn micros_ceil(d: Duration) -> Option<u64> {
    let rounding = u128::from(!d.subsec_nanos().is_multiple_of(1_000));
    let us = d.as_micros().checked_add(rounding)?;
    u64::try_from(us).ok().filter(|us| *us <= MAX_DELAY_US)
}

/// Converts a duration to microseconds, rounding down and saturating at `u64::MAX` (for
/// bounds that must never be exceeded, such as a maximum wait).
pub fn micros_floor(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn us(d: u64) -> Duration {
    Duration::from_micros(d)
}

/// Applies one operation at `now`, changing `state` as the rule says.
///
/// The one entry point every store mirrors: a store that holds a [`State`] under a lock or
/// in a transaction calls it with its clock's reading in microseconds and is done. Every
/// operation first absorbs a backward clock step (the state's instants move back by it).
pub fn apply(state: &mut State, now: u64, params: &Params, op: &Op) -> Reply {
    rebase(state, now, params);
    // A read creates nothing (its answer then says generation 0: no state). Only a first
    // admission by a caller that knew no state finds the bucket full: any other operation
    // comes from a process that used a state (it has a response to report, a slot to give
    // back), which the store has lost.
    if state.generation == 0 && !matches!(op, Op::Read { .. }) {
        state.generation = now.max(1);
        let first_use = match op {
            Op::Admit(req) => req.known_generation == 0,
            #[cfg(feature = "shares")]
            Op::Share(req) => req.admit.known_generation == 0,
            #[cfg(feature = "lease")]
            Op::Grant(req) => req.known_generation == 0,
            _ => false,
        };
        if !first_use {
            recreated(state, now, params);
        }
    }
    match *op {
        Op::Admit(req) => Reply::Admit(admit(state, now, params, &req)),
        Op::Release(res) => Reply::Release {
            released: release(state, params, &res),
        },
        Op::Defer { delay_us } => Reply::Defer(extend_cooldown(state, now, params, delay_us)),
        Op::Throttle { delay_us, age_us } => {
            Reply::Defer(throttle(state, now, params, delay_us, age_us))
        }
        Op::Advertise { rate_milli } => Reply::Rate {
            rate_milli: advertise(state, now, params, rate_milli),
        },
        Op::Close { delay_us, by } => Reply::Changed(close(state, now, delay_us, by)),
        Op::Clear => Reply::Changed(clear(state, now)),
        Op::Read { deposits } => {
            deposit(&mut state.budget, now, &params.budget, deposits);
            Reply::State(read(state, now, params))
        }
        #[cfg(feature = "quota")]
        Op::Lease { .. } | Op::FinishProbe { .. } => probe::apply(state, now, params, op),
        #[cfg(any(feature = "shares", feature = "settle", feature = "lease"))]
        _ => features::apply(state, now, params, op),
    }
}

/// The shared state as of `now`.
pub fn read(state: &mut State, now: u64, params: &Params) -> StoreState {
    let left = remaining(&mut state.budget, now, &params.budget);
    StoreState {
        blocked_for: us(state.blocked_until.saturating_sub(now)),
        closed: (now < state.closed_until)
            .then(|| (state.closed_until != FOREVER).then(|| us(state.closed_until - now))),
        closed_by: (now < state.closed_until)
            .then(|| ClosedBy::from_code(state.closed_by).unwrap_or(ClosedBy::ServerDelay)),
        retries_remaining: (left != u64::MAX).then_some(left),
        probes: state.probes,
        epoch: state.epoch,
        generation: state.generation,
        rate_milli: adaptive_rate(state, now, params).unwrap_or(0),
    }
}

#[cfg(test)]
pub(crate) mod tests;
