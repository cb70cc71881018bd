//! The in-memory allowance state: a lock-free first attempt, a locked retry budget.
//!
//! The pure rules of [`algorithm`] applied atomically, with `now` passed in so the cell can
//! be model-checked (`RUSTFLAGS="--cfg loom" cargo test -p tower-allowance --release --lib loom`).
//!
//! - The token bucket is GCRA's theoretical arrival time in one `AtomicU64`, advanced by a
//!   compare-and-swap loop around [`algorithm::gcra_step`] (governor's approach).
//! - The cooldown deadline is one `AtomicU64` raised with `fetch_max`: it never moves earlier.
//! - The retry budget stays behind a `Mutex`. A retry takes the lock, checks the budget
//!   first (as [`algorithm::admit`] does), then the cooldown, then takes a token with the
//!   same CAS loop, and spends only if the token was taken: all or nothing, no overdraw,
//!   while first attempts never touch the lock.
//!
//! Each atomic sits on its own cache line, so a first attempt reads the rarely written
//! cooldown line without it being invalidated by every admission's write to the bucket.

#[cfg(loom)]
use loom::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex, MutexGuard,
};
#[cfg(not(loom))]
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex, MutexGuard,
};
use std::{fmt, sync::PoisonError};

use crate::algorithm::{self, Ask, BudgetState, Params, Refused, Step, Verdict};

/// Keeps `T` on a cache line (a pair of lines, for adjacent-line prefetch) of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// One allowance's state in this process.
pub(crate) struct Cell {
    /// GCRA theoretical arrival time, in microseconds on the owner's clock.
    tat_us: Padded<AtomicU64>,
    /// No admission before this instant; only ever raised.
    blocked_until_us: Padded<AtomicU64>,
    budget: Mutex<BudgetState>,
}

