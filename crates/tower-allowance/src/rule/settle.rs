//! Reserve, then settle (feature `settle`): a request is charged at admission what the provider

//! reserves (its [`Cost`](crate::Cost): a prompt estimate plus `max_tokens`), and its
//! answer's reported use settles the reservation ([`Op::Settle`](super::Op::Settle)).
//!
//! The unused part comes back in the share the provider gives back: configured
//! ([`SettleParams`]) or learned from the provider's `x-ratelimit-remaining-tokens`. The
//! rule keeps, per allowance and shared by every process:
//!
//! - `outstanding`: the cost admitted and not settled yet (a charge the provider may not have
//!   seen: a reservation still waiting for its slot, a request on its way);
//! - `unused`: the unused reservations settled so far, and `credited`: what came back of them
//!   (less what a refused attempt is still owed: a reading may hold part of it back);
//! - `share`: the share learned (thousandths), which only grows.
//!
//! An answer reporting the provider's remaining tokens bounds what may come back: the
//! client's deficit on the first limit counted in cost never drops below the provider's
//! deficit plus everything outstanding (`room`), so whatever the provider's rule, the client
//! never believes it has more than the provider will have once it has seen every request
//! admitted — as long as the reading is fresh (no settlement since the request was sent: an
//! answer settled after a later one may not count that one's charge); a stale one may only
//! take tokens away. The share learned is the largest `(credited + room - drift) / unused`
//! seen, where `drift` is what the provider refilled beyond the bucket's count since the bucket
//! was last full (the bucket's interval is rounded up to the microsecond: 34 µs a token at
//! 30,000/s where the provider takes 33.3; [`Settle::refill_excess`]): a lower bound of the
//! provider's share, since `room` counts requests the provider has seen as if it had not. A
//! refused attempt's reservation held back by a reading stays owed (it comes back later), and
//! is no evidence of the provider's share either. Without a reading, the share (learned or configured) gives the unused part back,
//! never more than leaves the deficit at `outstanding`: no earlier than now, never fuller
//! than the bucket's bound. An under-estimate (the answer used more than was reserved) is
//! debited, and so is a reading showing less than the allowance counts: a debit moves the
//! pending schedule later, as a cooldown does, so the slots already reserved count it. A credit moves the pending schedule earlier ([`EventKind::Settled`], [`Shift`]): the
//! holders of reserved slots move up with it, no earlier than the event's floor.

// The accessors are for stores that mirror the rule (feature `rule`).
#![cfg_attr(not(feature = "rule"), allow(dead_code))]

/// A class's virtual-time step for units at a weight (`rule/shares.rs`), for this process's
/// class queues too.
#[cfg(feature = "shares")]
pub(crate) use super::shares::share_step_of;
use super::{pending, Applied, Event, EventKind, Params, Reservation, State, Unit, MAX_LIMITS};

/// How a settlement gives unused reservations back (derived from the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SettleParams {
    /// The share of the unused part given back, in thousandths: the starting point when
    /// `learn` (the share only grows from it), the rule otherwise.
    pub(crate) share_milli: u64,
    /// Learn the share from the provider's remaining tokens.
    pub(crate) learn: bool,
}

impl Params {
    /// How settlements give unused reservations back, when configured and in force (feature
    /// `settle`): beside the main limit, a limit counted in cost (with a single limit, the
    /// in-memory store decides a first attempt without the rule, so nothing is outstanding).
    pub fn settle(&self) -> Option<SettleParams> {
        self.settle.filter(|_| self.limit_count > 1)
    }
}

impl SettleParams {
    /// The share given back in thousandths (the starting point when learned).
    pub fn share_milli(&self) -> u64 {
        self.share_milli
    }

    /// Whether the share is learned from the provider's readings.
    pub fn learns(&self) -> bool {
        self.learn
    }
}

