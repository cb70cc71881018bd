//! The operations a store applies, their replies, and the events and reservations they carry.

use std::time::Duration;

#[cfg(feature = "quota")]
use super::ProbeOutcome;
use super::{micros_ceil, micros_floor, Params, Stretch, MAX_DELAY_US, MAX_LIMITS};

/// What an admission asks for.
///
#[cfg_attr(feature = "rule", doc = "```")]
#[cfg_attr(not(feature = "rule"), doc = "```ignore")]
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

impl Reservation {
    /// The reserved instant, on the store's clock.
    pub fn slot(&self) -> u64 {
        self.slot
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
            EventKind::Cooldown {
                until,
                shift,
                stretch,
            } => {
                // The store re-timed the main limit's schedule (a cut of the adaptive rate),
                // then moved each limit's; the slot is the earliest instant at which every
                // limit conforms again, never before the cooldown's end and never earlier
                // than it was.
                let old = self.slot;
                let n = params.limit_count;
                self.tat[0] = stretch.apply(self.tat[0]);
                let least = shift[..n].iter().copied().min().unwrap_or(0);
                let mut slot = stretch.apply(old).saturating_add(least).max(until);
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
            #[cfg(feature = "settle")]
            EventKind::Settled(shift) => shift.apply(self, params),
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
    /// Applied: the slot is now this many microseconds earlier (a settlement gave unused
    /// reservations back; feature `settle`).
    #[cfg(feature = "settle")]
    Earlier(u64),
}

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
}

/// What an [`Event`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The pending schedule moved: the main limit's re-timed by `stretch` (a cut of the
    /// adaptive rate), then each limit's moved by its shift (the cooldown was extended to
    /// `until`).
    Cooldown {
        /// The cooldown deadline, on the store's clock (unchanged when only `stretch` moves).
        until: u64,
        /// Per limit, microseconds the pending schedule moved (zeros when none was pending).
        shift: [u64; MAX_LIMITS],
        /// The main limit's re-timing, applied before the shift ([`Stretch::NONE`]: none).
        stretch: Stretch,
    },
    /// The allowance closed until `until` ([`FOREVER`](super::FOREVER): until cleared).
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
    /// state, so every holder of a reservation in a lost one asks again at once. (Only such
    /// a store makes it: the memory store never loses its state.)
    #[cfg_attr(not(feature = "rule"), allow(dead_code))]
    Created,
    /// A settlement gave unused reservations back (feature `settle`): each limit's pending
    /// schedule moved earlier.
    #[cfg(feature = "settle")]
    Settled(super::settle::Shift),
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
        /// The shared cooldown's time left, when it is (part of) the reason: when a caller
        /// may come back, even before this process hears of the cooldown.
        cooldown: Option<Duration>,
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
    /// Set when the delay closed the allowance instead (longer than `max_cooldown`, or
    /// unrepresentable): for how long it is closed now (`max_cooldown`, or longer when an
    /// earlier closure ends later; `None`: until cleared).
    pub closed: Option<Option<Duration>>,
    /// What reservation holders must apply, when anything changed.
    pub event: Option<Event>,
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
    #[cfg_attr(feature = "serde", serde(serialize_with = "super::ser::closed_json"))]
    pub closed: Option<Option<Duration>>,
    /// Why it is closed; `None` when open.
    pub closed_by: Option<ClosedBy>,
    /// Retries that could be spent now; `None` for an unlimited budget.
    pub retries_remaining: Option<u64>,
    /// Quota probes granted so far (across every process).
    pub probes: u64,
    /// The event epoch.
    pub epoch: u64,
    /// The state's generation (see [`State::generation`](super::State::generation)); 0 when the store holds no state
    /// (never used, or lost and not yet recreated: a read creates none).
    pub generation: u64,
    /// The adaptive rate now, in thousandths of a request per second (0: not adaptive).
    pub rate_milli: u64,
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
    /// Close the allowance for `delay_us` (`None`: until cleared). (Made by a store or tool
    /// that mirrors the rule: the layers close only through `Defer`'s closure and the quota
    /// probe.)
    #[cfg_attr(not(feature = "rule"), allow(dead_code))]
    Close {
        /// Microseconds, or `None` for until cleared.
        delay_us: Option<u64>,
        /// Why.
        by: ClosedBy,
    },
    /// Lift the cooldown, the closed state and the probe backoff (an operator's decision).
    Clear,
    /// Take the quota probe's single-flight lease for `ttl_us`, as `token` (feature `quota`,
    /// like every op and reply of the probe: nothing else asks for them).
    #[cfg(feature = "quota")]
    Lease {
        /// How long the lease lasts unless finished (a dead prober's lease expires).
        ttl_us: u64,
        /// The prober's token.
        token: u64,
    },
    /// Report a quota probe's outcome and release the lease held as `token`.
    #[cfg(feature = "quota")]
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
    /// Admit one attempt of a class (feature `shares`): a share of the same bucket.
    #[cfg(feature = "shares")]
    Share(super::ShareRequest),
    /// Settle an admitted attempt's reservation to what its answer used (feature `settle`).
    #[cfg(feature = "settle")]
    Settle(super::settle::Settle),
    /// Take a lease of tokens from the shared bucket (feature `lease`).
    #[cfg(feature = "lease")]
    Grant(super::GrantRequest),
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
    /// To `Op::Lease`.
    #[cfg(feature = "quota")]
    Lease {
        /// Whether this caller holds the lease now and should probe.
        granted: bool,
    },
    /// To `Op::FinishProbe`: the event when the probe closed the allowance.
    #[cfg(feature = "quota")]
    ProbeFinished(Option<Event>),
    /// To [`Op::Read`].
    State(StoreState),
    /// To `Op::Share`.
    #[cfg(feature = "shares")]
    Share(super::ShareReply),
    /// To `Op::Settle`.
    #[cfg(feature = "settle")]
    Settled(super::settle::Settled),
    /// To `Op::Grant` (feature `lease`).
    #[cfg(feature = "lease")]
    Grant(super::Grant),
}
