//! Reading the rate-limit signals real APIs send: pure header readers, one per dialect.
//!
//! A [`Dialect`] is a small set of [`Reader`]s, chosen per allowance. [`Dialect::read`] turns
//! a response's headers into one [`Reading`]: the longest wait any reader in the set asked
//! for, the smallest remaining count, the most restrictive advertised policy, and how
//! absolute times were measured. It reads no clock (the local wall clock comes in a
//! [`ReadContext`]), never panics on input, and allocates only what the reading holds.
//!
#![cfg_attr(feature = "dialects", doc = "```")]
#![cfg_attr(not(feature = "dialects"), doc = "```ignore")]
//! use std::time::Duration;
//! use http::HeaderMap;
//! use tower_allowance::signals::{DateTrust, Dialect, ReadContext, Reader, Wait};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A 429 asking for 30 s as an HTTP-date, measured against the response's own `Date`.
//! let mut headers = HeaderMap::new();
//! headers.insert("date", "Mon, 01 Jul 2013 17:27:06 GMT".parse()?);
//! headers.insert("retry-after", "Mon, 01 Jul 2013 17:27:36 GMT".parse()?);
//!
//! // The caller's wall clock, read once by the caller (here: 2 s behind the server).
//! let now = httpdate::parse_http_date("Mon, 01 Jul 2013 17:27:04 GMT")?;
//! let reading = Dialect::standard().read(&headers, &ReadContext::new(now));
//! assert_eq!(reading.wait, Some(Wait::For(Duration::from_secs(30))));
//! assert_eq!(reading.source, Some(Reader::RetryAfter));
//! assert_eq!(reading.date, DateTrust::Trusted);
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! This module is public with the `dialects` feature, which adds the providers' readers below
//! (and `sfv`, for the IETF fields) and their dialects (`Dialect::github()`, `openai()`,
//! `anthropic()`, `ietf()`, `x_ratelimit()`, and `generic()`: the IETF fields and
//! `X-RateLimit-*` beside `Retry-After`). [`Dialect::standard`], the default, is
//! [`RetryAfter`](Reader::RetryAfter) and [`RetryAfterMs`](Reader::RetryAfterMs) in every
//! build: enabling the feature adds dialects to choose from and changes no allowance that
//! does not choose one. Only the providers' readers fill [`Reading::remaining`],
//! [`limit`](Reading::limit), [`policy`](Reading::policy) and [`bucket`](Reading::bucket).
//! Without the feature the cooldown reads `Retry-After` and `retry-after-ms` through the same
//! code, and [`retry_after`](crate::retry_after) is public at the crate root.
//!
//! # Readers and the headers they read
//!
//! | [`Reader`] | headers | wait when |
//! | --- | --- | --- |
//! | [`RetryAfter`](Reader::RetryAfter) | `Retry-After`: delay-seconds (`1*DIGIT`) or an HTTP-date (IMF-fixdate, RFC 850, asctime) | present |
//! | [`RetryAfterMs`](Reader::RetryAfterMs) | `retry-after-ms`: milliseconds, `1*DIGIT ["." 1*DIGIT]` | present |
//! | `Ietf` (`dialects`) | `RateLimit-Policy: "default";q=100;w=60`, `RateLimit: "default";r=0;t=30` (draft-ietf-httpapi-ratelimit-headers-10) | an item has `r=0` |
//! | `IetfLegacy` (`dialects`) | `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (delta seconds, or an epoch; drafts up to -06) | remaining is 0 |
//! | `Github` (`dialects`) | `x-ratelimit-limit`, `-remaining`, `-reset` (epoch seconds), `-resource` (`-used` is not needed) | remaining is 0 |
//! | `OpenAi` (`dialects`) | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations (`1s`, `6m0s`, `20ms`) | a remaining is 0 |
//! | `Anthropic` (`dialects`) | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`, resets in RFC 3339 | a remaining is 0 |
//! | `XRateLimit` (`dialects`) | `X-RateLimit-Limit`, `-Remaining`, `-Bucket`, and `-Reset` (epoch or delta, see below) | remaining is 0 |
//!
//! The status code is not considered: which responses to read is the caller's choice.
//!
//! # Semantics
//!
//! - **Every signal is read, and combined by one rule.** A response's waits come in two kinds:
//!   a `Retry-After` (or `retry-after-ms`), and a *reset* (a spent remaining count:
//!   `remaining: 0` with its reset time, in any reader). [`Reading::reset`] is the longest
//!   reset. [`Reading::wait`], the wait of a throttling response, is the longest of them all,
//!   with one exception the IETF draft makes: when a `Retry-After` was read, it takes
//!   precedence over the IETF fields' resets (`RateLimit`'s `t`, the legacy `RateLimit-Reset`),
//!   which are then left out of it (draft-ietf-httpapi-ratelimit-headers: when a response
//!   has both, `Retry-After` takes precedence and the reset may be ignored); every other
//!   reset still counts, and the longest wins. The cooldown layer applies it so: a
//!   **throttling** response (or a transient one) waits [`Reading::wait`]; a **success**
//!   waits only [`Reading::reset`]
//!   (`remaining: 0` with a reset is the allowance spent until then), and a `Retry-After` on
//!   it is no wait and never wipes the reset. So a 200 with `x-ratelimit-remaining: 0`, a
//!   reset 30 s ahead and `Retry-After: 60` (or `: 5`) cools down for 30 s; a 429 with
//!   `RateLimit: "d";r=0;t=30` and `Retry-After: 5` for 5 s; a 429 with GitHub's reset 30 s
//!   ahead and `Retry-After: 5` for 30 s.
//! - **The longest wait wins.** Over every reader in the set and every duplicate field line,
//!   [`Reading::wait`] is the longest (but for the precedence above), and
//!   [`Reading::source`] names the reader that asked for it (on a tie, the first in
//!   [`Reader`] order). A value too large to represent ([`Wait::TooLong`]: beyond
//!   [`MAX_DELAY`], 2^53 µs, or digits that overflow) is longer than any other and is never
//!   clamped: `Retry-After: 1` plus
//!   `Retry-After: 99999999999999999999` is `TooLong`. Arithmetic is checked throughout.
//! - **Invalid values are ignored.** `later`, `-1`, `1.5` (for `Retry-After`), empty values and
//!   bytes that are not UTF-8 never invent a wait and never shorten one. Each IETF field
//!   line is parsed on its own (with `sfv`), so one malformed line does not discard the
//!   others. Structured-field integers have at most 15 digits: a longer `t` makes its line
//!   invalid (RFC 9651), and the line is ignored rather than read as `TooLong`.
//! - **Remaining counts are approximate.** `remaining == 0` together with a reset time of
//!   the same family means "wait until that reset". A positive remaining never produces a
//!   wait, and is never a promise: several responses each saying "1 left" do not reserve
//!   several slots. [`Reading::remaining`] is the smallest request count reported (token
//!   counts only matter when they reach 0); among duplicate lines, the smallest counts.
//! - **IETF policies are matched by name.** A `RateLimit` item with `r=0` waits `t` seconds;
//!   without `t`, it waits the window `w` of the `RateLimit-Policy` of the same name (the
//!   longest the server can mean), or not at all. Its remaining counts as requests unless
//!   its policy declares another quota unit (`qu`). [`Reading::policy`] is the most
//!   restrictive request policy with a window (lowest `q/w`); the first 16 policies are
//!   read.
//! - **Limits are policies where the provider documents a window**: OpenAI's and
//!   Anthropic's request limits per minute, GitHub's per hour (per minute for `search` and
//!   `code_search`). A limit with no documented window is [`Reading::limit`] only.
//! - **Absolute times** (epoch seconds, RFC 3339, HTTP-date) are measured against the
//!   response's `Date` when it parses and lies within [`ReadContext::max_skew`] of the
//!   local clock ([`DateTrust::Trusted`]). `Date` has whole seconds, so it only places the
//!   server's time within a second: when the local clock, at the response's arrival, lies
//!   in `[Date, Date + 1 s)`, it is the reference (a reset or a `Retry-After` date at
//!   `Date + 30 s` read 0.6 s into that second is a wait of 29.4 s, not 30 s: it ends at the
//!   time the server named, not up to a second past it); otherwise `Date` is (the longer
//!   wait). Otherwise they are measured against the local clock, and [`Reading::date`]
//!   says why ([`DateTrust::Absent`], [`DateTrust::Untrusted`], [`DateTrust::Unparseable`])
//!   so the caller can warn. A time in the past is a wait of
//!   zero (`Wait::For(Duration::ZERO)`): the caller applies its own floor.
//! - **Epoch or delta?** GitHub's `x-ratelimit-reset` is epoch seconds. In the `XRateLimit`
//!   reader (`Dialect::x_ratelimit`, `Dialect::generic`) a generic `X-RateLimit-Reset` of at least
//!   `EPOCH_THRESHOLD` (1,000,000,000: September 2001) is epoch seconds, and a smaller one
//!   delta seconds: no API resets a window 31 years ahead, and no server's clock reads 2001.
//!   The legacy `RateLimit-Reset` (delta seconds by the drafts) is read the same way, since
//!   servers send epochs there too. Where epoch seconds are expected (GitHub's reset, an epoch
//!   `X-RateLimit-Reset` or `RateLimit-Reset`), a value of at least `EPOCH_MILLIS_THRESHOLD`
//!   (10^12) is epoch *milliseconds*: `1767225600000` is 2026-01-01, not a wait of some
//!   56,000 years that would close the allowance.
//! - **GitHub's 403.** GitHub answers its primary and secondary limits with "403 or 429". The
//!   `Github` reader marks a response carrying a valid `retry-after`, or
//!   `x-ratelimit-remaining: 0` with a valid reset, as [`Reading::refused`]; the cooldown layer
//!   then classifies a 403 that its classifier calls a failure as throttling (so it waits and
//!   is retried). A 403 without those signals stays a final 403, and no other reader sets it.
//!
//! [`MAX_DELAY`]: crate::MAX_DELAY
//!
//! # Cost
//!
//! A response without headers is answered at once; otherwise each reader in the set looks
//! up a few names built at compile time. Allocation happens only for what a [`Reading`]
//! holds (a bucket name, the text of a `TooLong` value), and inside `sfv` for an escaped
//! policy name or a byte-sequence parameter.