impl fmt::Debug for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cell")
            .field("tat_us", &self.tat_us.0.load(Ordering::Relaxed))
            .field(
                "blocked_until_us",
                &self.blocked_until_us.0.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Cell {
    /// Full burst, no cooldown, full budget.
    pub(crate) fn new() -> Self {
        Self {
            tat_us: Padded(AtomicU64::new(0)),
            blocked_until_us: Padded(AtomicU64::new(0)),
            budget: Mutex::new(BudgetState::default()),
        }
    }

    fn budget(&self) -> MutexGuard<'_, BudgetState> {
        // The critical sections are pure arithmetic that cannot panic, so a poisoned lock
        // still guards a consistent budget.
        self.budget.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`algorithm::admit`], atomically: budget (retries only), cooldown, token.
    pub(crate) fn admit(&self, now_us: u64, params: &Params, ask: Ask) -> Verdict {
        if !ask.spend_retry {
            return self.take_token(now_us, params);
        }
        let mut budget = self.budget();
        if !algorithm::budget_available(&mut budget, now_us, &params.budget) {
            return Verdict::BudgetExhausted;
        }
        let verdict = self.take_token(now_us, params);
        if let Verdict::Admitted { .. } = verdict {
            algorithm::spend(&mut budget, now_us, &params.budget);
        }
        verdict
    }

    /// The cooldown check, then one token by compare-and-swap.
    fn take_token(&self, now_us: u64, params: &Params) -> Verdict {
        if let Some(wait) =
            algorithm::cooling(self.blocked_until_us.0.load(Ordering::Acquire), now_us)
        {
            return wait;
        }
        let tat = &self.tat_us.0;
        let mut current = tat.load(Ordering::Acquire);
        loop {
            match algorithm::gcra_step(current, now_us, params) {
                Err(Refused { wait_us }) => {
                    return Verdict::Wait {
                        wait_us,
                        cooldown: false,
                    }
                }
                Ok(Step {
                    new_tat_us,
                    next_in_us,
                }) => match tat.compare_exchange_weak(
                    current,
                    new_tat_us,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Verdict::Admitted { next_in_us },
                    Err(actual) => current = actual,
                },
            }
        }
    }

    /// Raises the cooldown to `now + delay` (max semantics). Returns whether it moved, and
    /// the deadline after the call.
    pub(crate) fn defer(&self, now_us: u64, delay_us: u64) -> (bool, u64) {
        let until = algorithm::cooldown_until(now_us, delay_us);
        let before = self.blocked_until_us.0.fetch_max(until, Ordering::AcqRel);
        (until > before, before.max(until))
    }

    /// The cooldown deadline.
    pub(crate) fn blocked_until_us(&self) -> u64 {
        self.blocked_until_us.0.load(Ordering::Acquire)
    }

    /// Records one success for a replenishing budget.
    pub(crate) fn deposit(&self, now_us: u64, params: &Params) {
        algorithm::deposit_budget(&mut self.budget(), now_us, &params.budget);
    }

    /// Retries that could be spent now (`u64::MAX` when unlimited).
    pub(crate) fn budget_remaining(&self, now_us: u64, params: &Params) -> u64 {
        algorithm::remaining(&mut self.budget(), now_us, &params.budget)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{BudgetParams, State};
    use proptest::prelude::*;

    fn params(per_sec: u32, burst: u32, budget: BudgetParams) -> Params {
        Params::new(Duration::from_secs(1), per_sec, burst, budget).expect("valid")
    }

    proptest! {
        /// Single-threaded, the cell decides exactly as the pure algorithm on one `State`.
        #[test]
        fn cell_matches_the_pure_algorithm(
            per_sec in 1u32..50,
            burst in 1u32..5,
            retries in 0u64..4,
            replenishing in any::<bool>(),
            ops in proptest::collection::vec((0u64..300_000, 0u8..4, 0u64..2_000_000), 1..200),
        ) {
            let budget = if replenishing {
                // A 1 s window in 100 ms slots: deposits and withdrawals expire during a run.
                BudgetParams::Replenishing { slot_us: 100_000, reserve: retries, per_mille: 500 }
            } else {
                BudgetParams::Fixed { retries }
            };
            let p = params(per_sec, burst, budget);
            let cell = Cell::new();
            let mut state = State::default();
            let mut now = 0;
            for (advance, op, delay) in ops {
                now += advance;
                match op {
                    0 | 1 => {
                        let ask = Ask { spend_retry: op == 1 };
                        prop_assert_eq!(cell.admit(now, &p, ask), algorithm::admit(&mut state, now, &p, ask));
                    }
                    2 => {
                        let moved = algorithm::defer(&mut state, now, delay);
                        prop_assert_eq!(cell.defer(now, delay), (moved, state.blocked_until_us));
                    }
                    _ => {
                        cell.deposit(now, &p);
                        algorithm::deposit(&mut state, now, &p);
                    }
                }
                prop_assert_eq!(cell.blocked_until_us(), state.blocked_until_us);
                prop_assert_eq!(
                    cell.budget_remaining(now, &p),
                    algorithm::budget_remaining(&mut state, now, &p)
                );
            }
        }
    }
}

/// Model-checked interleavings: `RUSTFLAGS="--cfg loom" cargo test -p tower-allowance --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::time::Duration;

    use loom::{sync::Arc, thread};

    use super::*;
    use crate::algorithm::BudgetParams;

    const FIRST: Ask = Ask { spend_retry: false };
    const RETRY: Ask = Ask { spend_retry: true };

    fn params(burst: u32, budget: BudgetParams) -> Params {
        Params::new(Duration::from_secs(1), 1, burst, budget).expect("valid")
    }

    fn admitted(v: Verdict) -> bool {
        matches!(v, Verdict::Admitted { .. })
    }

    #[test]
    fn loom_two_first_attempts_burst_one_admit_exactly_one() {
        loom::model(|| {
            let p = params(1, BudgetParams::Unlimited);
            let cell = Arc::new(Cell::new());
            let other = cell.clone();
            let t = thread::spawn(move || other.admit(0, &p, FIRST));
            let here = cell.admit(0, &p, FIRST);
            let there = t.join().expect("thread");
            assert_eq!(u8::from(admitted(here)) + u8::from(admitted(there)), 1);
            let refused = if admitted(here) { there } else { here };
            assert_eq!(
                refused,
                Verdict::Wait {
                    wait_us: 1_000_000,
                    cooldown: false
                }
            );
        });
    }

    #[test]
    fn loom_three_first_attempts_burst_two_admit_exactly_two() {
        loom::model(|| {
            let p = params(2, BudgetParams::Unlimited);
            let cell = Arc::new(Cell::new());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let c = cell.clone();
                    thread::spawn(move || c.admit(0, &p, FIRST))
                })
                .collect();
            let mut count = u8::from(admitted(cell.admit(0, &p, FIRST)));
            for t in threads {
                count += u8::from(admitted(t.join().expect("thread")));
            }
            assert_eq!(count, 2);
        });
    }

    #[test]
    fn loom_defers_racing_an_admission_never_lower_the_deadline() {
        loom::model(|| {
            let p = params(1, BudgetParams::Unlimited);
            let cell = Arc::new(Cell::new());
            let (a, b) = (cell.clone(), cell.clone());
            let long = thread::spawn(move || a.defer(0, 10));
            let short = thread::spawn(move || b.defer(1, 5));
            let seen_before = cell.blocked_until_us();
            let verdict = cell.admit(2, &p, FIRST);
            let seen_after = cell.blocked_until_us();
            assert!(seen_after >= seen_before, "the deadline moved earlier");
            let (long_moved, long_until) = long.join().expect("thread");
            let (_, short_until) = short.join().expect("thread");
            // Each defer reports a deadline at least as late as its own, and the long one
            // always moves it (nothing asked for later).
            assert!(long_moved);
            assert_eq!(long_until, 10);
            assert!(short_until >= 6);
            assert_eq!(cell.blocked_until_us(), 10);
            // The admission either came before both defers or saw a cooldown.
            match verdict {
                Verdict::Admitted { .. } => assert!(seen_before <= 2),
                Verdict::Wait { cooldown, .. } => assert!(cooldown),
                Verdict::BudgetExhausted => panic!("a first attempt has no budget"),
            }
        });
    }

    #[test]
    fn loom_two_retries_racing_for_a_budget_of_one_spend_once() {
        loom::model(|| {
            let p = params(10, BudgetParams::Fixed { retries: 1 });
            let cell = Arc::new(Cell::new());
            let other = cell.clone();
            let t = thread::spawn(move || other.admit(0, &p, RETRY));
            let here = cell.admit(0, &p, RETRY);
            let there = t.join().expect("thread");
            assert_eq!(u8::from(admitted(here)) + u8::from(admitted(there)), 1);
            let refused = if admitted(here) { there } else { here };
            assert_eq!(refused, Verdict::BudgetExhausted);
            assert_eq!(cell.budget_remaining(0, &p), 0);
            // The refused retry took no token: nine of the burst of ten are left.
            let left = (0..10)
                .filter(|_| admitted(cell.admit(0, &p, FIRST)))
                .count();
            assert_eq!(left, 9);
        });
    }

    #[test]
    fn loom_a_first_attempt_racing_a_retry_for_one_token() {
        loom::model(|| {
            let p = params(1, BudgetParams::Fixed { retries: 1 });
            let cell = Arc::new(Cell::new());
            let other = cell.clone();
            let t = thread::spawn(move || other.admit(0, &p, RETRY));
            let first = cell.admit(0, &p, FIRST);
            let retry = t.join().expect("thread");
            assert_eq!(u8::from(admitted(first)) + u8::from(admitted(retry)), 1);
            // The budget is spent exactly when the retry was admitted.
            let left = cell.budget_remaining(0, &p);
            assert_eq!(left, if admitted(retry) { 0 } else { 1 });
        });
    }
}
