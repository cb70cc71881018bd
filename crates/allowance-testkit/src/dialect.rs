//! The rate-limit headers each provider sends, so the test upstream can speak like it.
//!
//! [`ServerDialect::headers`] is pure: given what the server's bucket knows ([`LimitState`],
//! including the server's wall clock) and whether it is answering with a 429
//! ([`Answer`]), it returns the headers that provider would send. The client side reads
//! them with the matching [`tower_allowance::signals::Dialect`]
//! ([`ServerDialect::client_dialect`]).
//!
//! | dialect | every response | on a 429 |
//! | --- | --- | --- |
//! | `odds` | `x-ratelimit-limit`, `-remaining`, `x-ratelimit-bucket: odds` (no reset) | `retry-after` |
//! | `ietf` | `ratelimit-policy: "default";q=L;w=W`, `ratelimit: "default";r=R;t=T` | `retry-after` |
//! | `github` | `date`, `x-ratelimit-limit`, `-remaining`, `-used`, `-reset` (epoch s), `-resource: core` | `retry-after` |
//! | `openai` | `x-ratelimit-limit-requests`, `-remaining-requests`, `-reset-requests` (Go duration) | `retry-after` |
//! | `anthropic` | `date`, `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` (RFC 3339) | `retry-after` |
//!
//! Resets in whole seconds are rounded up, so a client never computes a wait shorter than
//! the bucket's (it may compute up to two seconds more, against a `Date` rounded down).
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use allowance_testkit::dialect::{Answer, LimitState, ServerDialect};
//! use tower_allowance::signals::{ReadContext, Wait};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dialect: ServerDialect = "openai".parse()?;
//! let state = LimitState {
//!     limit: 2,
//!     window: Duration::from_secs(1),
//!     remaining: 0,
//!     next_token: Duration::from_millis(500),
//!     now: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
//! };
//! let headers = dialect.headers(&state, Answer::Throttled { retry_after: None });
//! assert_eq!(headers["x-ratelimit-reset-requests"], "500ms");
//! let reading = dialect.client_dialect().read(&headers, &ReadContext::new(state.now));
//! assert_eq!(reading.wait, Some(Wait::For(Duration::from_millis(500))));
//! # Ok(())
//! # }
//! ```

