//! The rule: every decision an allowance makes, as a pure function of
//! `(state, now, params, request) -> (reply, new state)`.
//!
//! Nothing here reads a clock, locks, allocates or does I/O. Time is a count of microseconds
//! on the store's own clock (`now`). A [`Store`](crate::store::Store) only applies these
//! functions atomically: [`MemoryStore`](crate::store::MemoryStore) under a compare-and-swap
//! or a lock, the Redis store in a Lua script that transcribes these decisions, most
//! functions under the same names (not in the same order, and with a few helpers of each
//! side's own); the differential property test, not the layout, holds the two to identical
//! answers. [`apply`] is the one entry point; a third-party
//! store that can hold a [`State`] under a lock or in a transaction calls it and is done.
//!
//! ```
//! use std::time::Duration;
//! use tower_allowance::{rule::{self, Admission, AdmitRequest, Op, Reply, State}, AllowanceConfig};
//!
//! let config = AllowanceConfig::per_second(2, 1)?;
//! let mut state = State::default();
//! let first = rule::apply(&mut state, 0, config.params(), &Op::Admit(AdmitRequest::first()));
//! assert!(matches!(first, Reply::Admit(Admission::Admitted)));
//! // The burst is spent: the next caller is given a reserved slot one interval later.
//! let Reply::Admit(Admission::Reserved { wait, .. }) =
//!     rule::apply(&mut state, 0, config.params(), &Op::Admit(AdmitRequest::first()))
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

/// Slots in a replenishing retry budget's sliding window.
pub const BUDGET_SLOTS: u64 = 10;

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
    let us = d
        .as_micros()
        .checked_add(u128::from(!d.subsec_nanos().is_multiple_of(1_000)))?;
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

// === Parameters ===

/// What one limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Unit {
    /// Every request counts one.
    Requests,
    /// Every request counts its cost (for example, the tokens an LLM request carries).
    Cost,
}

/// One limit's derived parameters: a read-only view of a validated configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LimitParams {
    pub(crate) interval_us: u64,
    pub(crate) tolerance_us: u64,
    pub(crate) unit: Unit,
}

impl LimitParams {
    /// Microseconds between two units (period / rate, rounded up so the admitted rate never
    /// exceeds the configured one).
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// `burst * interval_us`: how far ahead of now the limit's theoretical arrival time may run
    /// before an admission has to wait.
    pub fn tolerance_us(&self) -> u64 {
        self.tolerance_us
    }

    /// What the limit counts.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// The units a request of `cost` takes from this limit.
    pub fn units(&self, cost: u32) -> u64 {
        match self.unit {
            Unit::Requests => 1,
            Unit::Cost => u64::from(cost),
        }
    }
}

/// The retry budget's derived parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum BudgetParams {
    /// No group bound.
    Unlimited,
    /// A fixed number of retries for the group.
    Fixed {
        /// Retries in total.
        retries: u64,
    },
    /// A sliding window of [`BUDGET_SLOTS`] slots.
    Replenishing {
        /// Length of one slot, in microseconds.
        slot_us: u64,
        /// Retries always available per window (the floor).
        reserve: u64,
        /// Retries earned per 1,000 successful requests.
        per_mille: u64,
    },
}

/// Every number the rule needs, derived once from an [`AllowanceConfig`](crate::AllowanceConfig)
/// and passed to the store with every call, so that no store re-derives (or drifts from) them.
///
/// A read-only view: obtain it with [`AllowanceConfig::params`](crate::AllowanceConfig::params).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Params {
    pub(crate) limits: [LimitParams; MAX_LIMITS],
    pub(crate) limit_count: usize,
    pub(crate) budget: BudgetParams,
    pub(crate) max_cooldown_us: u64,
    pub(crate) probe_backoff_min_us: u64,
    pub(crate) probe_backoff_max_us: u64,
    pub(crate) adaptive: Option<AdaptiveParams>,
}

/// The adaptive rate's derived parameters: rates in thousandths of a request per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AdaptiveParams {
    pub(crate) initial_milli: u64,
    pub(crate) floor_milli: u64,
    pub(crate) ceiling_milli: u64,
    /// The main limit's burst: the tolerance is `burst` intervals at whatever rate.
    pub(crate) burst: u64,
    /// Take the rate a server advertises (not only cap at it).
    pub(crate) adopt: bool,
}

impl AdaptiveParams {
    /// The rate it starts at.
    pub fn initial_milli(&self) -> u64 {
        self.initial_milli
    }

    /// The lowest rate.
    pub fn floor_milli(&self) -> u64 {
        self.floor_milli
    }

    /// The highest rate.
    pub fn ceiling_milli(&self) -> u64 {
        self.ceiling_milli
    }

    /// The main limit's burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether an advertised rate is adopted.
    pub fn adopts(&self) -> bool {
        self.adopt
    }
}

impl Params {
    /// The limits, at least one.
    pub fn limits(&self) -> &[LimitParams] {
        &self.limits[..self.limit_count]
    }

    /// The retry budget.
    pub fn budget(&self) -> BudgetParams {
        self.budget
    }

    /// The longest cooldown a server may ask for; a longer (or unrepresentable) delay closes
    /// the allowance instead.
    pub fn max_cooldown_us(&self) -> u64 {
        self.max_cooldown_us
    }

    /// The first backoff after a quota probe failed or found quota left.
    pub fn probe_backoff_min_us(&self) -> u64 {
        self.probe_backoff_min_us
    }

    /// The longest backoff between quota probes.
    pub fn probe_backoff_max_us(&self) -> u64 {
        self.probe_backoff_max_us
    }

    /// The adaptive rate, if the main limit's rate adapts.
    pub fn adaptive(&self) -> Option<AdaptiveParams> {
        self.adaptive
    }

    /// Whether the rule can decide a first attempt from the main limit's bucket alone: the
    /// memory store's lock-free path.
    pub(crate) fn single_limit(&self) -> bool {
        self.limit_count == 1 && self.adaptive.is_none()
    }
}

// === State ===

/// The retry budget's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BudgetState {
    /// Fixed budget: retries spent so far.
    pub(crate) spent: u64,
    /// Replenishing: the newest slot, counted in slots since the clock's epoch.
    pub(crate) head_slot: u64,
    pub(crate) deposits: [u64; BUDGET_SLOTS as usize],
    pub(crate) withdrawals: [u64; BUDGET_SLOTS as usize],
}

