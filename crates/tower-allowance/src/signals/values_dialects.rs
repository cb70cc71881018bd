//! The value grammars only the providers' readers (feature `dialects`) use: counts, epoch
//! seconds, Go durations, RFC 3339. Same contract as those in `values`: trimmed text in, `None`
//! outside the grammar, [`Value::TooLong`] for a value too large to represent.

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};

use super::x_ratelimit::{EPOCH_MILLIS_THRESHOLD, EPOCH_THRESHOLD};
use crate::rule::MAX_DELAY;
use crate::signals::values::{self, digits, fraction_ceil, texts, Value};

/// A count (`1*DIGIT`) that fits a `u64`; anything else, including an overflowing number,
/// is ignored (a count is only an observation).
pub(in crate::signals) fn count(text: &str) -> Option<u64> {
    digits(text).flatten()
}

/// The smallest valid count among the values of `name`.
pub(in crate::signals) fn smallest_count(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    texts(headers, name).filter_map(count).min()
}

/// Seconds since the Unix epoch, `1*DIGIT`; a value of at least [`EPOCH_MILLIS_THRESHOLD`]
/// is milliseconds (a server sending `Date.now()` where seconds are expected).
pub(in crate::signals) fn epoch_seconds(text: &str) -> Option<Value> {
    let since = match digits(text)? {
        Some(ms) if ms >= EPOCH_MILLIS_THRESHOLD => Duration::from_millis(ms),
        Some(secs) => Duration::from_secs(secs),
        None => return Some(Value::TooLong),
    };
    Some(
        UNIX_EPOCH
            .checked_add(since)
            .map_or(Value::TooLong, Value::At),
    )
}

/// Epoch or delta seconds: a value of at least [`EPOCH_THRESHOLD`] is an epoch (seconds, or
/// milliseconds as in [`epoch_seconds`]), a smaller one delta seconds.
pub(in crate::signals) fn epoch_or_delta(text: &str) -> Option<Value> {
    match count(text) {
        Some(n) if n < EPOCH_THRESHOLD => values::delay_seconds(text),
        _ => epoch_seconds(text),
    }
}

/// A Go `time.Duration` string as OpenAI sends it: `1s`, `6m0s`, `20ms`, `1m30.5s`, `2h1m`;
/// units `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`; a bare `0`. Negative durations are
/// invalid here (a reset is never in the past by more than zero).
pub(in crate::signals) fn go_duration(text: &str) -> Option<Value> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Value::Delay(Duration::ZERO));
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: Option<u128> = Some(0);
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        rest = after;
        let unit: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (whole, frac) = match number.split_once('.') {
            Some((whole, frac)) => (whole, frac),
            None => (number, ""),
        };
        if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
            return None;
        }
        // `whole` and `frac` are all digits here. An overflow is remembered, not returned:
        // the rest of the text must still be valid for the value to count at all.
        let whole: Option<u128> = if whole.is_empty() {
            Some(0)
        } else {
            whole.parse().ok()
        };
        let frac = fraction_ceil(frac, unit).map(u128::from);
        total = add_part(total, whole, unit, frac);
    }
    let max_nanos = MAX_DELAY.as_nanos();
    Some(match total {
        Some(nanos) if nanos <= max_nanos => {
            let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
            // Below 1e9, so it fits.
            let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
            Value::Delay(Duration::new(secs, sub))
        }
        _ => Value::TooLong,
    })
}

/// `total + whole * unit + frac`, `None` once anything has overflowed.
fn add_part(
    total: Option<u128>,
    whole: Option<u128>,
    unit: u128,
    frac: Option<u128>,
) -> Option<u128> {
    total?
        .checked_add(whole?.checked_mul(unit)?)?
        .checked_add(frac?)
}

