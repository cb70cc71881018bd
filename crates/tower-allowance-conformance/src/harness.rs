//! What every check stands on: an allowance over the store under test, the same store asked
//! directly, and the services the layers are put around.
//!
//! The allowance's public API says what a caller sees (admitted, when, or abandoned and why);
//! the checks of the rule's mechanics also want the store's raw answers (a reserved slot's
//! wait, the state, whether it is settled). [`Direct`] asks the store for them exactly as the
//! allowance does (synchronously when the store can, with the allowance's parameters), so the
//! answers are the ones the allowance would get.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::service_fn;
use tower_allowance::{
    error::AbandonReason,
    rule::{Admission, AdmitRequest, Event, Op, Reply, StoreState},
    store::{self, Params, Store, StoreError, StoreFuture, Watcher},
    AcquireOptions, Allowance, AllowanceConfig,
};

/// One millisecond: the checks' unit.
pub(crate) const MS: Duration = Duration::from_millis(1);

/// An allowance over `store`, and the store asked directly with the allowance's parameters.
pub(crate) fn allowance<S: Store>(config: AllowanceConfig, store: S) -> (Allowance, Direct) {
    let store: Arc<dyn Store> = Arc::new(store);
    let watchers = Arc::new(Mutex::new(Vec::new()));
    let direct = Direct {
        store: store.clone(),
        params: *config.params(),
        watchers: watchers.clone(),
    };
    (
        Allowance::with_store(config, Tapped { store, watchers }),
        direct,
    )
}

/// The checks of the rule's mechanics use the limits as configured (`exact`); the headroom
/// kept by default is checked on its own (`headroom_*`).
pub(crate) fn per_second(rate: u32, burst: u32) -> AllowanceConfig {
    match AllowanceConfig::per_second(rate, burst) {
        Ok(c) => c.exact(),
        Err(e) => panic!("valid config: {e}"),
    }
}

/// The store under test asked directly, as the allowance over it asks it.
#[derive(Clone)]
pub(crate) struct Direct {
    store: Arc<dyn Store>,
    params: Params,
    /// The watchers the allowance gave the store.
    watchers: Arc<Mutex<Vec<Watcher>>>,
}

// === impl Direct ===

impl Direct {
    /// Applies `op` as the allowance does: synchronously when the store can, else through
    /// its future.
    pub(crate) async fn apply(&self, op: Op) -> Result<Reply, StoreError> {
        let op = store::Op::from(op);
        let reply = match self.store.try_apply(Instant::now(), &self.params, &op) {
            Some(result) => result,
            None => self.store.apply(&self.params, op).await,
        };
        reply.map(Reply::from)
    }

    /// The rule's answer to an admission (a reserved slot is the caller's: nothing waits on
    /// it here).
    pub(crate) async fn admit(&self, req: AdmitRequest) -> Admission {
        match self.apply(Op::Admit(req)).await {
            Ok(Reply::Admit(adm)) => adm,
            other => panic!("admit answered {other:?}"),
        }
    }

    /// The shared state now.
    pub(crate) async fn state(&self) -> StoreState {
        match self.apply(Op::Read { deposits: 0 }).await {
            Ok(Reply::State(state)) => state,
            other => panic!("read answered {other:?}"),
        }
    }

    /// Whether the store says the state is settled now ([`Store::is_settled`]).
    pub(crate) fn is_settled(&self) -> bool {
        self.store.is_settled(Instant::now(), &self.params)
    }

    /// Delivers `event` to the allowance through the watcher it gave the store, as the store
    /// delivers another process's event.
    pub(crate) fn deliver(&self, event: Event) {
        let watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            !watchers.is_empty(),
            "the allowance gave the store a watcher"
        );
        for w in watchers.iter() {
            w.notify(event.into());
        }
    }
}

/// The store under test, keeping a copy of each watcher it is given (for
/// [`Direct::deliver`]); everything else is the store's.
#[derive(Debug)]
struct Tapped {
    store: Arc<dyn Store>,
    watchers: Arc<Mutex<Vec<Watcher>>>,
}

impl Store for Tapped {
    fn apply(&self, params: &Params, op: store::Op) -> StoreFuture<store::Reply> {
        self.store.apply(params, op)
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &store::Op,
    ) -> Option<Result<store::Reply, StoreError>> {
        self.store.try_apply(now, params, op)
    }

    fn is_settled(&self, now: Instant, params: &Params) -> bool {
        self.store.is_settled(now, params)
    }

    fn watch(&self, watcher: Watcher) {
        self.watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(watcher.clone());
        self.store.watch(watcher);
    }

    fn name(&self) -> Option<&str> {
        self.store.name()
    }
}

/// What raising a cooldown through the allowance did ([`Allowance::extend_cooldown`], as a
/// server's delay does), and the state right after.
pub(crate) struct Raised {
    /// Whether the cooldown moved later or the allowance closed.
    pub(crate) changed: bool,
    pub(crate) state: StoreState,
}

/// Raises the cooldown to `delay` through the allowance.
pub(crate) async fn raise(a: &Allowance, direct: &Direct, delay: Duration) -> Raised {
    let changed = a.extend_cooldown(delay).await.expect("defer");
    Raised {
        changed,
        state: direct.state().await,
    }
}

/// The instant an acquire completes, or its error's abandonment reason.
pub(crate) async fn acquire_at(
    a: &Allowance,
    options: AcquireOptions,
) -> Result<Duration, AbandonReason> {
    let start = Instant::now();
    match a.acquire_with(options).await {
        Ok(()) => Ok(start.elapsed()),
        Err(e) => Err(e.abandon_reason().unwrap_or(AbandonReason::Overloaded)),
    }
}

/// A service that answers every request with an empty 200.
pub(crate) fn ok_service() -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(|_req: Request<String>| async { Ok(Response::new(String::new())) })
}

/// A service that answers 429 with `Retry-After`, counting calls.
pub(crate) fn throttling(
    retry_after: &'static str,
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static(retry_after),
            );
            Ok(res)
        }
    })
}

/// `ServiceExt::layer`-like helper.
pub(crate) trait LayerService<S> {
    type Service;
    fn layer_service(&self, inner: S) -> Self::Service;
}

impl<L: tower::Layer<S>, S> LayerService<S> for L {
    type Service = L::Service;
    fn layer_service(&self, inner: S) -> Self::Service {
        self.layer(inner)
    }
}