/// Everything one allowance remembers, on the store's clock (microseconds).
///
/// Stores keep it however they like (atomics, a locked struct, a Redis hash); the rule is
/// the only code that changes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct State {
    /// Each limit's theoretical arrival time.
    pub(crate) tat: [u64; MAX_LIMITS],
    /// No admission before this instant (the shared cooldown).
    pub(crate) blocked_until: u64,
    /// Bumped by every change reservation holders must hear of (cooldown, close, clear).
    pub(crate) epoch: u64,
    /// The latest slot ever reserved: reservations are pending while it is ahead of now.
    pub(crate) reserved_until: u64,
    /// Closed (exhausted) until this instant; 0 when open, [`FOREVER`] until cleared.
    pub(crate) closed_until: u64,
    /// Why it is closed.
    pub(crate) closed_by: u64,
    pub(crate) budget: BudgetState,
    /// The quota probe's lease: held until this instant by `lease_token`.
    pub(crate) lease_until: u64,
    pub(crate) lease_token: u64,
    /// No quota probe before this instant.
    pub(crate) next_probe_at: u64,
    /// Consecutive failed probes (doubles the backoff).
    pub(crate) probe_failures: u64,
    /// Quota probes granted so far.
    pub(crate) probes: u64,
    /// Adaptive rate: the rate at the last cut (or the initial one), thousandths per second.
    pub(crate) rate_at_cut: u64,
    /// Adaptive rate: when it was last cut (0: never; the rate is still doubling).
    pub(crate) cut_at: u64,
    /// Adaptive rate: when its slow start began (the first admission).
    pub(crate) started_at: u64,
    /// Adaptive rate: the rate a server advertised (0: none).
    pub(crate) advertised: u64,
    /// The latest clock reading seen (detects a backward step).
    pub(crate) seen: u64,
    /// Total backward steps absorbed, in microseconds.
    pub(crate) rebased: u64,
    /// When this state was created, on the store's clock (0: not yet): a state lost and
    /// recreated (a Redis `FLUSHALL`, a restart without persistence) has another one, so the
    /// holders of reservations made in the old one know to ask again.
    pub(crate) generation: u64,
}

impl State {
    /// Applies one operation at `now` (the store's clock, in microseconds): the whole rule,
    /// one atomic step. A store that keeps a `State` under a lock or in a transaction calls
    /// this and is done.
    pub fn apply(&mut self, now: u64, params: &Params, op: &Op) -> Reply {
        apply(self, now, params, op)
    }

    /// Whether dropping this state and starting over from a fresh one would let nothing
    /// through that keeping it would not: no cooldown or closure running, every bucket full,
    /// no reservation pending, no retry budget spent, nothing learned by an adaptive rate.
    pub fn is_settled(&self, now: u64, params: &Params) -> bool {
        is_settled(self, now, params)
    }

    /// The cooldown deadline.
    pub fn blocked_until(&self) -> u64 {
        self.blocked_until
    }

    /// The event epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Each limit's theoretical arrival time.
    pub fn tat(&self) -> [u64; MAX_LIMITS] {
        self.tat
    }

    /// When this state was created (0: not yet).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

// === Operations and replies ===

/// What an admission asks for.
///
/// ```
/// use std::time::Duration;
/// use tower_allowance::rule::AdmitRequest;
///
/// let retry = AdmitRequest::retry().cost(3).not_before(Duration::from_secs(1)).max_wait(Duration::from_secs(10));
/// assert!(retry.is_retry());
/// assert_eq!(retry.cost_units(), 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmitRequest {
    pub(crate) cost: u32,
    pub(crate) retry: bool,
    pub(crate) not_before_us: u64,
    pub(crate) max_wait_us: u64,
    pub(crate) deposits: u64,
    pub(crate) known_generation: u64,
}

impl AdmitRequest {
    /// A first attempt of cost 1, willing to wait however long.
    pub const fn first() -> Self {
        Self {
            cost: 1,
            retry: false,
            not_before_us: 0,
            max_wait_us: u64::MAX,
            deposits: 0,
            known_generation: 0,
        }
    }

    /// A retry: spends one unit of the retry budget in the same step, or is refused with
    /// `Admission::BudgetExhausted`.
    pub const fn retry() -> Self {
        let mut r = Self::first();
        r.retry = true;
        r
    }

    /// The request's cost, charged to limits that count cost
    /// ([`Limit::counting_cost`](crate::Limit::counting_cost)).
    pub const fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// Not before `delay` from now, rounded up.
    ///
    /// Meant for delays that hold for the whole allowance anyway (a server's `Retry-After`,
    /// which the cooldown normally already covers): the slot is reserved in the schedule, so
    /// callers arriving later queue behind it. A caller's private backoff is better slept
    /// before asking.
    pub fn not_before(mut self, delay: Duration) -> Self {
        self.not_before_us = micros_ceil(delay).unwrap_or(MAX_DELAY_US);
        self
    }

    /// Reserve nothing when the admission would be later than `max_wait` from now.
    /// `Duration::ZERO` means "only now".
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait_us = micros_floor(max_wait);
        self
    }

    /// Record `n` successful requests (for a replenishing budget) first, in the same step.
    pub const fn deposits(mut self, n: u64) -> Self {
        self.deposits = n;
        self
    }

    /// The generation of the state the caller last heard of (0: none). When the store has
    /// lost that state, the new one it creates for this request starts with an empty bucket
    /// rather than a full one: the provider's bucket was likely being used, and the holders
    /// of the lost reservations are about to ask again.
    pub const fn known_generation(mut self, generation: u64) -> Self {
        self.known_generation = generation;
        self
    }

    /// See [`AdmitRequest::known_generation`].
    pub fn known_generation_of(&self) -> u64 {
        self.known_generation
    }

    /// Whether this is a retry.
    pub fn is_retry(&self) -> bool {
        self.retry
    }

    /// The cost.
    pub fn cost_units(&self) -> u32 {
        self.cost
    }

    /// Not before this many microseconds from now.
    pub fn not_before_us(&self) -> u64 {
        self.not_before_us
    }

    /// At most this many microseconds from now (`u64::MAX`: unbounded).
    pub fn max_wait_us(&self) -> u64 {
        self.max_wait_us
    }

    /// Successes to record first.
    pub fn deposit_count(&self) -> u64 {
        self.deposits
    }
}

/// A slot reserved for a caller: what it needs to apply later events and to give the slot
/// back ([`Op::Release`]) if it leaves before using it. All times are on the store's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub(crate) slot: u64,
    pub(crate) tat: [u64; MAX_LIMITS],
    pub(crate) generation: u64,
    pub(crate) epoch: u64,
    pub(crate) rebased: u64,
    pub(crate) cost: u32,
    pub(crate) retry: bool,
    pub(crate) budget_slot: u64,
}