/// What the settlements remember (shared by every process: Redis hash field `s`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SettleState {
    /// Cost admitted and not settled yet.
    pub(crate) outstanding: u64,
    /// Unused reservations settled so far (tokens).
    pub(crate) unused: u64,
    /// What came back of them, less what refused attempts are still owed (negative after a
    /// correction down).
    pub(crate) credited: i64,
    /// The share learned, in thousandths.
    pub(crate) share_milli: u64,
    /// When the last settlement was made (store clock): a reading from an answer to a request
    /// sent before it may miss that request's charge (answers settle out of order).
    pub(crate) last_at: u64,
    /// When the first limit counted in cost was last seen full (store clock), at an
    /// admission or a settlement: the provider's bucket, refilling at least as fast, was
    /// full then too. Since then, the provider refilled more than the bucket's whole
    /// microseconds per unit count ([`Settle::refill_excess`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub(crate) full_at: u64,
}

impl SettleState {
    /// Cost admitted and not settled yet.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// The share learned so far, in thousandths.
    pub fn share_milli(&self) -> u64 {
        self.share_milli
    }
}

/// One settlement: what an attempt reserved and what its answer says it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settle {
    pub(crate) reserved: u32,
    pub(crate) used: u32,
    pub(crate) refused: bool,
    pub(crate) observed: Option<(u64, u64)>,
    pub(crate) sent_ago_us: u64,
    /// The admission's class index and weight (feature `shares`; weight 0: no class).
    pub(crate) class: (u8, u32),
    /// How much faster than the bucket the provider refills, in millionths.
    pub(crate) excess_ppm: u32,
}

impl Settle {
    /// An answer that used `used` of the `reserved` cost.
    pub const fn used(reserved: u32, used: u32) -> Self {
        Self {
            reserved,
            used,
            refused: false,
            observed: None,
            sent_ago_us: u64::MAX,
            class: (0, 0),
            excess_ppm: 0,
        }
    }

    /// An attempt the provider charged nothing for (a 429): the whole reservation comes back.
    pub const fn refused(reserved: u32) -> Self {
        Self {
            reserved,
            used: 0,
            refused: true,
            observed: None,
            sent_ago_us: u64::MAX,
            class: (0, 0),
            excess_ppm: 0,
        }
    }

    /// With the provider's reading of the limit counted in cost: its `limit` and what
    /// `remaining` after this request.
    pub const fn observed(mut self, limit: u64, remaining: u64) -> Self {
        self.observed = Some((limit, remaining));
        self
    }

    /// The request was sent `ago` (unknown: as long ago as can be). A reading is trusted to
    /// give tokens back only when no settlement was made since the request was sent: an
    /// answer settled late may not count a request the provider charged after answering it.
    pub fn sent(mut self, ago: std::time::Duration) -> Self {
        self.sent_ago_us = super::micros_floor(ago);
        self
    }

    /// Microseconds since the request was sent (`u64::MAX`: unknown).
    pub fn sent_ago_us(&self) -> u64 {
        self.sent_ago_us
    }

    /// Admitted for class index `class` at `weight` (feature `shares`): the settlement moves
    /// the class's virtual finish time by what it gives back or debits ([`Self::class_units`]),
    /// in the same store call, so that a class's share counts the tokens settled, not those
    /// reserved. Weight 0: no class (the default).
    pub fn class(mut self, class: u8, weight: u32) -> Self {
        self.class = (class, weight);
        self
    }

    /// The class index and weight (weight 0: no class).
    pub fn class_of(&self) -> (u8, u32) {
        self.class
    }

    /// The provider refills the first limit counted in cost `ppm` millionths faster than the
    /// bucket does: the bucket's interval is the limit's `period / rate` rounded *up* to the
    /// microsecond (30,000 tokens/s: 34 µs, not 33.3, so 2% slower). The difference builds up
    /// as room in the provider's readings that is no unused token coming back: the share
    /// learned leaves it out ([`refill_excess_ppm`] computes it from the limit).
    pub fn refill_excess(mut self, ppm: u32) -> Self {
        // Below a million: the bucket's interval is less than twice the provider's.
        self.excess_ppm = ppm.min(1_000_000);
        self
    }

