//! Fixtures shared by the readers' tests, and the properties every reader must keep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

use super::{DateTrust, Dialect, ReadContext, Reader, Reading, Wait};
use crate::MAX_DELAY;

/// The local clock of most tests (RFC 9110's example date).
pub(super) const NOW: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

pub(super) fn at(date: &str) -> SystemTime {
    httpdate::parse_http_date(date).expect("an HTTP-date")
}

pub(super) fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_bytes(value).expect("value"),
        );
    }
    h
}

/// Reads `pairs` with `dialect` at [`NOW`].
pub(super) fn read(dialect: Dialect, pairs: &[(&str, &[u8])]) -> Reading {
    dialect.read(&headers(pairs), &ReadContext::new(at(NOW)))
}

/// An independent RFC 3339 formatter: `httpdate` formats the civil date
/// (`Sun, 06 Nov 1994 08:49:37 GMT`) and we rearrange its fields (no zone suffix).
pub(super) fn rfc3339_via_httpdate(t: SystemTime) -> String {
    let s = httpdate::fmt_http_date(t);
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == &s[8..11])
    .map_or(0, |i| i + 1);
    format!("{}-{month:02}-{}T{}", &s[12..16], &s[5..7], &s[17..25])
}

/// Every field some reader reads, and `Date`.
const NAMES: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-resource",
    "x-ratelimit-bucket",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "date",
];

/// Values that reach every parser's valid paths, and its edges, as well as noise.
fn value() -> impl Strategy<Value = Vec<u8>> {
    let near_now = || {
        (-100i64..100_000).prop_map(|d| {
            at(NOW)
                .duration_since(UNIX_EPOCH)
                .map_or(0, |n| n.as_secs())
                .saturating_add_signed(d)
        })
    };
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        Just(b"0".to_vec()),
        (0u64..100).prop_map(|n| n.to_string().into_bytes()),
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        Just(b"99999999999999999999".to_vec()),
        Just(b"9007199255".to_vec()),
        near_now().prop_map(|s| s.to_string().into_bytes()),
        near_now().prop_map(|s| format!(
            "{}Z",
            rfc3339_via_httpdate(UNIX_EPOCH + Duration::from_secs(s))
        )
        .into_bytes()),
        near_now().prop_map(
            |s| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(s)).into_bytes()
        ),
        "[0-9]{0,3}(\\.[0-9]{0,2})?(h|m|s|ms|us|ns|x)?[0-9]{0,2}(s|m)?"
            .prop_map(String::into_bytes),
        "\"[ab]\";r=[0-2](;t=[0-9]{1,3})?(, ?\"[ab]\";r=[0-2])?".prop_map(String::into_bytes),
        "\"[ab]\";q=[0-9]{1,3}(;w=[0-9]{1,3})?(;qu=\"requests\")?".prop_map(String::into_bytes),
    ]
}

/// Fields that interact (one family's remaining and reset, policies and limits), so cases
/// meet each other's values often; the last family is every field.
const FAMILIES: &[&[&str]] = &[
    &["retry-after", "retry-after-ms", "date"],
    &["ratelimit", "ratelimit-policy"],
    &["ratelimit-remaining", "ratelimit-reset", "ratelimit-limit"],
    &[
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-limit",
        "date",
    ],
    &[
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ],
    &[
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
        "date",
    ],
    NAMES,
];

/// A family, and up to 10 (field, value) pairs from it.
fn pairs() -> impl Strategy<Value = (&'static [&'static str], Vec<(&'static str, Vec<u8>)>)> {
    proptest::sample::select(FAMILIES).prop_flat_map(|family| {
        let pair = (proptest::sample::select(family), value());
        (Just(family), proptest::collection::vec(pair, 0..10))
    })
}

fn to_map(pairs: &[(&'static str, Vec<u8>)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.append(HeaderName::from_static(name), v);
        }
    }
    h
}

fn dialect_of(mask: u16) -> Dialect {
    Reader::ALL
        .iter()
        .copied()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .fold(Dialect::none(), |d, (_, r)| d.with(r))
}

/// `after` is at least as long as `before` (no wait being the shortest).
fn not_shorter(before: &Option<Wait>, after: &Option<Wait>) -> bool {
    match (before, after) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(b), Some(a)) => !b.is_longer_than(a),
    }
}

#[test]
fn no_headers_no_reading() {
    let cx = ReadContext::new(at(NOW));
    for dialect in [Dialect::standard(), dialect_of(u16::MAX), Dialect::none()] {
        assert_eq!(dialect.read(&HeaderMap::new(), &cx), Reading::default());
    }
    let h = headers(&[("content-type", b"application/json")]);
    assert_eq!(Dialect::standard().read(&h, &cx), Reading::default());
}

