//! The token buckets: GCRA with reservations, every limit in one step.

use super::{
    closed, deposit, effective_limits, refund, remaining, spend, us, Admission, AdmitRequest,
    LimitParams, Params, Reservation, State, MAX_LIMITS, SLOT_GRANULARITY_US,
};

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
    let (start, at) = (at, on_grid(at, now));
    let mut new_tat = [0; MAX_LIMITS];
    for (((n, t), i), limit) in new_tat.iter_mut().zip(tat).zip(inc).zip(limits) {
        *n = next_tat(*t, limit, start, at, i);
    }
    Some((at, new_tat))
}

/// [`schedule`] for one limit: the same arithmetic without the arrays, for the in-memory
/// store's lock-free first attempt (a property test holds the two equal).
#[inline]
pub(crate) fn schedule_one(
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
    let at = t0.max(
        tat.max(t0)
            .saturating_add(inc)
            .saturating_sub(limit.tolerance_us),
    );
    let (start, at) = (at, on_grid(at, now));
    Some((at, next_tat(tat, limit, start, at, inc)))
}

/// `at`, rounded up to a whole [`SLOT_GRANULARITY_US`] when it is later than `now`.
#[inline]
fn on_grid(at: u64, now: u64) -> u64 {
    match at > now {
        true => at
            .div_ceil(SLOT_GRANULARITY_US)
            .saturating_mul(SLOT_GRANULARITY_US),
        false => at,
    }
}

/// A limit's arrival time after an admission at `at` (`start` before the slot grid's
/// rounding) taking `inc`: an admission that finds the bucket full (`tat <= start`: every
/// admission at burst 1) moves the schedule [`LimitParams::headroom_us`] later, once, so
/// that the sends after it keep that much margin from a strict server's own schedule.
#[inline]
fn next_tat(tat: u64, limit: &LimitParams, start: u64, at: u64, inc: u64) -> u64 {
    let headroom = if tat <= start { limit.headroom_us } else { 0 };
    tat.max(at).saturating_add(inc).saturating_add(headroom)
}

/// Decides one admission at `now`: deposits, closed, budget, then the schedule.
///
/// The order is part of the rule. Nothing changes unless the answer is `Admitted` or
/// `Reserved`, deposits aside: they record successes that already happened.
pub(crate) fn admit(state: &mut State, now: u64, params: &Params, req: &AdmitRequest) -> Admission {
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
            cooldown: (state.blocked_until > now).then(|| us(state.blocked_until - now)),
        };
    }
    state.tat[..n].copy_from_slice(&new_tat[..n]);
    #[cfg(feature = "settle")]
    super::settle::admitted(state, now, params, req.cost);
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
///
/// Only the tail can go back: a slot in the middle of the schedule has later slots granted
/// after it, and moving the schedule back under them would grant one instant twice. So a
/// process first hands a leaving holder's slot down its own line (each later holder of the
/// same cost moves up one slot, the last one's slot is released here: the tail whenever no
/// other process reserved since), and keeps a slot this refuses as a spare for its next
/// arrival (`shared/holders.rs`). Every send stays on an instant this rule granted, used
/// once, never later than granted: nothing goes over the rate. What remains lost: a spare
/// no local arrival takes before its instant passes (the end of a run; a process whose
/// callers stop coming; a retry reserved behind it), a slot already due when its holder
/// leaves, and, with several limits, a release some of them refused.
pub(crate) fn release(state: &mut State, params: &Params, res: &Reservation) -> bool {
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
            let inc = limit.units(res.cost) * limit.interval_us;
            // (At burst 1 every admission moved the schedule by the headroom as well.)
            let back = inc + limit.headroom_us * u64::from(inc >= limit.tolerance_us);
            state.tat[l] = mine.saturating_sub(back);
        } else {
            all = false;
        }
    }
    if res.retry {
        refund(&mut state.budget, &params.budget, res.budget_slot);
    }
    all
}