    /// How much faster the provider refills, in millionths ([`Self::refill_excess`]).
    pub fn refill_excess_of(&self) -> u32 {
        self.excess_ppm
    }

    /// The units this settlement moves its class by, given what it `moved` in the bucket
    /// ([`Settled::moved`]): positive, given back to the class, never more than its own
    /// unused part (its whole reservation after a 429); negative, charged to it, never more
    /// than its own under-estimate. So a class is credited only what the bucket got back (a
    /// provider that keeps unused tokens keeps them in the class's share too), and a
    /// correction of the whole bucket (a reading showing less) is no class's charge.
    pub fn class_units(&self, moved: i64) -> i64 {
        let (reserved, used) = (i64::from(self.reserved), i64::from(self.used));
        let own = if self.refused {
            reserved
        } else {
            (reserved - used).max(0)
        };
        moved.clamp(-(used - reserved).max(0), own)
    }

    /// The cost reserved.
    pub fn reserved(&self) -> u32 {
        self.reserved
    }

    /// The cost used.
    pub fn used_units(&self) -> u32 {
        self.used
    }

    /// Whether the provider charged nothing.
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// The provider's reading (limit, remaining), if any.
    pub fn observation(&self) -> Option<(u64, u64)> {
        self.observed
    }
}

/// What a settlement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Units given back to the first limit counted in cost (negative: debited).
    pub moved: i64,
    /// The share in force now, in thousandths.
    pub share_milli: u64,
    /// What holders of reserved slots must apply (the schedule moved earlier).
    pub event: Option<Event>,
}

/// The share in force.
fn share(state: &State, sp: &SettleParams) -> u64 {
    if sp.learn {
        state.settle.share_milli.max(sp.share_milli)
    } else {
        sp.share_milli
    }
}

/// Whole units of limit `l` owed at `now` (its deficit, rounded down).
fn deficit(state: &State, params: &Params, l: usize, now: u64) -> u64 {
    state.tat[l].saturating_sub(now) / params.limits[l].interval_us.max(1)
}

fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// The most units of refill the drift between the provider's refill and the bucket's is
/// counted over (2^33: its product with a millionth rate stays exact in Lua's doubles).
pub const DRIFT_UNITS_CAP: u64 = 1 << 33;

/// How much faster (millionths) a provider refills a limit of `rate` per `period` than a bucket
/// of whole microseconds per unit (`period / rate` rounded up) does: what
/// [`Settle::refill_excess`] takes.
pub fn refill_excess_ppm(rate: u32, period: std::time::Duration) -> u32 {
    let (rate, period) = (u128::from(rate.max(1)), period.as_micros().max(1));
    let interval = period.div_ceil(rate);
    u32::try_from((interval * rate - period) * 1_000_000 / period).unwrap_or(u32::MAX)
}

/// The first limit counted in cost.
fn first_cost(params: &Params) -> Option<usize> {
    params.limits[..params.limit_count]
        .iter()
        .position(|l| l.unit == Unit::Cost)
}

/// An admission of `cost` at `now` while settlement is on: outstanding until settled; the
/// first limit counted in cost was full before it if it holds no more than this cost now.
pub(crate) fn admitted(state: &mut State, now: u64, params: &Params, cost: u32) {
    if params.settle().is_some() {
        state.settle.outstanding = state.settle.outstanding.saturating_add(u64::from(cost));
        if let Some(f) = first_cost(params) {
            let took = u64::from(cost).saturating_mul(params.limits[f].interval_us);
            if state.tat[f] <= now.saturating_add(took) {
                state.settle.full_at = now;
            }
        }
    }
}

