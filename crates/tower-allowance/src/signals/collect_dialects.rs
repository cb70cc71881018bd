//! What only the providers' readers (feature `dialects`) offer a [`Collector`]: remaining
//! counts, limits, advertised policies and buckets, with the same max/min semantics.

use super::grammars;
use crate::signals::{values, Collector, Policy, Reader, Value};

impl Collector<'_> {
    /// Offers a remaining request count; the smallest is kept.
    pub(super) fn remaining(&mut self, remaining: u64) {
        let r = &mut self.reading.remaining;
        *r = Some(r.map_or(remaining, |r| r.min(remaining)));
    }

    /// Offers a request limit; the smallest is kept.
    pub(super) fn limit(&mut self, limit: u64) {
        let l = &mut self.reading.limit;
        *l = Some(l.map_or(limit, |l| l.min(limit)));
    }

    /// Offers a request limit its provider documents per `window`: a limit, and the policy
    /// an adaptive rate caps at (or adopts).
    pub(super) fn limit_per(&mut self, limit: u64, window: std::time::Duration) {
        self.limit(limit);
        self.policy(Policy {
            quota: limit,
            window,
        });
    }

    /// Offers an advertised policy; the most restrictive (lowest quota per window) is kept.
    pub(super) fn policy(&mut self, policy: Policy) {
        let stricter = |a: &Policy, b: &Policy| {
            u128::from(a.quota) * b.window.as_nanos() < u128::from(b.quota) * a.window.as_nanos()
        };
        if self
            .reading
            .policy
            .as_ref()
            .is_none_or(|current| stricter(&policy, current))
        {
            self.reading.policy = Some(policy);
        }
    }

    /// Offers a bucket name; the first valid one is kept.
    pub(super) fn bucket(&mut self, name: &http::HeaderName) {
        if self.reading.bucket.is_some() {
            return;
        }
        self.reading.bucket = values::texts(self.headers, name)
            .find(|v| v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_owned);
    }

    /// Offers the wait a spent remaining count asks for (`remaining: 0` until `value`): the
    /// longest is kept as [`Reading::reset`](crate::signals::Reading::reset), and it is offered
    /// as a wait too, unless it is the IETF fields' and a `Retry-After` (or `retry-after-ms`)
    /// was read: the draft gives `Retry-After` precedence. (The readers run in [`Reader`]
    /// order, `RetryAfter` and `RetryAfterMs` first, so any `Retry-After` is read by now.)
    pub(super) fn reset(&mut self, reader: Reader, value: Value, text: &str) {
        let wait = self.measure(value, text);
        let reset = &mut self.reading.reset;
        if reset.as_ref().is_none_or(|c| wait.is_longer_than(c)) {
            *reset = Some(wait.clone());
        }
        let ietf = matches!(reader, Reader::Ietf | Reader::IetfLegacy);
        let retry_after = matches!(
            self.reading.source,
            Some(Reader::RetryAfter | Reader::RetryAfterMs)
        );
        if !(ietf && retry_after) {
            self.offer(reader, wait);
        }
    }

    /// The common "remaining 0 + reset" rule: when the smallest count of `remaining` is 0,
    /// every valid value of `reset` (read by `parse`) is offered as a wait.
    pub(super) fn wait_when_spent(
        &mut self,
        reader: Reader,
        remaining: &http::HeaderName,
        reset: &http::HeaderName,
        parse: impl Fn(&str) -> Option<Value>,
    ) -> Option<u64> {
        let left = grammars::smallest_count(self.headers, remaining);
        if left == Some(0) {
            for text in values::texts(self.headers, reset) {
                if let Some(value) = parse(text) {
                    self.reset(reader, value, text);
                }
            }
        }
        left
    }
}
