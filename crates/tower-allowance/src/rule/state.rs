//! The state one allowance keeps, and when it is settled (as good as a fresh one).

use super::{adaptive_rate, advance, pending, BudgetParams, Params, BUDGET_SLOTS, MAX_LIMITS};

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
    /// The classes' virtual times (feature `shares`).
    #[cfg(feature = "shares")]
    #[cfg_attr(feature = "serde", serde(default))]
    pub(crate) classes: super::ClassState,
    /// Reserve, then settle: what the settlements remember (feature `settle`).
    #[cfg(feature = "settle")]
    pub(crate) settle: super::settle::SettleState,
    /// Leases (feature `lease`): when the holders' window began, the holders counted in it,
    /// and in the window before.
    #[cfg(feature = "lease")]
    pub(crate) holders: [u64; 3],
}

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
/// Not a step of [`apply`](super::apply): a store answers it from the state it holds, for
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
