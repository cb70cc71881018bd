//! `grpc-timeout`: read as the call's deadline, written as the time left when an attempt
//! is sent, and the instant a timer set from what was written can fire at the earliest.

use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;

use crate::Deadline;

/// The call's deadline from its `grpc-timeout`, carried by every attempt, so that the
/// attempt says the time left when it is sent ([`Trailers`](super::Trailers)).
#[derive(Clone, Copy, Debug)]
pub(super) struct GrpcDeadline(pub(super) Instant);

/// When a call with a `grpc-timeout` is over, as [`GrpcCall`](super::GrpcCall) keeps it.
///
/// Each attempt is sent with the time left, rounded down to the unit it is written in
/// ([`format_timeout`]), so a timer set from it downstream (tonic's `Channel` sets one, a
/// server another) fires up to one unit before the deadline. The unit of any attempt is at
/// most the unit of the call's whole timeout (less time is left at each send), so no such
/// timer fires before `expiry`: the deadline less that unit, plus a nanosecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CallDeadline {
    /// The deadline (`now + grpc-timeout`).
    pub(super) at: Instant,
    /// The earliest instant a timer set from one of the call's `grpc-timeout`s can fire.
    pub(super) expiry: Instant,
}

impl CallDeadline {
    /// The deadline of a call that starts now with `timeout` left.
    pub(super) fn after(timeout: Duration) -> Self {
        let Deadline(at) = Deadline::after(timeout);
        let early = unit(timeout).saturating_sub(Duration::from_nanos(1));
        Self {
            at,
            expiry: at.checked_sub(early).unwrap_or(at),
        }
    }
}

/// Reads `grpc-timeout`: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`);
/// `None` for anything else (then the call has no deadline from it, and the header is
/// passed on unchanged).
pub(super) fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let (unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The largest value `grpc-timeout` carries: 8 digits.
const MAX_VALUE: u128 = 99_999_999;

/// `grpc-timeout`'s units, most precise first: nanoseconds in one, and its letter.
const UNITS: [(u64, char); 6] = [
    (1, 'n'),
    (1_000, 'u'),
    (1_000_000, 'm'),
    (1_000_000_000, 'S'),
    (60_000_000_000, 'M'),
    (3_600_000_000_000, 'H'),
];

/// The unit `left` is written in: the most precise whose value fits in 8 digits (hours
/// beyond that, the value capped).
fn unit_of(left: Duration) -> (u64, char) {
    let nanos = left.as_nanos();
    UNITS
        .into_iter()
        .find(|(per, _)| nanos / u128::from(*per) <= MAX_VALUE)
        .unwrap_or(UNITS[UNITS.len() - 1])
}

/// [`unit_of`] as a duration: how much [`format_timeout`] can round `left` down by, at most
/// (less a nanosecond).
fn unit(left: Duration) -> Duration {
    Duration::from_nanos(unit_of(left).0)
}

/// `grpc-timeout` for `left`: the most precise unit whose value fits in 8 digits, rounded
/// down (the server gives up no later than the caller), as tonic and grpc-go write it.
pub(super) fn format_timeout(left: Duration) -> HeaderValue {
    let (per, unit) = unit_of(left);
    let value = (left.as_nanos() / u128::from(per)).min(MAX_VALUE);
    HeaderValue::try_from(format!("{value}{unit}")).unwrap_or(HeaderValue::from_static("0n"))
}
