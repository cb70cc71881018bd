//! A store's calls timed, for the `metrics` feature: a wrapper store.

use std::sync::Arc;

use tokio::time::Instant;

use super::metrics::Metrics;
use crate::store::{Op, Params, Reply, Store, StoreError, StoreFuture, Watcher};

/// `S`, with every call that goes to I/O timed into the allowance's
/// `tower_allowance_store_call_duration_seconds` (and its failures counted by kind). Calls
/// answered synchronously ([`Store::try_apply`]) are not timed: they do no I/O.
pub(crate) struct Timed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Timed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<S> Timed<S> {
    pub(crate) fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

impl<S: Store> Store for Timed<S> {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        let call = self.inner.apply(params, op);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let started = Instant::now();
            let result = call.await;
            let error = result.as_ref().err().map(StoreError::kind);
            metrics.store_call(started.elapsed(), error);
            result
        })
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        self.inner.try_apply(now, params, op)
    }

    fn is_settled(&self, now: Instant, params: &Params) -> bool {
        self.inner.is_settled(now, params)
    }

    fn watch(&self, watcher: Watcher) {
        self.inner.watch(watcher);
    }

    fn name(&self) -> Option<&str> {
        self.inner.name()
    }
}
