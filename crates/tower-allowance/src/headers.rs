//! Reading the provider's rate-limit feedback from response headers.
//!
//! `Retry-After` (RFC 9110 §10.2.3) is either delay-seconds (exactly `1*DIGIT`) or an
//! HTTP-date (IMF-fixdate, or the obsolete RFC 850 and asctime forms). A date is measured
//! against the response's own `Date` header when it has a valid one, so a skewed local
//! clock does not matter; only without it is the local wall clock read (the one wall-clock
//! read in this crate). A date in the past means no wait.
//!
//! Anything else (`later`, `-1`, `1.5`, empty, bytes that are not text) is ignored: an
//! invalid header never invents a cooldown. A delay too long to represent is an error,
//! never clamped to something shorter.
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderMap;
//! use tower_allowance::headers::retry_after;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("retry-after", "30".parse()?);
//! assert_eq!(retry_after(&headers)?, Some(Duration::from_secs(30)));
//!
//! headers.insert("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT".parse()?);
//! headers.insert("date", "Wed, 21 Oct 2015 07:28:00 GMT".parse()?);
//! assert_eq!(retry_after(&headers)?, Some(Duration::from_secs(30)));
//!
//! headers.insert("retry-after", "later".parse()?);
//! assert_eq!(retry_after(&headers)?, None);
//!
//! headers.insert("retry-after", "999999999999999999999".parse()?);
//! assert!(retry_after(&headers).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, HeaderName, HeaderValue};

use crate::{error::UnrepresentableDelay, rule::MAX_DELAY};

/// The delay a response's `Retry-After` asks for.
///
/// `Ok(None)` when absent or invalid. When the header appears more than once, the longest
/// valid delay wins (a wait is never shortened), an unrepresentable one included.
///
/// # Errors
///
/// [`UnrepresentableDelay`] when a value exceeds [`MAX_DELAY`].
pub fn retry_after(headers: &HeaderMap) -> Result<Option<Duration>, UnrepresentableDelay> {
    retry_after_at(headers, wall_clock)
}

/// The one wall-clock read: absolute times in response headers (HTTP-dates, epoch seconds,
/// RFC 3339) are measured against the response's `Date` when it can be trusted, and against
/// this otherwise (see [`signals`](crate::signals)).
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_clock() -> SystemTime {
    SystemTime::now()
}

/// [`retry_after`] with an explicit wall clock, for tests.
pub(crate) fn retry_after_at(
    headers: &HeaderMap,
    now: impl Fn() -> SystemTime,
) -> Result<Option<Duration>, UnrepresentableDelay> {
    // The longest valid value wins, an unrepresentable one included: a wait is never shortened.
    let mut longest: Option<Duration> = None;
    let mut too_long = None;
    for value in headers.get_all(header::RETRY_AFTER) {
        match parse_one(value, headers, &now) {
            Ok(Some(delay)) => longest = Some(longest.map_or(delay, |l| l.max(delay))),
            Ok(None) => {}
            Err(e) => too_long = Some(e),
        }
    }
    match too_long {
        Some(e) => Err(e),
        None => Ok(longest),
    }
}

fn parse_one(
    value: &HeaderValue,
    headers: &HeaderMap,
    now: &impl Fn() -> SystemTime,
) -> Result<Option<Duration>, UnrepresentableDelay> {
    let Ok(text) = std::str::from_utf8(value.as_bytes()) else {
        return Ok(None);
    };
    let text = text.trim_matches([' ', '\t']);
    if text.is_empty() {
        return Ok(None);
    }
    let unrepresentable = || UnrepresentableDelay::new(text.to_owned());
    if text.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = match text.parse() {
            Ok(secs) => secs,
            // All digits, so the only failure is overflow.
            Err(_) => return Err(unrepresentable()),
        };
        let delay = Duration::from_secs(secs);
        if delay > MAX_DELAY {
            return Err(unrepresentable());
        }
        return Ok(Some(delay));
    }
    let Ok(at) = httpdate::parse_http_date(text) else {
        return Ok(None);
    };
    let reference = headers
        .get(header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(|d| httpdate::parse_http_date(d.trim_matches([' ', '\t'])).ok())
        .unwrap_or_else(now);
    let delay = at.duration_since(reference).unwrap_or(Duration::ZERO);
    if delay > MAX_DELAY {
        return Err(unrepresentable());
    }
    Ok(Some(delay))
}

