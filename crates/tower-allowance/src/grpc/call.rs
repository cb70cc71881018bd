//! [`GrpcCall`]: the call's `grpc-timeout` as its deadline across every attempt, and what the
//! stack did told to a tonic caller (an abandoned answer's reason, the stack's own refusals
//! as trailers-only gRPC answers).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};

use http::{header::CONTENT_TYPE, HeaderValue, Request, Response};
use tokio::time::{sleep_until, Instant, Sleep};
use tower_service::Service;

use super::{
    body::WatchTrailers,
    codes::Code,
    deadline::{parse_timeout, CallDeadline, GrpcDeadline},
    trailers::FeedAllowance,
    GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, GRPC_TIMEOUT, X_ALLOWANCE_ABANDONED,
    X_ALLOWANCE_COOLED, X_ALLOWANCE_WAITED,
};
use crate::{
    classify::Classified,
    error::{find, AbandonReason, Abandoned, Exhausted, Overloaded, StoreUnavailable},
    Allowance, Attempt, BoxError, Deadline,
};

/// The outermost service of [`GrpcLayer`](super::GrpcLayer): a call's `grpc-timeout` becomes its
/// [`Deadline`] across every attempt, an abandoned answer says why in
/// `x-allowance-abandoned`, and the stack's own refusals become trailers-only gRPC
/// answers (see the [module docs](super#deadlines-and-what-a-tonic-caller-sees)).
///
/// ```
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_allowance::{grpc::GrpcLayer, retry::RetryConfig, Allowance, AllowanceConfig, BoxError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?);
/// let channel = tower::service_fn(|_req: Request<String>| async {
///     Ok::<_, BoxError>(Response::builder().header("grpc-status", "0").body(String::new())?)
/// });
/// let client = ServiceBuilder::new()
///     .layer(GrpcLayer::new(allowance))
///     .service(channel);
/// client.clone().oneshot(Request::post("/pkg.Svc/Get").body(String::new())?).await?;
///
/// // The next slot is a second away: a call with 300 ms left is refused at once.
/// let call = Request::post("/pkg.Svc/Get").header("grpc-timeout", "300m").body(String::new())?;
/// let answer = client.oneshot(call).await?;
/// assert_eq!(answer.headers()["grpc-status"], "4"); // DEADLINE_EXCEEDED
/// assert_eq!(answer.headers()["x-allowance-abandoned"], "deadline");
/// # Ok(())
/// # }
/// ```
///
/// # Clone
///
/// Clones share the allowance (which counts the calls abandoned at their deadline); only
/// `S` is cloned.
#[derive(Clone, Debug)]
pub struct GrpcCall<S> {
    inner: S,
    allowance: Allowance,
}

impl<S> GrpcCall<S> {
    /// `inner`, with the calls it gives up on at their deadline counted by `allowance`.
    pub(super) fn new(inner: S, allowance: Allowance) -> Self {
        Self { inner, allowance }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for GrpcCall<S>
where
    S: Service<Request<B>, Response = Response<WatchTrailers<RB, FeedAllowance>>, Error = BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = GrpcCallFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let timeout = req.headers().get(GRPC_TIMEOUT).and_then(parse_timeout);
        let deadline = timeout.map(CallDeadline::after);
        if let Some(CallDeadline { at, .. }) = deadline {
            let extensions = req.extensions_mut();
            extensions.insert(GrpcDeadline(at));
            let earliest = extensions.get::<Deadline>().map_or(at, |d| d.0.min(at));
            extensions.insert(Deadline(earliest));
        }
        GrpcCallFuture {
            inner: self.inner.call(req),
            deadline: deadline.map(|d| (d, self.allowance.clone())),
            timer: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`GrpcCall`].
    pub struct GrpcCallFuture<F> {
        #[pin]
        inner: F,
        // The call's deadline, if it has a `grpc-timeout`, and the allowance that counts
        // the call if it is abandoned there.
        deadline: Option<(CallDeadline, Allowance)>,
        // Armed at the first poll, for the deadline's `expiry`.
        #[pin]
        timer: Option<Sleep>,
    }
}

impl<F> fmt::Debug for GrpcCallFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcCallFuture").finish_non_exhaustive()
    }
}

