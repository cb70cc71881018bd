//! The headroom as a time, and sends paced from when they actually leave (issue 30, items 5
//! and 6). Virtual time: every figure is exact.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{Allowance, AllowanceConfig};

fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

/// `workers` callers share `jobs` admissions: when the last one was admitted.
async fn makespan(config: AllowanceConfig, workers: usize, jobs: usize) -> Duration {
    let a = Allowance::new(config);
    let left = Arc::new(AtomicUsize::new(jobs));
    let start = Instant::now();
    let mut tasks = vec![];
    for _ in 0..workers {
        let (a, left) = (a.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = Duration::ZERO;
            while left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                a.acquire().await.expect("admitted");
                last = start.elapsed();
            }
            last
        }));
    }
    let mut last = Duration::ZERO;
    for t in tasks {
        last = last.max(t.await.expect("worker"));
    }
    last
}

/// The case: 64 workers, 400 jobs at burst 2. The headroom used to take 10 ms off a
/// tolerance of two intervals, leaving less than one from ~91/s up, and the slot grid then
/// halved the rate (999/s ran at 500/s: 798 ms). Now it costs 10 ms once: at every rate the
/// default ends within one interval + 10 ms of `exact`.
#[tokio::test(start_paused = true)]
async fn burst_two_keeps_its_rate_at_every_rate() {
    for rate in [1u32, 20, 120, 300, 700, 999, 2_000, 5_000] {
        let config = AllowanceConfig::per_second(rate, 2).expect("valid");
        let jobs = (rate as usize).clamp(8, 400);
        let exact = makespan(config.clone().exact(), 64, jobs).await;
        let default = makespan(config.clone(), 64, jobs).await;
        let bound = exact + config.interval() + Duration::from_millis(10);
        assert!(
            default <= bound && default >= exact,
            "{rate}/s: {default:?} by default, {exact:?} exact"
        );
    }
}

/// At burst 1, the headroom is a 50th of the interval between two sends: 20/s sends every
/// 51 ms (98% of the rate), never 75 ms as before.
#[tokio::test(start_paused = true)]
async fn burst_one_keeps_98_percent_of_its_rate() {
    let config = AllowanceConfig::per_second(20, 1).expect("valid");
    let took = makespan(config.clone(), 16, 100).await;
    assert_eq!(took, Duration::from_millis(99 * 51));
    assert_eq!(
        makespan(config.exact(), 16, 100).await,
        Duration::from_millis(99 * 50)
    );
}

/// A reserved slot sent late moves a strict server's schedule by as much: the next slot keeps
/// the spacing the rule granted from that send, less the headroom (which absorbs that much).
#[tokio::test(start_paused = true)]
async fn a_late_send_moves_the_next_slot() {
    let a = Allowance::new(AllowanceConfig::per_second(20, 1).expect("valid"));
    let start = Instant::now();
    a.acquire().await.expect("admitted at once");
    // Two reserved: at 51 and 102 ms.
    let mut second = Box::pin(a.acquire());
    let mut third = Box::pin(a.acquire());
    assert!(futures::poll!(&mut second).is_pending());
    assert!(futures::poll!(&mut third).is_pending());
    // The second is not polled at its slot (a descheduled process): sent at 60 ms, 9 ms late.
    tokio::time::sleep(Duration::from_millis(60)).await;
    second.await.expect("admitted");
    assert_eq!(ms(start), 60);
    // The third goes 8 ms late too (9 ms less the 1 ms of headroom), not at 102 ms.
    third.await.expect("admitted");
    assert_eq!(ms(start), 110);
    // A send late by no more than the headroom moves nothing: the fourth at 161 ms... once
    // the schedule is in use; after a quiet spell longer than the tolerance, nothing carries.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    a.acquire().await.expect("admitted at once");
    a.acquire().await.expect("admitted");
    assert_eq!(ms(t), 51);
}

/// `exact` sends every slot at its instant, however late the one before left.
#[tokio::test(start_paused = true)]
async fn exact_does_not_pace_from_sends() {
    let a = Allowance::new(AllowanceConfig::per_second(20, 1).expect("valid").exact());
    let start = Instant::now();
    a.acquire().await.expect("admitted at once");
    let mut second = Box::pin(a.acquire());
    let mut third = Box::pin(a.acquire());
    assert!(futures::poll!(&mut second).is_pending());
    assert!(futures::poll!(&mut third).is_pending());
    tokio::time::sleep(Duration::from_millis(60)).await;
    second.await.expect("admitted");
    third.await.expect("admitted");
    assert_eq!(ms(start), 100);
}

/// Burst 4 at 20/s: 3 at once, the 4th 10 ms later, then one every 50 ms (the configured
/// rate); after a quiet spell the same again: 10 ms once per burst.
#[tokio::test(start_paused = true)]
async fn burst_four_pays_10_ms_once_per_burst() {
    let a = Allowance::new(AllowanceConfig::per_second(20, 4).expect("valid"));
    for _ in 0..2 {
        let start = Instant::now();
        let mut at = vec![];
        for _ in 0..8 {
            a.acquire().await.expect("admitted");
            at.push(ms(start));
        }
        assert_eq!(at, [0, 0, 0, 10, 60, 110, 160, 210]);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A strict server's token bucket (no tolerance), in µs: how many of `arrivals` (sorted) it
/// refuses. Full at the first arrival, as a server that has not seen the key for a while.
fn refused_by_strict_bucket(arrivals: &[u64], burst: u64, interval_us: u64) -> usize {
    let capacity = burst * interval_us;
    let (mut level, mut last, mut refused) = (0u64, None::<u64>, 0);
    for &t in arrivals {
        level = last.map_or(capacity, |l| (level + (t - l)).min(capacity));
        last = Some(t);
        match level >= interval_us {
            true => level -= interval_us,
            false => refused += 1,
        }
    }
    refused
}

/// At 1,000/s and burst 100, the requests of the first 5 ms reach the server only at 5 ms (new
/// connections' handshakes, processes starting), the rest as they are admitted: the server's
/// bucket, full until the first arrival, is 5 ms behind the allowance's from then on. The
/// headroom is a time at short intervals too (10 ms, or half the burst): it absorbs that,
/// where one interval of headroom (1 ms, before) drew 4 refusals.
#[tokio::test(start_paused = true)]
async fn a_short_interval_keeps_a_headroom_of_10_ms() {
    let a = Allowance::new(AllowanceConfig::per_second(1_000, 100).expect("valid"));
    let start = Instant::now();
    let mut arrivals = vec![];
    for _ in 0..300 {
        a.acquire().await.expect("admitted");
        let at = start.elapsed().as_micros() as u64;
        arrivals.push(at.max(5_000));
    }
    arrivals.sort_unstable();
    assert_eq!(refused_by_strict_bucket(&arrivals, 100, 1_000), 0);
    // The price: 10 ms once (90 at once, then one every millisecond).
    assert_eq!(start.elapsed(), Duration::from_millis(210));
}