/// Settles one attempt at `now` (see the module's docs).
pub(crate) fn settle(state: &mut State, now: u64, params: &Params, op: &Settle) -> Settled {
    let Some(sp) = params.settle() else {
        return Settled {
            moved: 0,
            share_milli: 0,
            event: None,
        };
    };
    let n = params.limit_count;
    let st = &mut state.settle;
    st.outstanding = st.outstanding.saturating_sub(u64::from(op.reserved));
    let Some(first) = first_cost(params) else {
        return Settled {
            moved: 0,
            share_milli: share(state, &sp),
            event: None,
        };
    };
    if state.tat[first] <= now {
        state.settle.full_at = now;
    }
    let owed = deficit(state, params, first, now);
    let k = i128::from(owed);
    // What the provider has not seen is within what the bucket owes (a slot given back without
    // a settlement leaves its cost counted: forgotten here once the bucket has refilled).
    state.settle.outstanding = state.settle.outstanding.min(owed);
    let outstanding = i128::from(state.settle.outstanding);
    // Fresh: no settlement since the request was sent, so every request settled is counted in
    // the reading. A stale reading may only take tokens away.
    // The latest instant settled, whatever the order settlements arrive in (a memory store
    // reads its clock before its lock), and never moved back by a clock step.
    let fresh = state.settle.last_at <= now.saturating_sub(op.sent_ago_us);
    state.settle.last_at = state.settle.last_at.max(now);
    let room = op.observed.map(|(limit, remaining)| {
        let room = k - outstanding - i128::from(limit.saturating_sub(remaining));
        if fresh {
            room
        } else {
            room.min(0)
        }
    });
    let (reserved, used) = (u64::from(op.reserved), u64::from(op.used));
    let extra = i128::from(used.saturating_sub(reserved));
    let target = if op.refused {
        i128::from(reserved)
    } else {
        let st = &mut state.settle;
        st.unused = st.unused.saturating_add(reserved.saturating_sub(used));
        if let (Some(room), true, true, true) = (room, sp.learn, st.unused > 0, fresh) {
            // Less what the provider refilled beyond the bucket's count since both were full:
            // room, but no unused token coming back.
            let iv = params.limits[first].interval_us.max(1);
            let units = (now.saturating_sub(st.full_at) / iv).min(DRIFT_UNITS_CAP);
            let drift = units * u64::from(op.excess_ppm) / 1_000_000;
            let bound = i128::from(st.credited) + room - i128::from(drift);
            if bound > 0 {
                let l = (bound * 1000 / i128::from(st.unused)).min(1000);
                st.share_milli = st.share_milli.max(u64::try_from(l).unwrap_or(0));
            }
        }
        let owed = i128::from(state.settle.unused) * i128::from(share(state, &sp)) / 1000
            - i128::from(state.settle.credited);
        owed - extra
    };
    let fin = match room {
        Some(room) => target.min(room),
        None if target > 0 => target.min((k - outstanding).max(0)),
        None => target,
    };
    // What came back beyond what is owed whatever the provider's rule: a refused attempt's
    // reservation is owed whole, so the part a reading held back counts as still owed (it
    // comes back with a later settlement, and is no evidence of the provider's share).
    let owed_back = if op.refused {
        -i128::from(reserved)
    } else {
        extra
    };
    state.settle.credited = clamp_i64(i128::from(state.settle.credited) + fin + owed_back);
    #[cfg(feature = "shares")]
    class_settled(state, op, clamp_i64(fin));
    let mut shift = [0u64; MAX_LIMITS];
    #[allow(
        clippy::needless_range_loop,
        reason = "limit l's parameters, arrival time and shift, read and written by index"
    )]
    for l in 0..n {
        let limit = params.limits[l];
        if limit.unit != Unit::Cost {
            continue;
        }
        let iv = limit.interval_us;
        if fin > 0 {
            let cap = (i128::from(deficit(state, params, l, now)) - outstanding).max(0);
            let c = u64::try_from(fin.min(cap)).unwrap_or(0);
            shift[l] = c.saturating_mul(iv);
            state.tat[l] = state.tat[l].saturating_sub(shift[l]);
        } else if fin < 0 {
            let d = u64::try_from(-fin).unwrap_or(u64::MAX);
            shift[l] = d.saturating_mul(iv);
            state.tat[l] = state.tat[l].max(now).saturating_add(shift[l]);
        }
    }
    let event = (shift.iter().any(|s| *s > 0) && pending(state, now)).then(|| {
        state.epoch += 1;
        Event {
            generation: state.generation,
            epoch: state.epoch,
            rebased: state.rebased,
            kind: EventKind::Settled(Shift {
                floor: now.max(state.blocked_until),
                shift,
                later: fin < 0,
            }),
        }
    });
    Settled {
        moved: clamp_i64(fin),
        share_milli: share(state, &sp),
        event,
    }
}

