//! GitHub's REST API: `x-ratelimit-limit`, `-remaining`, `-used`, `-reset` (epoch seconds),
//! `-resource`; `retry-after` on secondary limits is the [`RetryAfter`](crate::signals::Reader::RetryAfter)
//! reader's.

use std::time::Duration;

use http::{header, HeaderName};

use super::grammars;
use crate::signals::{values, Collector, Reader, Value};

pub(super) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(super) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
pub(super) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_RATELIMIT_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");

/// `x-ratelimit-remaining: 0` waits until `x-ratelimit-reset`, in epoch seconds. GitHub's
/// limits answer "403 or 429": a response with a valid `retry-after`, or spent with a valid
/// reset, is [`refused`](crate::signals::Reading::refused), so that a 403 with them throttles.
pub(super) fn read(c: &mut Collector<'_>) {
    let left = c.wait_when_spent(
        Reader::Github,
        &X_RATELIMIT_REMAINING,
        &X_RATELIMIT_RESET,
        grammars::epoch_seconds,
    );
    let valid = |name: &HeaderName, parse: fn(&str) -> Option<Value>| {
        values::texts(c.headers, name).any(|text| parse(text).is_some())
    };
    let retry_after = |text: &str| {
        values::delay_seconds(text).or_else(|| httpdate::parse_http_date(text).ok().map(Value::At))
    };
    if (left == Some(0) && valid(&X_RATELIMIT_RESET, grammars::epoch_seconds))
        || valid(&header::RETRY_AFTER, retry_after)
    {
        c.reading.refused = true;
    }
    if let Some(left) = left {
        c.remaining(left);
    }
    c.bucket(&X_RATELIMIT_RESOURCE);
    // GitHub documents `x-ratelimit-limit` per hour; its search resources per minute.
    if let Some(limit) = grammars::smallest_count(c.headers, &X_RATELIMIT_LIMIT) {
        let per_minute = matches!(c.reading.bucket.as_deref(), Some("search" | "code_search"));
        c.limit_per(
            limit,
            Duration::from_secs(if per_minute { 60 } else { 3600 }),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::signals::tests::{at, headers};
    use crate::signals::{DateTrust, Dialect, Policy, ReadContext, Reader, Wait};

    /// GitHub's documented example ("Rate limits for the REST API" and the older
    /// "Resources in the REST API" page): `Date` and an epoch reset 1247 s later.
    const EXAMPLE: &[(&str, &[u8])] = &[
        ("date", b"Mon, 01 Jul 2013 17:27:06 GMT"),
        ("x-ratelimit-limit", b"60"),
        ("x-ratelimit-remaining", b"56"),
        ("x-ratelimit-used", b"4"),
        ("x-ratelimit-reset", b"1372700873"),
        ("x-ratelimit-resource", b"core"),
    ];

    fn example(remaining: &'static [u8]) -> http::HeaderMap {
        let mut h = headers(EXAMPLE);
        h.insert(
            "x-ratelimit-remaining",
            http::HeaderValue::from_static(std::str::from_utf8(remaining).unwrap_or("x")),
        );
        h
    }

    fn cx() -> ReadContext {
        ReadContext::new(at("Mon, 01 Jul 2013 17:27:06 GMT"))
    }

    #[test]
    fn documented_example() {
        let r = Dialect::github().read(&example(b"56"), &cx());
        assert_eq!(r.wait, None, "56 left: no wait");
        assert_eq!((r.remaining, r.limit), (Some(56), Some(60)));
        assert_eq!(r.bucket.as_deref(), Some("core"));
        assert_eq!(r.date, DateTrust::NotNeeded);
        let r = Dialect::github().read(&example(b"0"), &cx());
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(1247))));
        assert_eq!(r.source, Some(Reader::Github));
        assert_eq!(r.date, DateTrust::Trusted);
    }

    #[test]
    fn the_limit_is_advertised_per_the_documented_window() {
        let per = |quota, secs| {
            Some(Policy {
                quota,
                window: Duration::from_secs(secs),
            })
        };
        let r = Dialect::github().read(&example(b"56"), &cx());
        assert_eq!(r.policy, per(60, 3600), "core: requests per hour");
        let mut h = example(b"29");
        h.insert("x-ratelimit-limit", http::HeaderValue::from_static("30"));
        h.insert(
            "x-ratelimit-resource",
            http::HeaderValue::from_static("search"),
        );
        let r = Dialect::github().read(&h, &cx());
        assert_eq!(r.policy, per(30, 60), "search: requests per minute");
    }

    #[test]
    fn secondary_limit_retry_after() {
        // A secondary limit: `retry-after`, with the primary limit far from spent.
        let mut h = example(b"4999");
        h.insert("retry-after", http::HeaderValue::from_static("60"));
        let r = Dialect::github().read(&h, &cx());
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(60))));
        assert_eq!(r.source, Some(Reader::RetryAfter));
    }

    #[test]
    fn reset_is_always_epoch_in_this_dialect() {
        // A small value is an epoch in 1970: long past, so zero.
        let h = headers(&[
            ("x-ratelimit-remaining", b"0"),
            ("x-ratelimit-reset", b"30"),
        ]);
        let r = Dialect::github().read(&h, &cx());
        assert_eq!(r.wait, Some(Wait::For(Duration::ZERO)));
        assert_eq!(r.date, DateTrust::Absent);
        // Far future beyond MAX_DELAY, and beyond u64.
        for far in [&b"99999999999"[..], b"99999999999999999999999"] {
            let h = headers(&[("x-ratelimit-remaining", b"0"), ("x-ratelimit-reset", far)]);
            let r = Dialect::github().read(&h, &cx());
            assert!(matches!(r.wait, Some(Wait::TooLong { .. })), "{far:?}");
        }
    }

    #[test]
    fn refused_by_the_documented_signals_only() {
        // GitHub's "403 or 429": spent with a reset (a primary limit), or a `retry-after` (a
        // secondary limit), with the documented example headers.
        let r = Dialect::github().read(&example(b"0"), &cx());
        assert!(r.refused);
        let mut h = example(b"4999");
        h.insert("retry-after", http::HeaderValue::from_static("60"));
        assert!(Dialect::github().read(&h, &cx()).refused);
        // Neither: a plain 403 (permissions), or signals that do not parse.
        assert!(!Dialect::github().read(&example(b"56"), &cx()).refused);
        let mut h = example(b"0");
        h.insert("x-ratelimit-reset", http::HeaderValue::from_static("soon"));
        h.insert("retry-after", http::HeaderValue::from_static("later"));
        assert!(!Dialect::github().read(&h, &cx()).refused);
        // Only the GitHub reader says so.
        let r = Dialect::generic().read(&example(b"0"), &cx());
        assert!(!r.refused);
    }

    #[test]
    fn epoch_milliseconds_are_milliseconds() {
        // `1372700873000`: the documented reset, in milliseconds.
        let mut h = example(b"0");
        h.insert(
            "x-ratelimit-reset",
            http::HeaderValue::from_static("1372700873000"),
        );
        let r = Dialect::github().read(&h, &cx());
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(1247))));
        // Just below the threshold: seconds, past any representable wait.
        h.insert(
            "x-ratelimit-reset",
            http::HeaderValue::from_static("999999999999"),
        );
        let r = Dialect::github().read(&h, &cx());
        assert!(matches!(r.wait, Some(Wait::TooLong { .. })));
    }
}
