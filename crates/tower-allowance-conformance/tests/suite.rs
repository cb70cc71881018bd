//! The suite passes the memory store, and fails stores that decide differently from the
//! rule: it can fail, and says where.

use tokio::time::Instant;
use tower_allowance::store::{
    MemoryStore, Op, Params, Reply, Store, StoreError, StoreFuture, Watcher,
};

#[tokio::test(start_paused = true)]
async fn the_memory_store_passes() {
    tower_allowance_conformance::run(|| async { MemoryStore::new() }).await;
}

/// A memory store whose clock runs 1% fast: a rate's slots come 1% early on tokio's clock.
#[derive(Debug)]
struct Fast {
    store: MemoryStore,
    epoch: Instant,
}

impl Fast {
    fn new() -> Self {
        Self {
            store: MemoryStore::new(),
            epoch: Instant::now(),
        }
    }
}

impl Store for Fast {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        let reply = self.try_apply(Instant::now(), params, &op);
        Box::pin(std::future::ready(reply.expect("decides at once")))
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        let fast = now.saturating_duration_since(self.epoch).mul_f64(1.01);
        self.store.try_apply(self.epoch + fast, params, op)
    }

    fn watch(&self, watcher: Watcher) {
        self.store.watch(watcher);
    }
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "400 admissions at 300/s, burst 1")]
async fn a_store_whose_clock_runs_fast_fails() {
    tower_allowance_conformance::run(|| async { Fast::new() }).await;
}

/// A memory store that says its state is settled whatever the rule says.
#[derive(Debug)]
struct AlwaysSettled(MemoryStore);

impl Store for AlwaysSettled {
    fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
        self.0.apply(params, op)
    }

    fn try_apply(
        &self,
        now: Instant,
        params: &Params,
        op: &Op,
    ) -> Option<Result<Reply, StoreError>> {
        self.0.try_apply(now, params, op)
    }

    fn is_settled(&self, _now: Instant, _params: &Params) -> bool {
        true
    }

    fn watch(&self, watcher: Watcher) {
        self.0.watch(watcher);
    }
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "a token short")]
async fn a_store_settled_too_soon_fails() {
    tower_allowance_conformance::run(|| async { AlwaysSettled(MemoryStore::new()) }).await;
}
