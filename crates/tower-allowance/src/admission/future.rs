use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tower::Service;

use crate::{
    acquire::{self, Begin, OwnedAdmit, Progress},
    error::{AbandonReason, Abandoned},
    extensions::{AcquireOptions, Attempt, Cost},
    shared::Shared,
    BoxError, Deadline,
};

pin_project! {
    /// Response future of [`Admission`](super::Admission).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        // Not polled yet: nothing asked of the allowance or the inner service.
        Start {
            start: Option<Start<S, B>>,
        },
        Waiting {
            // Boxed, with the request and the service it waits to call: only a waiting
            // request pays for the timers, the store future and the request's room, and
            // the future stays the size of the inner one on the fast path.
            waiting: Pin<Box<Waiting<S, B>>>,
        },
        Called {
            #[pin]
            future: S::Future,
            // The attempt's record, for the response (when it has one to carry).
            record: Option<Attempt>,
            // The slot it was sent at, when paced: told of the answer (`Holders::answered`).
            at: Option<Box<(Arc<Shared>, Instant)>>,
        },
        Done,
    }
}

/// What a future not yet polled keeps: the allowance, the inner service (a clone, readied
/// only once admitted) and the request.
struct Start<S, B> {
    shared: Arc<Shared>,
    service: S,
    request: Request<B>,
}

pin_project! {
    /// What a waiting request keeps, in one allocation: its admission (`None` once admitted),
    /// then a clone of the inner service, readied only once admitted, by the deadline.
    struct Waiting<S, B> {
        #[pin]
        acquire: Option<OwnedAdmit>,
        #[pin]
        deadline: Option<Sleep>,
        service: S,
        request: Option<Request<B>>,
        shared: Arc<Shared>,
        since: Instant,
    }
}

/// The admission a request asks for, from its extensions: a retry (its record says so)
/// spends a unit of the retry budget and is admitted no earlier than its record's floor,
/// strictly before its deadline.
fn options_for<B>(req: &Request<B>, now: Instant) -> AcquireOptions {
    let ext = req.extensions();
    let record = Attempt::of(ext);
    let retry = record.is_some_and(|a| a.is_retry());
    let request = record.and_then(|a| a.request);
    let deadline = ext.get::<Deadline>().map(|Deadline(d)| match retry {
        // A retry's slot must come strictly before the deadline.
        true => d.checked_sub(Duration::from_micros(1)).unwrap_or(*d),
        false => *d,
    });
    AcquireOptions {
        deadline,
        request,
        retry,
        cost: ext.get::<Cost>().map(|Cost(c)| *c),
        not_before: record
            .and_then(|a| a.not_before)
            .map(|at| at.saturating_duration_since(now)),
        #[cfg(feature = "shares")]
        class: crate::config::classes::Class::key_of(ext),
    }
}

/// The record the response will carry: the request's, or (for an adaptive rate, which
/// cuts once per round of sends) a new one, with when the attempt was sent, how long it
/// waited and how much of that a cooldown held it (`progress`: its admission's, when it
/// waited for one).
fn record_for<B>(
    shared: &Shared,
    req: &Request<B>,
    sent: Instant,
    waited: Duration,
    progress: Option<&Progress>,
) -> Option<Attempt> {
    let record = Attempt::of(req.extensions());
    let adaptive = shared.config().rule_params().adaptive().is_some();
    (record.is_some() || adaptive || !waited.is_zero()).then(|| {
        let (record, cooled) = (record.unwrap_or_default(), progress.map(|p| p.cooled));
        Attempt {
            sent: Some(sent),
            queued: record.queued.saturating_add(waited),
            cooled: record.cooled.saturating_add(cooled.unwrap_or_default()),
            cooldowns: record.cooldowns + u32::from(cooled.is_some_and(|c| !c.is_zero())),
            request: record.request.or(progress.and_then(|p| p.request)),
            ..record
        }
    })
}

impl<S: Service<Request<B>>, B> ResponseFuture<S, B> {
    pub(crate) fn new(shared: Arc<Shared>, service: S, request: Request<B>) -> Self {
        let start = Start {
            shared,
            service,
            request,
        };
        Self {
            state: State::Start { start: Some(start) },
        }
    }
}

