//! The generic `X-RateLimit-*` shape (the Odds API's, among many):
//! `X-RateLimit-Limit`, `-Remaining`, `-Bucket`, and an `X-RateLimit-Reset` that may be epoch
//! or delta seconds.

use http::HeaderName;

use super::github::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
use super::grammars;
use crate::signals::{Collector, Reader};

const X_RATELIMIT_BUCKET: HeaderName = HeaderName::from_static("x-ratelimit-bucket");

/// In a generic `X-RateLimit-Reset`, values at least this large are epoch seconds (on or
/// after 2001-09-09T01:46:40Z); smaller ones are delta seconds.
pub const EPOCH_THRESHOLD: u64 = 1_000_000_000;

/// In an epoch-seconds reset (GitHub's `x-ratelimit-reset`, a generic `X-RateLimit-Reset`, a
/// legacy `RateLimit-Reset` sent as an epoch), values at least this large are epoch
/// *milliseconds* (on or after 2001-09-09T01:46:40Z): as seconds they would be past the year
/// 33000, as milliseconds they are what `Date.now()` sends.
pub const EPOCH_MILLIS_THRESHOLD: u64 = 1_000_000_000_000;

/// `X-RateLimit-Remaining: 0` waits until `X-RateLimit-Reset`, epoch or delta by
/// [`EPOCH_THRESHOLD`] (and epoch milliseconds by [`EPOCH_MILLIS_THRESHOLD`]).
pub(super) fn read(c: &mut Collector<'_>) {
    let left = c.wait_when_spent(
        Reader::XRateLimit,
        &X_RATELIMIT_REMAINING,
        &X_RATELIMIT_RESET,
        grammars::epoch_or_delta,
    );
    if let Some(left) = left {
        c.remaining(left);
    }
    if let Some(limit) = grammars::smallest_count(c.headers, &X_RATELIMIT_LIMIT) {
        c.limit(limit);
    }
    c.bucket(&X_RATELIMIT_BUCKET);
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use crate::signals::tests::{headers, read};
    use crate::signals::{DateTrust, Dialect, ReadContext, Reader, Wait};

    #[test]
    fn todays_upstream() {
        // What allowance-sim's upstream sends on a 429 today.
        let r = read(
            Dialect::x_ratelimit(),
            &[
                ("retry-after", b"1"),
                ("x-ratelimit-limit", b"2"),
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-bucket", b"odds"),
            ],
        );
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(1))));
        assert_eq!((r.remaining, r.limit), (Some(0), Some(2)));
        assert_eq!(r.bucket.as_deref(), Some("odds"));
        // Invalid numbers and buckets are dropped (`remaining: -1`, a bucket with a space).
        let r = read(
            Dialect::x_ratelimit(),
            &[
                ("x-ratelimit-limit", b"2"),
                ("x-ratelimit-remaining", b"-1"),
                ("x-ratelimit-bucket", b"odds snapshot"),
            ],
        );
        assert_eq!((r.limit, r.remaining, r.bucket), (Some(2), None, None));
        let long = "b".repeat(129);
        let r = read(
            Dialect::x_ratelimit(),
            &[("x-ratelimit-bucket", long.as_bytes())],
        );
        assert_eq!(r.bucket, None);
        let ok = "b".repeat(128);
        let r = read(
            Dialect::x_ratelimit(),
            &[("x-ratelimit-bucket", ok.as_bytes())],
        );
        assert_eq!(r.bucket, Some(ok));
    }

    #[test]
    fn reset_heuristic_both_sides() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cx = ReadContext::new(now);
        let read_reset = |reset: &str| {
            let h = headers(&[
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", reset.as_bytes()),
            ]);
            Dialect::x_ratelimit().read(&h, &cx)
        };
        // Just below: delta seconds (almost 32 years, but representable).
        let r = read_reset("999999999");
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(999_999_999))));
        assert_eq!(
            (r.source, r.date),
            (Some(Reader::XRateLimit), DateTrust::NotNeeded)
        );
        let r = read_reset("30");
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(30))));
        // At the threshold: an epoch, long past.
        let r = read_reset("1000000000");
        assert_eq!(
            (r.wait, r.date),
            (Some(Wait::For(Duration::ZERO)), DateTrust::Absent)
        );
        let r = read_reset("1700000030");
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(30))));
        // Epoch milliseconds (`Date.now()`): 30 s ahead, not a closure.
        let r = read_reset("1700000030000");
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(30))));
        let r = read_reset("1767225600000");
        assert!(
            matches!(r.wait, Some(Wait::For(d)) if d.as_secs() / 86_400 == 778),
            "{r:?}"
        );
        let r = read_reset("99999999999999999999");
        assert!(matches!(r.wait, Some(Wait::TooLong { .. })));
        // A positive remaining never waits, whatever the reset says.
        let h = headers(&[
            ("x-ratelimit-remaining", b"1"),
            ("x-ratelimit-reset", b"30"),
        ]);
        assert_eq!(Dialect::x_ratelimit().read(&h, &cx).wait, None);
    }
}