/// An RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (`T` and `Z` in either
/// case; `-00:00` is UTC). Leap second 60 is accepted and counts as the next second.
/// Fractions finer than a nanosecond round up.
pub(in crate::signals) fn rfc3339(text: &str) -> Option<Value> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let sep = |at: usize, allowed: &[u8]| b.get(at).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut nanos: u64 = 0;
    if b.get(at) == Some(&b'.') {
        let digits_end = b[at + 1..]
            .iter()
            .position(|c| !c.is_ascii_digit())
            .map_or(b.len(), |p| at + 1 + p);
        let frac = text.get(at + 1..digits_end)?;
        if frac.is_empty() {
            return None;
        }
        nanos = fraction_ceil(frac, 1_000_000_000)?;
        at = digits_end;
    }
    let offset = match b.get(at..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(at + 1..at + 3)?, num(at + 4..at + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let minutes = oh * 60 + om;
            if *sign == b'+' {
                minutes * 60
            } else {
                -minutes * 60
            }
        }
        _ => return None,
    };
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second - offset;
    // `nanos` is at most 1e9 (a fraction of all nines rounds up to a whole second).
    let since_epoch = |s: u64| Duration::from_secs(s).checked_add(Duration::from_nanos(nanos));
    Some(if secs >= 0 {
        let after = since_epoch(secs.unsigned_abs())?;
        UNIX_EPOCH
            .checked_add(after)
            .map_or(Value::TooLong, Value::At)
    } else {
        // Before 1970: certainly in the past; how far does not matter.
        Value::At(UNIX_EPOCH)
    })
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::tests::rfc3339_via_httpdate;
    use crate::signals::values::{delay_seconds, milliseconds};
    use proptest::prelude::*;

    fn delay(secs: u64, nanos: u32) -> Option<Value> {
        Some(Value::Delay(Duration::new(secs, nanos)))
    }

    fn at(secs: u64, nanos: u32) -> Option<Value> {
        Some(Value::At(UNIX_EPOCH + Duration::new(secs, nanos)))
    }

    #[test]
    fn go_durations_as_openai_sends_them() {
        // The examples of OpenAI's rate-limit guide, and Go's own formatting of them.
        assert_eq!(go_duration("1s"), delay(1, 0));
        assert_eq!(go_duration("6m0s"), delay(360, 0));
        assert_eq!(go_duration("20ms"), delay(0, 20_000_000));
        assert_eq!(go_duration("1m30.5s"), delay(90, 500_000_000));
        assert_eq!(go_duration("2h1m"), delay(7_260, 0));
        assert_eq!(go_duration("0"), delay(0, 0));
        assert_eq!(go_duration("0s"), delay(0, 0));
        assert_eq!(go_duration("+1.5h"), delay(5_400, 0));
        assert_eq!(go_duration(".5s"), delay(0, 500_000_000));
        assert_eq!(go_duration("1.s"), delay(1, 0));
        assert_eq!(go_duration("3us"), delay(0, 3_000));
        assert_eq!(go_duration("3\u{b5}s"), delay(0, 3_000));
        assert_eq!(go_duration("3\u{3bc}s"), delay(0, 3_000));
        assert_eq!(go_duration("7ns"), delay(0, 7));
        // A third of a nanosecond still rounds up: a wait is never shortened.
        assert_eq!(go_duration("0.3333ns"), delay(0, 1));
        for bad in [
            "", "1", "s", ".s", "-1s", "1x", "1.2.3s", "1 s", "1s ", "1S", "1sec", "--1s", "+",
            "1h-1m", "0.5", "1e3s",
        ] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn go_durations_beyond_max_delay_are_too_long() {
        let max_h = MAX_DELAY.as_secs() / 3_600;
        assert_eq!(
            go_duration(&format!("{max_h}h")),
            delay(max_h * 3_600, 0),
            "just under"
        );
        assert_eq!(
            go_duration(&format!("{}h", max_h + 1)),
            Some(Value::TooLong)
        );
        assert_eq!(
            go_duration("99999999999999999999999999999999999999999h"),
            Some(Value::TooLong)
        );
        // Still invalid when an overflowing part is followed by garbage.
        assert_eq!(
            go_duration("999999999999999999999999999999999999999999h1x"),
            None
        );
        let max = MAX_DELAY.as_nanos();
        assert_eq!(
            go_duration(&format!("{max}ns")),
            Some(Value::Delay(MAX_DELAY))
        );
        assert_eq!(go_duration(&format!("{}ns", max + 1)), Some(Value::TooLong));
    }

    #[test]
    fn milliseconds_and_seconds() {
        assert_eq!(milliseconds("1500"), delay(1, 500_000_000));
        assert_eq!(milliseconds("0.0001"), delay(0, 100));
        assert_eq!(milliseconds("20.5"), delay(0, 20_500_000));
        for bad in ["", "-1", "1.", ".5", "1.5.5", "1e3", "1 2", "+1"] {
            assert_eq!(milliseconds(bad), None, "{bad:?}");
        }
        assert_eq!(milliseconds("99999999999999999999"), Some(Value::TooLong));
        assert_eq!(delay_seconds("30"), delay(30, 0));
        assert_eq!(delay_seconds("1.5"), None);
        assert_eq!(delay_seconds("99999999999999999999"), Some(Value::TooLong));
        assert_eq!(epoch_seconds("1372700873"), at(1_372_700_873, 0));
        assert_eq!(epoch_seconds("-1"), None);
        assert_eq!(epoch_seconds("99999999999999999999"), Some(Value::TooLong));
        assert_eq!(count("0"), Some(0));
        assert_eq!(count("99999999999999999999"), None);
        assert_eq!(count("1.0"), None);
    }

    #[test]
    fn rfc3339_forms() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(rfc3339("2013-07-01T17:47:53Z"), at(1_372_700_873, 0));
        assert_eq!(rfc3339("2013-07-01t17:47:53z"), at(1_372_700_873, 0));
        assert_eq!(rfc3339("2013-07-01T19:47:53+02:00"), at(1_372_700_873, 0));
        assert_eq!(rfc3339("2013-07-01T12:17:53-05:30"), at(1_372_700_873, 0));
        assert_eq!(rfc3339("2013-07-01T17:47:53-00:00"), at(1_372_700_873, 0));
        assert_eq!(
            rfc3339("2013-07-01T17:47:53.25Z"),
            at(1_372_700_873, 250_000_000)
        );
        assert_eq!(
            rfc3339("2013-07-01T17:47:53.0000000001Z"),
            at(1_372_700_873, 1)
        );
        assert_eq!(
            rfc3339("2013-07-01T17:47:53.9999999999Z"),
            at(1_372_700_874, 0)
        );
        assert_eq!(rfc3339("2016-12-31T23:59:60Z"), at(1_483_228_800, 0));
        assert_eq!(rfc3339("2024-02-29T00:00:00Z"), at(1_709_164_800, 0));
        assert_eq!(rfc3339("1969-12-31T23:59:59Z"), at(0, 0));
        assert_eq!(rfc3339("0000-01-01T00:00:00Z"), at(0, 0));
        assert!(matches!(
            rfc3339("9999-12-31T23:59:59Z"),
            Some(Value::At(_))
        ));
        for bad in [
            "",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-00-01T00:00:00Z",
            "2024-01-00T00:00:00Z",
            "2024-04-31T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:61Z",
            "2024-01-01T00:00:00",
            "2024-01-01 00:00:00Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+24:00",
            "2024-01-01T00:00:00+01:60",
            "2024-01-01T00:00:00+0100",
            "2024-01-01T00:00:00Z ",
            "2024-1-01T00:00:00Z",
            "+2024-01-01T00:00:00Z",
            "2024-01-01T00:00:00ZZ",
            "\u{663}024-01-01T00:00:00Z",
            "2024-01-01T00:00:00.\u{663}Z",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn rfc3339_matches_httpdate(secs in 0u64..253_402_300_800, frac in 0u32..1_000_000_000,
                                    offset_min in -1439i64..=1439) {
            let t = UNIX_EPOCH + Duration::from_secs(secs);
            // UTC, with a fraction.
            let text = format!("{}.{frac:09}Z", rfc3339_via_httpdate(t));
            prop_assert_eq!(rfc3339(&text), Some(Value::At(t + Duration::from_nanos(frac.into()))));
            // The same instant at another offset: the civil time shifts, the instant does not.
            let shifted = if offset_min >= 0 {
                t.checked_add(Duration::from_secs(offset_min.unsigned_abs() * 60))
            } else {
                t.checked_sub(Duration::from_secs(offset_min.unsigned_abs() * 60))
            };
            if let Some(shifted) = shifted.filter(|s| {
                s.duration_since(UNIX_EPOCH).is_ok_and(|d| d.as_secs() < 253_402_300_800)
            }) {
                let sign = if offset_min >= 0 { '+' } else { '-' };
                let (h, m) = (offset_min.abs() / 60, offset_min.abs() % 60);
                let text = format!("{}{sign}{h:02}:{m:02}", rfc3339_via_httpdate(shifted));
                prop_assert_eq!(rfc3339(&text), Some(Value::At(t)));
            }
        }

        #[test]
        fn go_duration_seconds_are_exact(secs in 0u64..=MAX_DELAY.as_secs(), ms in 0u32..1000) {
            let (h, m, s) = (secs / 3_600, secs / 60 % 60, secs % 60);
            let text = format!("{h}h{m}m{s}.{ms:03}s");
            prop_assert_eq!(go_duration(&text), delay(secs, ms * 1_000_000));
        }

        #[test]
        fn parsers_never_panic(text in "\\PC{0,40}") {
            if let Some(Value::Delay(d)) = go_duration(&text) {
                prop_assert!(d <= MAX_DELAY);
            }
            let _ = (rfc3339(&text), milliseconds(&text), delay_seconds(&text), epoch_seconds(&text));
        }
    }
}