#[cfg(not(feature = "dialects"))]
#[test]
fn without_dialects_the_standard_set_is_retry_after_and_retry_after_ms() {
    use Reader::*;
    assert_eq!(Dialect::default(), Dialect::standard());
    assert_eq!(
        Dialect::standard().readers().collect::<Vec<_>>(),
        [RetryAfter, RetryAfterMs]
    );
    assert_eq!(Reader::ALL, [RetryAfter, RetryAfterMs]);
    assert!(!Dialect::standard()
        .without(RetryAfterMs)
        .contains(RetryAfterMs));
    // What the providers' readers would read is not read.
    let h = [
        ("x-ratelimit-remaining", &b"0"[..]),
        ("x-ratelimit-reset", b"30"),
        ("ratelimit", br#""x";r=0;t=20"#),
    ];
    assert_eq!(read(Dialect::standard(), &h), Reading::default());
}

#[cfg(feature = "dialects")]
#[test]
fn dialects_are_the_documented_sets() {
    use Reader::*;
    let set = |d: Dialect| d.readers().collect::<Vec<_>>();
    assert_eq!(Dialect::default(), Dialect::standard());
    // Features add dialects, never readers to the default one.
    assert_eq!(set(Dialect::standard()), [RetryAfter, RetryAfterMs]);
    assert_eq!(
        set(Dialect::generic()),
        [RetryAfter, RetryAfterMs, Ietf, IetfLegacy, XRateLimit]
    );
    assert_eq!(set(Dialect::github()), [RetryAfter, Github]);
    assert_eq!(set(Dialect::openai()), [RetryAfter, RetryAfterMs, OpenAi]);
    assert_eq!(set(Dialect::anthropic()), [RetryAfter, Anthropic]);
    assert_eq!(set(Dialect::x_ratelimit()), [RetryAfter, XRateLimit]);
    assert_eq!(set(Dialect::ietf()), [RetryAfter, Ietf, IetfLegacy]);
    assert!(Dialect::none().with(Github).contains(Github));
    assert!(!Dialect::github().without(Github).contains(Github));
    assert_eq!(set(dialect_of(u16::MAX)), Reader::ALL);
}

#[cfg(feature = "dialects")]
#[test]
fn a_reader_outside_the_dialect_never_waits() {
    let h = [
        ("x-ratelimit-remaining-requests", &b"0"[..]),
        ("x-ratelimit-reset-requests", b"1s"),
    ];
    assert!(read(Dialect::openai(), &h).wait.is_some());
    assert_eq!(
        read(Dialect::openai().without(Reader::OpenAi), &h).wait,
        None
    );
    let h = [("retry-after", &b"5"[..])];
    assert_eq!(read(Dialect::none(), &h), Reading::default());
    assert_eq!(
        read(Dialect::github().without(Reader::RetryAfter), &h).wait,
        None
    );
}

#[cfg(feature = "dialects")]
#[test]
fn the_longest_wait_wins_across_readers_and_ties_go_to_the_first() {
    let h = [
        ("retry-after", &b"10"[..]),
        ("ratelimit", br#""x";r=0;t=20"#),
        ("ratelimit-remaining", b"0"),
        ("ratelimit-reset", b"20"),
        ("x-ratelimit-remaining", b"0"),
        ("x-ratelimit-reset", b"20"),
    ];
    let r = read(Dialect::generic(), &h);
    assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(20))));
    assert_eq!(r.source, Some(Reader::XRateLimit));
    assert_eq!(r.reset, Some(Wait::For(Duration::from_secs(20))));
    // Without `Retry-After` the IETF resets count, and the first in order wins the tie.
    let r = read(Dialect::generic(), &h[1..]);
    assert_eq!(r.source, Some(Reader::Ietf));
    let r = read(Dialect::generic().without(Reader::Ietf), &h[1..]);
    assert_eq!(r.source, Some(Reader::IetfLegacy));
    // With it, and no other reset, `Retry-After` takes precedence over theirs.
    let r = read(Dialect::generic(), &h[..4]);
    assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(10))));
    assert_eq!(r.source, Some(Reader::RetryAfter));
    assert_eq!(r.reset, Some(Wait::For(Duration::from_secs(20))));
}

#[test]
fn the_skew_bound_is_configurable() {
    // Retry-After 30 s after a Date 10 minutes ahead of the local clock.
    let h = headers(&[
        ("retry-after", b"Sun, 06 Nov 1994 09:00:07 GMT"),
        ("date", b"Sun, 06 Nov 1994 08:59:37 GMT"),
    ]);
    let cx = ReadContext::new(at(NOW));
    let r = Dialect::standard().read(&h, &cx);
    assert!(matches!(r.date, DateTrust::Untrusted { .. }));
    assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(630))));
    let r = Dialect::standard().read(&h, &cx.with_max_skew(Duration::from_secs(600)));
    assert_eq!(r.date, DateTrust::Trusted);
    assert_eq!(r.wait, Some(Wait::For(Duration::from_secs(30))));
    assert_eq!(cx.max_skew(), ReadContext::DEFAULT_MAX_SKEW);
    assert_eq!(cx.now(), at(NOW));
}

