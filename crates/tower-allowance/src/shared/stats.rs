//! This process's counters for one allowance: striped admission counts, abandonments.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    time::Duration,
};

use super::metrics::Metrics;
use crate::{error::AbandonReason, store::cell::Padded};

/// Counters kept by this process (and, with the `metrics` feature, the metric handles).
pub(crate) struct Stats {
    name: Arc<str>,
    /// Written on every admission: striped, so concurrent threads do not share a line.
    pub(crate) admissions: Admissions,
    pub(crate) deferred: AtomicU64,
    pub(crate) abandoned: [AtomicU64; AbandonReason::COUNT],
    #[cfg(feature = "dialects")]
    pub(crate) rate_limit: Mutex<Option<crate::signals::RateLimitObservation>>,
    pub(crate) metrics: Arc<Metrics>,
}

/// Slots of the admission counters owned by one thread each; later threads share one more.
const OWNED_SLOTS: usize = 8;

/// Admission counters in cache-line-padded slots, summed by [`Allowance::snapshot`].
///
/// Up to [`OWNED_SLOTS`] live threads each own a slot (handed on when the thread exits):
/// one writer, so a plain load and store (no locked read-modify-write, no line shared with
/// another writer). Threads beyond those share the last slot with `fetch_add`. So two
/// threads admitting at once write two different lines instead of bouncing one between
/// their caches. (1.1 KiB per allowance.)
#[derive(Default)]
pub(crate) struct Admissions {
    slots: [Padded<AdmissionSlot>; OWNED_SLOTS + 1],
}

#[derive(Default)]
struct AdmissionSlot {
    admitted: AtomicU64,
    waited: AtomicU64,
    retries_spent: AtomicU64,
}

impl Admissions {
    /// Counts one admission.
    #[inline]
    pub(crate) fn record(&self, waited: bool, retry: bool) {
        let id = thread_slot();
        let slot = &self.slots[id.min(OWNED_SLOTS)].0;
        let add = |counter: &AtomicU64| {
            if id < OWNED_SLOTS {
                // This thread is the slot's only writer: nothing can land in between.
                let n = counter.load(Ordering::Relaxed);
                counter.store(n.wrapping_add(1), Ordering::Relaxed);
            } else {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        };
        add(&slot.admitted);
        if waited {
            add(&slot.waited);
        }
        if retry {
            add(&slot.retries_spent);
        }
    }

    /// `(admitted, waited, retries_spent)` over all slots.
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        self.slots.iter().fold((0, 0, 0), |(a, w, r), slot| {
            let slot = &slot.0;
            (
                a.wrapping_add(slot.admitted.load(Ordering::Relaxed)),
                w.wrapping_add(slot.waited.load(Ordering::Relaxed)),
                r.wrapping_add(slot.retries_spent.load(Ordering::Relaxed)),
            )
        })
    }
}

/// This thread's slot number: below [`OWNED_SLOTS`] it is owned by this thread alone (in
/// every allowance) until the thread exits and hands it on; [`OWNED_SLOTS`] is the shared
/// slot, for threads beyond the first [`OWNED_SLOTS`] alive at once.
#[inline]
fn thread_slot() -> usize {
    thread_local! {
        static SLOT: SlotClaim = SlotClaim::claim();
    }
    // During thread teardown the claim may be gone already: use the shared slot.
    SLOT.try_with(|s| s.0).unwrap_or(OWNED_SLOTS)
}

/// Owned slot numbers handed back by exited threads.
static FREE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Locks `m` (`FREE_SLOTS`, through a poisoned lock too: a list of numbers stays valid): the
/// critical sections are bookkeeping that cannot panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The next owned slot number never handed out.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// A thread's claim on a slot number, returned when the thread exits. The hand-over goes
/// through the `FREE_SLOTS` mutex, so the next owner sees the last owner's stores.
struct SlotClaim(usize);

impl SlotClaim {
    fn claim() -> Self {
        let freed = lock(&FREE_SLOTS).pop();
        Self(freed.unwrap_or_else(|| {
            // Saturates at OWNED_SLOTS: the shared slot.
            NEXT_SLOT
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_add(1).min(OWNED_SLOTS))
                })
                .unwrap_or(OWNED_SLOTS)
        }))
    }
}

impl Drop for SlotClaim {
    fn drop(&mut self) {
        if self.0 < OWNED_SLOTS {
            lock(&FREE_SLOTS).push(self.0);
        }
    }
}

impl Stats {
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            metrics: Arc::new(Metrics::new(name.clone())),
            name,
            admissions: Admissions::default(),
            deferred: AtomicU64::new(0),
            abandoned: Default::default(),
            #[cfg(feature = "dialects")]
            rate_limit: Mutex::new(None),
        }
    }

    /// One admission: at once, or after waiting `waited` for a reserved slot.
    #[inline]
    pub(crate) fn admitted(&self, waited: Option<Duration>, retry: bool) {
        self.admissions.record(waited.is_some(), retry);
        self.metrics.admitted(waited, retry);
    }

    pub(crate) fn abandon(&self, reason: AbandonReason) {
        self.abandoned[reason.index()].fetch_add(1, Ordering::Relaxed);
        self.metrics.abandoned(reason);
        let (allowance, reason) = (&*self.name, reason.as_str());
        tracing::debug!(allowance, reason, "request abandoned");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_stay_exact_as_threads_come_and_go() {
        let counts = Arc::new(Admissions::default());
        // Far more threads over time than slots, a few alive at once: all counted exactly.
        for _ in 0..(OWNED_SLOTS * 4) {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let counts = counts.clone();
                    std::thread::spawn(move || {
                        for _ in 0..100 {
                            counts.record(false, false);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("thread");
            }
        }
        assert_eq!(counts.totals().0, (OWNED_SLOTS * 4 * 2 * 100) as u64);
    }

    #[test]
    fn admission_counts_are_exact_across_more_threads_than_slots() {
        let counts = Arc::new(Admissions::default());
        let threads: Vec<_> = (0..OWNED_SLOTS * 2 + 3)
            .map(|i| {
                let counts = counts.clone();
                std::thread::spawn(move || {
                    for n in 0..1_000 {
                        counts.record(n % 2 == 0, i % 3 == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let threads = (OWNED_SLOTS * 2 + 3) as u64;
        let retrying = (0..threads).filter(|i| i % 3 == 0).count() as u64;
        assert_eq!(
            counts.totals(),
            (threads * 1_000, threads * 500, retrying * 1_000)
        );
    }
}
