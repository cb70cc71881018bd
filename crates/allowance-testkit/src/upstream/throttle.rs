//! One 429 the upstream sends at a chosen moment, whatever its bucket says: the first
//! snapshot request at or after the moment is answered 429 with `Retry-After`. Requests after
//! it are answered by the bucket as usual (so a client that does not hear of the cooldown is
//! not stopped by the next 429 either). For measuring how fast a cooldown reaches every
//! process sharing an allowance: the upstream's log shows any request that arrived inside it.

use std::time::Duration;

use tokio::time::Instant;

/// When the forced cooldown starts and how long it lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottleAt {
    /// From the upstream's start: the first snapshot request at or after this is the 429.
    pub after: Duration,
    /// The `Retry-After` it carries, in whole seconds (at least 1): the cooldown's length.
    pub retry_after_secs: u64,
}

impl std::str::FromStr for ThrottleAt {
    type Err = String;

    /// Parses `MS:SECS`, e.g. `1500:1`: at 1500 ms, a 429 with `Retry-After: 1`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use allowance_testkit::upstream::ThrottleAt;
    ///
    /// let t: ThrottleAt = "1500:1".parse()?;
    /// assert_eq!((t.after, t.retry_after_secs), (Duration::from_millis(1500), 1));
    /// assert!("1500".parse::<ThrottleAt>().is_err());
    /// assert!("1500:0".parse::<ThrottleAt>().is_err());
    /// # Ok::<(), String>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!("invalid throttle {s:?}: use MS:SECS, e.g. 1500:1 (at 1500 ms, Retry-After: 1)")
        };
        let (ms, secs) = s.split_once(':').ok_or_else(bad)?;
        let after = Duration::from_millis(ms.trim().parse().map_err(|_| bad())?);
        let retry_after_secs: u64 = secs.trim().parse().map_err(|_| bad())?;
        if retry_after_secs == 0 {
            return Err(bad());
        }
        Ok(Self {
            after,
            retry_after_secs,
        })
    }
}

/// The forced cooldown as it happened, on the upstream's log clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Throttled {
    /// When the first 429 was sent, ms since the upstream started (as [`SeenRequest::at_ms`]).
    ///
    /// [`SeenRequest::at_ms`]: super::SeenRequest::at_ms
    pub sent_at_ms: u64,
    /// Its `Retry-After`, in ms.
    pub retry_after_ms: u64,
}

/// The armed or sent 429, kept with the upstream's state.
#[derive(Debug, Default)]
pub(super) struct Forced {
    armed: Option<(Instant, u64)>,
    fired: Option<(Instant, u64)>,
}

impl Forced {
    pub(super) fn arm(&mut self, at: Instant, retry_after_secs: u64) {
        self.armed = Some((at, retry_after_secs.max(1)));
        self.fired = None;
    }

    /// For a snapshot request at `now`: the `Retry-After` seconds when this request is the
    /// one to answer 429 (armed and due).
    pub(super) fn check(&mut self, now: Instant) -> Option<u64> {
        match self.armed {
            Some((at, secs)) if now >= at => {
                self.armed = None;
                self.fired = Some((now, secs));
                Some(secs)
            }
            _ => None,
        }
    }

    /// When it fired, relative to `start`.
    pub(super) fn fired(&self, start: Instant) -> Option<Throttled> {
        self.fired.map(|(at, secs)| Throttled {
            sent_at_ms: u64::try_from(at.saturating_duration_since(start).as_millis())
                .unwrap_or(u64::MAX),
            retry_after_ms: secs.saturating_mul(1000),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_once_at_the_first_request_due() {
        let t0 = Instant::now();
        let mut f = Forced::default();
        assert_eq!(f.check(t0), None, "not armed");
        f.arm(t0 + Duration::from_millis(100), 2);
        assert_eq!(f.check(t0 + Duration::from_millis(99)), None);
        assert_eq!(f.fired(t0), None);
        assert_eq!(f.check(t0 + Duration::from_millis(150)), Some(2));
        assert_eq!(f.check(t0 + Duration::from_millis(151)), None, "once");
        assert_eq!(
            f.fired(t0),
            Some(Throttled {
                sent_at_ms: 150,
                retry_after_ms: 2000
            })
        );
    }
}
