//! Calls that arrive late: every call carries when it was sent and until when it is valid,
//! both on the server's clock, bounded from the clock readings the replies carry.
//!
//! A call the client stopped waiting for (its timeout passed: a partition delaying packets, a
//! paused server) may still reach Redis and run. The script (`apply.lua`) refuses such a call,
//! unapplied, when it would take from the bucket or reserve for its caller; a cooldown or
//! closure still applies, counted from when it was sent (it ends when it would have; one over
//! already changes nothing); a release or settlement applies as it is.
//!
//! The bound is conservative: a call the client still waits for is never refused because of
//! the estimate. Every reply ends with the server's clock (`now`); a reply read at `server`
//! for a call sent at local `t` gives `server - t` ≥ the clocks' offset (the call ran after it
//! was sent), so the least such sample `o` bounds the offset from above. The first sample is
//! the `TIME` a store reads at its first decision, before any script call (its configuration
//! version, `config_check`; on a cluster, from the primary its script runs on), so that even
//! its first calls carry a bound, at no round trip of their own. A call sent at local
//! `t` is then stamped sent at `t + o` and valid until `t + timeout + o`: when the client
//! gives up (`t + timeout`) the server's clock reads at most that. A call refused anyway (the
//! server's clock stepped forward, or drifted past the margin) answers with the server's
//! clock: the client learns it afresh and sends the call once more, within the same timeout.
//!
//! What remains: a call may still run up to `o` minus the true offset after its caller gave up,
//! that is the one-way latency of the best sample (plus [`MARGIN_US`]), tens of microseconds
//! on one host, a millisecond or two across zones. Samples age out after two windows
//! ([`WINDOW_US`]), so a drifting clock is followed. Every script call carries a bound: a
//! first decision whose `TIME` is not answered fails before any script call is sent. Only
//! under `follow_tokio_clock` (test support), where the script's clock is not `TIME`, do
//! replies alone teach the store, and its first call carries none.

use std::sync::{Mutex, PoisonError};

use tokio::time::Instant;

/// How long a sample counts: the bound is the least over the current window and the last.
const WINDOW_US: u64 = 10_000_000;
/// Added to the bound: clocks drifting apart by 100 ppm over two windows.
pub(crate) const MARGIN_US: u64 = 2_000;

/// When a call was sent and until when it is valid, on the server's clock (0: unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) sent_us: u64,
    pub(crate) valid_until_us: u64,
}

/// The server's clock as this store bounds it (one per allowance: on a cluster, its key's node).
pub(crate) struct ServerClock {
    epoch: Instant,
    samples: Mutex<Samples>,
}

#[derive(Default)]
struct Samples {
    /// The least `server - sent` of the current window, and of the one before.
    current: Option<i64>,
    previous: Option<i64>,
    window_start_us: u64,
}

impl ServerClock {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            samples: Mutex::new(Samples::default()),
        }
    }

    /// Microseconds on this process's clock.
    pub(crate) fn local_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The stamp of a call sent at local `sent` that the client gives up on at local
    /// `deadline`.
    pub(crate) fn stamp(&self, sent: u64, deadline: u64) -> Stamp {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let bound = match (samples.current, samples.previous) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return Stamp::default(),
        };
        let at = |local: u64| {
            let margin = i64::try_from(MARGIN_US).unwrap_or(i64::MAX);
            let on_server = i64::try_from(local)
                .unwrap_or(i64::MAX)
                .saturating_add(bound)
                .saturating_add(margin);
            u64::try_from(on_server).unwrap_or(0).max(1)
        };
        Stamp {
            sent_us: at(sent),
            valid_until_us: at(deadline),
        }
    }

    /// Learns from a reply read at `server` (its clock) to a call sent at local `sent`;
    /// `afresh` forgets what was learnt before (a call refused while its caller waited).
    pub(crate) fn learn(&self, sent: u64, server: u64, afresh: bool) {
        let sample = i64::try_from(server)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(sent).unwrap_or(i64::MAX));
        let mut s = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.local_us();
        if afresh {
            *s = Samples {
                current: Some(sample),
                previous: None,
                window_start_us: now,
            };
            return;
        }
        if now.saturating_sub(s.window_start_us) >= WINDOW_US {
            s.previous = s.current.take();
            s.window_start_us = now;
        }
        s.current = Some(s.current.map_or(sample, |c| c.min(sample)));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bound_is_the_least_sample_of_two_windows() {
        let clock = ServerClock::new();
        assert_eq!(clock.stamp(0, 100), Stamp::default(), "nothing learnt yet");
        // The server's clock is 1 s ahead; calls took 300 µs, then 50, to run.
        clock.learn(0, 1_000_300, false);
        clock.learn(10, 1_000_060, false);
        clock.learn(20, 1_000_400, false);
        let s = clock.stamp(1_000, 201_000);
        assert_eq!(s.sent_us, 1_000 + 1_000_050 + MARGIN_US);
        assert_eq!(s.valid_until_us, 201_000 + 1_000_050 + MARGIN_US);
        // Two windows later the old samples are forgotten: a drifting clock is followed.
        tokio::time::advance(Duration::from_micros(WINDOW_US)).await;
        clock.learn(0, 1_000_200, false);
        assert_eq!(clock.stamp(0, 0).sent_us, 1_000_050 + MARGIN_US);
        tokio::time::advance(Duration::from_micros(WINDOW_US)).await;
        clock.learn(0, 1_000_300, false);
        assert_eq!(clock.stamp(0, 0).sent_us, 1_000_200 + MARGIN_US);
        // Afresh: a forward step of the server's clock is taken at once.
        clock.learn(0, 5_000_000, true);
        assert_eq!(clock.stamp(0, 0).sent_us, 5_000_000 + MARGIN_US);
    }

    #[test]
    fn a_server_clock_behind_ours_bounds_too() {
        let clock = ServerClock::new();
        clock.learn(5_000_000, 1_000, false);
        let s = clock.stamp(5_000_000, 5_200_000);
        assert_eq!(s.sent_us, 1_000 + MARGIN_US);
        assert_eq!(s.valid_until_us, 201_000 + MARGIN_US);
        // Never 0 ("unknown"), even before the server's epoch.
        assert_eq!(clock.stamp(0, 0).sent_us, 1);
    }
}
