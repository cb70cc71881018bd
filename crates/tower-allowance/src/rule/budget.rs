//! The retry budget: fixed, or replenishing over a sliding window of slots.

use super::{BudgetParams, BudgetState};

/// Slots in a replenishing retry budget's sliding window.
pub const BUDGET_SLOTS: u64 = 10;

/// Records `n` successful requests for a replenishing budget (a no-op for the others).
pub(crate) fn deposit(budget: &mut BudgetState, now: u64, params: &BudgetParams, n: u64) {
    if n == 0 {
        return;
    }
    if let BudgetParams::Replenishing { slot_us, .. } = *params {
        let slot = advance(budget, now, slot_us);
        budget.deposits[slot] = budget.deposits[slot].saturating_add(n);
    }
}

/// Retries that could be spent now (`u64::MAX` when unlimited).
pub(crate) fn remaining(budget: &mut BudgetState, now: u64, params: &BudgetParams) -> u64 {
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
            let total = reserve.saturating_add(earned);
            total.saturating_sub(sum(&budget.withdrawals))
        }
    }
}

/// Spends one retry (the caller checked [`remaining`] in the same step). Returns the slot
/// (in slots since the epoch) a replenishing budget recorded it in, for a refund.
pub(crate) fn spend(budget: &mut BudgetState, now: u64, params: &BudgetParams) -> u64 {
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
pub(crate) fn refund(budget: &mut BudgetState, params: &BudgetParams, slot: u64) {
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
pub(crate) fn advance(budget: &mut BudgetState, now: u64, slot_us: u64) -> usize {
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
