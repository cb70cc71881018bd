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
    classify::{self, Classification, Classify, ServerDelay},
    error::{AbandonReason, Abandoned},
    extensions::Attempt,
    rule::{self, Op},
    shared::{Answer, Applying},
    signals, BoxError,
};

pin_project! {
    /// Response future of [`Cooldown`](super::Cooldown).
    pub struct ResponseFuture<F, RB, C> {
        #[pin]
        state: State<F, RB>,
        shared: Arc<CooldownShared<C>>,
        // Why no retry follows this attempt, if none does (the attempt's record).
        last: Option<AbandonReason>,
        // The attempt's span (disabled, and free, without a subscriber that wants it).
        span: tracing::Span,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateProjReplace]
    enum State<F, RB> {
        // The attempt is in flight.
        Sent {
            #[pin]
            inner: F,
        },
        // The cooldown its response raised is being recorded in a shared store; the response
        // waits for it, so that the retry that follows is scheduled after it. Boxed (rare: a
        // throttling response on a shared store), to keep the future small.
        Recording {
            recording: Box<Recording<RB>>,
        },
        Done,
    }
}

/// A cooldown raise in flight, and the response handed on once it is recorded.
struct Recording<RB> {
    store: Answer,
    at: Instant,
    response: Response<RB>,
    asked: Option<String>,
}

impl<F, RB, C> ResponseFuture<F, RB, C> {
    pub(crate) fn new(
        inner: F,
        shared: Arc<CooldownShared<C>>,
        last: Option<AbandonReason>,
        span: tracing::Span,
    ) -> Self {
        Self {
            state: State::Sent { inner },
            shared,
            last,
            span,
        }
    }
}

impl<F, RB, C> std::fmt::Debug for ResponseFuture<F, RB, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Sent { .. } => "sent",
            State::Recording { .. } => "recording a cooldown",
            State::Done => "done",
        };
        let mut f = f.debug_struct("ResponseFuture");
        f.field("state", &state).finish_non_exhaustive()
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
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            match this.state.as_mut().project() {
                StateProj::Sent { inner } => {
                    let result = ready!(inner.poll(cx));
                    this.state.set(State::Done);
                    let (response, raise) =
                        observe(this.shared, *this.last, result.map_err(Into::into)?);
                    let Some((op, asked)) = raise else {
                        return Poll::Ready(Ok(response));
                    };
                    let at = Instant::now();
                    let allowance = &this.shared.allowance;
                    match allowance.shared.apply(at, op) {
                        Applying::Done(result) => {
                            allowance.shared.recorded(at, result, asked.as_deref());
                            return Poll::Ready(Ok(response));
                        }
                        Applying::Pending(store) => {
                            let recording = Box::new(Recording {
                                store,
                                at,
                                response,
                                asked,
                            });
                            this.state.set(State::Recording { recording });
                        }
                    }
                }
                StateProj::Recording { recording } => {
                    let result = ready!(Pin::new(&mut recording.store).poll(cx));
                    let replaced = this.state.as_mut().project_replace(State::Done);
                    if let StateProjReplace::Recording { recording } = replaced {
                        let recording = *recording;
                        let shared = &this.shared.allowance.shared;
                        shared.recorded(recording.at, result, recording.asked.as_deref());
                        return Poll::Ready(Ok(recording.response));
                    }
                }
                StateProj::Done => panic!("cooldown future polled after completion"),
            }
        }
    }
}

/// Observes one response: reads it once, records what it says in this process (the
/// provider's view, an advertised rate, a success for the budget), marks it for the layers
/// above (its classification; abandoned when it is a throttling answer no retry follows), and
/// says which cooldown to raise in the store, if any, with the wait as sent (for the warning
/// when it closes the allowance).
fn observe<RB, C: Classify>(
    shared: &CooldownShared<C>,
    last: Option<AbandonReason>,
    response: Response<RB>,
) -> (Response<RB>, Option<(Op, Option<String>)>) {
    let (mut parts, body) = response.into_parts();
    let allowance = &shared.allowance;
    let read = classify::read(
        &shared.classifier,
        allowance.config().reading(),
        signals::wall_clock,
        parts.status,
        &parts.headers,
    );
    let classified = read.classified;
    #[cfg(feature = "dialects")]
    if let Some(seen) = read.observation {
        allowance.shared.observe(seen);
    }
    if read.untrusted_date {
        allowance.shared.warn_untrusted_date();
    }
    if let Some(rate_milli) = read.advertised_milli {
        allowance.shared.advertise(rate_milli);
    }
    // Handed on to the retry policy and `Outcome::of`. A success that any reader would call
    // one anyway (2xx/3xx) carries nothing: an extension costs allocations, and the fast path
    // makes none.
    if classified.class != Classification::Success || !classify::plainly_successful(parts.status) {
        parts.extensions.insert(classified);
    }
    let retryable = matches!(
        classified.class,
        Classification::Throttled | Classification::Transient
    );
    if let (true, Some(reason)) = (retryable, last) {
        // No retry follows: report it as abandoned, not as final, with the server's wait as
        // when to come back; for a closure (this response's, or one already known) with the
        // closure's reason.
        let closes = classified.delay == Some(ServerDelay::TooLong) || read.asked.is_some();
        let abandoned = if reason == AbandonReason::NotReplayable {
            Abandoned::new(reason)
        } else if closes {
            Abandoned::new(AbandonReason::CooldownTooLong)
        } else {
            allowance.shared.or_closed(reason, classified.delay)
        };
        allowance.shared.abandon(abandoned.reason());
        parts.extensions.insert(abandoned);
    }
    // When the attempt was sent, from its record (the admission layer below puts it in the
    // response of an adaptive allowance): an adaptive rate cuts once per round of sends.
    let sent = Attempt::of(&parts.extensions).and_then(|a| a.sent);
    let response = Response::from_parts(parts, body);
    let op = match (classified.class, classified.delay) {
        (Classification::Success, _) => {
            allowance.shared.succeeded();
            // `remaining: 0` until a reset: a cooldown until then. Not a throttling signal
            // for an adaptive rate: the allowance was used up, not exceeded (at a rate exactly
            // at the limit, or at an adopted policy's, it is every window).
            match read.spent_until {
                Some(ServerDelay::After(d)) if !d.is_zero() => Op::Defer {
                    delay_us: rule::micros_ceil(d),
                },
                Some(ServerDelay::TooLong) => Op::Defer { delay_us: None },
                _ => return (response, None),
            }
        }
        (Classification::Throttled, delay) => {
            allowance.shared.throttled(response.status().as_u16());
            allowance.on_throttled(matches!(delay, Some(ServerDelay::After(_))));
            let adaptive = allowance.config().rule_params().adaptive().is_some();
            let delay_us = match delay {
                Some(ServerDelay::After(d)) => rule::micros_ceil(d),
                // An unrepresentable wait closes the allowance (the rule decides).
                Some(ServerDelay::TooLong) => None,
                // No usable delay (or "do not retry"): no cooldown is invented (it may be a
                // spent quota); an adaptive rate is still cut.
                None | Some(ServerDelay::DoNotRetry) if adaptive => Some(0),
                None | Some(ServerDelay::DoNotRetry) => return (response, None),
            };
            // How long ago the attempt was sent, in whole microseconds (0 when unknown).
            let age_us = sent.map_or(0, |sent| {
                rule::micros_floor(Instant::now().saturating_duration_since(sent))
            });
            Op::Throttle { delay_us, age_us }
        }
        _ => return (response, None),
    };
    (response, Some((op, read.asked)))
}