/// The provider's own view, from `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
/// `X-RateLimit-Bucket` response headers.
///
/// `remaining` is approximate and shared by everyone using the key: it is an observation,
/// never a reservation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RateLimitObservation {
    /// `X-RateLimit-Limit`.
    pub limit: Option<u64>,
    /// `X-RateLimit-Remaining`.
    pub remaining: Option<u64>,
    /// `X-RateLimit-Bucket`.
    pub bucket: Option<String>,
}

// Names built at compile time: `HeaderMap::get(&str)` would parse the name on every call.
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_BUCKET: HeaderName = HeaderName::from_static("x-ratelimit-bucket");

/// The `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Bucket` headers, if
/// any is present and well formed.
///
/// Numbers must be plain digits; a bucket must be 1 to 128 visible ASCII characters.
///
/// ```
/// use http::HeaderMap;
/// use tower_allowance::headers::rate_limit;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(rate_limit(&headers), None);
/// headers.insert("x-ratelimit-remaining", "0".parse()?);
/// headers.insert("x-ratelimit-bucket", "snapshot".parse()?);
/// let seen = rate_limit(&headers).expect("present");
/// assert_eq!(seen.remaining, Some(0));
/// assert_eq!(seen.bucket.as_deref(), Some("snapshot"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn rate_limit(headers: &HeaderMap) -> Option<RateLimitObservation> {
    // Most responses carry none of these: answer without hashing three names.
    if headers.is_empty() {
        return None;
    }
    let number = |name: &HeaderName| {
        let v = headers.get(name)?.to_str().ok()?.trim_matches([' ', '\t']);
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        v.parse::<u64>().ok()
    };
    let limit = number(&X_RATELIMIT_LIMIT);
    let remaining = number(&X_RATELIMIT_REMAINING);
    let bucket = headers
        .get(&X_RATELIMIT_BUCKET)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches([' ', '\t']))
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned);
    if limit.is_none() && remaining.is_none() && bucket.is_none() {
        return None;
    }
    Some(RateLimitObservation {
        limit,
        remaining,
        bucket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn with(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_bytes(v).expect("value"),
            );
        }
        h
    }

    fn at(s: &str) -> SystemTime {
        httpdate::parse_http_date(s).expect("date")
    }

    const NOW: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

    #[test]
    fn delay_seconds() {
        let h = with(&[("retry-after", b"30")]);
        assert_eq!(
            retry_after_at(&h, || at(NOW)),
            Ok(Some(Duration::from_secs(30)))
        );
        let h = with(&[("retry-after", b" 0 ")]);
        assert_eq!(retry_after_at(&h, || at(NOW)), Ok(Some(Duration::ZERO)));
    }

    #[test]
    fn invalid_values_never_invent_a_cooldown() {
        for raw in [
            &b"later"[..],
            b"-1",
            b"1.5",
            b"",
            b"  ",
            b"+5",
            b"5s",
            b"0x10",
            b"\xff\xfe",
            b"1 2",
        ] {
            let h = with(&[("retry-after", raw)]);
            assert_eq!(retry_after_at(&h, || at(NOW)), Ok(None), "{raw:?}");
        }
        assert_eq!(retry_after_at(&HeaderMap::new(), || at(NOW)), Ok(None));
    }

    #[test]
    fn unrepresentable_delays_are_errors() {
        for raw in [
            &b"999999999999999999999"[..],
            b"18446744073709551615",
            b"9007199254741",
        ] {
            let h = with(&[("retry-after", raw)]);
            assert!(retry_after_at(&h, || at(NOW)).is_err(), "{raw:?}");
        }
        // The largest representable delay is accepted exactly.
        let max = MAX_DELAY.as_secs().to_string();
        let h = with(&[("retry-after", max.as_bytes())]);
        assert_eq!(
            retry_after_at(&h, || at(NOW)),
            Ok(Some(Duration::from_secs(MAX_DELAY.as_secs())))
        );
    }

    #[test]
    fn http_dates_in_all_three_formats_against_date_header() {
        // The local clock is wildly wrong; the Date header is the reference.
        let wrong_clock = || at("Thu, 01 Jan 2015 00:00:00 GMT");
        for ra in [
            &b"Sun, 06 Nov 1994 08:50:07 GMT"[..],
            b"Sunday, 06-Nov-94 08:50:07 GMT",
            b"Sun Nov  6 08:50:07 1994",
        ] {
            let h = with(&[("retry-after", ra), ("date", NOW.as_bytes())]);
            assert_eq!(
                retry_after_at(&h, wrong_clock),
                Ok(Some(Duration::from_secs(30))),
                "{ra:?}"
            );
        }
    }

    #[test]
    fn http_dates_without_date_header_use_the_wall_clock() {
        for ra in [
            &b"Sun, 06 Nov 1994 08:50:07 GMT"[..],
            b"Sunday, 06-Nov-94 08:50:07 GMT",
            b"Sun Nov  6 08:50:07 1994",
        ] {
            let h = with(&[("retry-after", ra)]);
            assert_eq!(
                retry_after_at(&h, || at(NOW)),
                Ok(Some(Duration::from_secs(30))),
                "{ra:?}"
            );
        }
    }

    #[test]
    fn past_dates_mean_zero_and_bad_date_headers_fall_back() {
        let h = with(&[
            ("retry-after", b"Sun, 06 Nov 1994 08:00:00 GMT"),
            ("date", NOW.as_bytes()),
        ]);
        assert_eq!(retry_after_at(&h, || at(NOW)), Ok(Some(Duration::ZERO)));
        let h = with(&[
            ("retry-after", b"Sun, 06 Nov 1994 08:50:37 GMT"),
            ("date", b"garbage"),
        ]);
        assert_eq!(
            retry_after_at(&h, || at(NOW)),
            Ok(Some(Duration::from_secs(60)))
        );
    }

    #[test]
    fn repeated_header_takes_the_longest() {
        let h = with(&[
            ("retry-after", b"5"),
            ("retry-after", b"later"),
            ("retry-after", b"30"),
        ]);
        assert_eq!(
            retry_after_at(&h, || at(NOW)),
            Ok(Some(Duration::from_secs(30)))
        );
    }

    #[test]
    fn rate_limit_headers() {
        let h = with(&[
            ("x-ratelimit-limit", b"2"),
            ("x-ratelimit-remaining", b"-1"),
            ("x-ratelimit-bucket", b"odds snapshot"),
        ]);
        let seen = rate_limit(&h).expect("limit present");
        assert_eq!(seen.limit, Some(2));
        assert_eq!(seen.remaining, None);
        assert_eq!(seen.bucket, None);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_or_shorten(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let mut h = HeaderMap::new();
                h.insert(header::RETRY_AFTER, v.clone());
                h.insert(header::DATE, v.clone());
                h.insert("x-ratelimit-limit", v.clone());
                h.insert("x-ratelimit-bucket", v);
                let _ = rate_limit(&h);
                if let Ok(Some(d)) = retry_after_at(&h, || at(NOW)) {
                    prop_assert!(d <= MAX_DELAY);
                }
            }
        }

        #[test]
        fn digits_are_exact(secs in 0u64..=MAX_DELAY.as_secs()) {
            let mut h = HeaderMap::new();
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            prop_assert_eq!(retry_after_at(&h, || at(NOW)), Ok(Some(Duration::from_secs(secs))));
        }
    }
}