#[cfg(feature = "dialects")]
#[test]
fn a_whole_second_date_is_refined_by_the_local_clock() {
    // A reset 30 s after `Date`, read 600 ms into `Date`'s second: 29.4 s, not 30 s.
    let epoch = at(NOW)
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let reset = (epoch + 30).to_string();
    let h = headers(&[
        ("x-ratelimit-remaining", b"0"),
        ("x-ratelimit-reset", reset.as_bytes()),
        ("date", b"Sun, 06 Nov 1994 08:49:37 GMT"),
    ]);
    let wait = |local: SystemTime| Dialect::github().read(&h, &ReadContext::new(local)).reset;
    let ms = Duration::from_millis;
    assert_eq!(wait(at(NOW) + ms(600)), Some(Wait::For(ms(29_400))));
    // A local clock outside that second is not the server's: `Date` corrects it, and the
    // wait is the longer one it states.
    assert_eq!(wait(at(NOW) + ms(2_500)), Some(Wait::For(ms(30_000))));
    assert_eq!(wait(at(NOW) - ms(2_500)), Some(Wait::For(ms(30_000))));
    assert_eq!(wait(at(NOW) + ms(999)), Some(Wait::For(ms(29_001))));
}

#[test]
fn a_retry_after_date_is_refined_by_the_local_clock_as_resets_are() {
    // A `Retry-After` date 30 s after `Date`, read 600 ms into `Date`'s second: the wait
    // ends at the date (29.4 s), not 600 ms past it (30 s from now, as measured against
    // `Date` alone).
    let h = headers(&[
        ("retry-after", b"Sun, 06 Nov 1994 08:50:07 GMT"),
        ("date", b"Sun, 06 Nov 1994 08:49:37 GMT"),
    ]);
    let wait = |local: SystemTime| Dialect::standard().read(&h, &ReadContext::new(local)).wait;
    let ms = Duration::from_millis;
    assert_eq!(wait(at(NOW) + ms(600)), Some(Wait::For(ms(29_400))));
    assert_eq!(wait(at(NOW) + ms(999)), Some(Wait::For(ms(29_001))));
    // A local clock outside `Date`'s second is not the server's: the longer wait `Date` states.
    assert_eq!(wait(at(NOW) + ms(2_500)), Some(Wait::For(ms(30_000))));
    assert_eq!(wait(at(NOW) - ms(2_500)), Some(Wait::For(ms(30_000))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Arbitrary bytes in every field never panic, never yield a wait from a reader outside
    /// the set, and a `For` wait is never beyond `MAX_DELAY`.
    #[test]
    fn arbitrary_headers_are_safe((_, pairs) in pairs(), mask in any::<u16>()) {
        let dialect = dialect_of(mask);
        let reading = dialect.read(&to_map(&pairs), &ReadContext::new(at(NOW)));
        prop_assert_eq!(reading.wait.is_some(), reading.source.is_some());
        // Every reset is a wait too, unless a `Retry-After` was read.
        prop_assert!(reading.reset.is_none() || reading.wait.is_some());
        if let Some(source) = reading.source {
            prop_assert!(dialect.contains(source));
        }
        if let Some(Wait::For(d)) = reading.wait {
            prop_assert!(d <= MAX_DELAY);
        }
        if let Some(bucket) = &reading.bucket {
            prop_assert!((1..=128).contains(&bucket.len()));
        }
    }

    /// Adding any field value never makes the wait shorter. (`Date` is excluded: it is the
    /// reference absolute times are measured against, not a signal, and a trusted `Date`
    /// exists precisely to correct the local clock in either direction.)
    #[test]
    fn an_extra_value_never_shortens_the_wait(
        (family, pairs) in pairs(),
        extra_name in any::<proptest::sample::Index>(),
        extra in value(),
        mask in any::<u16>(),
    ) {
        let dialect = dialect_of(mask);
        let cx = ReadContext::new(at(NOW));
        let mut h = to_map(&pairs);
        let before = dialect.read(&h, &cx);
        let signals: Vec<&str> = family.iter().copied().filter(|n| *n != "date").collect();
        if let Ok(v) = HeaderValue::from_bytes(&extra) {
            h.append(HeaderName::from_static(signals[extra_name.index(signals.len())]), v);
        }
        let after = dialect.read(&h, &cx);
        prop_assert!(not_shorter(&before.wait, &after.wait), "{:?} -> {:?}", before, after);
    }
}
