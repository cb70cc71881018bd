//! Anthropic's API: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
//! remaining,reset}`, resets as RFC 3339 timestamps; `retry-after` is the
//! [`RetryAfter`](crate::signals::Reader::RetryAfter) reader's.

use std::time::Duration;

use http::HeaderName;

use super::grammars;
use crate::signals::{Collector, Reader};

const REQUESTS_LIMIT: HeaderName = HeaderName::from_static("anthropic-ratelimit-requests-limit");
const REQUESTS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-remaining");
const REQUESTS_RESET: HeaderName = HeaderName::from_static("anthropic-ratelimit-requests-reset");
const TOKEN_FAMILIES: [(HeaderName, HeaderName); 3] = [
    (
        HeaderName::from_static("anthropic-ratelimit-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-tokens-reset"),
    ),
    (
        HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-input-tokens-reset"),
    ),
    (
        HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-output-tokens-reset"),
    ),
];

/// A spent request or token budget waits until its reset, measured against `Date`.
pub(super) fn read(c: &mut Collector<'_>) {
    let reader = Reader::Anthropic;
    let left = c.wait_when_spent(
        reader,
        &REQUESTS_REMAINING,
        &REQUESTS_RESET,
        grammars::rfc3339,
    );
    if let Some(left) = left {
        c.remaining(left);
    }
    for (remaining, reset) in &TOKEN_FAMILIES {
        c.wait_when_spent(reader, remaining, reset, grammars::rfc3339);
    }
    // Anthropic documents its request limits per minute (RPM), replenished continuously.
    if let Some(limit) = grammars::smallest_count(c.headers, &REQUESTS_LIMIT) {
        c.limit_per(limit, Duration::from_secs(60));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::signals::tests::{at, headers};
    use crate::signals::{DateTrust, Dialect, Policy, ReadContext, Reader, Wait};

    /// The headers of Anthropic's "Rate limits" page (its response-header table), with
    /// values of ours: a minute's request budget, and token budgets.
    const EXAMPLE: [(&str, &[u8]); 13] = [
        ("date", b"Wed, 19 Jun 2024 15:20:00 GMT"),
        ("anthropic-ratelimit-requests-limit", b"50"),
        ("anthropic-ratelimit-requests-remaining", b"49"),
        (
            "anthropic-ratelimit-requests-reset",
            b"2024-06-19T15:20:30Z",
        ),
        ("anthropic-ratelimit-tokens-limit", b"80000"),
        ("anthropic-ratelimit-tokens-remaining", b"79000"),
        ("anthropic-ratelimit-tokens-reset", b"2024-06-19T15:20:01Z"),
        ("anthropic-ratelimit-input-tokens-limit", b"40000"),
        ("anthropic-ratelimit-input-tokens-remaining", b"39500"),
        (
            "anthropic-ratelimit-input-tokens-reset",
            b"2024-06-19T15:20:01Z",
        ),
        ("anthropic-ratelimit-output-tokens-limit", b"8000"),
        ("anthropic-ratelimit-output-tokens-remaining", b"7500"),
        (
            "anthropic-ratelimit-output-tokens-reset",
            b"2024-06-19T15:20:02.500Z",
        ),
    ];

    fn cx() -> ReadContext {
        ReadContext::new(at("Wed, 19 Jun 2024 15:20:00 GMT"))
    }

    fn set(name: &str, value: &'static str) -> http::HeaderMap {
        let mut h = headers(&EXAMPLE);
        let name = http::HeaderName::from_bytes(name.as_bytes()).expect("a header name");
        h.insert(name, http::HeaderValue::from_static(value));
        h
    }

    #[test]
    fn documented_headers() {
        let r = Dialect::anthropic().read(&headers(&EXAMPLE), &cx());
        assert_eq!((r.wait, r.remaining, r.limit), (None, Some(49), Some(50)));
        let minute = Duration::from_secs(60);
        assert_eq!(
            r.policy,
            Some(Policy {
                quota: 50,
                window: minute
            }),
            "RPM"
        );
        let r =
            Dialect::anthropic().read(&set("anthropic-ratelimit-requests-remaining", "0"), &cx());
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(30))));
        assert_eq!(
            (r.source, r.date),
            (Some(Reader::Anthropic), DateTrust::Trusted)
        );
        for family in ["tokens", "input-tokens", "output-tokens"] {
            let name = format!("anthropic-ratelimit-{family}-remaining");
            let r = Dialect::anthropic().read(&set(&name, "0"), &cx());
            assert!(r.wait.is_some(), "{family}");
            assert_eq!(r.remaining, Some(49), "{family}: tokens are not requests");
        }
        let r = Dialect::anthropic().read(
            &set("anthropic-ratelimit-output-tokens-remaining", "0"),
            &cx(),
        );
        assert_eq!(r.wait, Some(Wait::For(Duration::from_millis(2500))));
    }

    #[test]
    fn retry_after_on_429_and_offsets() {
        let mut h = set("anthropic-ratelimit-requests-remaining", "0");
        h.insert("retry-after", http::HeaderValue::from_static("45"));
        let r = Dialect::anthropic().read(&h, &cx());
        assert_eq!(
            (r.wait, r.source),
            (
                Some(Wait::For(Duration::from_secs(45))),
                Some(Reader::RetryAfter)
            )
        );
        let mut h = set("anthropic-ratelimit-requests-remaining", "0");
        h.insert(
            "anthropic-ratelimit-requests-reset",
            http::HeaderValue::from_static("2024-06-19T17:21:00+02:00"),
        );
        let r = Dialect::anthropic().read(&h, &cx());
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(60))));
        h.insert(
            "anthropic-ratelimit-requests-reset",
            http::HeaderValue::from_static("in a minute"),
        );
        assert_eq!(Dialect::anthropic().read(&h, &cx()).wait, None);
    }
}