/// A [`Reservation`]'s fields, for stores that carry it over the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReservationParts {
    /// The reserved instant.
    pub slot: u64,
    /// Each limit's theoretical arrival time after the reservation.
    pub tat: [u64; MAX_LIMITS],
    /// The state's generation (see [`State::generation`]); 0 when the store holds no state
    /// (never used, or lost and not yet recreated: a read creates none).
    pub generation: u64,
    /// The event epoch the reservation has seen.
    pub epoch: u64,
    /// The store's total backward clock steps when it was made.
    pub rebased: u64,
    /// The request's cost.
    pub cost: u32,
    /// Whether it spent a unit of retry budget.
    pub retry: bool,
    /// The budget slot it was recorded in.
    pub budget_slot: u64,
}

impl ReservationParts {
    /// The parts of a reservation made for a request of `cost` (`retry`: spending budget).
    #[allow(clippy::too_many_arguments, reason = "one per field, for decoders")]
    pub fn new(
        slot: u64,
        tat: [u64; MAX_LIMITS],
        generation: u64,
        epoch: u64,
        rebased: u64,
        cost: u32,
        retry: bool,
        budget_slot: u64,
    ) -> Self {
        Self {
            slot,
            tat,
            generation,
            epoch,
            rebased,
            cost,
            retry,
            budget_slot,
        }
    }
}

impl Reservation {
    /// Its fields.
    pub fn to_parts(self) -> ReservationParts {
        ReservationParts {
            slot: self.slot,
            tat: self.tat,
            generation: self.generation,
            epoch: self.epoch,
            rebased: self.rebased,
            cost: self.cost,
            retry: self.retry,
            budget_slot: self.budget_slot,
        }
    }

    /// A reservation from its fields (as a store decoded them).
    pub fn from_parts(p: ReservationParts) -> Self {
        Self {
            slot: p.slot,
            tat: p.tat,
            generation: p.generation,
            epoch: p.epoch,
            rebased: p.rebased,
            cost: p.cost,
            retry: p.retry,
            budget_slot: p.budget_slot,
        }
    }

    /// The reserved instant, on the store's clock.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// The event epoch the reservation has seen.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The generation of the state it was made in.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Applies an event the store published after this reservation was made.
    ///
    /// Events apply in epoch order, each once: one already seen changes nothing
    /// ([`Applied::Seen`]); one beyond the next expected epoch is not applied
    /// ([`Applied::Gap`]) until the events in between have been. An event of another
    /// generation of the state ([`Applied::Lost`]) means the state this reservation was made
    /// in is gone: its schedule, and so this slot's place in it, are unknown to the store.
    pub fn apply(&mut self, event: &Event, params: &Params) -> Applied {
        if event.generation != self.generation {
            return Applied::Lost;
        }
        if event.epoch <= self.epoch {
            return Applied::Seen;
        }
        if event.epoch > self.epoch + 1 {
            return Applied::Gap;
        }
        self.epoch = event.epoch;
        // A clock step since the reservation: move our instants into the store's new frame.
        let step = event.rebased.saturating_sub(self.rebased);
        if step > 0 {
            self.rebased = event.rebased;
            self.slot = self.slot.saturating_sub(step);
            for t in &mut self.tat {
                *t = t.saturating_sub(step);
            }
        }
        match event.kind {
            EventKind::Cooldown { until, shift } => {
                // The store moved each limit's schedule; the slot is the earliest instant at
                // which every limit conforms again, never before the cooldown's end and never
                // earlier than it was.
                let old = self.slot;
                let n = params.limit_count;
                let least = shift[..n].iter().copied().min().unwrap_or(0);
                let mut slot = old.saturating_add(least).max(until);
                if params.adaptive.is_none() {
                    for (l, limit) in params.limits().iter().enumerate() {
                        slot = slot.max(
                            self.tat[l]
                                .saturating_add(shift[l])
                                .saturating_sub(limit.tolerance_us),
                        );
                    }
                }
                for (t, s) in self.tat[..n].iter_mut().zip(shift) {
                    *t = t.saturating_add(s);
                }
                self.slot = slot;
                Applied::Moved(slot - old)
            }
            EventKind::Closed { .. } => Applied::Closed,
            EventKind::Cleared | EventKind::Created => Applied::Moved(0),
        }
    }
}

/// What [`Reservation::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The event was already applied (or older).
    Seen,
    /// An earlier event is missing: apply that one first.
    Gap,
    /// Applied: the slot is now this many microseconds later (zero: unchanged).
    Moved(u64),
    /// The allowance closed: the reservation cannot be used.
    Closed,
    /// The store lost the state the reservation was made in (and made a new one): ask
    /// again, no earlier than the slot, so the new state schedules it.
    Lost,
}

/// Words in an encoded [`Event`]: generation, epoch, rebased, kind, and five per kind.
pub const EVENT_WORDS: usize = 9;

/// Something every holder of a reservation must hear of, published by the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub(crate) generation: u64,
    pub(crate) epoch: u64,
    pub(crate) rebased: u64,
    pub(crate) kind: EventKind,
}

impl Event {
    /// The event's epoch: events are applied in epoch order, each once.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What happened.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The generation of the state that published it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Encodes the event as integers (for a store that publishes it, such as Redis).
    pub fn to_words(&self) -> [u64; EVENT_WORDS] {
        let mut w = [0; EVENT_WORDS];
        w[0] = self.generation;
        w[1] = self.epoch;
        w[2] = self.rebased;
        match self.kind {
            EventKind::Cooldown { until, shift } => {
                w[3] = 1;
                w[4] = until;
                w[5..].copy_from_slice(&shift);
            }
            EventKind::Closed { until, by } => {
                w[3] = 2;
                w[4] = until;
                w[5] = by as u64;
            }
            EventKind::Cleared => w[3] = 3,
            EventKind::Created => w[3] = 4,
        }
        w
    }

    /// Decodes [`Event::to_words`]; `None` for anything else.
    pub fn from_words(w: &[u64]) -> Option<Self> {
        if w.len() != EVENT_WORDS {
            return None;
        }
        let kind = match w[3] {
            1 => {
                let mut shift = [0; MAX_LIMITS];
                shift.copy_from_slice(&w[5..]);
                EventKind::Cooldown { until: w[4], shift }
            }
            2 => EventKind::Closed {
                until: w[4],
                by: ClosedBy::from_code(w[5])?,
            },
            3 => EventKind::Cleared,
            4 => EventKind::Created,
            _ => return None,
        };
        Some(Self {
            generation: w[0],
            epoch: w[1],
            rebased: w[2],
            kind,
        })
    }
}

