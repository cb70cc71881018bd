//! Unit tests of the `grpc` module's private parts: `GrpcStatus` built field by field, the
//! `grpc-timeout` wire format, the refusals' codes and `grpc-message`'s encoding. Tests of its
//! public API are in the integration tests (`tests/tests/grpc.rs`, and against a real tonic
//! server and client `tests/tests/grpc_tonic.rs`).

use std::{
    cell::Cell,
    fmt,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body::{Body, Frame};
use http_body_util::StreamBody;
use proptest::prelude::*;

use super::{
    call::{percent_encode, refusal},
    deadline::{format_timeout, parse_timeout, CallDeadline},
    Code, GrpcResponse, GrpcStatus, Pushback, WatchTrailers,
};
use crate::{
    classify::Classification,
    error::{AbandonReason, Abandoned, Exhausted, Overloaded, StoreUnavailable},
    BoxError,
};

fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_static(value));
    }
    map
}

fn status(code: Code, pushback: Option<Pushback>) -> GrpcStatus {
    GrpcStatus { code, pushback }
}

fn ms(ms: u64) -> Option<Pushback> {
    Some(Pushback::Delay(Duration::from_millis(ms)))
}

/// Response heads as servers and proxies send them.
#[test]
fn fixtures_of_real_responses() {
    use GrpcResponse::*;
    let grpc = ("content-type", "application/grpc");
    let cases: &[(&str, StatusCode, HeaderMap, Option<GrpcResponse>)] = &[
        (
            "trailers-only RESOURCE_EXHAUSTED with pushback (a throttling server)",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "8"),
                ("grpc-message", "quota exceeded for key"),
                ("grpc-retry-pushback-ms", "1500"),
            ]),
            Some(TrailersOnly(status(Code::RESOURCE_EXHAUSTED, ms(1500)))),
        ),
        (
            "trailers-only UNAVAILABLE (an envoy with no healthy upstream)",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "14"),
                ("grpc-message", "no healthy upstream"),
            ]),
            Some(TrailersOnly(status(Code::UNAVAILABLE, None))),
        ),
        (
            "a streaming OK: status in the trailers",
            StatusCode::OK,
            map(&[
                ("content-type", "application/grpc+proto"),
                ("grpc-encoding", "identity"),
            ]),
            Some(StatusInTrailers),
        ),
        (
            "content-type with parameters, any case",
            StatusCode::OK,
            map(&[("content-type", "Application/GRPC; charset=utf-8")]),
            Some(StatusInTrailers),
        ),
        (
            "pushback negative: do not retry",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")]),
            Some(TrailersOnly(status(
                Code::RESOURCE_EXHAUSTED,
                Some(Pushback::DoNotRetry),
            ))),
        ),
        (
            "pushback malformed: do not retry",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "8"),
                ("grpc-retry-pushback-ms", "1.5s"),
            ]),
            Some(TrailersOnly(status(
                Code::RESOURCE_EXHAUSTED,
                Some(Pushback::DoNotRetry),
            ))),
        ),
        (
            "pushback twice, even equal: do not retry (grpc-go)",
            StatusCode::OK,
            map(&[
                grpc,
                ("grpc-status", "8"),
                ("grpc-retry-pushback-ms", "100"),
                ("grpc-retry-pushback-ms", "100"),
            ]),
            Some(TrailersOnly(status(
                Code::RESOURCE_EXHAUSTED,
                Some(Pushback::DoNotRetry),
            ))),
        ),
        (
            "grpc-status malformed: UNKNOWN, a final failure",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "eight")]),
            Some(TrailersOnly(status(Code::UNKNOWN, None))),
        ),
        (
            "grpc-status twice: malformed",
            StatusCode::OK,
            map(&[grpc, ("grpc-status", "0"), ("grpc-status", "8")]),
            Some(TrailersOnly(status(Code::UNKNOWN, None))),
        ),
        (
            "grpc-status wins over the HTTP status",
            StatusCode::SERVICE_UNAVAILABLE,
            map(&[grpc, ("grpc-status", "8")]),
            Some(TrailersOnly(status(Code::RESOURCE_EXHAUSTED, None))),
        ),
        (
            "a non-gRPC 429: left to the HTTP status classifier",
            StatusCode::TOO_MANY_REQUESTS,
            map(&[("content-type", "application/json"), ("retry-after", "1")]),
            None,
        ),
        (
            "a proxy's 429 on a gRPC call, no grpc-status: the HTTP classifier's too",
            StatusCode::TOO_MANY_REQUESTS,
            map(&[grpc]),
            None,
        ),
        (
            "grpc-web is not gRPC over HTTP/2: its trailers are in the body",
            StatusCode::OK,
            map(&[("content-type", "application/grpc-web+proto")]),
            None,
        ),
        ("no headers at all", StatusCode::OK, HeaderMap::new(), None),
    ];
    for (name, http_status, headers, expected) in cases {
        assert_eq!(
            GrpcResponse::from_head(*http_status, headers),
            *expected,
            "{name}"
        );
    }
}

