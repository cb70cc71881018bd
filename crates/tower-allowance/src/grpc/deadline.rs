//! `grpc-timeout`: read as the call's deadline, written as the time left when an attempt
//! is sent.

use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;

/// The call's deadline from its `grpc-timeout`, carried by every attempt, so that the
/// attempt says the time left when it is sent ([`Trailers`](super::Trailers)).
#[derive(Clone, Copy, Debug)]
pub(super) struct GrpcDeadline(pub(super) Instant);

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

/// `grpc-timeout` for `left`: the most precise unit whose value fits in 8 digits, rounded
/// down (the server gives up no later than the caller), as tonic and grpc-go write it.
pub(super) fn format_timeout(left: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    let nanos = left.as_nanos();
    let (value, unit) = units
        .iter()
        .map(|(per, unit)| (nanos / per, *unit))
        .find(|(value, _)| *value <= MAX)
        .unwrap_or((MAX, 'H'));
    HeaderValue::try_from(format!("{value}{unit}")).unwrap_or(HeaderValue::from_static("0n"))
}
