//! Clock steps: a backward step of the store's clock rebased away, and a lost state recreated.

use super::{BudgetParams, Params, State, FOREVER};

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
pub(crate) fn recreated(state: &mut State, now: u64, params: &Params) {
    for (t, limit) in state.tat.iter_mut().zip(params.limits()) {
        *t = now.saturating_add(limit.tolerance_us);
    }
}
