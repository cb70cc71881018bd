//! The IETF fields: `RateLimit` and `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10),
//! and the `RateLimit-Limit`/`-Remaining`/`-Reset` trio of the earlier drafts.
//!
//! The draft-10 fields are structured-field lists (RFC 9651), parsed with `sfv`'s visitor
//! interface so nothing is collected into owned lists. Each list member names a policy (a
//! string, or a token from servers that send one):
//!
//! ```text
//! RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400
//! RateLimit: "burst";r=0;t=30, "daily";r=950;t=3600
//! ```
//!
//! - policy parameters: `q` quota (required), `w` window in seconds, `qu` quota unit
//!   (`"requests"` when absent), `pk` partition key (not used);
//! - limit parameters: `r` remaining (required), `t` seconds until the quota resets, `pk`.

use std::{borrow::Cow, convert::Infallible, time::Duration};

use http::HeaderName;
use sfv::{
    visitor::{
        EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor,
    },
    BareItemFromInput, KeyRef, Parser,
};

use super::grammars;
use crate::signals::{values, Collector, Policy, Reader, Value};

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// How many policies are remembered for matching; later ones are ignored.
const MAX_POLICIES: usize = 16;

/// Draft-10 `RateLimit-Policy` and `RateLimit`.
pub(super) fn read(c: &mut Collector<'_>) {
    let mut policies = Policies::default();
    let headers = c.headers;
    for line in headers.get_all(RATELIMIT_POLICY) {
        // Validate the line first: the visitor acts while parsing, and an invalid line must
        // leave no trace (RFC 9651 §4.2). Each line stands alone, so garbage in one line
        // cannot discard the others.
        if Parser::new(line.as_bytes())
            .parse_list_with_visitor(Ignored)
            .is_ok()
        {
            let _ = Parser::new(line.as_bytes()).parse_list_with_visitor(&mut policies);
        }
    }
    for entry in policies.entries.iter().flatten() {
        if entry.requests {
            c.limit(entry.quota);
            if let Some(window) = entry.window.filter(|w| *w > 0) {
                c.policy(Policy {
                    quota: entry.quota,
                    window: Duration::from_secs(window),
                });
            }
        }
    }
    for line in headers.get_all(RATELIMIT) {
        if Parser::new(line.as_bytes())
            .parse_list_with_visitor(Ignored)
            .is_ok()
        {
            // Valid structured fields are ASCII, so this is the line as sent.
            let text = std::str::from_utf8(line.as_bytes()).unwrap_or_default();
            let _ = Parser::new(line.as_bytes()).parse_list_with_visitor(Limits {
                c: &mut *c,
                policies: &policies,
                text: text.trim_matches(' '),
            });
        }
    }
}

/// The earlier drafts' trio: `RateLimit-Remaining: 0` with `RateLimit-Reset` (delta
/// seconds; a value of at least `EPOCH_THRESHOLD` is an epoch, as servers send) waits until
/// the reset. `RateLimit-Limit` may carry draft-01 style policies
/// (`10, 10;w=1`): its first number is the limit.
pub(super) fn read_legacy(c: &mut Collector<'_>) {
    let left = c.wait_when_spent(
        Reader::IetfLegacy,
        &RATELIMIT_REMAINING,
        &RATELIMIT_RESET,
        grammars::epoch_or_delta,
    );
    if let Some(left) = left {
        c.remaining(left);
    }
    let first_number = |text: &str| {
        let first = text.split([',', ';']).next().unwrap_or_default();
        grammars::count(first.trim_matches([' ', '\t']))
    };
    if let Some(limit) = values::texts(c.headers, &RATELIMIT_LIMIT)
        .filter_map(first_number)
        .min()
    {
        c.limit(limit);
    }
}

/// A member's name: a string, or a token.
fn name<'de>(item: BareItemFromInput<'de>) -> Option<Cow<'de, str>> {
    match item {
        BareItemFromInput::String(Cow::Borrowed(s)) => Some(Cow::Borrowed(s.as_str())),
        BareItemFromInput::String(Cow::Owned(s)) => Some(Cow::Owned(s.as_str().to_owned())),
        BareItemFromInput::Token(t) => Some(Cow::Borrowed(t.as_str())),
        _ => None,
    }
}

/// A non-negative integer parameter.
fn non_negative(value: &BareItemFromInput<'_>) -> Option<u64> {
    match value {
        BareItemFromInput::Integer(i) => u64::try_from(i64::from(*i)).ok(),
        _ => None,
    }
}