impl<F, RB> Future for GrpcCallFuture<F>
where
    F: Future<Output = Result<Response<WatchTrailers<RB, FeedAllowance>>, BoxError>>,
{
    type Output = F::Output;

    /// The deadline first: once it has passed, the call is over whatever the attempt in
    /// flight is doing (see the [module docs](super#deadlines-and-what-a-tonic-caller-sees)).
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some((CallDeadline { expiry, .. }, _)) = this.deadline {
            if this.timer.is_none() {
                this.timer.set(Some(sleep_until(*expiry)));
            }
            let timer = this.timer.as_mut().as_pin_mut();
            if timer.is_some_and(|timer| timer.poll(cx).is_ready()) {
                return Poll::Ready(Ok(deadline_exceeded(this.deadline)));
            }
        }
        Poll::Ready(match ready!(this.inner.poll(cx)) {
            Ok(mut response) => {
                if let Some(abandoned) = response.extensions().get::<Abandoned>() {
                    let reason = HeaderValue::from_static(abandoned.reason().as_str());
                    response.headers_mut().insert(X_ALLOWANCE_ABANDONED, reason);
                }
                let attempt = response.extensions().get::<Attempt>().copied();
                let waits = attempt.map(|a| {
                    [
                        (X_ALLOWANCE_WAITED, a.queued()),
                        (X_ALLOWANCE_COOLED, a.cooled()),
                    ]
                });
                for (key, wait) in waits.into_iter().flatten().filter(|(_, w)| !w.is_zero()) {
                    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                    response.headers_mut().insert(key, HeaderValue::from(ms));
                }
                Ok(response)
            }
            Err(e) => match refusal(&*e) {
                Some(refusal) => Ok(refusal.into_response(&*e)),
                // An error once a timer set from one of the call's `grpc-timeout`s may have
                // fired (tonic's, in `Channel`: `TimeoutExpired`), ours not seen to have:
                // the deadline's doing. (With `retry_transport_errors`, the retry policy
                // has seen the error first, and may have counted an abandonment too.)
                None if this
                    .deadline
                    .as_ref()
                    .is_some_and(|(d, _)| Instant::now() >= d.expiry) =>
                {
                    Ok(deadline_exceeded(this.deadline))
                }
                None => Err(e),
            },
        })
    }
}

/// The answer to a call whose deadline passed while an attempt was in flight, counted once
/// as abandoned (the deadline is taken): DEADLINE_EXCEEDED, as the stack answers a call
/// whose deadline passes before it is sent.
fn deadline_exceeded<RB, F>(
    deadline: &mut Option<(CallDeadline, Allowance)>,
) -> Response<WatchTrailers<RB, F>> {
    let reason = AbandonReason::Deadline;
    if let Some((_, allowance)) = deadline.take() {
        allowance.shared.abandon(reason);
    }
    let refusal = Refusal {
        code: Code::DEADLINE_EXCEEDED,
        pushback: None,
        reason: Some(reason),
    };
    refusal.into_response(&Abandoned::new(reason))
}

/// What the stack answers a tonic caller for one of its own refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) code: Code,
    /// `grpc-retry-pushback-ms`: milliseconds, or `-1` for "do not retry".
    pub(super) pushback: Option<i64>,
    /// `None` for a store failure: nothing was given up on, the store could not decide.
    reason: Option<AbandonReason>,
}

/// The gRPC status for the stack's own errors; `None` for any other (a transport error is
/// tonic's to map).
pub(super) fn refusal(e: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    // Milliseconds, rounded up (never early); `None`: -1, do not retry.
    let ms = |left: Option<Duration>| {
        left.map_or(-1, |d| {
            i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
        })
    };
    let (code, pushback, reason) = if let Some(x) = find::<Exhausted>(e) {
        let left = x
            .until()
            .map(|at| at.saturating_duration_since(Instant::now()));
        (Code::RESOURCE_EXHAUSTED, Some(ms(left)), Some(x.reason()))
    } else if let Some(o) = find::<Overloaded>(e) {
        let reason = Some(AbandonReason::Overloaded);
        (Code::UNAVAILABLE, Some(ms(Some(o.wait))), reason)
    } else if let Some(a) = find::<Abandoned>(e) {
        match a.reason() {
            AbandonReason::Deadline => (Code::DEADLINE_EXCEEDED, None, Some(a.reason())),
            // Retrying cannot help: the budget is the batch's, the cost never fits.
            reason => (Code::RESOURCE_EXHAUSTED, Some(-1), Some(reason)),
        }
    } else if find::<StoreUnavailable>(e).is_some() {
        (Code::UNAVAILABLE, None, None)
    } else {
        return None;
    };
    Some(Refusal {
        code,
        pushback,
        reason,
    })
}

impl Refusal {
    /// A trailers-only answer: HTTP 200, `content-type: application/grpc`, the status in
    /// the headers, an empty body.
    fn into_response<RB, F>(
        self,
        e: &(dyn std::error::Error + 'static),
    ) -> Response<WatchTrailers<RB, F>> {
        let mut response = Response::new(WatchTrailers::empty());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(GRPC_STATUS, HeaderValue::from(self.code.get()));
        if let Ok(message) = HeaderValue::try_from(percent_encode(&e.to_string())) {
            headers.insert(GRPC_MESSAGE, message);
        }
        if let Some(ms) = self.pushback {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        }
        if let Some(reason) = self.reason {
            let reason = HeaderValue::from_static(reason.as_str());
            headers.insert(X_ALLOWANCE_ABANDONED, reason);
        }
        // For `Outcome::of`: abandoned with its reason, or (a store failure) not a success.
        let extensions = response.extensions_mut();
        extensions.insert(Classified::new(self.code.classification(), None));
        if let Some(reason) = self.reason {
            extensions.insert(Abandoned::new(reason));
        }
        response
    }
}

/// `grpc-message`: percent-encoded outside printable ASCII, and `%` itself (gRPC over HTTP/2).
pub(super) fn percent_encode(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