/// A classed settlement moves its class's virtual finish time by the units it gives back to
/// the class (earlier: the class's next turn comes sooner) or charges it (later), at the
/// class's weight, as its admission moved it by the cost reserved (`rule/shares.rs`). Never
/// below zero: a class cannot bank time before the virtual time (its next start is the later
/// of the two).
#[cfg(feature = "shares")]
fn class_settled(state: &mut State, op: &Settle, moved: i64) {
    let (class, weight) = op.class;
    let units = op.class_units(moved);
    if weight == 0 || units == 0 {
        return;
    }
    let c = usize::from(class).min(super::MAX_CLASSES - 1);
    let step = share_step_of(units.unsigned_abs(), weight);
    let f = &mut state.classes.finish[c];
    *f = if units > 0 {
        f.saturating_sub(step)
    } else {
        f.saturating_add(step)
    };
}

/// How a settlement moved the pending schedule earlier ([`EventKind::Settled`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shift {
    /// No slot moves before this instant (the store's now, or the cooldown's end).
    pub floor: u64,
    /// Per limit, microseconds the pending schedule moved.
    pub shift: [u64; MAX_LIMITS],
    /// Moved later (a debit: the waiting holders' schedule must count it too), not earlier.
    pub later: bool,
}

impl Shift {
    /// A holder's reservation after it: each limit's arrival time moves back by its shift;
    /// the slot moves back by the largest, but never before the floor nor before any limit
    /// conforms again, and never later ([`Applied::Earlier`]). After a debit (`later`), the
    /// other way round ([`Applied::Moved`]).
    pub(crate) fn apply(&self, res: &mut Reservation, params: &Params) -> Applied {
        let (old, n) = (res.slot, params.limit_count);
        if self.later {
            // A debit: every limit's arrival time moves later by its shift, the slot to where
            // every limit conforms again (never earlier).
            let mut at = old;
            for (l, limit) in params.limits().iter().enumerate() {
                res.tat[l] = res.tat[l].saturating_add(self.shift[l]);
                at = at.max(res.tat[l].saturating_sub(limit.tolerance_us));
            }
            res.slot = at;
            return Applied::Moved(at - old);
        }
        for (t, s) in res.tat[..n].iter_mut().zip(self.shift) {
            *t = t.saturating_sub(s);
        }
        if params.adaptive.is_some() {
            // The main limit's interval moves with the rate: keep the slot (conservative).
            return Applied::Earlier(0);
        }
        let most = self.shift[..n].iter().copied().max().unwrap_or(0);
        let mut at = old.saturating_sub(most).max(self.floor);
        for (l, limit) in params.limits().iter().enumerate() {
            at = at.max(res.tat[l].saturating_sub(limit.tolerance_us));
        }
        res.slot = at.min(old);
        Applied::Earlier(old - res.slot)
    }
}

/// A holder's local instant `us` earlier (unchanged if unrepresentable; one already past is
/// due at once).
pub(crate) fn earlier(at: tokio::time::Instant, us: u64) -> tokio::time::Instant {
    at.checked_sub(std::time::Duration::from_micros(us))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests;
