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
                    cooldown: (blocked_until > now)
                        .then(|| Duration::from_micros(blocked_until - now)),
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
        let reserved = self.reserved_until.0.load(Ordering::Acquire);
        state.reserved_until = state.reserved_until.max(reserved);
        // tokio's clock is monotonic; readings that reach the lock out of order by a few
        // microseconds are taken as the latest seen, never as a backward step.
        let now = now.max(state.seen);
        let reply = rule::apply(&mut state, now, params, op);
        // Publish before the word (see the module docs).
        let publish = |field: &AtomicU64, value| field.store(value, Ordering::Release);
        publish(&published.generation, state.generation);
        publish(&published.blocked_until, state.blocked_until);
        publish(&published.closed_until, state.closed_until);
        publish(&published.closed_by, state.closed_by);
        publish(&published.epoch, state.epoch);
        let (reserved, word) = (&self.reserved_until.0, &self.word.0);
        reserved.fetch_max(state.reserved_until, Ordering::AcqRel);
        word.store(pack(state.tat[0], state.epoch), Ordering::Release);
        reply
    }

    /// [`rule::is_settled`] of the state as it stands: the locked state with the latest
    /// bucket and reservation of the lock-free path. Changes nothing (no `BUSY`): a
    /// lock-free commit racing it is one the caller may or may not see, as with any read.
    pub(crate) fn is_settled(&self, now: u64, params: &Params) -> bool {
        let state = self.lock();
        let mut tat = state.tat;
        tat[0] = unpack(self.word.0.load(Ordering::Acquire)).0;
        let reserved = self.reserved_until.0.load(Ordering::Acquire);
        let reserved_until = state.reserved_until.max(reserved);
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
mod tests;

/// Model-checked interleavings: `RUSTFLAGS="--cfg loom" cargo test -p tower-allowance --release --lib loom`.
#[cfg(all(test, loom))]
mod tests_loom;
