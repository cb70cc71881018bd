//! The value grammars the readers share: counts, delays in several notations, absolute times.
//!
//! Every parser takes already-trimmed text and answers `None` for anything outside its
//! grammar, so an invalid value can never invent a wait. A value inside the grammar that is
//! too large to represent is [`Value::TooLong`], never clamped.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName};

/// One reset or delay value as read, before it is measured against a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Value {
    /// A delay from the time of the response.
    Delay(Duration),
    /// An absolute time, measured against the response's `Date` (or the local clock).
    At(SystemTime),
    /// A number too large to hold: longer than any representable wait.
    TooLong,
}

/// The field values of `name`, as text trimmed of SP and HTAB; values that are empty or not
/// UTF-8 are skipped.
pub(super) fn texts<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'h str> + 'h {
    headers.get_all(name).iter().filter_map(|value| {
        let text = std::str::from_utf8(value.as_bytes()).ok()?;
        let text = text.trim_matches([' ', '\t']);
        (!text.is_empty()).then_some(text)
    })
}

/// `1*DIGIT`. `Some(None)` when the digits overflow a `u64`.
pub(super) fn digits(text: &str) -> Option<Option<u64>> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // All digits, so the only possible failure is overflow.
    Some(text.parse().ok())
}

/// Delay-seconds, exactly `1*DIGIT` (RFC 9110 §10.2.3).
pub(super) fn delay_seconds(text: &str) -> Option<Value> {
    Some(match digits(text)? {
        Some(secs) => Value::Delay(Duration::from_secs(secs)),
        None => Value::TooLong,
    })
}

/// Milliseconds, `1*DIGIT [ "." 1*DIGIT ]`, rounded up to the nanosecond.
pub(super) fn milliseconds(text: &str) -> Option<Value> {
    let (whole, frac) = match text.split_once('.') {
        Some((whole, frac)) => (whole, Some(frac)),
        None => (text, None),
    };
    let Some(whole) = digits(whole)? else {
        return Some(Value::TooLong);
    };
    let frac_ns = match frac {
        Some(frac) => {
            digits(frac)?;
            fraction_ceil(frac, 1_000_000)?
        }
        None => 0,
    };
    let delay = Duration::from_millis(whole).checked_add(Duration::from_nanos(frac_ns));
    Some(delay.map_or(Value::TooLong, Value::Delay))
}

/// `0.<frac>` of `unit` (itself in nanoseconds), rounded up. `frac` is all digits.
pub(super) fn fraction_ceil(frac: &str, unit: u128) -> Option<u64> {
    // 19 digits of a fraction are far finer than a nanosecond of any unit used here; any
    // non-zero digit beyond them rounds up by one.
    let (kept, rest) = frac.split_at(frac.len().min(19));
    let numerator: u128 = if kept.is_empty() {
        0
    } else {
        kept.parse().ok()?
    };
    let scale = 10u128.checked_pow(u32::try_from(kept.len()).ok()?)?;
    let product = numerator.checked_mul(unit)?;
    let mut nanos = product / scale + u128::from(product % scale != 0);
    if rest.bytes().any(|b| b != b'0') && product % scale == 0 {
        nanos += 1;
    }
    u64::try_from(nanos).ok()
}