/// What an [`Event`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The cooldown was extended to `until`; each limit's pending schedule moved by its shift.
    Cooldown {
        /// The new cooldown deadline, on the store's clock.
        until: u64,
        /// Per limit, microseconds the pending schedule moved (zeros when none was pending).
        shift: [u64; MAX_LIMITS],
    },
    /// The allowance closed until `until` ([`FOREVER`]: until cleared).
    Closed {
        /// On the store's clock.
        until: u64,
        /// Why.
        by: ClosedBy,
    },
    /// An operator cleared the cooldown and the closed state.
    Cleared,
    /// The state was created: first use, or the store lost the previous one (a Redis
    /// `FLUSHALL`, a restart without persistence). Published by stores that can lose their
    /// state, so every holder of a reservation in a lost one asks again at once.
    Created,
}

/// Why an allowance is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ClosedBy {
    /// A quota probe found the provider's quota spent.
    Quota = 1,
    /// A server asked for a wait longer than `max_cooldown` (or too long to represent).
    ServerDelay = 2,
}

impl ClosedBy {
    /// The numeric code stores keep.
    pub fn code(self) -> u64 {
        self as u64
    }

    /// From [`ClosedBy::code`].
    pub fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(Self::Quota),
            2 => Some(Self::ServerDelay),
            _ => None,
        }
    }
}

/// The answer to an admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted now: a token (and, for a retry, a unit of budget) was spent.
    Admitted,
    /// A slot was reserved `wait` from now; the token (and budget) is spent. Sleep, then send
    /// without asking again; if the caller leaves first, [`Op::Release`] gives it back.
    Reserved {
        /// Time until the slot.
        wait: Duration,
        /// The slot, for events and release.
        reservation: Reservation,
    },
    /// The admission would be `wait` from now, later than the request's `max_wait`: nothing
    /// was spent or reserved.
    Refused {
        /// Time until an admission could happen.
        wait: Duration,
        /// The shared cooldown is (part of) the reason.
        cooldown: bool,
    },
    /// A retry was refused: the shared retry budget is spent. Nothing was spent.
    BudgetExhausted,
    /// The allowance is closed (exhausted). Nothing was spent.
    Closed {
        /// Time until it reopens; `None`: until an operator clears it.
        until: Option<Duration>,
        /// Why.
        by: ClosedBy,
    },
    /// The request's cost exceeds some limit's burst: it can never be admitted.
    TooCostly,
}

/// The answer to a cooldown raise ([`Op::Defer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deferred {
    /// Whether the cooldown moved later (it never moves earlier).
    pub extended: bool,
    /// Time from now until the (possibly unchanged) cooldown deadline.
    pub blocked_for: Duration,
    /// Set when the delay closed the allowance instead (longer than `max_cooldown`).
    pub closed: Option<Option<Duration>>,
    /// What reservation holders must apply, when anything changed.
    pub event: Option<Event>,
}

/// What a quota probe found, reported with [`Op::FinishProbe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Quota remains.
    Available,
    /// The quota is spent until `retry_in` from now.
    Exhausted {
        /// Time until it renews.
        retry_in: Duration,
    },
    /// The probe failed (an error, a panic, a cancellation): back off before the next one.
    Failed,
}

/// A read of the shared state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StoreState {
    /// Time until the cooldown ends; zero when not cooling down.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub blocked_for: Duration,
    /// `Some(Some(d))`: closed for `d`; `Some(None)`: closed until cleared; `None`: open.
    ///
    /// In JSON (feature `serde`): `null` when open, `{ "for": "2s" }` when closed for a
    /// while, `{ "for": null }` when closed until cleared.
    #[cfg_attr(feature = "serde", serde(serialize_with = "closed_json"))]
    pub closed: Option<Option<Duration>>,
    /// Why it is closed; `None` when open.
    pub closed_by: Option<ClosedBy>,
    /// Retries that could be spent now; `None` for an unlimited budget.
    pub retries_remaining: Option<u64>,
    /// Quota probes granted so far (across every process).
    pub probes: u64,
    /// The event epoch.
    pub epoch: u64,
    /// The state's generation (see [`State::generation`]); 0 when the store holds no state
    /// (never used, or lost and not yet recreated: a read creates none).
    pub generation: u64,
    /// The adaptive rate now, in thousandths of a request per second (0: not adaptive).
    pub rate_milli: u64,
}

/// [`StoreState::closed`] without the ambiguity of a nested `Option` (which serde would
/// write as `null` both when open and when closed until cleared).
#[cfg(feature = "serde")]
fn closed_json<S: serde::Serializer>(
    closed: &Option<Option<Duration>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    match closed {
        None => serializer.serialize_none(),
        Some(d) => {
            let mut map = serializer.serialize_map(Some(1))?;
            map.serialize_entry("for", &d.map(humantime_serde::Serde::from))?;
            map.end()
        }
    }
}

/// One operation on an allowance's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Admit (or reserve for) one attempt.
    Admit(AdmitRequest),
    /// Give a reserved slot back (its holder left before using it).
    Release(Reservation),
    /// Raise the cooldown to `delay` from now; `None`: a delay too long to represent.
    Defer {
        /// Microseconds, or `None` when unrepresentable.
        delay_us: Option<u64>,
    },
    /// A throttling response arrived (to a request sent `age_us` ago), asking for
    /// `delay_us` (`Some(0)`: no delay; `None`: one too long to represent): the adaptive rate
    /// is cut (once per round of requests), and the cooldown raised as [`Op::Defer`] does.
    Throttle {
        /// Microseconds, `Some(0)` for none, or `None` when unrepresentable.
        delay_us: Option<u64>,
        /// How long ago the throttled request was sent.
        age_us: u64,
    },
    /// A server advertised its rate (thousandths of a request per second): the adaptive rate
    /// never goes above it, and adopts it when configured to.
    Advertise {
        /// The advertised rate, in thousandths per second.
        rate_milli: u64,
    },
    /// Close the allowance for `delay_us` (`None`: until cleared).
    Close {
        /// Microseconds, or `None` for until cleared.
        delay_us: Option<u64>,
        /// Why.
        by: ClosedBy,
    },
    /// Lift the cooldown, the closed state and the probe backoff (an operator's decision).
    Clear,
    /// Take the quota probe's single-flight lease for `ttl_us`, as `token`.
    Lease {
        /// How long the lease lasts unless finished (a dead prober's lease expires).
        ttl_us: u64,
        /// The prober's token.
        token: u64,
    },
    /// Report a quota probe's outcome and release the lease held as `token`.
    FinishProbe {
        /// The prober's token.
        token: u64,
        /// What it found.
        outcome: ProbeOutcome,
    },
    /// Read the state (recording `deposits` successes first).
    Read {
        /// Successes to record first.
        deposits: u64,
    },
}