#[test]
fn classification_of_every_code() {
    for code in 0..=20 {
        let expected = match code {
            0 => Classification::Success,
            8 => Classification::Throttled,
            14 => Classification::Transient,
            _ => Classification::Failure,
        };
        assert_eq!(Code::new(code).classification(), expected, "{code}");
    }
    assert_eq!(
        status(Code::RESOURCE_EXHAUSTED, Some(Pushback::DoNotRetry)).classification(),
        Classification::Throttled
    );
    assert_eq!(Code::RESOURCE_EXHAUSTED.to_string(), "RESOURCE_EXHAUSTED");
    assert_eq!(format!("{:?}", Code::OK), "Code::OK");
    assert_eq!(Code::new(17).to_string(), "code 17");
    assert_eq!(Code::new(u32::MAX).name(), None);
}

#[test]
fn parsing_rules_at_the_edges() {
    for (value, expected) in [
        ("0", ms(0)),
        ("+5", ms(5)),
        ("-0", ms(0)),
        ("9223372036854775807", ms(i64::MAX as u64)),
        ("9223372036854775808", Some(Pushback::DoNotRetry)),
        ("", Some(Pushback::DoNotRetry)),
        (" 5", Some(Pushback::DoNotRetry)),
        ("5ms", Some(Pushback::DoNotRetry)),
    ] {
        let trailers = map(&[("grpc-retry-pushback-ms", value)]);
        assert_eq!(Pushback::from_header_map(&trailers), expected, "{value:?}");
    }
    for (value, expected) in [
        (&b"0"[..], Some(Code::OK)),
        (b"08", Some(Code::RESOURCE_EXHAUSTED)),
        (b"4294967295", Some(Code::new(u32::MAX))),
        (b"4294967296", None),
        (b"-1", None),
        (b"1 ", None),
        (b"\xff", None),
    ] {
        assert_eq!(Code::from_bytes(value), expected, "{value:?}");
    }
    // Trailers of a streamed call: status and pushback.
    let trailers = map(&[("grpc-status", "0"), ("grpc-message", "")]);
    assert_eq!(
        GrpcStatus::from_header_map(&trailers),
        Some(status(Code::OK, None))
    );
    assert_eq!(GrpcStatus::from_header_map(&HeaderMap::new()), None);
}

// === WatchTrailers ===

type Item = Result<Frame<Bytes>, std::convert::Infallible>;

fn stream(items: Vec<Item>) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Item>>> {
    StreamBody::new(futures_util::stream::iter(items))
}

/// Every frame, polled with a no-op waker (the test bodies are always ready).
fn frames<B: Body + Unpin>(mut body: B) -> Vec<Frame<B::Data>>
where
    B::Error: fmt::Debug,
{
    let mut frames = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
        frames.push(frame.expect("infallible"));
    }
    frames
}

#[test]
fn watch_trailers_sees_trailers_once_and_forwards_every_frame_unchanged() {
    let trailers = map(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "200")]);
    let calls = Cell::new(0);
    let seen = Cell::new(None);
    let body = stream(vec![
        Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\x02hi"))),
        Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
        Ok(Frame::trailers(trailers.clone())),
    ]);
    let watched = WatchTrailers::new(body, |t: &HeaderMap| {
        calls.set(calls.get() + 1);
        seen.set(GrpcStatus::from_header_map(t));
    });
    let frames = frames(watched);
    assert_eq!(frames.len(), 3);
    assert_eq!(
        frames[0].data_ref().map(|d| &d[..]),
        Some(&b"\0\0\0\0\x02hi"[..])
    );
    assert_eq!(
        frames[1].data_ref().map(|d| &d[..]),
        Some(&b"\0\0\0\0\0"[..])
    );
    assert_eq!(frames[2].trailers_ref(), Some(&trailers));
    assert_eq!(calls.get(), 1);
    assert_eq!(seen.get(), Some(status(Code::RESOURCE_EXHAUSTED, ms(200))));
}

// === deadlines, outcomes and the stack's own answers ===

