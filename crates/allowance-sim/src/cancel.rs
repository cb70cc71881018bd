//! Callers that give up while they wait: `--cancel-fraction F`.
//!
//! A fraction of the jobs, picked by a seeded generator from the job's number (the same jobs
//! in every process and every run), are cancelled at a random moment while they wait for
//! admission: their worker drops the request's future, as a caller that times out or hangs
//! up would, and moves on to its next job. A job whose attempt is already on its way when the
//! moment comes is left to finish (dropping it then would cancel an HTTP request, not a
//! wait). Cancelled jobs are reported as `cancelled`, never as completed or abandoned.
//!
//! A waiter dropped while it holds a reserved slot gives the slot back to the store; the
//! store takes it back only when it is still the latest one, otherwise the slot is lost (one
//! interval of the schedule nobody uses). [`CountReleases`] counts both, from the store's
//! own answers.
//!
//! ```
//! use std::time::Duration;
//! use allowance_sim::cancel::CancelPlan;
//!
//! let plan = CancelPlan::new("0.25".parse()?, Duration::from_secs(2));
//! let picked = (0..1000).filter(|job| plan.for_job(*job).is_some()).count();
//! assert!((200..300).contains(&picked));
//! assert!((0..1000).filter_map(|job| plan.for_job(job)).all(|d| d <= Duration::from_secs(2)));
//! # Ok::<(), String>(())
//! ```

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{
    rule,
    store::{Op, Params, Reply, Store, StoreError, StoreFuture, Watcher},
};

use allowance_testkit::{figures::Releases, scenario::CancelFraction};

/// Which jobs are cancelled, and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CancelPlan {
    fraction: CancelFraction,
    within: Duration,
}

impl CancelPlan {
    /// Cancels `fraction` of the jobs, each after a delay drawn uniformly from `0..=within`
    /// after it starts (a run's workers over its rate is about how long a job waits).
    pub fn new(fraction: CancelFraction, within: Duration) -> Self {
        Self { fraction, within }
    }

    /// After how long job `job` is cancelled, if it is one of the picked.
    pub fn for_job(&self, job: usize) -> Option<Duration> {
        let mut rng = SplitMix(0x5EED_0000_0000_0000 ^ job as u64);
        // 53 random bits as a fraction in [0, 1).
        let draw = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        if draw >= self.fraction.get() {
            return None;
        }
        let within = u64::try_from(self.within.as_micros()).unwrap_or(u64::MAX);
        Some(Duration::from_micros(rng.next() % within.saturating_add(1)))
    }
}

/// splitmix64: small, seeded, and good in its low bits.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A request extension the client service updates as the job's attempts go out: whether
/// one is on its way to the upstream (so a cancellation spares a request already sent), and
/// when the first one was sent (when the job was admitted).
#[derive(Clone, Debug)]
pub struct AttemptWatch(Arc<Watched>);

#[derive(Debug)]
struct Watched {
    in_flight: AtomicBool,
    /// ms from the run's start; `u64::MAX` until sent.
    first_sent_ms: AtomicU64,
}

impl Default for AttemptWatch {
    fn default() -> Self {
        Self(Arc::new(Watched {
            in_flight: AtomicBool::new(false),
            first_sent_ms: AtomicU64::new(u64::MAX),
        }))
    }
}

impl AttemptWatch {
    /// An attempt is being sent, at `at_ms` from the run's start.
    pub fn sending(&self, at_ms: u64) {
        self.0.first_sent_ms.fetch_min(at_ms, Ordering::Relaxed);
        self.0.in_flight.store(true, Ordering::Release);
    }

    /// The attempt's answer (or error) came back.
    pub fn answered(&self) {
        self.0.in_flight.store(false, Ordering::Release);
    }

    /// When the first attempt was sent, if one was.
    pub fn first_sent_ms(&self) -> Option<u64> {
        let ms = self.0.first_sent_ms.load(Ordering::Relaxed);
        (ms != u64::MAX).then_some(ms)
    }

    fn in_flight(&self) -> bool {
        self.0.in_flight.load(Ordering::Acquire)
    }
}

/// Runs `job`; after `after` (if given), drops it if it is waiting for admission (no attempt
/// on its way, as `watch` says) and returns `None`: cancelled. Otherwise its output.
pub async fn unless_cancelled<F: Future>(
    job: F,
    after: Option<Duration>,
    watch: &AttemptWatch,
) -> Option<F::Output> {
    let Some(after) = after else {
        return Some(job.await);
    };
    let mut job = std::pin::pin!(job);
    tokio::select! {
        out = &mut job => return Some(out),
        () = tokio::time::sleep(after) => {}
    }
    if watch.in_flight() {
        Some(job.await)
    } else {
        None
    }
}