/// The answer to an [`Op`], variant for variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// To [`Op::Admit`].
    Admit(Admission),
    /// To [`Op::Release`]: whether the slot went back to the schedule (it was still the latest).
    Release {
        /// The slot was the latest on every limit and was given back.
        released: bool,
    },
    /// To [`Op::Defer`] and [`Op::Throttle`].
    Defer(Deferred),
    /// To [`Op::Advertise`]: the adaptive rate now, in thousandths per second (0 when the
    /// allowance's rate does not adapt).
    Rate {
        /// Thousandths of a request per second.
        rate_milli: u64,
    },
    /// To [`Op::Close`] and [`Op::Clear`]: the event holders must apply.
    Changed(Event),
    /// To [`Op::Lease`].
    Lease {
        /// Whether this caller holds the lease now and should probe.
        granted: bool,
    },
    /// To [`Op::FinishProbe`]: the event when the probe closed the allowance.
    ProbeFinished(Option<Event>),
    /// To [`Op::Read`].
    State(StoreState),
}

// === The rule ===

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
        let first_use = matches!(op, Op::Admit(req) if req.known_generation == 0);
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
        Op::Lease { ttl_us, token } => Reply::Lease {
            granted: lease(state, now, ttl_us, token),
        },
        Op::FinishProbe { token, outcome } => {
            Reply::ProbeFinished(finish_probe(state, now, params, token, outcome))
        }
        Op::Read { deposits } => {
            deposit(&mut state.budget, now, &params.budget, deposits);
            Reply::State(read(state, now, params))
        }
    }
}

/// A backward clock step: moves every stored instant back by the step, so that no wait
/// grows by it. Forward, it only records `now`.
pub fn rebase(state: &mut State, now: u64, params: &Params) {
    if now >= state.seen {
        state.seen = now;
        return;
    }
    let step = state.seen - now;
    let back = |t: &mut u64| *t = t.saturating_sub(step);
    state.tat.iter_mut().for_each(back);
    back(&mut state.blocked_until);
    back(&mut state.reserved_until);
    back(&mut state.cut_at);
    back(&mut state.started_at);
    if state.closed_until != FOREVER {
        back(&mut state.closed_until);
    }
    back(&mut state.lease_until);
    back(&mut state.next_probe_at);
    if let BudgetParams::Replenishing { slot_us, .. } = params.budget {
        state.budget.head_slot = state.budget.head_slot.saturating_sub(step / slot_us.max(1));
    }
    state.rebased = state.rebased.saturating_add(step);
    state.seen = now;
}

/// A state created for a caller that knew an earlier one (the store lost it), or by any
/// operation but an admission (only a process that used the state reports a response,
/// releases a slot or reads it to catch up): every limit starts empty, its next unit one
/// interval away, instead of with the full burst. After a loss, the provider's bucket was
/// likely in use and the lost reservations' holders are about to ask again: a full burst now
/// would be sent on top of them.
pub fn recreated(state: &mut State, now: u64, params: &Params) {
    for (t, limit) in state.tat.iter_mut().zip(params.limits()) {
        *t = now.saturating_add(limit.tolerance_us);
    }
}

/// Whether the allowance is closed at `now`: the admission's answer if it is.
pub fn closed(closed_until: u64, closed_by: u64, now: u64) -> Option<Admission> {
    (now < closed_until).then(|| Admission::Closed {
        until: (closed_until != FOREVER).then(|| us(closed_until - now)),
        by: ClosedBy::from_code(closed_by).unwrap_or(ClosedBy::ServerDelay),
    })
}

/// The earliest instant at which every limit admits `cost`, no earlier than `t0`, and each
/// limit's theoretical arrival time after that admission. `None` when some limit can never
/// admit `cost` (it exceeds that limit's burst).
///
/// A slot later than `now` is rounded up to a whole [`SLOT_GRANULARITY_US`] (of the store's
/// clock): timers fire on whole milliseconds, so slots on one grid are all delayed by the
/// same amount, and a caller is never sent a fraction of a millisecond early relative to the
/// caller before it (a strict limiter counting to the millisecond would refuse it).
pub fn schedule(
    tat: &[u64],
    limits: &[LimitParams],
    now: u64,
    t0: u64,
    cost: u32,
) -> Option<(u64, [u64; MAX_LIMITS])> {
    let mut at = t0;
    // Each limit's increment for this cost, computed once.
    let mut inc = [0u64; MAX_LIMITS];
    for ((t, limit), i) in tat.iter().zip(limits).zip(&mut inc) {
        *i = limit.units(cost).checked_mul(limit.interval_us)?;
        if *i > limit.tolerance_us {
            return None;
        }
        // The limit conforms from `max(tat, t) + inc - tolerance` on.
        let earliest = (*t)
            .max(t0)
            .saturating_add(*i)
            .saturating_sub(limit.tolerance_us);
        at = at.max(earliest);
    }
    if at > now {
        at = at
            .div_ceil(SLOT_GRANULARITY_US)
            .saturating_mul(SLOT_GRANULARITY_US);
    }
    let mut new_tat = [0; MAX_LIMITS];
    for ((n, t), i) in new_tat.iter_mut().zip(tat).zip(inc) {
        *n = (*t).max(at).saturating_add(i);
    }
    Some((at, new_tat))
}

/// [`schedule`] for one limit: the same arithmetic without the arrays, for the in-memory
/// store's lock-free first attempt (a property test holds the two equal).
#[inline]
pub fn schedule_one(
    tat: u64,
    limit: &LimitParams,
    now: u64,
    t0: u64,
    cost: u32,
) -> Option<(u64, u64)> {
    let inc = limit.units(cost).checked_mul(limit.interval_us)?;
    if inc > limit.tolerance_us {
        return None;
    }
    let mut at = t0.max(
        tat.max(t0)
            .saturating_add(inc)
            .saturating_sub(limit.tolerance_us),
    );
    if at > now {
        at = at
            .div_ceil(SLOT_GRANULARITY_US)
            .saturating_mul(SLOT_GRANULARITY_US);
    }
    Some((at, tat.max(at).saturating_add(inc)))
}

