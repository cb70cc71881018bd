//! The response future of [`KeyedService`](super::KeyedService).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use super::{registry::Entry, KeyedError};
use crate::{
    admission::Admission,
    classify::StatusClassifier,
    cooldown::Cooldown,
    retry::{Prepare, RetryPolicy},
    BoxError,
};

/// The stack a key's [`AllowanceLayer`](crate::AllowanceLayer) builds over `S`.
type Stack<S> = Prepare<tower::retry::Retry<RetryPolicy, Cooldown<Admission<S>, StatusClassifier>>>;

pin_project! {
    /// Runs a request through its key's allowance stack; holds the key's allowance so that it
    /// is not evicted while the request (its admission, its retries) is in flight.
    pub struct ResponseFuture<S, B>
    where
        Stack<S>: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        Stack<S>: Service<Request<B>>,
    {
        Running {
            #[pin]
            fut: Oneshot<Stack<S>, Request<B>>,
            entry: Arc<Entry>,
        },
        Failed {
            error: Option<KeyedError>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    Stack<S>: Service<Request<B>>,
{
    pub(crate) fn running(fut: Oneshot<Stack<S>, Request<B>>, entry: Arc<Entry>) -> Self {
        Self {
            state: State::Running { fut, entry },
        }
    }

    pub(crate) fn failed(error: KeyedError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    Stack<S>: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Running { .. } => "running",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    Stack<S>: Service<Request<B>, Response = Response<RB>, Error = BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Running { fut, .. } => Poll::Ready(ready!(fut.poll(cx))),
            StateProj::Failed { error } => Poll::Ready(Err(error.take().map_or_else(
                || "keyed response future polled after completion".into(),
                Into::into,
            ))),
        }
    }
}