use std::{
    fmt,
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http::{header, HeaderMap, HeaderName, HeaderValue};
use tower_allowance::signals::Dialect;

/// Which provider's rate-limit headers the upstream sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ServerDialect {
    /// The odds API shape: `X-RateLimit-Limit`, `-Remaining`, `-Bucket`, `Retry-After`.
    #[default]
    Odds,
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit` and `RateLimit-Policy`.
    Ietf,
    /// GitHub: `x-ratelimit-*` with an epoch-seconds reset.
    Github,
    /// OpenAI: `x-ratelimit-*-requests` with a Go-duration reset.
    OpenAi,
    /// Anthropic: `anthropic-ratelimit-requests-*` with an RFC 3339 reset.
    Anthropic,
}

/// What the server's bucket knows when it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitState {
    /// Requests allowed per window (the bucket's burst, for a token bucket).
    pub limit: u64,
    /// The window `limit` applies to.
    pub window: Duration,
    /// Requests left now.
    pub remaining: u64,
    /// Time until the bucket has a token again (zero while `remaining > 0`).
    pub next_token: Duration,
    /// The server's wall clock.
    pub now: SystemTime,
}

/// The kind of response the headers go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A successful response.
    Success,
    /// A 429, with its `Retry-After` delay-seconds if it sends one.
    Throttled {
        /// `Retry-After` in seconds; `None` sends no `Retry-After`.
        retry_after: Option<u64>,
    },
}

/// A dialect name that is not one of `odds|ietf|github|openai|anthropic`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownDialect {
    /// The name given.
    pub given: String,
}

const BUCKET: HeaderName = HeaderName::from_static("x-ratelimit-bucket");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const OPENAI_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const OPENAI_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const OPENAI_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const ANTHROPIC_LIMIT: HeaderName = HeaderName::from_static("anthropic-ratelimit-requests-limit");
const ANTHROPIC_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-remaining");
const ANTHROPIC_RESET: HeaderName = HeaderName::from_static("anthropic-ratelimit-requests-reset");

// === impl ServerDialect ===

impl ServerDialect {
    /// Every dialect, in the order of the command line's help.
    pub const ALL: [ServerDialect; 5] = [
        ServerDialect::Odds,
        ServerDialect::Ietf,
        ServerDialect::Github,
        ServerDialect::OpenAi,
        ServerDialect::Anthropic,
    ];

    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            ServerDialect::Odds => "odds",
            ServerDialect::Ietf => "ietf",
            ServerDialect::Github => "github",
            ServerDialect::OpenAi => "openai",
            ServerDialect::Anthropic => "anthropic",
        }
    }

    /// The client-side dialect that reads what this one writes.
    pub const fn client_dialect(self) -> Dialect {
        match self {
            ServerDialect::Odds => Dialect::x_ratelimit(),
            ServerDialect::Ietf => Dialect::ietf(),
            ServerDialect::Github => Dialect::github(),
            ServerDialect::OpenAi => Dialect::openai(),
            ServerDialect::Anthropic => Dialect::anthropic(),
        }
    }

    /// The rate-limit headers this provider would send with `answer`, given `state`.
    pub fn headers(self, state: &LimitState, answer: Answer) -> HeaderMap {
        let mut h = HeaderMap::new();
        let LimitState {
            limit, remaining, ..
        } = *state;
        let reset_at = state.now.checked_add(state.next_token).unwrap_or(state.now);
        match self {
            ServerDialect::Odds => {
                h.insert(X_LIMIT, limit.into());
                h.insert(X_REMAINING, remaining.into());
                h.insert(BUCKET, HeaderValue::from_static("odds"));
            }
            ServerDialect::Ietf => {
                let window = ceil_secs(state.window).max(1);
                let reset = ceil_secs(state.next_token);
                put(
                    &mut h,
                    RATELIMIT_POLICY,
                    format!("\"default\";q={limit};w={window}"),
                );
                put(
                    &mut h,
                    RATELIMIT,
                    format!("\"default\";r={remaining};t={reset}"),
                );
            }
            ServerDialect::Github => {
                put(&mut h, header::DATE, httpdate::fmt_http_date(state.now));
                h.insert(X_LIMIT, limit.into());
                h.insert(X_REMAINING, remaining.into());
                h.insert(X_USED, limit.saturating_sub(remaining).into());
                let epoch = reset_at.duration_since(UNIX_EPOCH).unwrap_or_default();
                h.insert(X_RESET, ceil_secs(epoch).into());
                h.insert(X_RESOURCE, HeaderValue::from_static("core"));
            }
            ServerDialect::OpenAi => {
                h.insert(OPENAI_LIMIT, limit.into());
                h.insert(OPENAI_REMAINING, remaining.into());
                put(&mut h, OPENAI_RESET, go_duration(state.next_token));
            }
            ServerDialect::Anthropic => {
                put(&mut h, header::DATE, httpdate::fmt_http_date(state.now));
                h.insert(ANTHROPIC_LIMIT, limit.into());
                h.insert(ANTHROPIC_REMAINING, remaining.into());
                put(&mut h, ANTHROPIC_RESET, rfc3339_ceil(reset_at));
            }
        }
        if let Answer::Throttled {
            retry_after: Some(secs),
        } = answer
        {
            h.insert(header::RETRY_AFTER, secs.into());
        }
        h
    }
}

impl fmt::Display for ServerDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ServerDialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDialect {
                given: s.to_owned(),
            })
    }
}

// === impl UnknownDialect ===

impl fmt::Display for UnknownDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown dialect {:?}: expected odds, ietf, github, openai or anthropic",
            self.given
        )
    }
}

impl std::error::Error for UnknownDialect {}

// === formatting ===

/// Inserts a value built from text that is always visible ASCII here.
fn put(h: &mut HeaderMap, name: HeaderName, value: String) {
    if let Ok(value) = HeaderValue::try_from(value) {
        h.insert(name, value);
    }
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Go's `time.Duration.String()`: `0s`, `20ms`, `1.5µs`, `1.5s`, `6m0s`, `2h1m0s`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        let (unit_nanos, unit) = match nanos {
            0..1_000 => (1, "ns"),
            1_000..1_000_000 => (1_000, "\u{b5}s"),
            _ => (1_000_000, "ms"),
        };
        return format!(
            "{}{}{unit}",
            nanos / unit_nanos,
            fraction(nanos % unit_nanos, unit_nanos)
        );
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3_600, secs / 60 % 60, secs % 60);
    let frac = fraction(u128::from(d.subsec_nanos()), 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{s}{frac}s"),
        (0, _) => format!("{m}m{s}{frac}s"),
        _ => format!("{h}h{m}m{s}{frac}s"),
    }
}

/// `.ddd` for `rem / unit` without trailing zeros; empty for zero. `unit` is a power of 10.
fn fraction(rem: u128, unit: u128) -> String {
    if rem == 0 {
        return String::new();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{rem:0width$}");
    format!(".{}", digits.trim_end_matches('0'))
}

/// RFC 3339 in UTC, whole seconds rounded up: `2013-07-01T17:47:53Z`.
pub fn rfc3339_ceil(t: SystemTime) -> String {
    let secs = ceil_secs(t.duration_since(UNIX_EPOCH).unwrap_or_default());
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // H. Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_allowance::signals::{Policy, ReadContext, Reading, Wait};

    fn state(remaining: u64, next_token: Duration) -> LimitState {
        LimitState {
            limit: 4,
            window: Duration::from_secs(1),
            remaining,
            next_token,
            // Not on a whole second, so rounding is exercised.
            now: UNIX_EPOCH + Duration::from_millis(1_700_000_000_300),
        }
    }

    fn round_trip(dialect: ServerDialect, state: &LimitState, answer: Answer) -> Reading {
        let headers = dialect.headers(state, answer);
        dialect
            .client_dialect()
            .read(&headers, &ReadContext::new(state.now))
    }

    #[test]
    fn names_round_trip() {
        for d in ServerDialect::ALL {
            assert_eq!(d.to_string().parse::<ServerDialect>(), Ok(d));
        }
        assert_eq!(ServerDialect::default(), ServerDialect::Odds);
        let err = "aws".parse::<ServerDialect>().expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "unknown dialect \"aws\": expected odds, ietf, github, openai or anthropic"
        );
    }

    #[test]
    fn positive_remaining_never_waits() {
        for d in ServerDialect::ALL {
            let r = round_trip(d, &state(3, Duration::ZERO), Answer::Success);
            assert_eq!(r.wait, None, "{d}");
            assert_eq!((r.remaining, r.limit), (Some(3), Some(4)), "{d}");
        }
    }

    #[test]
    fn spent_bucket_waits_until_the_next_token() {
        let next = Duration::from_millis(1_500);
        for d in ServerDialect::ALL {
            for answer in [Answer::Success, Answer::Throttled { retry_after: None }] {
                let r = round_trip(d, &state(0, next), answer);
                assert_eq!(r.remaining, Some(0), "{d}");
                if d == ServerDialect::Odds {
                    // The odds shape has no reset: only a 429's Retry-After makes a wait.
                    assert_eq!(r.wait, None, "{d}");
                    continue;
                }
                let wait = r.wait.as_ref().and_then(Wait::duration);
                // Never shorter than the bucket's; whole-second resets against a `Date`
                // rounded down may add up to two seconds.
                let ok = wait.is_some_and(|w| w >= next && w <= next + Duration::from_secs(2));
                assert!(ok, "{d} {answer:?}: {r:?}");
                if d == ServerDialect::OpenAi {
                    assert_eq!(wait, Some(next), "Go durations are exact");
                }
            }
        }
    }

    #[test]
    fn throttled_with_retry_after() {
        for d in ServerDialect::ALL {
            let s = state(0, Duration::from_millis(400));
            let r = round_trip(
                d,
                &s,
                Answer::Throttled {
                    retry_after: Some(3),
                },
            );
            assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(3))), "{d}");
            // No Retry-After on a success.
            let headers = d.headers(&s, Answer::Success);
            assert!(!headers.contains_key(header::RETRY_AFTER), "{d}");
        }
    }

    #[test]
    fn ietf_advertises_its_policy() {
        let s = LimitState {
            window: Duration::from_millis(500),
            ..state(1, Duration::ZERO)
        };
        let r = round_trip(ServerDialect::Ietf, &s, Answer::Success);
        assert_eq!(
            r.policy,
            Some(Policy {
                quota: 4,
                window: Duration::from_secs(1)
            })
        );
    }

    #[test]
    fn provider_formats() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(go_duration(Duration::from_millis(90_500)), "1m30.5s");
        assert_eq!(go_duration(Duration::from_secs(7_260)), "2h1m0s");
        assert_eq!(go_duration(Duration::from_nanos(1_500)), "1.5\u{b5}s");
        assert_eq!(go_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(
            go_duration(Duration::from_nanos(1_000_000_001)),
            "1.000000001s"
        );
        let t = UNIX_EPOCH + Duration::from_secs(1_372_700_873);
        assert_eq!(rfc3339_ceil(t), "2013-07-01T17:47:53Z");
        assert_eq!(
            rfc3339_ceil(t + Duration::from_millis(1)),
            "2013-07-01T17:47:54Z"
        );
        assert_eq!(rfc3339_ceil(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_ceil(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        let h =
            ServerDialect::Ietf.headers(&state(0, Duration::from_millis(1_500)), Answer::Success);
        assert_eq!(h["ratelimit"], "\"default\";r=0;t=2");
        assert_eq!(h["ratelimit-policy"], "\"default\";q=4;w=1");
    }
}