/// Decides one admission at `now`: deposits, closed, budget, then the schedule.
///
/// The order is part of the rule. Nothing changes unless the answer is `Admitted` or
/// `Reserved`, deposits aside: they record successes that already happened.
pub fn admit(state: &mut State, now: u64, params: &Params, req: &AdmitRequest) -> Admission {
    deposit(&mut state.budget, now, &params.budget, req.deposits);
    if let Some(answer) = closed(state.closed_until, state.closed_by, now) {
        return answer;
    }
    if req.retry && remaining(&mut state.budget, now, &params.budget) < 1 {
        return Admission::BudgetExhausted;
    }
    let natural = now.max(state.blocked_until);
    let t0 = natural.max(now.saturating_add(req.not_before_us));
    let n = params.limit_count;
    if params.adaptive.is_some() && state.started_at == 0 {
        state.started_at = now.max(1);
    }
    // The configured limits, unless an adaptive rate moves the first (no copy otherwise).
    let adapted;
    let limits = if params.adaptive.is_some() {
        adapted = effective_limits(state, now, params);
        &adapted[..n]
    } else {
        params.limits()
    };
    let Some((at, new_tat)) = schedule(&state.tat[..n], limits, now, t0, req.cost) else {
        return Admission::TooCostly;
    };
    let wait = at - now;
    if wait > req.max_wait_us {
        return Admission::Refused {
            wait: us(wait),
            cooldown: state.blocked_until > now,
        };
    }
    state.tat[..n].copy_from_slice(&new_tat[..n]);
    let budget_slot = if req.retry {
        spend(&mut state.budget, now, &params.budget)
    } else {
        0
    };
    if wait == 0 {
        return Admission::Admitted;
    }
    state.reserved_until = state.reserved_until.max(at);
    Admission::Reserved {
        wait: us(wait),
        reservation: Reservation {
            slot: at,
            tat: new_tat,
            generation: state.generation,
            epoch: state.epoch,
            rebased: state.rebased,
            cost: req.cost,
            retry: req.retry,
            budget_slot,
        },
    }
}

/// Gives a reserved slot back: each limit whose schedule still ends with this reservation
/// moves back by its units; a retry's budget unit is refunded. Returns whether every limit
/// took its slot back (otherwise the rest is a bounded loss: at most this one slot).
pub fn release(state: &mut State, params: &Params, res: &Reservation) -> bool {
    if res.generation != state.generation {
        // Made in a state that is gone: the current one never scheduled it.
        return false;
    }
    // A reservation from before a clock step: translate it into the current frame.
    let step = state.rebased.saturating_sub(res.rebased);
    let mut all = true;
    // The units it took: its own tat minus the one before it is not known, so the interval
    // it was charged is the limit's (for an adaptive rate: as at its slot).
    let limits = effective_limits(state, res.slot, params);
    for (l, limit) in limits[..params.limit_count].iter().enumerate() {
        let mine = res.tat[l].saturating_sub(step);
        if state.tat[l] == mine {
            state.tat[l] = mine.saturating_sub(limit.units(res.cost) * limit.interval_us);
        } else {
            all = false;
        }
    }
    if res.retry {
        refund(&mut state.budget, &params.budget, res.budget_slot);
    }
    all
}

/// Raises the cooldown to `now + delay` (max semantics) and translates pending reservations
/// past it (see the module docs); a delay beyond `max_cooldown` (or unrepresentable) closes
/// the allowance instead.
pub fn extend_cooldown(
    state: &mut State,
    now: u64,
    params: &Params,
    delay_us: Option<u64>,
) -> Deferred {
    let too_long = delay_us.is_none_or(|d| d > params.max_cooldown_us);
    if too_long {
        let event = close(state, now, delay_us, ClosedBy::ServerDelay);
        return Deferred {
            extended: false,
            blocked_for: us(state.blocked_until.saturating_sub(now)),
            closed: Some(
                (state.closed_until != FOREVER).then(|| us(state.closed_until.saturating_sub(now))),
            ),
            event: Some(event),
        };
    }
    let until = now.saturating_add(delay_us.unwrap_or(0));
    if until <= state.blocked_until {
        return Deferred {
            extended: false,
            blocked_for: us(state.blocked_until.saturating_sub(now)),
            closed: None,
            event: None,
        };
    }
    let shift = cooldown_shift(state, now, until, params);
    for (l, s) in shift.iter().enumerate().take(params.limit_count) {
        state.tat[l] = state.tat[l].saturating_add(*s);
    }
    if shift.iter().any(|s| *s > 0) {
        // The last reservation's new slot: where every limit conforms again.
        let mut last = until;
        for (l, limit) in params.limits().iter().enumerate() {
            last = last.max(state.tat[l].saturating_sub(limit.tolerance_us));
        }
        state.reserved_until = state.reserved_until.max(last);
    }
    state.blocked_until = until;
    state.epoch += 1;
    Deferred {
        extended: true,
        blocked_for: us(until - now),
        closed: None,
        event: Some(Event {
            generation: state.generation,
            epoch: state.epoch,
            rebased: state.rebased,
            kind: EventKind::Cooldown { until, shift },
        }),
    }
}

/// How far each limit's pending schedule moves when the cooldown is raised to `until` at
/// `now`.
///
/// - Nothing pending (no reservation due later than `PENDING_GRACE_US` ago): nothing moves;
///   the bucket refills while blocked, and callers arriving later get the recovered burst.
/// - Otherwise the pending schedule translates rigidly by the time added,
///   `until - max(now, previous deadline)`, on every limit: each holder keeps its place and
///   its spacing, and the bucket's accounting moves with them (as if time stood still
///   during the cooldown). Holders do not also get the burst that recovers meanwhile: which
///   of the pending slots that burst could absorb depends on how many are pending, which the
///   state does not know, and granting it on a guess sent more than burst + rate x window
///   (a property test found it: a cooldown raised while the previous one's burst was still
///   pending).
pub fn cooldown_shift(state: &State, now: u64, until: u64, params: &Params) -> [u64; MAX_LIMITS] {
    let mut shift = [0; MAX_LIMITS];
    if pending(state, now) {
        let rigid = until.saturating_sub(now.max(state.blocked_until));
        shift[..params.limit_count].fill(rigid);
    }
    shift
}

/// Whether a reservation counts as pending at `now`: one was made, due no longer than
/// [`PENDING_GRACE_US`] ago.
fn pending(state: &State, now: u64) -> bool {
    state.reserved_until != 0 && state.reserved_until.saturating_add(PENDING_GRACE_US) > now
}

