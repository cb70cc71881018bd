//! What one response says, read once: a pure function of the response, the classifier, the
//! allowance's dialect and bounds, and the local wall clock.
//!
//! The cooldown layer reads every response with it, and hands the classification on in the
//! response's extensions ([`Classified`]); the retry policy reads a response itself only
//! when no cooldown layer did.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use super::{Classification, Classified, Classify, ServerDelay};
use crate::signals::{Dialect, ReadContext, Wait};

#[cfg(test)]
mod tests;

/// How an allowance reads responses: its dialect and its bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadWith {
    pub(crate) readers: Dialect,
    pub(crate) max_date_skew: Duration,
    pub(crate) max_cooldown: Duration,
}

/// What one response says.
#[derive(Debug)]
pub(crate) struct Read {
    pub(crate) classified: Classified,
    /// A success that says the allowance is spent until a reset (`remaining: 0`).
    pub(crate) spent_until: Option<ServerDelay>,
    /// A rate the server advertised, in thousandths per second.
    pub(crate) advertised_milli: Option<u64>,
    /// The wait asked for, as sent, when it is beyond `max_cooldown` (for the warning).
    pub(crate) asked: Option<String>,
    #[cfg(feature = "dialects")]
    pub(crate) observation: Option<crate::signals::RateLimitObservation>,
    /// The response's `Date` was not trusted (for the warning).
    pub(crate) untrusted_date: bool,
}

/// Classifies a response and reads its rate-limit headers with the allowance's dialect.
/// `wall` is the local wall clock, read only when the response has headers (the one
/// wall-clock read, for the absolute times in them).
pub(crate) fn read<C: Classify>(
    classifier: &C,
    with: ReadWith,
    wall: impl FnOnce() -> SystemTime,
    status: StatusCode,
    headers: &HeaderMap,
) -> Read {
    // The classifier's own reading (a gRPC pushback, say), then the dialect's.
    let base = classifier.classify_response(status, headers);
    let mut read = Read {
        classified: base,
        spent_until: None,
        advertised_milli: None,
        asked: None,
        #[cfg(feature = "dialects")]
        observation: None,
        untrusted_date: false,
    };
    if headers.is_empty() {
        return read;
    }
    let cx = ReadContext::new(wall()).with_max_skew(with.max_date_skew);
    #[cfg_attr(not(feature = "dialects"), allow(unused_mut))]
    let mut reading = with.readers.read(headers, &cx);
    // A 403 the dialect says a rate limit refused (GitHub's) is throttling.
    let class = match base.class {
        Classification::Failure if reading.refused && status == 403 => Classification::Throttled,
        class => class,
    };
    // One rule (see `signals`): a throttling response waits `wait`; a success, only `reset`.
    let throttling = matches!(class, Classification::Throttled | Classification::Transient);
    let wait = if throttling {
        &reading.wait
    } else {
        &reading.reset
    };
    let dialect_delay = wait.as_ref().map(|w| match w {
        Wait::For(d) => ServerDelay::After(*d),
        Wait::TooLong { .. } => ServerDelay::TooLong,
    });
    let delay = longest(base.delay, dialect_delay);
    read.asked = match (delay, wait) {
        (Some(ServerDelay::TooLong), Some(Wait::TooLong { value })) => Some(value.clone()),
        (Some(ServerDelay::After(d)), _) if d > with.max_cooldown => Some(format!("{d:?}")),
        _ => None,
    };
    (read.classified, read.spent_until) = match class {
        _ if throttling => (Classified::new(class, delay), None),
        Classification::Success => (Classified::new(class, None), delay),
        _ => (Classified::new(class, None), None),
    };
    read.advertised_milli = reading.policy.and_then(|p| {
        let window_us = u64::try_from(p.window.as_micros()).ok();
        let window_us = window_us.filter(|w| *w > 0)?;
        Some(p.quota.saturating_mul(1_000_000_000) / window_us)
    });
    #[cfg(feature = "dialects")]
    {
        read.observation = crate::signals::RateLimitObservation::of(&mut reading);
    }
    read.untrusted_date = reading.date.should_warn();
    read
}

/// What readers assume of a response without a [`Classified`] extension.
pub(crate) fn plainly_successful(status: StatusCode) -> bool {
    status.is_success() || status.is_redirection() || status.is_informational()
}

/// The longer of two waits a response asks for; "do not retry" wins over any wait.
fn longest(a: Option<ServerDelay>, b: Option<ServerDelay>) -> Option<ServerDelay> {
    use ServerDelay::{After, DoNotRetry, TooLong};
    match (a, b) {
        (Some(DoNotRetry), _) | (_, Some(DoNotRetry)) => Some(DoNotRetry),
        (Some(TooLong), _) | (_, Some(TooLong)) => Some(TooLong),
        (Some(After(x)), Some(After(y))) => Some(After(x.max(y))),
        (x, None) | (None, x) => x,
    }
}
