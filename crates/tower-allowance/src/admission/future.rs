use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{acquire::OwnedAdmit, error::AcquireError, extensions::SentAt, BoxError};

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
        Waiting {
            // Boxed, with the request and the service it waits to call: only a waiting
            // admission pays for the timer, the store future and the request's room, and
            // the future stays the size of the inner one on the fast path.
            waiting: Pin<Box<Waiting<S, Req>>>,
        },
        Called {
            #[pin]
            future: S::Future,
        },
        Failed {
            error: Option<AcquireError>,
        },
    }
}

pin_project! {
    /// What a waiting admission keeps, in one allocation.
    pub(crate) struct Waiting<S, Req> {
        #[pin]
        acquire: OwnedAdmit,
        service: Option<S>,
        request: Option<Req>,
        // For an adaptive allowance: tells the cooldown layer when the request was sent.
        sent: Option<SentAt>,
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn called(future: S::Future) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    pub(crate) fn failed(error: AcquireError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }

    pub(crate) fn waiting(
        acquire: OwnedAdmit,
        service: S,
        request: Req,
        sent: Option<SentAt>,
    ) -> Self {
        Self {
            state: State::Waiting {
                waiting: Box::pin(Waiting {
                    acquire,
                    service: Some(service),
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

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { waiting } => {
                    let waiting = waiting.as_mut().project();
                    if let Err(e) = ready!(waiting.acquire.poll(cx)) {
                        return Poll::Ready(Err(e.into_box()));
                    }
                    // Admitted: send now, with the service that was polled ready in `poll_ready`.
                    let (Some(mut service), Some(request)) =
                        (waiting.service.take(), waiting.request.take())
                    else {
                        panic!("admission future polled after completion");
                    };
                    // `service` was polled ready before the call that created this future.
                    if let Some(sent) = waiting.sent.take() {
                        sent.mark(tokio::time::Instant::now());
                    }
                    let future = service.call(request);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => return future.poll(cx).map_err(Into::into),
                StateProj::Failed { error } => {
                    let e = error
                        .take()
                        .expect("admission future polled after completion");
                    return Poll::Ready(Err(e.into_box()));
                }
            }
        }
    }
}