// === Policies ===

struct PolicyEntry<'de> {
    name: Cow<'de, str>,
    quota: u64,
    window: Option<u64>,
    requests: bool,
}

/// The first [`MAX_POLICIES`] valid policies, in order, without allocating a list.
struct Policies<'de> {
    entries: [Option<PolicyEntry<'de>>; MAX_POLICIES],
    len: usize,
}

impl Default for Policies<'_> {
    fn default() -> Self {
        Self {
            entries: [const { None }; MAX_POLICIES],
            len: 0,
        }
    }
}

impl<'p> Policies<'p> {
    fn named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s PolicyEntry<'p>> + 's {
        self.entries
            .iter()
            .flatten()
            .filter(move |e| e.name.as_ref() == name)
    }
}

impl<'de> ListVisitor<'de> for &mut Policies<'de> {
    type Out = ();
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Self::Error> {
        Ok(PolicyMember { table: self })
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

struct PolicyMember<'a, 'de> {
    table: &'a mut Policies<'de>,
}

impl<'de> EntryVisitor<'de> for PolicyMember<'_, 'de> {
    type Error = Infallible;

    fn item(self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(self)
    }

    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Self::Error> {
        Ok(Ignored)
    }
}

impl<'de> ItemVisitor<'de> for PolicyMember<'_, 'de> {
    type Out = ();
    type Error = Infallible;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Self::Error> {
        Ok(PolicyParams {
            table: self.table,
            name: name(bare_item),
            quota: None,
            window: None,
            requests: true,
        })
    }
}

struct PolicyParams<'a, 'de> {
    table: &'a mut Policies<'de>,
    name: Option<Cow<'de, str>>,
    quota: Option<u64>,
    window: Option<u64>,
    requests: bool,
}

impl<'de> ParameterVisitor<'de> for PolicyParams<'_, 'de> {
    type Out = ();
    type Error = Infallible;

    // A repeated parameter overwrites the earlier one, as RFC 9651 requires.
    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Self::Error> {
        match key.as_str() {
            "q" => self.quota = non_negative(&value),
            "w" => self.window = non_negative(&value),
            "qu" => {
                self.requests =
                    matches!(&value, BareItemFromInput::String(s) if s.as_str() == "requests");
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Self::Error> {
        let table = self.table;
        if let (Some(name), Some(quota)) = (self.name, self.quota) {
            if let Some(slot) = table.entries.get_mut(table.len) {
                *slot = Some(PolicyEntry {
                    name,
                    quota,
                    window: self.window,
                    requests: self.requests,
                });
                table.len += 1;
            }
        }
        Ok(())
    }
}

// === Limits ===

struct Limits<'a, 'c, 'p> {
    c: &'a mut Collector<'c>,
    policies: &'a Policies<'p>,
    text: &'a str,
}

impl<'de> ListVisitor<'de> for Limits<'_, '_, '_> {
    type Out = ();
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Self::Error> {
        Ok(LimitMember { limits: &mut *self })
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

struct LimitMember<'m, 'a, 'c, 'p> {
    limits: &'m mut Limits<'a, 'c, 'p>,
}

impl<'de> EntryVisitor<'de> for LimitMember<'_, '_, '_, '_> {
    type Error = Infallible;

    fn item(self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(self)
    }

    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Self::Error> {
        Ok(Ignored)
    }
}

impl<'de> ItemVisitor<'de> for LimitMember<'_, '_, '_, '_> {
    type Out = ();
    type Error = Infallible;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Self::Error> {
        Ok(LimitParams {
            limits: self.limits,
            name: name(bare_item),
            remaining: None,
            reset: None,
        })
    }
}

struct LimitParams<'m, 'a, 'c, 'p, 'de> {
    limits: &'m mut Limits<'a, 'c, 'p>,
    name: Option<Cow<'de, str>>,
    remaining: Option<u64>,
    reset: Option<u64>,
}

impl<'de> ParameterVisitor<'de> for LimitParams<'_, '_, '_, '_, 'de> {
    type Out = ();
    type Error = Infallible;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Self::Error> {
        match key.as_str() {
            "r" => self.remaining = non_negative(&value),
            "t" => self.reset = non_negative(&value),
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Self::Error> {
        let Some(remaining) = self.remaining else {
            return Ok(());
        };
        let Limits { c, policies, text } = self.limits;
        let name = self.name.as_deref().unwrap_or_default();
        let matched = || policies.named(name);
        if matched().all(|p| p.requests) {
            c.remaining(remaining);
        }
        if remaining == 0 {
            // `t` when given; otherwise the longest window a policy of that name declares.
            let reset = self
                .reset
                .or_else(|| matched().filter_map(|p| p.window).max());
            if let Some(secs) = reset {
                c.reset(Reader::Ietf, Value::Delay(Duration::from_secs(secs)), text);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::signals::tests::read;
    use crate::signals::{Dialect, Policy, Reader, Wait};

    fn secs(s: u64) -> Option<Wait> {
        Some(Wait::For(Duration::from_secs(s)))
    }

    #[test]
    fn draft_10_examples() {
        // The draft's examples: one policy, then several matched by name.
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-policy", br#""default";q=100;w=60"#),
                ("ratelimit", br#""default";r=0;t=30"#),
            ],
        );
        assert_eq!((r.wait, r.source), (secs(30), Some(Reader::Ietf)));
        assert_eq!(r.remaining, Some(0));
        assert_eq!(r.limit, Some(100));
        assert_eq!(
            r.policy,
            Some(Policy {
                quota: 100,
                window: Duration::from_secs(60)
            })
        );
        let r = read(
            Dialect::ietf(),
            &[
                (
                    "ratelimit-policy",
                    br#""burst";q=100;w=60,"daily";q=1000;w=86400"#,
                ),
                ("ratelimit", br#""burst";r=50;t=30, "daily";r=0;t=3600"#),
            ],
        );
        assert_eq!(r.wait, secs(3600));
        assert_eq!(r.remaining, Some(0));
        assert_eq!(r.limit, Some(100));
        // 1000/day is stricter than 100/min.
        assert_eq!(
            r.policy,
            Some(Policy {
                quota: 1000,
                window: Duration::from_secs(86_400)
            })
        );
    }

    #[test]
    fn positive_remaining_never_waits() {
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-policy", br#""default";q=100;w=60"#),
                ("ratelimit", br#""default";r=1;t=30"#),
            ],
        );
        assert_eq!((r.wait, r.remaining), (None, Some(1)));
    }

    #[test]
    fn items_match_policies_by_name() {
        // No `t`: the window of the policy of the same name, not of another one.
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-policy", br#""a";q=10;w=1, "b";q=10;w=600"#),
                ("ratelimit", br#""a";r=0"#),
            ],
        );
        assert_eq!(r.wait, secs(1));
        // No `t` and no policy of that name: nothing to wait for.
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-policy", br#""a";q=10;w=1"#),
                ("ratelimit", br#""c";r=0"#),
            ],
        );
        assert_eq!((r.wait, r.remaining), (None, Some(0)));
        // Tokens as names, from servers that send them.
        let r = read(
            Dialect::ietf(),
            &[("ratelimit-policy", b"a;q=10;w=5"), ("ratelimit", b"a;r=0")],
        );
        assert_eq!(r.wait, secs(5));
        // A policy in another unit: its remaining is not a request count, but 0 still waits.
        let r = read(
            Dialect::ietf(),
            &[
                (
                    "ratelimit-policy",
                    br#""bytes";q=1000;qu="content-bytes";w=10"#,
                ),
                ("ratelimit", br#""bytes";r=0;t=4"#),
            ],
        );
        assert_eq!(
            (r.wait, r.remaining, r.limit, r.policy),
            (secs(4), None, None, None)
        );
    }

    #[test]
    fn each_line_stands_alone_and_invalid_members_are_ignored() {
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit", b"garbage ;;; here"),
                ("ratelimit", br#""x";r=0;t=7"#),
                (
                    "ratelimit",
                    br#""y";r=-1;t=70, "z";t=80, "w";r=0;t=-5, "v";r=0;t=1.5"#,
                ),
            ],
        );
        assert_eq!(r.wait, secs(7));
        // 16 digits is not a structured-field integer: the line is invalid.
        let r = read(
            Dialect::ietf(),
            &[("ratelimit", br#""x";r=0;t=1000000000000000"#)],
        );
        assert_eq!(r.wait, None);
        // 15 digits is, and beyond MAX_DELAY it is too long, never clamped.
        let r = read(
            Dialect::ietf(),
            &[("ratelimit", br#""x";r=0;t=999999999999999"#)],
        );
        assert_eq!(
            r.wait,
            Some(Wait::TooLong {
                value: r#""x";r=0;t=999999999999999"#.into()
            })
        );
        // The generic dialect reads it; the GitHub and the standard ones do not.
        let h = [("ratelimit", &br#""x";r=0;t=7"#[..])];
        assert_eq!(read(Dialect::generic(), &h).wait, secs(7));
        assert_eq!(read(Dialect::standard(), &h).wait, None);
        assert_eq!(read(Dialect::github(), &h).wait, None);
    }

    #[test]
    fn legacy_trio() {
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-limit", b"100"),
                ("ratelimit-remaining", b"0"),
                ("ratelimit-reset", b"50"),
            ],
        );
        assert_eq!((r.wait, r.source), (secs(50), Some(Reader::IetfLegacy)));
        assert_eq!((r.remaining, r.limit), (Some(0), Some(100)));
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-limit", b"10, 10;w=1, 50;w=60"),
                ("ratelimit-remaining", b"3"),
                ("ratelimit-reset", b"50"),
            ],
        );
        assert_eq!((r.wait, r.remaining, r.limit), (None, Some(3), Some(10)));
        // Duplicates: the smallest remaining, the longest reset.
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-remaining", b"5"),
                ("ratelimit-remaining", b"0"),
                ("ratelimit-reset", b"50"),
                ("ratelimit-reset", b"9"),
                ("ratelimit-reset", b"soon"),
            ],
        );
        assert_eq!(r.wait, secs(50));
    }

    #[test]
    fn retry_after_takes_precedence_over_the_ietf_resets() {
        // A 429's wait: `Retry-After` over `t` (draft-ietf-httpapi-ratelimit-headers), shorter
        // or longer; the reset is still the success's wait.
        for (ra, ms) in [(&b"5"[..], false), (b"60", false), (b"5000", true)] {
            let name = if ms { "retry-after-ms" } else { "retry-after" };
            let r = read(
                Dialect::generic(),
                &[(name, ra), ("ratelimit", br#""d";r=0;t=30"#)],
            );
            let asked = if ra == b"60" { 60 } else { 5 };
            assert_eq!(r.wait, secs(asked), "{name}: {ra:?}");
            assert_eq!(r.reset, secs(30));
            // The legacy trio likewise.
            let r = read(
                Dialect::generic(),
                &[
                    (name, ra),
                    ("ratelimit-remaining", b"0"),
                    ("ratelimit-reset", b"30"),
                ],
            );
            assert_eq!((r.wait, r.reset), (secs(asked), secs(30)), "{name}: {ra:?}");
        }
        // An invalid `Retry-After` takes no precedence; without one the longest reset wins.
        let r = read(
            Dialect::ietf(),
            &[("retry-after", b"later"), ("ratelimit", br#""d";r=0;t=30"#)],
        );
        assert_eq!((r.wait, r.source), (secs(30), Some(Reader::Ietf)));
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit", br#""d";r=0;t=30"#),
                ("ratelimit-remaining", b"0"),
                ("ratelimit-reset", b"40"),
            ],
        );
        assert_eq!((r.wait, r.reset), (secs(40), secs(40)));
        // Another provider's reset is not the IETF's: with `Retry-After` the longest wins.
        let r = read(
            Dialect::generic(),
            &[
                ("retry-after", b"5"),
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", b"30"),
            ],
        );
        assert_eq!((r.wait, r.source), (secs(30), Some(Reader::XRateLimit)));
    }

    #[test]
    fn a_legacy_reset_sent_as_an_epoch_is_an_epoch() {
        use crate::signals::tests::headers;
        use crate::signals::ReadContext;
        let epoch = 1_700_000_030;
        let now = std::time::UNIX_EPOCH + Duration::from_secs(epoch - 30);
        for reset in [epoch.to_string(), (epoch * 1000).to_string()] {
            let h = headers(&[
                ("ratelimit-remaining", b"0"),
                ("ratelimit-reset", reset.as_bytes()),
            ]);
            let r = Dialect::ietf().read(&h, &ReadContext::new(now));
            assert_eq!(r.wait, secs(30), "{reset}");
        }
        // Delta seconds below the threshold, as before.
        let r = read(
            Dialect::ietf(),
            &[
                ("ratelimit-remaining", b"0"),
                ("ratelimit-reset", b"999999999"),
            ],
        );
        assert_eq!(r.wait, secs(999_999_999));
    }
}
