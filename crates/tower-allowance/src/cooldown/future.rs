use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::service::CooldownShared;
use crate::{
    classify::{Classification, Classified, Classify, ServerDelay},
    error::{AbandonReason, Abandoned},
    extensions::SentAt,
    rule::{self, Op, Reply},
    shared::Applying,
    signals::{self, ReadContext, Wait},
    store::{StoreError, StoreFuture},
    Allowance, AllowanceConfig, BoxError,
};

pin_project! {
    /// Response future of [`Cooldown`](super::Cooldown).
    pub struct ResponseFuture<F, RB, C> {
        #[pin]
        inner: F,
        shared: Arc<CooldownShared<C>>,
        final_attempt: Option<AbandonReason>,
        // When the request was sent (set by the admission layer below): only for an adaptive
        // rate (one cut per round).
        sent: Option<SentAt>,
        // The attempt's span (disabled, and free, without a subscriber that wants it).
        span: tracing::Span,
        // A shared store's cooldown raise in flight, and the response waiting for it; boxed
        // (rare: a throttling response on a shared store) to keep the future small.
        deferring: Option<Box<(StoreFuture<Reply>, Instant, Response<RB>, Option<String>)>>,
    }
}

impl<F, RB, C> ResponseFuture<F, RB, C> {
    pub(crate) fn new(
        inner: F,
        shared: Arc<CooldownShared<C>>,
        final_attempt: Option<AbandonReason>,
        span: tracing::Span,
        sent: Option<SentAt>,
    ) -> Self {
        Self {
            inner,
            shared,
            final_attempt,
            sent,
            span,
            deferring: None,
        }
    }
}

impl<F, RB, C> std::fmt::Debug for ResponseFuture<F, RB, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("deferring", &self.deferring.is_some())
            .finish_non_exhaustive()
    }
}

/// What one response says, read once: its classification, the wait it asks for, and the
/// provider's other signals.
pub(crate) struct Read {
    pub(crate) classified: Classified,
    /// A success that says the allowance is spent until a reset (`remaining: 0`).
    pub(crate) spent_until: Option<ServerDelay>,
    /// A rate the server advertised, in thousandths per second.
    pub(crate) advertised_milli: Option<u64>,
    /// The wait asked for, as sent, when it is beyond `max_cooldown` (for the warning).
    pub(crate) asked: Option<String>,
    #[cfg(feature = "dialects")]
    pub(crate) observation: Option<crate::RateLimitObservation>,
    pub(crate) untrusted_date: bool,
}

/// Classifies a response and reads its rate-limit headers with the allowance's dialect:
/// once per response.
pub(crate) fn read_response<C: Classify>(
    classifier: &C,
    config: &AllowanceConfig,
    status: http::StatusCode,
    response_headers: &http::HeaderMap,
) -> Read {
    // The classifier's own reading (a gRPC pushback, say), then the dialect's.
    let base = classifier.classify_response(status, response_headers);
    if response_headers.is_empty() {
        return Read {
            classified: base,
            spent_until: None,
            advertised_milli: None,
            asked: None,
            #[cfg(feature = "dialects")]
            observation: None,
            untrusted_date: false,
        };
    }
    let cx = ReadContext::new(signals::wall_clock()).with_max_skew(config.max_date_skew());
    #[cfg_attr(not(feature = "dialects"), allow(unused_mut))]
    let mut reading = config.readers().read(response_headers, &cx);
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
    let asked = match (delay, wait) {
        (Some(ServerDelay::TooLong), Some(Wait::TooLong { value })) => Some(value.clone()),
        (Some(ServerDelay::After(d)), _) if d > config.max_cooldown() => Some(format!("{d:?}")),
        _ => None,
    };
    let (classified, spent_until) = match class {
        _ if throttling => (Classified::new(class, delay), None),
        Classification::Success => (Classified::new(class, None), delay),
        _ => (Classified::new(class, None), None),
    };
    let advertised_milli = reading.policy.and_then(|p| {
        let window_us = u64::try_from(p.window.as_micros())
            .ok()
            .filter(|w| *w > 0)?;
        Some(p.quota.saturating_mul(1_000_000_000) / window_us)
    });
    #[cfg(feature = "dialects")]
    let observation = crate::RateLimitObservation::of(&mut reading);
    Read {
        classified,
        spent_until,
        advertised_milli,
        asked,
        #[cfg(feature = "dialects")]
        observation,
        untrusted_date: reading.date.should_warn(),
    }
}

