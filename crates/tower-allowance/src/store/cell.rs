//! The in-memory state: [`rule::apply`] under a lock, and a lock-free first attempt.
//!
//! The rule is written once, in [`rule`]; this cell only applies it atomically, with `now`
//! passed in so the interleavings can be model-checked
//! (`RUSTFLAGS="--cfg loom" cargo test -p tower-allowance --release --lib loom`).
//!
//! - `word` packs the first limit's theoretical arrival time (54 bits), the low 9 bits of
//!   the event epoch and a `BUSY` bit. A lock-free first attempt commits with one
//!   compare-and-swap of it, so two attempts that read the same state cannot both commit.
//! - The locked path (everything else) holds the mutex and raises `BUSY` first, with one
//!   atomic read-modify-write that also reads the latest bucket: from then on no lock-free
//!   attempt can commit (its compare-and-swap expects a word without `BUSY`; a new attempt
//!   that sees `BUSY` takes the locked path, behind the mutex). So the locked path applies
//!   [`rule::apply`] to the state in place, with no copy and no retry, publishes what a
//!   first attempt reads besides the bucket (cooldown, closed state, epoch: `published`),
//!   and releases the word with the new bucket and epoch and `BUSY` clear.
//! - A first attempt loads the word, then the published fields: it sees at least what the
//!   locked path that stored that word published. If it read anything newer, a locked path
//!   has raised `BUSY` since, and its compare-and-swap fails. A word stored again unchanged
//!   (same bucket, same epoch) comes with the same published fields: every change to them
//!   bumps the epoch.
//! - The rest of [`State`] (other limits, the retry budget, the quota probe) lives behind the
//!   mutex.
//!
//! The lock-free path (a first attempt on a one-limit allowance, nothing to deposit, no
//! `not_before`) is [`rule::admit`] with nothing to do for deposits and the budget: it calls
//! [`rule::closed`] and [`rule::schedule`] in the rule's order. A property test checks that
//! the cell answers exactly as [`rule::apply`] on a plain [`State`].

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
use std::{fmt, sync::PoisonError, time::Duration};

use crate::rule::{
    self, Admission, AdmitRequest, BudgetParams, Op, Params, Reply, Reservation, State, MAX_LIMITS,
};

/// Keeps `T` on a cache line (a pair of lines, for adjacent-line prefetch) of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

const TAT_BITS: u32 = 54;
const TAT_MASK: u64 = (1 << TAT_BITS) - 1;
const EPOCH_BITS: u32 = 9;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;
/// Set while the locked path applies an operation: no lock-free commit meanwhile.
const BUSY: u64 = 1 << 63;

fn pack(tat: u64, epoch: u64) -> u64 {
    // A theoretical arrival time beyond 2^54 µs (570 years of uptime plus backlog) saturates.
    tat.min(TAT_MASK) | ((epoch & EPOCH_MASK) << TAT_BITS)
}

/// The bucket and the epoch's low bits (`BUSY` aside).
fn unpack(word: u64) -> (u64, u64) {
    (word & TAT_MASK, (word >> TAT_BITS) & EPOCH_MASK)
}

/// What the lock-free path reads besides the bucket.
#[derive(Debug, Default)]
struct Published {
    /// The state's generation; 0 until the locked path has stamped it.
    generation: AtomicU64,
    blocked_until: AtomicU64,
    closed_until: AtomicU64,
    closed_by: AtomicU64,
    epoch: AtomicU64,
}

/// One allowance's state in this process.
pub(crate) struct Cell {
    word: Padded<AtomicU64>,
    published: Padded<Published>,
    /// Raised by lock-free reservations too; the locked path takes the maximum.
    reserved_until: Padded<AtomicU64>,
    /// The full state; its first `tat` and `reserved_until` are refreshed from the atomics.
    locked: Mutex<State>,
}