/// The adaptive rate at `now`, in thousandths of a request per second, if the rate adapts.
///
/// Before the first throttling response it doubles every second from the initial rate (a
/// slow start: an unknown limit is found in a few seconds from far below it). After a cut it
/// grows by 1% of the rate at the cut per second (additive increase: it stays near the limit,
/// probing it rarely). Always within the floor and the ceiling, and never above a rate the
/// server advertised.
pub fn adaptive_rate(state: &State, now: u64, params: &Params) -> Option<u64> {
    let a = params.adaptive?;
    let base = if state.rate_at_cut == 0 {
        a.initial_milli
    } else {
        state.rate_at_cut
    };
    let rate = if state.cut_at == 0 {
        // Doubling each whole second since the first admission.
        let since = if state.started_at == 0 {
            0
        } else {
            now.saturating_sub(state.started_at)
        };
        let doublings = since / SLOW_START_DOUBLING_US;
        if doublings >= 40 {
            u64::MAX
        } else {
            base.saturating_mul(1 << doublings)
        }
    } else {
        // base * since / period, computed so that no product exceeds 2^53 (exact in Lua).
        let since = now.saturating_sub(state.cut_at);
        let (q, r) = (
            since / ADDITIVE_INCREASE_PERIOD_US,
            since % ADDITIVE_INCREASE_PERIOD_US,
        );
        base.saturating_add(
            base.saturating_mul(q)
                .saturating_add(base.saturating_mul(r) / ADDITIVE_INCREASE_PERIOD_US),
        )
    };
    let mut ceiling = a.ceiling_milli;
    if state.advertised != 0 {
        ceiling = ceiling.min(state.advertised);
    }
    Some(rate.min(ceiling).max(a.floor_milli))
}

/// A slow start doubles the adaptive rate this often (one second).
pub const SLOW_START_DOUBLING_US: u64 = 1_000_000;

/// After a cut the adaptive rate grows by its value at the cut every this long (100 s: 1% per
/// second).
pub const ADDITIVE_INCREASE_PERIOD_US: u64 = 100_000_000;

/// A cut keeps this many thousandths of the rate (0.85).
pub const CUT_PER_MILLE: u64 = 850;

/// A cut within [`FAST_CUT_WINDOW_US`] of the previous one keeps this many thousandths (0.7):
/// throttling that persists after a cut means the limit dropped, and it is found faster.
pub const FAST_CUT_PER_MILLE: u64 = 700;

/// See [`FAST_CUT_PER_MILLE`] (2.5 s).
pub const FAST_CUT_WINDOW_US: u64 = 2_500_000;

/// The limits as they stand at `now`: the configured ones, with the main limit's interval
/// from the adaptive rate when it adapts.
pub fn effective_limits(state: &State, now: u64, params: &Params) -> [LimitParams; MAX_LIMITS] {
    let mut limits = params.limits;
    if let (Some(rate), Some(a)) = (adaptive_rate(state, now, params), params.adaptive) {
        let interval_us = 1_000_000_000u64.div_ceil(rate.max(1)).max(1);
        limits[0].interval_us = interval_us;
        limits[0].tolerance_us = interval_us.saturating_mul(a.burst).min(MAX_DELAY_US);
    }
    limits
}

/// A throttling response: cuts the adaptive rate (unless the throttled request was sent
/// before the last cut: one cut per round of requests in flight), then raises the cooldown
/// as [`extend_cooldown`] does when the response asked for a delay.
pub fn throttle(
    state: &mut State,
    now: u64,
    params: &Params,
    delay_us: Option<u64>,
    age_us: u64,
) -> Deferred {
    if let Some(rate) = adaptive_rate(state, now, params) {
        let sent = now.saturating_sub(age_us);
        if state.cut_at == 0 || sent > state.cut_at {
            let fast = state.cut_at != 0 && now - state.cut_at < FAST_CUT_WINDOW_US;
            let keep = if fast {
                FAST_CUT_PER_MILLE
            } else {
                CUT_PER_MILLE
            };
            let floor = params.adaptive.map_or(1, |a| a.floor_milli.max(1));
            state.rate_at_cut = (rate.saturating_mul(keep) / 1_000).max(floor);
            state.cut_at = now.max(1);
        }
    }
    match delay_us {
        Some(0) => Deferred {
            extended: false,
            blocked_for: us(state.blocked_until.saturating_sub(now)),
            closed: None,
            event: None,
        },
        delay => extend_cooldown(state, now, params, delay),
    }
}

/// A server advertised its rate: the adaptive rate is capped at it from now on and, when
/// configured to adopt it, restarts from it. Returns the adaptive rate now (0: not adaptive).
pub fn advertise(state: &mut State, now: u64, params: &Params, rate_milli: u64) -> u64 {
    let Some(a) = params.adaptive else {
        return 0;
    };
    if rate_milli == 0 {
        return adaptive_rate(state, now, params).unwrap_or(0);
    }
    state.advertised = rate_milli;
    if a.adopt {
        state.rate_at_cut = rate_milli.min(a.ceiling_milli).max(a.floor_milli);
        state.cut_at = now.max(1);
    }
    adaptive_rate(state, now, params).unwrap_or(0)
}

/// Closes the allowance for `delay_us` from now (`None`: until cleared); a longer closure
/// wins over a shorter one.
pub fn close(state: &mut State, now: u64, delay_us: Option<u64>, by: ClosedBy) -> Event {
    let until = match delay_us {
        Some(d) if d <= MAX_DELAY_US => now.saturating_add(d),
        _ => FOREVER,
    };
    if until > state.closed_until {
        state.closed_until = until;
        state.closed_by = by.code();
    }
    state.epoch += 1;
    Event {
        generation: state.generation,
        epoch: state.epoch,
        rebased: state.rebased,
        kind: EventKind::Closed {
            until: state.closed_until,
            by: ClosedBy::from_code(state.closed_by).unwrap_or(by),
        },
    }
}

/// Lifts the cooldown, the closed state and the probe backoff.
pub fn clear(state: &mut State, now: u64) -> Event {
    state.blocked_until = state.blocked_until.min(now);
    state.closed_until = 0;
    state.closed_by = 0;
    state.next_probe_at = 0;
    state.probe_failures = 0;
    state.epoch += 1;
    Event {
        generation: state.generation,
        epoch: state.epoch,
        rebased: state.rebased,
        kind: EventKind::Cleared,
    }
}

/// Grants the quota probe's lease to `token` unless the allowance is closed, a probe is
/// backing off, or another prober holds an unexpired lease.
pub fn lease(state: &mut State, now: u64, ttl_us: u64, token: u64) -> bool {
    if now < state.closed_until || now < state.next_probe_at || now < state.lease_until {
        return false;
    }
    state.lease_until = now.saturating_add(ttl_us.max(1));
    state.lease_token = token;
    state.probes += 1;
    true
}

