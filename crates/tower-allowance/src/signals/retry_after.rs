//! `Retry-After` (RFC 9110 §10.2.3) and `retry-after-ms`.

use http::{header, HeaderName};

use super::{values, Collector, Reader, Value};

const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// `Retry-After`: delay-seconds, exactly `1*DIGIT`, or an HTTP-date in any of its three
/// forms. Every valid field line is offered; the longest wins.
pub(super) fn read_seconds(c: &mut Collector<'_>) {
    for text in values::texts(c.headers, &header::RETRY_AFTER) {
        let value = values::delay_seconds(text)
            .or_else(|| httpdate::parse_http_date(text).ok().map(Value::At));
        if let Some(value) = value {
            c.wait(Reader::RetryAfter, value, text);
        }
    }
}

/// `retry-after-ms`: milliseconds, `1*DIGIT [ "." 1*DIGIT ]`.
pub(super) fn read_millis(c: &mut Collector<'_>) {
    for text in values::texts(c.headers, &RETRY_AFTER_MS) {
        if let Some(value) = values::milliseconds(text) {
            c.wait(Reader::RetryAfterMs, value, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{header, HeaderMap, HeaderValue};
    use proptest::prelude::*;

    use crate::signals::tests::{at, headers, read, NOW};
    use crate::signals::{
        retry_after, retry_after_in, DateTrust, Dialect, ReadContext, Reader, Skew, Wait,
    };
    use crate::MAX_DELAY;

    /// `signals::retry_after` at [`NOW`].
    fn parse(
        pairs: &[(&str, &[u8])],
    ) -> Result<Option<Duration>, crate::error::UnrepresentableDelay> {
        retry_after_in(&headers(pairs), &ReadContext::new(at(NOW)))
    }

    fn secs(s: u64) -> Option<Wait> {
        Some(Wait::For(Duration::from_secs(s)))
    }

    #[test]
    fn delay_seconds() {
        let r = read(Dialect::standard(), &[("retry-after", b"30")]);
        assert_eq!((r.wait, r.source), (secs(30), Some(Reader::RetryAfter)));
        assert_eq!(r.date, DateTrust::NotNeeded);
        let r = read(Dialect::standard(), &[("retry-after", b" 0 ")]);
        assert_eq!(r.wait, secs(0));
    }

    #[test]
    fn invalid_values_never_invent_a_wait() {
        for raw in [
            &b"later"[..],
            b"-1",
            b"1.5",
            b"",
            b"  ",
            b"+5",
            b"5s",
            b"0x10",
            b"\xff\xfe",
            b"1 2",
        ] {
            let r = read(Dialect::standard(), &[("retry-after", raw)]);
            assert_eq!(r.wait, None, "{raw:?}");
            assert_eq!(r.source, None, "{raw:?}");
            assert_eq!(parse(&[("retry-after", raw)]), Ok(None), "{raw:?}");
        }
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(retry_after(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn the_function_reads_what_the_reader_reads() {
        assert_eq!(
            parse(&[("retry-after", b"30")]),
            Ok(Some(Duration::from_secs(30)))
        );
        assert_eq!(parse(&[("retry-after", b" 0 ")]), Ok(Some(Duration::ZERO)));
        // `retry-after-ms` is another reader's.
        assert_eq!(parse(&[("retry-after-ms", b"1500")]), Ok(None));
        // The wall clock does not matter to delay-seconds.
        let h = headers(&[("retry-after", b"7")]);
        assert_eq!(retry_after(&h), Ok(Some(Duration::from_secs(7))));
    }

    #[test]
    fn unrepresentable_delays_are_errors() {
        for raw in [
            &b"999999999999999999999"[..],
            b"18446744073709551615",
            b"9007199254741",
        ] {
            let err = parse(&[("retry-after", raw)]).expect_err("too long");
            assert_eq!(err.value().as_bytes(), raw, "{raw:?}");
            let r = read(Dialect::standard(), &[("retry-after", raw)]);
            assert!(matches!(r.wait, Some(Wait::TooLong { .. })), "{raw:?}");
        }
    }

    #[test]
    fn duplicates_longest_valid_wins_including_too_long() {
        let r = read(
            Dialect::standard(),
            &[
                ("retry-after", b"5"),
                ("retry-after", b"later"),
                ("retry-after", b"30"),
                ("retry-after", b"-1"),
            ],
        );
        assert_eq!(r.wait, secs(30));
        assert_eq!(
            parse(&[
                ("retry-after", b"5"),
                ("retry-after", b"later"),
                ("retry-after", b"30"),
            ]),
            Ok(Some(Duration::from_secs(30)))
        );
        let r = read(
            Dialect::standard(),
            &[
                ("retry-after", b"1"),
                ("retry-after", b"99999999999999999999"),
            ],
        );
        assert_eq!(
            r.wait,
            Some(Wait::TooLong {
                value: "99999999999999999999".into()
            })
        );
        // Either order.
        let r = read(
            Dialect::standard(),
            &[("retry-after", b"9007199255"), ("retry-after", b"1")],
        );
        assert_eq!(
            r.wait,
            Some(Wait::TooLong {
                value: "9007199255".into()
            })
        );
    }

    #[test]
    fn the_bound_is_max_delay_exactly() {
        let max = MAX_DELAY.as_secs().to_string();
        let r = read(Dialect::standard(), &[("retry-after", max.as_bytes())]);
        assert_eq!(r.wait, secs(MAX_DELAY.as_secs()));
        assert_eq!(
            parse(&[("retry-after", max.as_bytes())]),
            Ok(Some(Duration::from_secs(MAX_DELAY.as_secs())))
        );
        let over = (MAX_DELAY.as_secs() + 1).to_string();
        let r = read(Dialect::standard(), &[("retry-after", over.as_bytes())]);
        assert!(matches!(r.wait, Some(Wait::TooLong { .. })));
    }

    #[test]
    fn http_dates_in_all_three_forms_against_a_trusted_date() {
        // Local clock 2 minutes behind the server: within the skew, so Date is the reference.
        let cx = crate::signals::ReadContext::new(at(NOW) - Duration::from_secs(120));
        for ra in [
            &b"Sun, 06 Nov 1994 08:50:07 GMT"[..],
            b"Sunday, 06-Nov-94 08:50:07 GMT",
            b"Sun Nov  6 08:50:07 1994",
        ] {
            let h = headers(&[("retry-after", ra), ("date", NOW.as_bytes())]);
            let r = Dialect::standard().read(&h, &cx);
            assert_eq!(r.wait, secs(30), "{ra:?}");
            assert_eq!(r.date, DateTrust::Trusted);
            assert_eq!(
                retry_after_in(&h, &cx),
                Ok(Some(Duration::from_secs(30))),
                "{ra:?}"
            );
        }
    }

    #[test]
    fn http_dates_in_all_three_forms_against_a_wildly_wrong_clock() {
        // The local clock is 20 years ahead: the Date is not trusted, the local clock is the
        // reference, and the date is long past (no wait, and a warning).
        let cx = ReadContext::new(at("Thu, 01 Jan 2015 00:00:00 GMT"));
        for ra in [
            &b"Sun, 06 Nov 1994 08:50:07 GMT"[..],
            b"Sunday, 06-Nov-94 08:50:07 GMT",
            b"Sun Nov  6 08:50:07 1994",
        ] {
            let h = headers(&[("retry-after", ra), ("date", NOW.as_bytes())]);
            let r = Dialect::standard().read(&h, &cx);
            assert_eq!(r.wait, secs(0), "{ra:?}");
            assert!(matches!(
                r.date,
                DateTrust::Untrusted {
                    skew: Skew::Behind(_)
                }
            ));
            assert_eq!(retry_after_in(&h, &cx), Ok(Some(Duration::ZERO)), "{ra:?}");
        }
    }

    #[test]
    fn http_dates_in_all_three_forms_without_a_date_use_the_local_clock() {
        for ra in [
            &b"Sun, 06 Nov 1994 08:50:07 GMT"[..],
            b"Sunday, 06-Nov-94 08:50:07 GMT",
            b"Sun Nov  6 08:50:07 1994",
        ] {
            let r = read(Dialect::standard(), &[("retry-after", ra)]);
            assert_eq!((r.wait, r.date), (secs(30), DateTrust::Absent), "{ra:?}");
            assert_eq!(
                parse(&[("retry-after", ra)]),
                Ok(Some(Duration::from_secs(30))),
                "{ra:?}"
            );
        }
    }

    #[test]
    fn untrusted_unparseable_and_absent_dates_use_the_local_clock() {
        let ra: &[u8] = b"Sun, 06 Nov 1994 08:50:07 GMT";
        // The seed's hostile case: a Date at 1970 would ask for 25 years.
        let r = read(
            Dialect::standard(),
            &[
                ("retry-after", ra),
                ("date", b"Thu, 01 Jan 1970 00:00:00 GMT"),
            ],
        );
        assert_eq!(r.wait, secs(30));
        assert!(matches!(
            r.date,
            DateTrust::Untrusted {
                skew: Skew::Behind(_)
            }
        ));
        assert!(r.date.should_warn());
        let r = read(
            Dialect::standard(),
            &[
                ("retry-after", ra),
                ("date", b"Sun, 06 Nov 1994 09:49:37 GMT"),
            ],
        );
        assert_eq!(r.wait, secs(30));
        assert_eq!(
            r.date,
            DateTrust::Untrusted {
                skew: Skew::Ahead(Duration::from_secs(3600))
            }
        );
        let r = read(
            Dialect::standard(),
            &[("retry-after", ra), ("date", b"garbage")],
        );
        assert_eq!((r.wait, r.date), (secs(30), DateTrust::Unparseable));
        let r = read(Dialect::standard(), &[("retry-after", ra)]);
        assert_eq!((r.wait, r.date), (secs(30), DateTrust::Absent));
        assert!(!r.date.should_warn());
    }

    #[test]
    fn past_dates_are_a_zero_wait() {
        let r = read(
            Dialect::standard(),
            &[
                ("retry-after", b"Sun, 06 Nov 1994 08:00:00 GMT"),
                ("date", NOW.as_bytes()),
            ],
        );
        assert_eq!(r.wait, secs(0));
        assert_eq!(r.source, Some(Reader::RetryAfter));
        // A Date that is not an HTTP-date falls back to the local clock.
        let pairs: &[(&str, &[u8])] = &[
            ("retry-after", b"Sun, 06 Nov 1994 08:50:37 GMT"),
            ("date", b"garbage"),
        ];
        let r = read(Dialect::standard(), pairs);
        assert_eq!((r.wait, r.date), (secs(60), DateTrust::Unparseable));
        assert_eq!(parse(pairs), Ok(Some(Duration::from_secs(60))));
    }

    #[test]
    fn retry_after_ms() {
        let r = read(Dialect::standard(), &[("retry-after-ms", b"1500")]);
        assert_eq!(r.wait, Some(Wait::For(Duration::from_millis(1500))));
        assert_eq!(r.source, Some(Reader::RetryAfterMs));
        // The longer of the two wins, whichever header says it.
        let r = read(
            Dialect::standard(),
            &[("retry-after-ms", b"1500"), ("retry-after", b"2")],
        );
        assert_eq!((r.wait, r.source), (secs(2), Some(Reader::RetryAfter)));
        let r = read(
            Dialect::standard(),
            &[("retry-after-ms", b"2500.5"), ("retry-after", b"2")],
        );
        assert_eq!(
            (r.wait, r.source),
            (
                Some(Wait::For(Duration::from_micros(2_500_500))),
                Some(Reader::RetryAfterMs)
            )
        );
        // Not in a dialect without the reader.
        let without = Dialect::standard().without(Reader::RetryAfterMs);
        let r = read(without, &[("retry-after-ms", b"1500")]);
        assert_eq!(r.wait, None);
        #[cfg(feature = "dialects")]
        assert_eq!(
            read(Dialect::github(), &[("retry-after-ms", b"1500")]).wait,
            None
        );
        let r = read(
            Dialect::standard(),
            &[("retry-after-ms", b"99999999999999999999")],
        );
        assert!(matches!(r.wait, Some(Wait::TooLong { .. })));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_or_exceed_the_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let mut h = HeaderMap::new();
                h.insert(header::RETRY_AFTER, v.clone());
                h.insert(header::DATE, v.clone());
                h.insert("x-ratelimit-limit", v.clone());
                h.insert("x-ratelimit-bucket", v);
                let _ = Dialect::standard().read(&h, &ReadContext::new(at(NOW)));
                if let Ok(Some(d)) = retry_after_in(&h, &ReadContext::new(at(NOW))) {
                    prop_assert!(d <= MAX_DELAY);
                }
            }
        }

        #[test]
        fn digits_are_exact(secs in 0u64..=MAX_DELAY.as_secs()) {
            let mut h = HeaderMap::new();
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            prop_assert_eq!(
                retry_after_in(&h, &ReadContext::new(at(NOW))),
                Ok(Some(Duration::from_secs(secs)))
            );
        }
    }
}