impl<S, B> Start<S, B>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    /// The first poll: asks for admission and, admitted now, readies the inner service and
    /// calls it; otherwise the state the future then waits in.
    fn begin(self, cx: &mut Context<'_>) -> Result<State<S, B>, BoxError> {
        let Self {
            shared,
            mut service,
            request,
        } = self;
        let now = Instant::now();
        let options = options_for(&request, now);
        let mut progress = Progress::default();
        let step = acquire::begin(&shared, &options, &mut progress, now);
        #[cfg(feature = "shares")]
        crate::acquire::classes::end_if_ready(&shared, &mut progress, &step);
        let admit = match step {
            // Admitted now: sent now if the inner service is ready now.
            Begin::Ready(Ok(())) => match service.poll_ready(cx) {
                Poll::Ready(ready) => {
                    ready.map_err(Into::into)?;
                    let record = record_for(&shared, &request, now, Duration::ZERO, None);
                    let future = service.call(request);
                    let at = progress.slot.map(|at| Box::new((shared.clone(), at)));
                    return Ok(State::Called { future, record, at });
                }
                // The future waits for that readiness (the waker is registered), by the
                // deadline.
                Poll::Pending => None,
            },
            Begin::Ready(Err(e)) => return Err(e.into_box()),
            step => Some(OwnedAdmit::resume(shared.clone(), options, progress, step)),
        };
        let waiting = Waiting {
            acquire: admit,
            deadline: options.deadline.map(sleep_until),
            service,
            request: Some(request),
            shared,
            since: now,
        };
        Ok(State::Waiting {
            waiting: Box::pin(waiting),
        })
    }
}

impl<S, B> Waiting<S, B>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    /// Waits for the admission, then for the inner service's readiness by the deadline;
    /// calls it.
    fn poll_call(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<State<S, B>, BoxError>> {
        let mut this = self.project();
        let (mut at, mut progress) = (None, None);
        if let Some(mut acquire) = this.acquire.as_mut().as_pin_mut() {
            let admitted = ready!(acquire.as_mut().poll(cx));
            at = (acquire.progress.slot).map(|at| Box::new((this.shared.clone(), at)));
            progress = Some(acquire.progress);
            this.acquire.set(None);
            admitted.map_err(|e| e.into_box())?;
        }
        // Admitted: only now is the inner service readied, by the deadline.
        match this.service.poll_ready(cx) {
            Poll::Ready(ready) => ready.map_err(Into::into)?,
            Poll::Pending => {
                let Some(deadline) = this.deadline.as_pin_mut() else {
                    return Poll::Pending;
                };
                ready!(deadline.poll(cx));
                return Poll::Ready(Err(Abandoned::new(AbandonReason::Deadline).into()));
            }
        }
        let Some(request) = this.request.take() else {
            return Poll::Pending;
        };
        let now = Instant::now();
        let waited = now.saturating_duration_since(*this.since);
        let record = record_for(this.shared, &request, now, waited, progress.as_ref());
        let future = this.service.call(request);
        Poll::Ready(Ok(State::Called { future, record, at }))
    }
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Start { .. } => "not polled",
            State::Waiting { .. } => "waiting for admission",
            State::Called { .. } => "sent",
            State::Done => "done",
        };
        let mut f = f.debug_struct("ResponseFuture");
        f.field("state", &state).finish()
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Start { start } => match start.take() {
                    Some(start) => start.begin(cx),
                    None => panic!("admission future polled after completion"),
                },
                StateProj::Waiting { waiting } => ready!(waiting.as_mut().poll_call(cx)),
                StateProj::Called { future, record, at } => {
                    let result = ready!(future.poll(cx));
                    if let Some((shared, slot)) = at.as_deref() {
                        shared.holders().answered(*slot, Instant::now());
                    }
                    let record = *record;
                    this.state.set(State::Done);
                    let mut response = result.map_err(Into::into)?;
                    if let Some(record) = record {
                        response.extensions_mut().insert(record);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("admission future polled after completion"),
            };
            match next {
                Ok(next) => this.state.set(next),
                Err(e) => {
                    this.state.set(State::Done);
                    return Poll::Ready(Err(e));
                }
            }
        }
    }
}
