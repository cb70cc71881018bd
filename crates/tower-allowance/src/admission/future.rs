use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::Request;
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_service::Service;

use crate::{
    acquire::OwnedAdmit,
    error::{AbandonReason, Abandoned},
    extensions::SentAt,
    shared::Shared,
    BoxError,
};

pin_project! {
    /// Response future of [`Admission`](super::Admission).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        // Not polled yet: nothing asked of the allowance or the inner service.
        Start {
            start: Option<Start<S, Req>>,
        },
        Waiting {
            // Boxed, with the request and the service it waits to call: only a waiting
            // request pays for the timers, the store future and the request's room, and
            // the future stays the size of the inner one on the fast path.
            waiting: Pin<Box<Waiting<S, Req>>>,
        },
        Called {
            #[pin]
            future: S::Future,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

/// What a future not yet polled keeps: the allowance, the inner service (a clone, readied
/// only once admitted) and the request.
pub(crate) struct Start<S, Req> {
    shared: Arc<Shared>,
    service: S,
    request: Req,
}

pin_project! {
    /// What a waiting request keeps, in one allocation: its admission (`None` once admitted),
    /// then a clone of the inner service, readied only once admitted, by the deadline.
    pub(crate) struct Waiting<S, Req> {
        #[pin]
        acquire: Option<OwnedAdmit>,
        #[pin]
        deadline: Option<Sleep>,
        service: S,
        request: Option<Req>,
        // For an adaptive allowance: tells the cooldown layer when the request was sent.
        sent: Option<SentAt>,
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn start(shared: Arc<Shared>, service: S, request: Req) -> Self {
        Self {
            state: State::Start {
                start: Some(Start {
                    shared,
                    service,
                    request,
                }),
            },
        }
    }

    pub(crate) fn called(future: S::Future) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<S: Service<Request<B>>, B> ResponseFuture<S, Request<B>> {
    pub(crate) fn waiting(
        acquire: Option<OwnedAdmit>,
        deadline: Option<Instant>,
        service: S,
        request: Request<B>,
    ) -> Self {
        let sent = request.extensions().get::<SentAt>().cloned();
        Self {
            state: State::Waiting {
                waiting: Box::pin(Waiting {
                    acquire,
                    deadline: deadline.map(sleep_until),
                    service,
                    request: Some(request),
                    sent,
                }),
            },
        }
    }
}

impl<S: Service<Req>, Req> std::fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B> Future for ResponseFuture<S, Request<B>>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Start { start } => {
                    let Start {
                        shared,
                        service,
                        request,
                    } = start
                        .take()
                        .expect("admission future polled after completion");
                    let next = super::service::begin_call(&shared, service, request, cx);
                    this.state.set(next.state);
                }
                StateProj::Waiting { waiting } => {
                    let mut waiting = waiting.as_mut().project();
                    if let Some(acquire) = waiting.acquire.as_mut().as_pin_mut() {
                        let admitted = ready!(acquire.poll(cx));
                        waiting.acquire.set(None);
                        admitted.map_err(|e| e.into_box())?;
                    }
                    // Admitted: only now is the inner service readied, by the deadline.
                    if let Poll::Ready(ready) = waiting.service.poll_ready(cx) {
                        ready.map_err(Into::into)?;
                    } else if let Some(deadline) = waiting.deadline.as_pin_mut() {
                        ready!(deadline.poll(cx));
                        let e = Abandoned::new(AbandonReason::Deadline);
                        return Poll::Ready(Err(e.into()));
                    } else {
                        return Poll::Pending;
                    }
                    let request = waiting
                        .request
                        .take()
                        .expect("admission future polled after completion");
                    if let Some(sent) = waiting.sent.take() {
                        sent.mark(Instant::now());
                    }
                    let future = waiting.service.call(request);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => return future.poll(cx).map_err(Into::into),
                StateProj::Failed { error } => {
                    let e = error
                        .take()
                        .expect("admission future polled after completion");
                    return Poll::Ready(Err(e));
                }
            }
        }
    }
}