/// Release counts, shared between a [`CountReleases`] store and the run that reports them.
#[derive(Debug, Default)]
pub struct ReleaseCounts {
    made: AtomicU64,
    taken_back: AtomicU64,
}

impl ReleaseCounts {
    /// The counts so far.
    pub fn get(&self) -> Releases {
        Releases {
            made: self.made.load(Ordering::Relaxed),
            taken_back: self.taken_back.load(Ordering::Relaxed),
        }
    }

    fn record(&self, reply: &Reply) {
        if let rule::Reply::Release { released } = reply.rule() {
            self.made.fetch_add(1, Ordering::Relaxed);
            if *released {
                self.taken_back.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A store that counts the releases made through it, and whether the store took each slot
/// back; everything else passes through untouched.
#[derive(Debug)]
pub struct CountReleases<S> {
    inner: S,
    counts: Arc<ReleaseCounts>,
}

impl<S: Store> CountReleases<S> {
    /// Counts `inner`'s releases into `counts`.
    pub fn new(inner: S, counts: Arc<ReleaseCounts>) -> Self {
        Self { inner, counts }
    }
}

impl<S: Store> Store for CountReleases<S> {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        let release = matches!(op.rule(), rule::Op::Release(_));
        let fut = self.inner.apply(params, op);
        if !release {
            return fut;
        }
        let counts = self.counts.clone();
        Box::pin(async move {
            let reply = fut.await;
            if let Ok(reply) = &reply {
                counts.record(reply);
            }
            reply
        })
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        let reply = self.inner.try_apply(now, params, op);
        if let (rule::Op::Release(_), Some(Ok(reply))) = (op.rule(), &reply) {
            self.counts.record(reply);
        }
        reply
    }

    fn watch(&self, watcher: Watcher) {
        self.inner.watch(watcher);
    }

    fn name(&self) -> Option<&str> {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_allowance::{store::MemoryStore, Allowance, AllowanceConfig, BoxError};

    #[test]
    fn fractions_parse_within_bounds() {
        assert_eq!(
            "0.2".parse::<CancelFraction>().map(CancelFraction::get),
            Ok(0.2)
        );
        assert!("1.5".parse::<CancelFraction>().is_err());
        assert!("-0.1".parse::<CancelFraction>().is_err());
        assert!("some".parse::<CancelFraction>().is_err());
        let none = CancelPlan::new("0".parse().expect("valid"), Duration::from_secs(1));
        assert!((0..1000).all(|job| none.for_job(job).is_none()));
        let all = CancelPlan::new("1".parse().expect("valid"), Duration::from_secs(1));
        assert!((0..1000).all(|job| all.for_job(job).is_some()));
    }

    /// Three waiters hold slots 1 s apart; the last one leaves (its slot is taken back), then
    /// the first one leaves: the second moves up into its slot, and the second's own slot, now
    /// the tail, is taken back too.
    #[tokio::test(start_paused = true)]
    async fn releases_are_counted_with_what_the_store_did() -> Result<(), BoxError> {
        let counts = Arc::new(ReleaseCounts::default());
        let store = CountReleases::new(MemoryStore::new(), counts.clone());
        let allowance = Allowance::with_store(AllowanceConfig::per_second(1, 1)?, store);
        allowance.acquire().await?;
        let mut waiters: Vec<_> = (0..3)
            .map(|_| {
                let a = allowance.clone();
                tokio::spawn(async move { a.acquire().await })
            })
            .collect();
        while allowance.snapshot().waiting < 3 {
            tokio::task::yield_now().await;
        }
        let last = waiters.pop().expect("three");
        last.abort();
        let _ = last.await;
        let first = waiters.remove(0);
        first.abort();
        let _ = first.await;
        assert_eq!(
            counts.get(),
            Releases {
                made: 2,
                taken_back: 2
            }
        );
        assert_eq!(counts.get().lost(), 0);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_in_flight_is_not_cancelled() {
        let watch = AttemptWatch::default();
        let sent = watch.clone();
        let job = async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            sent.sending(10);
            tokio::time::sleep(Duration::from_millis(100)).await;
            sent.answered();
            7
        };
        let after = Some(Duration::from_millis(50));
        assert_eq!(unless_cancelled(job, after, &watch).await, Some(7));
        assert_eq!(watch.first_sent_ms(), Some(10));
        let waiting = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            7
        };
        let watch = AttemptWatch::default();
        assert_eq!(unless_cancelled(waiting, after, &watch).await, None);
        assert_eq!(watch.first_sent_ms(), None);
    }
}
