//! `read`, one response read once: a throttling answer's wait (seconds or an HTTP-date), a
//! success's spent reset, and what a malformed header leaves (no wait).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{read, Read, ReadWith};
use crate::{
    classify::{Classification, Classified, ServerDelay, StatusClassifier},
    signals::Dialect,
};

/// RFC 9110's example date, and the same instant in seconds since the epoch.
const DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";
const DATE_SECS: u64 = 784_111_777;

/// The local wall clock: 90 s before [`DATE`].
fn wall() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(DATE_SECS - 90)
}

fn read_as(readers: Dialect, status: u16, pairs: &[(&'static str, &str)]) -> Read {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        let value = HeaderValue::from_str(value).expect("a valid header value");
        headers.append(HeaderName::from_static(name), value);
    }
    let with = ReadWith {
        readers,
        max_date_skew: Duration::from_secs(300),
        max_cooldown: Duration::from_secs(60),
    };
    let status = StatusCode::from_u16(status).expect("a valid status");
    read(&StatusClassifier::default(), with, wall, status, &headers)
}

fn throttled(delay: Option<ServerDelay>) -> Classified {
    Classified::new(Classification::Throttled, delay)
}

fn after(secs: u64) -> Option<ServerDelay> {
    Some(ServerDelay::After(Duration::from_secs(secs)))
}

#[test]
fn a_429_waits_its_retry_after_seconds() {
    let read = read_as(Dialect::standard(), 429, &[("retry-after", "7")]);
    assert_eq!(read.classified, throttled(after(7)));
    assert_eq!((read.spent_until, read.asked), (None, None));
    assert!(!read.untrusted_date);
}

#[test]
fn an_http_date_waits_until_that_date_on_the_local_clock() {
    let read = read_as(Dialect::standard(), 503, &[("retry-after", DATE)]);
    assert_eq!(read.classified, throttled(after(90)));
    // A date already past waits nothing.
    let stale = "Sun, 06 Nov 1994 08:47:37 GMT";
    let read = read_as(Dialect::standard(), 429, &[("retry-after", stale)]);
    assert_eq!(read.classified, throttled(after(0)));
}

#[test]
fn a_malformed_retry_after_gives_no_wait() {
    for value in ["soon", "-5", "1.5", ""] {
        let read = read_as(Dialect::standard(), 429, &[("retry-after", value)]);
        assert_eq!(read.classified, throttled(None), "{value:?}");
        assert_eq!(read.asked, None, "{value:?}");
    }
}

#[test]
fn a_wait_beyond_max_cooldown_is_kept_and_named_for_the_warning() {
    let read = read_as(Dialect::standard(), 429, &[("retry-after", "3600")]);
    assert_eq!(read.classified, throttled(after(3600)));
    assert_eq!(read.asked.as_deref(), Some("3600s"));
    let huge = "99999999999999999999";
    let read = read_as(Dialect::standard(), 429, &[("retry-after", huge)]);
    assert_eq!(read.classified, throttled(Some(ServerDelay::TooLong)));
    assert_eq!(read.asked.as_deref(), Some(huge));
}

#[test]
fn a_success_waits_only_a_spent_reset_never_a_retry_after() {
    let read = read_as(Dialect::standard(), 200, &[("retry-after", "7")]);
    let success = Classified::new(Classification::Success, None);
    assert_eq!((read.classified, read.spent_until), (success, None));
    // A failure carries no wait either.
    let read = read_as(Dialect::standard(), 400, &[("retry-after", "7")]);
    assert_eq!(
        read.classified,
        Classified::new(Classification::Failure, None)
    );
}

#[cfg(feature = "dialects")]
#[test]
fn a_success_with_rate_limit_headers_is_spent_until_the_reset_and_advertises_the_rate() {
    let headers = [
        ("ratelimit-policy", r#""default";q=100;w=60"#),
        ("ratelimit", r#""default";r=0;t=30"#),
    ];
    let read = read_as(Dialect::ietf(), 200, &headers);
    let success = Classified::new(Classification::Success, None);
    assert_eq!((read.classified, read.spent_until), (success, after(30)));
    // 100 per 60 s, in thousandths per second.
    assert_eq!(read.advertised_milli, Some(1_666));
    // Requests left: nothing spent, the rate still advertised.
    let left = [headers[0], ("ratelimit", r#""default";r=5;t=30"#)];
    let read = read_as(Dialect::ietf(), 200, &left);
    assert_eq!(
        (read.spent_until, read.advertised_milli),
        (None, Some(1_666))
    );
}

#[test]
fn a_response_without_headers_never_reads_the_wall_clock() {
    let with = ReadWith {
        readers: Dialect::standard(),
        max_date_skew: Duration::from_secs(300),
        max_cooldown: Duration::from_secs(60),
    };
    let never = || -> SystemTime { panic!("the wall clock was read") };
    let headers = HeaderMap::new();
    let read = read(
        &StatusClassifier::default(),
        with,
        never,
        StatusCode::TOO_MANY_REQUESTS,
        &headers,
    );
    assert_eq!(read.classified, throttled(None));
}