#[test]
fn grpc_timeout_is_read_and_written_as_grpc_does() {
    let d = Duration::from_millis;
    for (value, expected) in [
        ("1500000u", Some(d(1500))),
        ("300m", Some(d(300))),
        ("1H", Some(Duration::from_secs(3600))),
        ("2M", Some(Duration::from_secs(120))),
        ("3S", Some(Duration::from_secs(3))),
        ("7n", Some(Duration::from_nanos(7))),
        ("99999999m", Some(d(99_999_999))),
        ("123456789m", None),
        ("m", None),
        ("5", None),
        ("-5m", None),
        ("5x", None),
        (" 5m", None),
    ] {
        let value = HeaderValue::from_static(value);
        assert_eq!(parse_timeout(&value), expected, "{value:?}");
    }
    for (left, written) in [
        (Duration::ZERO, "0n"),
        (Duration::from_nanos(99_999_999), "99999999n"),
        (d(100), "100000u"),
        (d(1500), "1500000u"),
        (Duration::from_micros(500_000_999), "500000m"),
        (Duration::from_secs(200_000), "200000S"),
        (Duration::from_secs(86_400 * 365 * 30), "15768000M"),
        (Duration::MAX, "99999999H"),
    ] {
        assert_eq!(format_timeout(left), written, "{left:?}");
        if written != "99999999H" {
            let back = parse_timeout(&format_timeout(left)).expect("valid");
            assert!(back <= left, "{left:?}: rounded down");
        }
    }
}

/// A channel that records each attempt's `grpc-timeout` and answers `answer(n)` to the

#[test]
fn refusals_map_to_codes_a_client_can_act_on() {
    let store = crate::store::StoreError::unavailable("connection refused");
    let cases: [(BoxError, Code, Option<i64>); 6] = [
        (
            Abandoned::new(AbandonReason::Deadline).into(),
            Code::DEADLINE_EXCEEDED,
            None,
        ),
        (
            Overloaded {
                wait: Duration::from_micros(1_500),
            }
            .into(),
            Code::UNAVAILABLE,
            Some(2),
        ),
        (StoreUnavailable::new(store).into(), Code::UNAVAILABLE, None),
        (
            Abandoned::new(AbandonReason::BudgetExhausted).into(),
            Code::RESOURCE_EXHAUSTED,
            Some(-1),
        ),
        (
            Exhausted::new(None, crate::rule::ClosedBy::Quota).into(),
            Code::RESOURCE_EXHAUSTED,
            Some(-1),
        ),
        ("a transport error".into(), Code::UNKNOWN, None),
    ];
    for (e, code, pushback) in cases {
        match refusal(&*e) {
            Some(r) => assert_eq!((r.code, r.pushback), (code, pushback), "{e}"),
            None => assert_eq!(code, Code::UNKNOWN, "{e}: left to tonic"),
        }
    }
    let message = percent_encode("100% sure: \u{e9}t\u{e9}\n");
    assert_eq!(message, "100%25 sure: %C3%A9t%C3%A9%0A");
}

proptest! {
    /// What lets `GrpcCall` answer a call's deadline before anything downstream does: no
    /// timer set from the `grpc-timeout` of an attempt (sent at any time during the call,
    /// with the time left then) fires before the call's `expiry`, which is less than one
    /// unit of the call's timeout before its deadline (at it, below 100 ms).
    #[test]
    fn no_timer_from_an_attempts_grpc_timeout_fires_before_the_calls_expiry(
        timeout_ns in 0u64..=20 * 365 * 86_400 * 1_000_000_000,
        sent_ppm in 0u64..=1_000_000,
    ) {
        let timeout = Duration::from_nanos(timeout_ns);
        let CallDeadline { at, expiry } = CallDeadline::after(timeout);
        prop_assert!(expiry <= at);
        let early = at.duration_since(expiry);
        let unit = [1, 1_000, 1_000_000, 1_000_000_000, 60_000_000_000, 3_600_000_000_000]
            .into_iter()
            .map(Duration::from_nanos)
            .find(|unit| timeout.as_nanos() / unit.as_nanos() <= 99_999_999)
            .expect("20 years fit in 8 digits of hours");
        prop_assert_eq!(early, unit - Duration::from_nanos(1));
        if timeout < Duration::from_millis(100) {
            prop_assert_eq!(expiry, at);
        }
        // An attempt sent `sent_ppm` millionths into the call.
        let since_start = u128::from(timeout_ns) * u128::from(sent_ppm) / 1_000_000;
        let left = timeout - Duration::from_nanos(u64::try_from(since_start).expect("<= timeout"));
        let sent = at - left;
        let given = parse_timeout(&format_timeout(left)).expect("what the stack writes, it reads");
        prop_assert!(sent + given >= expiry, "{left:?} written as {:?}", format_timeout(left));
    }
}
