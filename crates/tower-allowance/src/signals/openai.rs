//! OpenAI's API: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go
//! durations (`1s`, `6m0s`, `20ms`).

use std::time::Duration;

use http::HeaderName;

use super::grammars;
use crate::signals::{Collector, Reader};

const LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");
const RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");

const MINUTE: Duration = Duration::from_secs(60);

/// A spent request or token budget waits until its reset. Token counts are not request
/// counts: they only matter when they reach zero.
pub(super) fn read(c: &mut Collector<'_>) {
    let reader = Reader::OpenAi;
    let left = c.wait_when_spent(
        reader,
        &REMAINING_REQUESTS,
        &RESET_REQUESTS,
        grammars::go_duration,
    );
    if let Some(left) = left {
        c.remaining(left);
    }
    c.wait_when_spent(
        reader,
        &REMAINING_TOKENS,
        &RESET_TOKENS,
        grammars::go_duration,
    );
    // OpenAI documents its request limits per minute (RPM).
    if let Some(limit) = grammars::smallest_count(c.headers, &LIMIT_REQUESTS) {
        c.limit_per(limit, MINUTE);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::signals::tests::read;
    use crate::signals::{DateTrust, Dialect, Policy, Reader, Wait};

    /// The example of OpenAI's rate-limit guide ("Rate limits in headers").
    const EXAMPLE: [(&str, &[u8]); 6] = [
        ("x-ratelimit-limit-requests", b"60"),
        ("x-ratelimit-limit-tokens", b"150000"),
        ("x-ratelimit-remaining-requests", b"59"),
        ("x-ratelimit-remaining-tokens", b"149984"),
        ("x-ratelimit-reset-requests", b"1s"),
        ("x-ratelimit-reset-tokens", b"6m0s"),
    ];

    fn with(changes: &[(&'static str, &'static [u8])]) -> Vec<(&'static str, &'static [u8])> {
        let mut h: Vec<_> = EXAMPLE
            .iter()
            .filter(|(k, _)| !changes.iter().any(|(c, _)| c == k))
            .copied()
            .collect();
        h.extend_from_slice(changes);
        h
    }

    #[test]
    fn documented_example_never_waits() {
        let r = read(Dialect::openai(), &EXAMPLE);
        assert_eq!((r.wait, r.remaining, r.limit), (None, Some(59), Some(60)));
        let minute = Duration::from_secs(60);
        assert_eq!(
            r.policy,
            Some(Policy {
                quota: 60,
                window: minute
            }),
            "RPM"
        );
        assert_eq!(r.date, DateTrust::NotNeeded);
    }

    #[test]
    fn spent_requests_or_tokens_wait_for_their_reset() {
        let r = read(
            Dialect::openai(),
            &with(&[("x-ratelimit-remaining-requests", b"0")]),
        );
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(1))));
        assert_eq!((r.source, r.remaining), (Some(Reader::OpenAi), Some(0)));
        let r = read(
            Dialect::openai(),
            &with(&[("x-ratelimit-remaining-tokens", b"0")]),
        );
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(360))));
        assert_eq!(r.remaining, Some(59), "tokens are not requests");
        // Both spent: the longer reset.
        let r = read(
            Dialect::openai(),
            &with(&[
                ("x-ratelimit-remaining-requests", b"0"),
                ("x-ratelimit-remaining-tokens", b"0"),
                ("x-ratelimit-reset-requests", b"1m30.5s"),
                ("x-ratelimit-reset-tokens", b"20ms"),
            ]),
        );
        assert_eq!(r.wait, Some(Wait::For(Duration::from_millis(90_500))));
        let r = read(
            Dialect::openai(),
            &with(&[
                ("x-ratelimit-remaining-requests", b"0"),
                ("x-ratelimit-reset-requests", b"2h1m"),
            ]),
        );
        assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(7260))));
    }

    #[test]
    fn bad_durations_are_ignored() {
        let r = read(
            Dialect::openai(),
            &with(&[
                ("x-ratelimit-remaining-requests", b"0"),
                ("x-ratelimit-reset-requests", b"soon"),
            ]),
        );
        assert_eq!((r.wait, r.remaining), (None, Some(0)));
        // Not read at all outside the OpenAI dialect.
        let r = read(
            Dialect::standard(),
            &with(&[("x-ratelimit-remaining-requests", b"0")]),
        );
        assert_eq!((r.wait, r.remaining), (None, None));
    }
}