// Without `dialects` the module is private: its items serve the cooldown only.
#![cfg_attr(not(feature = "dialects"), allow(unreachable_pub, dead_code))]

use std::time::{Duration, SystemTime};

use http::{header, HeaderMap};

use crate::{error::UnrepresentableDelay, rule::MAX_DELAY};

// The providers' dialects: their readers, their names, and every reader.
#[cfg(feature = "dialects")]
mod named;
#[cfg(feature = "dialects")]
mod observation;
mod retry_after;
// Accessors only the public surface (feature `dialects`) and the tests use.
#[cfg(any(test, feature = "dialects"))]
mod surface;
mod values;

#[cfg(test)]
mod tests;

use values::Value;

#[cfg(feature = "dialects")]
pub use named::{EPOCH_MILLIS_THRESHOLD, EPOCH_THRESHOLD};
#[cfg(feature = "dialects")]
pub use observation::RateLimitObservation;

/// Which readers an allowance uses: a small `Copy` set of [`Reader`]s.
///
/// [`Dialect::default`] is [`Dialect::standard`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dialect {
    readers: u16,
}

/// One family of rate-limit headers. See the [module docs](self) for the headers each reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Reader {
    /// RFC 9110 `Retry-After`: delay-seconds or an HTTP-date.
    RetryAfter,
    /// `retry-after-ms`: a delay in milliseconds.
    RetryAfterMs,
    #[cfg(feature = "dialects")]
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit` and `RateLimit-Policy`.
    Ietf,
    #[cfg(feature = "dialects")]
    /// Earlier drafts: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    IetfLegacy,
    #[cfg(feature = "dialects")]
    /// GitHub: `x-ratelimit-*` with an epoch-seconds reset.
    Github,
    #[cfg(feature = "dialects")]
    /// OpenAI: `x-ratelimit-*-requests` and `-tokens` with Go-duration resets.
    OpenAi,
    #[cfg(feature = "dialects")]
    /// Anthropic: `anthropic-ratelimit-*` with RFC 3339 resets.
    Anthropic,
    #[cfg(feature = "dialects")]
    /// The generic `X-RateLimit-Limit`, `-Remaining`, `-Bucket`, `-Reset` (the odds API's shape).
    XRateLimit,
}

/// What a reading is measured against: the local wall clock, passed in, and how far a
/// response's `Date` may stray from it and still be trusted.
///
/// # Why five minutes
///
/// A `Date` header exists to correct the local clock, so it must be allowed to differ: an
/// unsynchronised host or a VM resumed from suspend is off by seconds to minutes, which is
/// exactly what `Date` should fix. A `Date` further off than that is more likely the
/// server's error (a clock at 1970, a cached response) than ours. Trusting a `Date` within
/// the bound errs by at most the bound; five minutes is the tolerance Kerberos settled on
/// for the same trade-off, and it keeps a bogus `Date` from turning into a decades-long wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReadContext {
    now: SystemTime,
    max_skew: Duration,
}

/// What a response's headers say about the allowance. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Reading {
    /// The wait a throttling response asks for: the longest any reader in the set asked for,
    /// but a `Retry-After` takes precedence over the IETF fields' resets (see the
    /// [module docs](self)).
    pub wait: Option<Wait>,
    /// The reader that produced [`wait`](Self::wait).
    pub source: Option<Reader>,
    /// The longest wait a spent remaining count asked for (`remaining: 0` with a reset): the
    /// wait of a success (see the [module docs](self)).
    pub reset: Option<Wait>,
    /// The provider's headers say the request was refused by a rate limit (GitHub's: a
    /// `retry-after`, or `x-ratelimit-remaining: 0` with a reset): a 403 with them throttles.
    pub refused: bool,
    /// The smallest remaining request count reported.
    pub remaining: Option<u64>,
    /// The smallest request limit reported.
    pub limit: Option<u64>,
    /// The most restrictive advertised policy (lowest quota per window).
    pub policy: Option<Policy>,
    /// The bucket the limit applies to: `X-RateLimit-Bucket` (odds), or GitHub's
    /// `x-ratelimit-resource`; 1 to 128 visible ASCII characters.
    pub bucket: Option<String>,
    /// How absolute times were measured.
    pub date: DateTrust,
}

/// A wait a server asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Wait {
    /// Wait this long from the response (at most [`MAX_DELAY`]; zero for a
    /// time already past).
    For(Duration),
    /// A wait longer than [`MAX_DELAY`], or a number too large to parse.
    /// Never clamped: the caller decides what "too long" means.
    TooLong {
        /// The field value, as sent (trimmed).
        value: String,
    },
}

/// A limit a server advertised: `quota` requests per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Requests allowed per window.
    pub quota: u64,
    /// The window.
    pub window: Duration,
}

/// How absolute times (epoch seconds, RFC 3339, HTTP-dates) in a response were measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DateTrust {
    /// No absolute time was read.
    #[default]
    NotNeeded,
    /// Against the response's `Date`, which is within the allowed skew of the local clock.
    Trusted,
    /// Against the local clock: the response has no `Date`.
    Absent,
    /// Against the local clock: the response's `Date` is further from it than allowed.
    Untrusted {
        /// How far, and in which direction, the `Date` is from the local clock.
        skew: Skew,
    },
    /// Against the local clock: the response's `Date` is not an HTTP-date.
    Unparseable,
}

/// The difference between a response's `Date` and the local clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Skew {
    /// The server's `Date` is later than the local clock by this much.
    Ahead(Duration),
    /// The server's `Date` is earlier than the local clock by this much.
    Behind(Duration),
}

/// The delay a response's `Retry-After` asks for, measured now: the one `Retry-After`
/// parser, the one the cooldown reads responses with, for code outside an allowance (a test,
/// a log line).
///
/// `Retry-After` (RFC 9110 §10.2.3) is delay-seconds (exactly `1*DIGIT`) or an HTTP-date
/// (IMF-fixdate, RFC 850 or asctime). A date is measured against the response's `Date` when
/// it is within five minutes of the local wall clock, against the local
/// clock otherwise; a date in the past is no wait (`Some(Duration::ZERO)`). An invalid value
/// (`later`, `-1`, `1.5`, empty, not text) is ignored. When the header appears more than
/// once, the longest valid delay wins, an unrepresentable one included.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use tower_allowance::retry_after;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(retry_after(&headers)?, None);
/// headers.insert("retry-after", "30".parse()?);
/// assert_eq!(retry_after(&headers)?, Some(Duration::from_secs(30)));
/// headers.insert("retry-after", "later".parse()?);
/// assert_eq!(retry_after(&headers)?, None);
/// headers.insert("retry-after", "999999999999999999999".parse()?);
/// assert!(retry_after(&headers).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`UnrepresentableDelay`] when a value exceeds [`MAX_DELAY`] (never clamped).
pub fn retry_after(headers: &HeaderMap) -> Result<Option<Duration>, UnrepresentableDelay> {
    if headers.is_empty() {
        return Ok(None);
    }
    retry_after_in(headers, &ReadContext::new(wall_clock()))
}

/// [`retry_after`] against an explicit context, for tests.
fn retry_after_in(
    headers: &HeaderMap,
    cx: &ReadContext,
) -> Result<Option<Duration>, UnrepresentableDelay> {
    let reading = Dialect::none().with(Reader::RetryAfter).read(headers, cx);
    match reading.wait {
        None => Ok(None),
        Some(Wait::For(delay)) => Ok(Some(delay)),
        Some(Wait::TooLong { value }) => Err(UnrepresentableDelay::new(value)),
    }
}

/// The one wall-clock read: absolute times in response headers (HTTP-dates, epoch seconds,
/// RFC 3339) are measured against the response's `Date` when it can be trusted, and against
/// this otherwise (see the [module docs](self)).
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_clock() -> SystemTime {
    SystemTime::now()
}

// === impl Dialect ===

impl Dialect {
    /// No readers at all: every reading is empty.
    pub const fn none() -> Self {
        Self { readers: 0 }
    }

    /// The default, in every build: `Retry-After` and `retry-after-ms`. (Features only add
    /// dialects; they never change what this one reads.)
    pub const fn standard() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::RetryAfterMs)
    }

    /// This dialect and `reader`.
    pub const fn with(self, reader: Reader) -> Self {
        let readers = self.readers | reader.bit();
        Self { readers }
    }

    /// Whether `reader` is in this dialect.
    pub const fn contains(&self, reader: Reader) -> bool {
        self.readers & reader.bit() != 0
    }

    /// The readers in this dialect, in [`Reader`] order.
    pub fn readers(&self) -> impl Iterator<Item = Reader> + '_ {
        Reader::ALL.iter().copied().filter(|r| self.contains(*r))
    }

    /// Reads `headers` with every reader in this dialect. See the [module docs](self).
    pub fn read(&self, headers: &HeaderMap, cx: &ReadContext) -> Reading {
        let mut reading = Reading::default();
        // Most responses carry none of these: answer without hashing a single name.
        if headers.is_empty() || self.readers == 0 {
            return reading;
        }
        let mut c = Collector {
            headers,
            cx,
            reference: None,
            reading: &mut reading,
        };
        for reader in self.readers() {
            match reader {
                Reader::RetryAfter => retry_after::read_seconds(&mut c),
                Reader::RetryAfterMs => retry_after::read_millis(&mut c),
                #[cfg(feature = "dialects")]
                provider => named::read(provider, &mut c),
            }
        }
        reading
    }
}

impl Default for Dialect {
    fn default() -> Self {
        Self::standard()
    }
}

// === impl Reader ===

impl Reader {
    /// Every reader, in order. A slice, so that adding a reader is not a breaking change.
    #[cfg(not(feature = "dialects"))]
    pub const ALL: &'static [Reader] = &[Reader::RetryAfter, Reader::RetryAfterMs];

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

// === impl ReadContext ===

impl ReadContext {
    /// The default [`max_skew`](Self::max_skew): five minutes (see the type's docs).
    pub const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(5 * 60);

    /// A context at the local wall-clock time `now`, with the default maximum skew.
    pub const fn new(now: SystemTime) -> Self {
        Self {
            now,
            max_skew: Self::DEFAULT_MAX_SKEW,
        }
    }

    /// Sets how far a response's `Date` may be from `now` and still be trusted.
    pub const fn with_max_skew(mut self, max_skew: Duration) -> Self {
        self.max_skew = max_skew;
        self
    }
}

// === impl Wait ===

impl Wait {
    /// Whether this wait is strictly longer than `other` (`TooLong` is longer than any
    /// `For`; two `TooLong`s are equal).
    pub fn is_longer_than(&self, other: &Wait) -> bool {
        match (self, other) {
            (Wait::For(a), Wait::For(b)) => a > b,
            (Wait::TooLong { .. }, Wait::For(_)) => true,
            (_, Wait::TooLong { .. }) => false,
        }
    }
}

// === impl DateTrust ===

impl DateTrust {
    /// Whether the response's `Date` was present but could not be used: worth a warning.
    pub const fn should_warn(&self) -> bool {
        matches!(self, DateTrust::Untrusted { .. } | DateTrust::Unparseable)
    }
}

// === impl Collector ===

/// A reading in progress: what each reader offers is folded in with max/min semantics.
struct Collector<'a> {
    headers: &'a HeaderMap,
    cx: &'a ReadContext,
    /// The time absolute values are measured against, once one has been needed.
    reference: Option<SystemTime>,
    reading: &'a mut Reading,
}

impl Collector<'_> {
    /// Offers a wait `value` (as read from `text`) from `reader`; the longest is kept.
    fn wait(&mut self, reader: Reader, value: Value, text: &str) {
        let wait = self.measure(value, text);
        self.offer(reader, wait);
    }

    /// Offers a measured wait from `reader`; the longest is kept.
    fn offer(&mut self, reader: Reader, wait: Wait) {
        let current = self.reading.wait.as_ref();
        if current.is_none_or(|c| wait.is_longer_than(c)) {
            self.reading.wait = Some(wait);
            self.reading.source = Some(reader);
        }
    }

    /// `value` (as read from `text`) as a wait from the response.
    fn measure(&mut self, value: Value, text: &str) -> Wait {
        let delay = match value {
            Value::Delay(d) => Some(d),
            Value::At(at) => Some(at.duration_since(self.reference()).unwrap_or_default()),
            Value::TooLong => None,
        };
        match delay {
            Some(d) if d <= MAX_DELAY => Wait::For(d),
            _ => Wait::TooLong {
                value: text.to_owned(),
            },
        }
    }

    /// The reference for absolute times (resets, `Retry-After` dates), decided (and recorded
    /// in the reading) once: `Date` refined by the local clock.
    fn reference(&mut self) -> SystemTime {
        if let Some(reference) = self.reference {
            return reference;
        }
        let now = self.cx.now;
        let date = self.headers.get(header::DATE).map(|v| {
            let text = std::str::from_utf8(v.as_bytes()).ok();
            text.and_then(|d| httpdate::parse_http_date(d.trim_matches([' ', '\t'])).ok())
        });
        let (trust, reference) = match date {
            None => (DateTrust::Absent, now),
            Some(None) => (DateTrust::Unparseable, now),
            Some(Some(date)) => {
                let skew = match date.duration_since(now) {
                    Ok(ahead) => Skew::Ahead(ahead),
                    Err(behind) => Skew::Behind(behind.duration()),
                };
                let (Skew::Ahead(off) | Skew::Behind(off)) = skew;
                // `Date` has whole seconds: the server's time was in `[date, date + 1 s)`. A
                // local clock inside that second places it there (a reset or a `Retry-After`
                // date is then kept to the instant it names, not up to a second past it);
                // one outside, `date` (the longer wait). (An HTTP-date ends in 9999: adding a
                // second cannot overflow.)
                let within = (date..date + Duration::from_secs(1)).contains(&now);
                if off <= self.cx.max_skew {
                    (DateTrust::Trusted, if within { now } else { date })
                } else {
                    (DateTrust::Untrusted { skew }, now)
                }
            }
        };
        self.reading.date = trust;
        self.reference = Some(reference);
        reference
    }
}