impl<F, E, RB, C> Future for ResponseFuture<F, RB, C>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    C: Classify,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        if let Some(pending) = this.deferring {
            let (defer, now, ..) = &mut **pending;
            let result = ready!(defer.as_mut().poll(cx));
            let now = *now;
            let Some(pending) = this.deferring.take() else {
                unreachable!("checked above");
            };
            deferred(&this.shared.allowance, now, result, pending.3.as_deref());
            return Poll::Ready(Ok(pending.2));
        }
        let response = ready!(this.inner.poll(cx)).map_err(Into::into)?;
        let (mut parts, body) = response.into_parts();
        let shared: &CooldownShared<C> = this.shared;
        let allowance = &shared.allowance;
        let read = read_response(
            &shared.classifier,
            allowance.config(),
            parts.status,
            &parts.headers,
        );
        let classified = read.classified;
        #[cfg(feature = "dialects")]
        if let Some(seen) = read.observation {
            allowance.shared.stats.observe(seen);
        }
        if read.untrusted_date {
            allowance.shared.warn_untrusted_date();
        }
        if let Some(rate_milli) = read.advertised_milli {
            allowance.shared.advertise(rate_milli);
        }
        // Handed on to the retry policy and `Outcome::of`. A success that any reader would
        // call one anyway (2xx/3xx) carries nothing: an extension costs allocations, and the
        // fast path makes none.
        if classified.class != Classification::Success || !plainly_successful(parts.status) {
            parts.extensions.insert(classified);
        }
        let retryable = matches!(
            classified.class,
            Classification::Throttled | Classification::Transient
        );
        if let (true, Some(mut reason)) = (retryable, *this.final_attempt) {
            // No retry follows: report it as abandoned, not as final; for a closure (this
            // response's, or one already known) with the closure's reason.
            if reason != AbandonReason::NotReplayable {
                let closes = classified.delay == Some(ServerDelay::TooLong) || read.asked.is_some();
                let closed = closes.then_some(AbandonReason::CooldownTooLong);
                reason = closed.unwrap_or_else(|| allowance.shared.or_closed(reason));
            }
            allowance.shared.stats.abandon(reason);
            parts.extensions.insert(Abandoned::new(reason));
        }
        let response = Response::from_parts(parts, body);
        let adaptive = this.sent.is_some();
        let op = match (classified.class, classified.delay) {
            (Classification::Success, _) => {
                allowance.on_success();
                // `remaining: 0` until a reset: a cooldown until then. Not a throttling
                // signal for an adaptive rate: the allowance was used up, not exceeded (at a
                // rate exactly at the limit, or at an adopted policy's, it is every window).
                match read.spent_until {
                    Some(ServerDelay::After(d)) if !d.is_zero() => Op::Defer {
                        delay_us: rule::micros_ceil(d),
                    },
                    Some(ServerDelay::TooLong) => Op::Defer { delay_us: None },
                    _ => return Poll::Ready(Ok(response)),
                }
            }
            (Classification::Throttled, delay) => {
                allowance
                    .shared
                    .stats
                    .metrics
                    .throttled(response.status().as_u16());
                allowance.on_throttled(matches!(delay, Some(ServerDelay::After(_))));
                let delay_us = match delay {
                    Some(ServerDelay::After(d)) => rule::micros_ceil(d),
                    // An unrepresentable wait closes the allowance (the rule decides).
                    Some(ServerDelay::TooLong) => None,
                    // No usable delay (or "do not retry"): no cooldown is invented (it may
                    // be a spent quota); an adaptive rate is still cut.
                    None | Some(ServerDelay::DoNotRetry) if adaptive => Some(0),
                    None | Some(ServerDelay::DoNotRetry) => return Poll::Ready(Ok(response)),
                };
                Op::Throttle {
                    delay_us,
                    age_us: age_us(this.sent.as_ref()),
                }
            }
            _ => return Poll::Ready(Ok(response)),
        };
        let now = Instant::now();
        let result = match allowance.shared.apply(now, op) {
            Applying::Done(result) => result,
            Applying::Pending(mut fut) => match fut.as_mut().poll(cx) {
                Poll::Ready(result) => result,
                Poll::Pending => {
                    // A shared store: hold the response until the cooldown is recorded, so the
                    // retry that follows is scheduled after it.
                    *this.deferring = Some(Box::new((fut, now, response, read.asked)));
                    return Poll::Pending;
                }
            },
        };
        deferred(&shared.allowance, now, result, read.asked.as_deref());
        Poll::Ready(Ok(response))
    }
}

/// How long ago the attempt was sent, in whole microseconds (0 when unknown).
fn age_us(sent: Option<&SentAt>) -> u64 {
    sent.and_then(|s| s.0.get().copied()).map_or(0, |sent| {
        rule::micros_floor(Instant::now().saturating_duration_since(sent))
    })
}

/// What readers assume of a response without a [`Classified`] extension.
pub(crate) fn plainly_successful(status: http::StatusCode) -> bool {
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

/// The cooldown raise's answer. A failure is logged, and the response still delivered: losing
/// it would be worse than a cooldown the other processes do not hear of.
pub(super) fn deferred(
    allowance: &Allowance,
    now: Instant,
    result: Result<Reply, StoreError>,
    asked: Option<&str>,
) {
    match result {
        Ok(Reply::Defer(d)) => allowance.shared.after_defer(now, &d, asked),
        Ok(_) => tracing::warn!("the allowance store answered a cooldown raise out of contract"),
        Err(e) => tracing::warn!(
            allowance = &*allowance.shared.name,
            error = %e,
            cause = ?std::error::Error::source(&e).map(ToString::to_string),
            "could not record the cooldown in the allowance store"
        ),
    }
}