impl fmt::Debug for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (tat, _) = unpack(self.word.0.load(Ordering::Relaxed));
        let p = &self.published.0;
        f.debug_struct("Cell")
            .field("tat", &tat)
            .field("blocked_until", &p.blocked_until.load(Ordering::Relaxed))
            .field("closed_until", &p.closed_until.load(Ordering::Relaxed))
            .field("epoch", &p.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Cell {
    /// Full burst, no cooldown, full budget.
    pub(crate) fn new() -> Self {
        Self {
            word: Padded(AtomicU64::new(0)),
            published: Padded(Published::default()),
            reserved_until: Padded(AtomicU64::new(0)),
            locked: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The critical section is the rule's arithmetic, which cannot panic; a poisoned lock
        // still guards a consistent state.
        self.locked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one operation at `now`.
    #[inline]
    pub(crate) fn apply(&self, now: u64, params: &Params, op: &Op) -> Reply {
        if let Op::Admit(req) = op {
            if lock_free(params, req) {
                if let Some(admission) = self.admit_first(now, params, req) {
                    return Reply::Admit(admission);
                }
            }
        }
        self.apply_locked(now, params, op)
    }

    /// The lock-free path: [`rule::admit`] for a request that touches neither the budget nor
    /// a second limit. `None` while the locked path is applying an operation: take it too.
    fn admit_first(&self, now: u64, params: &Params, req: &AdmitRequest) -> Option<Admission> {
        let published = &self.published.0;
        loop {
            let word = self.word.0.load(Ordering::Acquire);
            // The first operation stamps the state's generation, under the lock.
            let generation = published.generation.load(Ordering::Acquire);
            if word & BUSY != 0 || generation == 0 {
                return None;
            }
            let (tat, epoch_bits) = unpack(word);
            let closed_until = published.closed_until.load(Ordering::Acquire);
            if let Some(closed) = rule::closed(
                closed_until,
                published.closed_by.load(Ordering::Acquire),
                now,
            ) {
                return Some(closed);
            }
            let blocked_until = published.blocked_until.load(Ordering::Acquire);
            let Some((at, new_tat)) = rule::schedule_one(
                tat,
                &params.limits()[0],
                now,
                now.max(blocked_until),
                req.cost,
            ) else {
                return Some(Admission::TooCostly);
            };
            let wait = at - now;
            if wait > req.max_wait_us {
                return Some(Admission::Refused {
                    wait: Duration::from_micros(wait),
                    cooldown: blocked_until > now,
                });
            }
            // The full epoch of the word: the locked path that stored it published it first.
            // Anything newer means a locked path has raised `BUSY` since: the commit fails.
            let epoch = published.epoch.load(Ordering::Acquire);
            if wait > 0 {
                // Before the commit, so a cooldown raised concurrently sees it pending (if
                // the commit then fails, a cooldown errs late, never early).
                self.reserved_until.0.fetch_max(at, Ordering::AcqRel);
            }
            if self
                .word
                .0
                .compare_exchange_weak(
                    word,
                    pack(new_tat, epoch_bits),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                continue;
            }
            if wait == 0 {
                return Some(Admission::Admitted);
            }
            let mut reserved = [0; MAX_LIMITS];
            reserved[0] = new_tat;
            return Some(Admission::Reserved {
                wait: Duration::from_micros(wait),
                reservation: Reservation {
                    slot: at,
                    tat: reserved,
                    generation,
                    epoch,
                    rebased: 0,
                    cost: req.cost,
                    retry: req.retry,
                    budget_slot: 0,
                },
            });
        }
    }

    /// Everything else: [`rule::apply`] on the state in place, under the lock and with
    /// `BUSY` raised (so no lock-free commit lands meanwhile).
    fn apply_locked(&self, now: u64, params: &Params, op: &Op) -> Reply {
        let mut state = self.lock();
        let published = &self.published.0;
        // Reads the latest bucket (lock-free commits included) and stops further ones.
        let word = self.word.0.fetch_or(BUSY, Ordering::AcqRel);
        state.tat[0] = unpack(word).0;
        state.reserved_until = state
            .reserved_until
            .max(self.reserved_until.0.load(Ordering::Acquire));
        // tokio's clock is monotonic; readings that reach the lock out of order by a few
        // microseconds are taken as the latest seen, never as a backward step.
        let now = now.max(state.seen);
        let reply = rule::apply(&mut state, now, params, op);
        // Publish before the word (see the module docs).
        published
            .generation
            .store(state.generation, Ordering::Release);
        published
            .blocked_until
            .store(state.blocked_until, Ordering::Release);
        published
            .closed_until
            .store(state.closed_until, Ordering::Release);
        published
            .closed_by
            .store(state.closed_by, Ordering::Release);
        published.epoch.store(state.epoch, Ordering::Release);
        self.reserved_until
            .0
            .fetch_max(state.reserved_until, Ordering::AcqRel);
        self.word
            .0
            .store(pack(state.tat[0], state.epoch), Ordering::Release);
        reply
    }

    /// [`rule::is_settled`] of the state as it stands: the locked state with the latest
    /// bucket and reservation of the lock-free path. Changes nothing (no `BUSY`): a
    /// lock-free commit racing it is one the caller may or may not see, as with any read.
    pub(crate) fn is_settled(&self, now: u64, params: &Params) -> bool {
        let state = self.lock();
        let mut tat = state.tat;
        tat[0] = unpack(self.word.0.load(Ordering::Acquire)).0;
        let reserved_until = state
            .reserved_until
            .max(self.reserved_until.0.load(Ordering::Acquire));
        let current = State {
            tat,
            reserved_until,
            ..*state
        };
        rule::is_settled(&current, now.max(state.seen), params)
    }
}

/// Whether the lock-free path decides `req` exactly as [`rule::admit`] would.
#[inline]
fn lock_free(params: &Params, req: &AdmitRequest) -> bool {
    params.single_limit()
        && req.deposits == 0
        && req.not_before_us == 0
        && (!req.retry || params.budget == BudgetParams::Unlimited)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        rule::ProbeOutcome, AllowanceConfig, Limit, ReplenishingBudget, RetryBudgetConfig,
    };
    use proptest::prelude::*;

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<bool>(), 1u32..3, 0u64..3_000_000, proptest::option::of(0u64..2_000_000), 0u64..3)
                .prop_map(|(retry, cost, max_wait, nb, deposits)| {
                    let mut r = if retry { AdmitRequest::retry() } else { AdmitRequest::first() };
                    r = r.cost(cost).max_wait(Duration::from_micros(max_wait)).deposits(deposits);
                    if let Some(nb) = nb { r = r.not_before(Duration::from_micros(nb)); }
                    Op::Admit(r)
                }),
            2 => Just(Op::Admit(AdmitRequest::first())),
            1 => proptest::option::of(0u64..2_000_000).prop_map(|delay_us| Op::Defer { delay_us }),
            1 => Just(Op::Clear),
            1 => (0u64..4).prop_map(|token| Op::Lease { ttl_us: 500_000, token }),
            1 => (0u64..4, 0u8..3).prop_map(|(token, o)| Op::FinishProbe {
                token,
                outcome: match o {
                    0 => ProbeOutcome::Available,
                    1 => ProbeOutcome::Failed,
                    _ => ProbeOutcome::Exhausted { retry_in: Duration::from_millis(700) },
                },
            }),
            1 => (0u64..3).prop_map(|deposits| Op::Read { deposits }),
            1 => (proptest::option::of(prop_oneof![Just(0u64), 0u64..2_000_000]), 0u64..2_000_000)
                .prop_map(|(delay_us, age_us)| Op::Throttle { delay_us, age_us }),
            1 => (0u64..60_000).prop_map(|rate_milli| Op::Advertise { rate_milli }),
        ]
    }

    proptest! {
        /// Single-threaded, the cell answers exactly as the rule on one plain `State`,
        /// releases included (the latest reservation is given back now and then), and says
        /// the state is settled exactly when the rule does.
        #[test]
        fn cell_matches_the_rule(
            per_sec in 1u32..50,
            burst in 1u32..5,
            retries in 0u64..4,
            budget_kind in 0u8..3,
            second_limit in any::<bool>(),
            adaptive in any::<bool>(),
            ops in proptest::collection::vec((0u64..300_000, op_strategy(), any::<bool>()), 1..150),
        ) {
            let budget = match budget_kind {
                0 => RetryBudgetConfig::Unlimited,
                1 => RetryBudgetConfig::fixed(retries),
                _ => RetryBudgetConfig::Replenishing(
                    ReplenishingBudget::new(Duration::from_secs(1), 2, 0.5).expect("valid")),
            };
            let mut config = AllowanceConfig::per_second(per_sec, burst).expect("valid")
                .with_retry_budget(budget)
                .with_max_cooldown(Duration::from_secs(1)).expect("valid");
            if second_limit {
                config = config.with_limit(Limit::per_second(per_sec * 2, burst + 1).expect("valid").counting_cost()).expect("two");
            }
            #[cfg(feature = "adaptive")]
            if adaptive {
                config = config.with_adaptive_rate(crate::config::AdaptiveRate::new(f64::from(per_sec), 0.5, 100.0).expect("valid"));
            }
            #[cfg(not(feature = "adaptive"))]
            let _ = adaptive;
            let p = *config.params();
            let cell = Cell::new();
            let mut state = State::default();
            let mut now = 0;
            let mut last = None;
            for (advance, op, release) in ops {
                now += advance;
                let op = match (release, last.take()) {
                    (true, Some(r)) => Op::Release(r),
                    _ => op,
                };
                let got = cell.apply(now, &p, &op);
                let want = rule::apply(&mut state, now, &p, &op);
                prop_assert_eq!(got, want, "op {:?} at {}", op, now);
                // And says what the rule says of the state, lock-free commits included.
                let later = now + advance;
                prop_assert_eq!(cell.is_settled(later, &p), rule::is_settled(&state, later, &p));
                if let Reply::Admit(Admission::Reserved { reservation, .. }) = got {
                    last = Some(reservation);
                }
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
    use crate::{
        rule::{Applied, Event},
        AllowanceConfig, RetryBudgetConfig,
    };

    const FIRST: AdmitRequest = AdmitRequest::first();

    fn params(burst: u32, budget: RetryBudgetConfig) -> Params {
        *AllowanceConfig::new(1, Duration::from_secs(1), burst)
            .expect("valid")
            .with_retry_budget(budget)
            .params()
    }

    fn admit(cell: &Cell, now: u64, p: &Params, req: AdmitRequest) -> Admission {
        match cell.apply(now, p, &Op::Admit(req)) {
            Reply::Admit(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn loom_two_first_attempts_burst_one_admit_one_and_reserve_the_next() {
        loom::model(|| {
            let p = params(1, RetryBudgetConfig::Unlimited);
            let cell = Arc::new(Cell::new());
            let other = cell.clone();
            let t = thread::spawn(move || admit(&other, 0, &p, FIRST));
            let here = admit(&cell, 0, &p, FIRST);
            let there = t.join().expect("thread");
            let mut got = [here, there];
            got.sort_by_key(|a| matches!(a, Admission::Reserved { .. }));
            assert_eq!(got[0], Admission::Admitted);
            let Admission::Reserved { wait, .. } = got[1] else {
                panic!("the second one is reserved: {got:?}");
            };
            assert_eq!(wait, Duration::from_secs(1));
        });
    }

    #[test]
    fn loom_a_reservation_racing_a_cooldown_ends_after_it() {
        loom::model(|| {
            let p = params(1, RetryBudgetConfig::Unlimited);
            let cell = Arc::new(Cell::new());
            assert_eq!(admit(&cell, 0, &p, FIRST), Admission::Admitted);
            let other = cell.clone();
            // A cooldown of 5 s raised at 0 while a first attempt reserves the next slot (1 s).
            let t = thread::spawn(move || {
                match other.apply(
                    0,
                    &p,
                    &Op::Defer {
                        delay_us: Some(5_000_000),
                    },
                ) {
                    Reply::Defer(d) => d.event,
                    r => panic!("{r:?}"),
                }
            });
            let here = admit(&cell, 0, &p, FIRST);
            let event: Option<Event> = t.join().expect("thread");
            let Admission::Reserved {
                mut reservation, ..
            } = here
            else {
                panic!("the bucket is empty: {here:?}");
            };
            if let Some(e) = event {
                assert_ne!(reservation.apply(&e, &p), Applied::Gap);
            }
            assert!(
                reservation.slot >= 5_000_000,
                "slot {} inside the cooldown",
                reservation.slot
            );
            // The store and the holder agree: the next caller comes after the holder.
            let Admission::Reserved {
                reservation: next, ..
            } = admit(&cell, 0, &p, FIRST)
            else {
                panic!("reserved");
            };
            assert!(next.slot > reservation.slot);
        });
    }

    #[test]
    fn loom_two_retries_racing_for_a_budget_of_one_spend_once() {
        loom::model(|| {
            let p = params(10, RetryBudgetConfig::fixed(1));
            let cell = Arc::new(Cell::new());
            let other = cell.clone();
            let retry = AdmitRequest::retry();
            let t = thread::spawn(move || admit(&other, 0, &p, retry));
            let here = admit(&cell, 0, &p, retry);
            let there = t.join().expect("thread");
            let mut got = [here, there];
            got.sort_by_key(|a| *a == Admission::BudgetExhausted);
            assert_eq!(got, [Admission::Admitted, Admission::BudgetExhausted]);
            // The refused retry took no token: nine of the burst of ten are left.
            let left = (0..10)
                .filter(|_| admit(&cell, 0, &p, FIRST) == Admission::Admitted)
                .count();
            assert_eq!(left, 9);
        });
    }

    #[test]
    fn loom_a_first_attempt_racing_a_locked_retry_for_one_token() {
        loom::model(|| {
            let p = params(1, RetryBudgetConfig::fixed(1));
            let cell = Arc::new(Cell::new());
            let other = cell.clone();
            let t = thread::spawn(move || admit(&other, 0, &p, AdmitRequest::retry()));
            let first = admit(&cell, 0, &p, FIRST);
            let retry = t.join().expect("thread");
            // Exactly one goes now; the other is reserved one interval later.
            let now = [first, retry]
                .iter()
                .filter(|a| **a == Admission::Admitted)
                .count();
            assert_eq!(now, 1);
            assert!([first, retry]
                .iter()
                .any(|a| matches!(a, Admission::Reserved { .. })));
        });
    }
}