/// Records a probe's outcome: an exhausted quota closes the allowance; anything else backs
/// off the next probe (doubling after failures). The lease is released when `token` still
/// holds it. Returns the event when the allowance closed.
pub fn finish_probe(
    state: &mut State,
    now: u64,
    params: &Params,
    token: u64,
    outcome: ProbeOutcome,
) -> Option<Event> {
    if state.lease_token == token {
        state.lease_until = 0;
    }
    match outcome {
        ProbeOutcome::Exhausted { retry_in } => {
            state.probe_failures = 0;
            Some(close(state, now, micros_ceil(retry_in), ClosedBy::Quota))
        }
        ProbeOutcome::Available => {
            state.probe_failures = 0;
            state.next_probe_at = now.saturating_add(params.probe_backoff_min_us);
            None
        }
        ProbeOutcome::Failed => {
            let factor = 1u64
                .checked_shl(u32::try_from(state.probe_failures).unwrap_or(u32::MAX))
                .unwrap_or(u64::MAX);
            let backoff = params
                .probe_backoff_min_us
                .saturating_mul(factor)
                .min(params.probe_backoff_max_us);
            state.probe_failures += 1;
            state.next_probe_at = now.saturating_add(backoff);
            None
        }
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

// === The retry budget ===

/// Records `n` successful requests for a replenishing budget (a no-op for the others).
pub fn deposit(budget: &mut BudgetState, now: u64, params: &BudgetParams, n: u64) {
    if n == 0 {
        return;
    }
    if let BudgetParams::Replenishing { slot_us, .. } = *params {
        let slot = advance(budget, now, slot_us);
        budget.deposits[slot] = budget.deposits[slot].saturating_add(n);
    }
}

/// Retries that could be spent now (`u64::MAX` when unlimited).
pub fn remaining(budget: &mut BudgetState, now: u64, params: &BudgetParams) -> u64 {
    match *params {
        BudgetParams::Unlimited => u64::MAX,
        BudgetParams::Fixed { retries } => retries.saturating_sub(budget.spent),
        BudgetParams::Replenishing {
            slot_us,
            reserve,
            per_mille,
        } => {
            advance(budget, now, slot_us);
            let sum = |xs: &[u64]| xs.iter().fold(0u64, |a, x| a.saturating_add(*x));
            let earned = sum(&budget.deposits).saturating_mul(per_mille) / 1_000;
            reserve
                .saturating_add(earned)
                .saturating_sub(sum(&budget.withdrawals))
        }
    }
}

/// Spends one retry (the caller checked [`remaining`] in the same step). Returns the slot
/// (in slots since the epoch) a replenishing budget recorded it in, for a refund.
pub fn spend(budget: &mut BudgetState, now: u64, params: &BudgetParams) -> u64 {
    match *params {
        BudgetParams::Unlimited => 0,
        BudgetParams::Fixed { .. } => {
            budget.spent = budget.spent.saturating_add(1);
            0
        }
        BudgetParams::Replenishing { slot_us, .. } => {
            let slot = advance(budget, now, slot_us);
            budget.withdrawals[slot] = budget.withdrawals[slot].saturating_add(1);
            budget.head_slot
        }
    }
}

/// Refunds a retry that was reserved but never sent: the fixed count goes back down, or the
/// replenishing withdrawal is removed from its slot while that slot is still in the window.
pub fn refund(budget: &mut BudgetState, params: &BudgetParams, slot: u64) {
    match *params {
        BudgetParams::Unlimited => {}
        BudgetParams::Fixed { .. } => budget.spent = budget.spent.saturating_sub(1),
        BudgetParams::Replenishing { .. } => {
            if slot <= budget.head_slot && budget.head_slot - slot < BUDGET_SLOTS {
                let i = (slot % BUDGET_SLOTS) as usize;
                budget.withdrawals[i] = budget.withdrawals[i].saturating_sub(1);
            }
        }
    }
}

/// Moves the sliding window forward to `now`, clearing expired slots; returns the index of
/// the current slot.
pub fn advance(budget: &mut BudgetState, now: u64, slot_us: u64) -> usize {
    let now_slot = now / slot_us.max(1);
    if now_slot > budget.head_slot {
        let clear = (now_slot - budget.head_slot).min(BUDGET_SLOTS);
        for i in 1..=clear {
            let idx = ((budget.head_slot + i) % BUDGET_SLOTS) as usize;
            budget.deposits[idx] = 0;
            budget.withdrawals[idx] = 0;
        }
        budget.head_slot = now_slot;
    }
    (budget.head_slot % BUDGET_SLOTS) as usize
}

// === Settled: as good as fresh ===

/// Whether `state` is *settled* at `now`: as good as a fresh one ([`State::default`]), so that
/// starting over from a fresh state would let nothing through, now or later, that keeping
/// this one would not.
///
/// Not settled while it holds anything a fresh state lacks:
///
/// - a cooldown or a closure still running (a closure until cleared never ends);
/// - a bucket not full again: some limit's theoretical arrival time is ahead of `now` (a
///   fresh bucket would hand out its whole burst);
/// - a reservation still pending (a cooldown raised now would move the schedule);
/// - a fixed retry budget spent from (a fresh one has every retry back), or a replenishing
///   one whose window still counts a retry;
/// - a quota probe's lease or backoff running, or failed probes doubling the backoff;
/// - an adaptive rate cut below its ceiling, or capped by a rate a server advertised (a
///   fresh one would slow-start up to the ceiling again).
///
/// The rest (the event epoch, the generation, clock-step bookkeeping, successes deposited in
/// a replenishing budget, the probe count) only makes a fresh state stricter, or concerns
/// holders of reservations, who are gone once nothing holds the allowance.
///
/// Not a step of [`apply`]: a store answers it from the state it holds, for
/// [`Store::is_settled`](crate::store::Store::is_settled) (which the keyed registry asks
/// before evicting an allowance whose state dies with its store). The Redis script has no
/// twin: its state outlives the handle.
pub fn is_settled(state: &State, now: u64, params: &Params) -> bool {
    let running = [
        state.blocked_until,
        state.closed_until,
        state.lease_until,
        state.next_probe_at,
    ];
    if running.iter().any(|until| *until > now)
        || state.tat[..params.limit_count].iter().any(|tat| *tat > now)
        || pending(state, now)
        || state.probe_failures != 0
    {
        return false;
    }
    let budget = match params.budget {
        BudgetParams::Unlimited => true,
        BudgetParams::Fixed { .. } => state.budget.spent == 0,
        BudgetParams::Replenishing { slot_us, .. } => {
            // The window as it stands at `now`: slots it has forgotten are cleared.
            let mut window = state.budget;
            advance(&mut window, now, slot_us);
            window.withdrawals.iter().all(|w| *w == 0)
        }
    };
    let rate = match params.adaptive {
        // Cut, or capped by an advertised rate: settled once back at the ceiling. Never cut
        // nor capped, it is in (or past) the slow start a fresh one would begin only later.
        Some(a) if state.cut_at != 0 || state.advertised != 0 => {
            adaptive_rate(state, now, params).is_some_and(|r| r >= a.ceiling_milli)
        }
        _ => true,
    };
    budget && rate
}

#[cfg(test)]
mod tests;
