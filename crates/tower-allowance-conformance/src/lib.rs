//! The conformance suite every [`Store`] of `tower-allowance` must pass.
//!
//! A store keeps one allowance's state and applies the rule to it atomically
//! ([`tower_allowance::store`]). This suite replays the same operations, and the same requests
//! through the real layers, against a store, and checks every answer and every instant
//! exactly: bursts and reserved slots, the headroom, cooldowns that never shorten and move
//! the callers waiting, closures beyond `max_cooldown`, retry budgets, several limits and
//! costs, an adaptive rate's cut, a quota probe's verdict shared through the store, and
//! [`Store::is_settled`]. [`MemoryStore`](tower_allowance::store::MemoryStore) passes it by
//! construction; `tower-allowance-redis` runs it on Redis, over TLS and on a Redis Cluster;
//! a store of your own runs it in its tests, with this crate as a dev-dependency:
//!
//! ```toml
//! [dev-dependencies]
//! tower-allowance-conformance = "0.1"
//! tokio = { version = "1", features = ["macros", "rt", "test-util"] }
//! ```
//!
//! ```
//! use std::sync::Mutex;
//! use tokio::time::Instant;
//! use tower_allowance::store::{Op, Params, Reply, State, Store, StoreError, StoreFuture};
//!
//! /// A store that keeps the state under a lock, on tokio's clock.
//! #[derive(Debug)]
//! struct Locked {
//!     state: Mutex<State>,
//!     epoch: Instant,
//! }
//!
//! impl Locked {
//!     fn new() -> Self {
//!         Self { state: Mutex::new(State::default()), epoch: Instant::now() }
//!     }
//!
//!     /// The store's clock: microseconds since its epoch.
//!     fn micros(&self, now: Instant) -> u64 {
//!         now.saturating_duration_since(self.epoch).as_micros() as u64
//!     }
//! }
//!
//! impl Store for Locked {
//!     fn apply(&self, params: &Params, op: Op) -> StoreFuture<Reply> {
//!         let reply = self.try_apply(Instant::now(), params, &op).expect("decides at once");
//!         Box::pin(std::future::ready(reply))
//!     }
//!
//!     // Decided without I/O: answered synchronously, as the suite requires.
//!     fn try_apply(&self, now: Instant, params: &Params, op: &Op) -> Option<Result<Reply, StoreError>> {
//!         let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
//!         Some(Ok(state.apply(self.micros(now), params, op)))
//!     }
//!
//!     fn is_settled(&self, now: Instant, params: &Params) -> bool {
//!         let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
//!         state.is_settled(self.micros(now), params)
//!     }
//! }
//!
//! // In the store's tests: `#[tokio::test(start_paused = true)]`.
//! #[tokio::main(flavor = "current_thread", start_paused = true)]
//! async fn main() {
//!     tower_allowance_conformance::run(|| async { Locked::new() }).await;
//! }
//! ```
//!
//! # Requirements
//!
//! - Run it on a current-thread runtime with a **paused** clock (`start_paused = true`):
//!   instants are checked to the microsecond.
//! - The store must decide on tokio's clock (a test mode of a store with a clock of its own:
//!   the Redis store's `follow_tokio_clock`), answer [`Store::try_apply`] synchronously, and
//!   `make` must return a store with fresh state each time (a new name, say).
//!
//! Each check panics with what differed.
//!
//! # Why a crate of its own
//!
//! The suite needs tokio's `test-util` (a paused clock it advances) and the rule's insides
//! (tower-allowance's `rule` feature, outside semver). As a dev-dependency it brings them
//! into a store's test builds only; the library's own features never switch them on. It
//! follows `tower-allowance`'s version: use the same one.

use std::future::Future;

use tower_allowance::store::Store;

mod bucket;
mod budget;
mod cooldown;
mod harness;
mod layers;
mod lease;
#[cfg(feature = "settle")]
mod settle;
mod shared;
mod shares;

/// Runs every check, each on a fresh store from `make`.
///
/// # Panics
///
/// When the store decides differently from the rule, or is not run as the
/// [requirements](crate#requirements) say.
pub async fn run<F, Fut, S>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
    S: Store,
{
    bucket::burst_then_reserved_slots(make().await).await;
    bucket::burst_one_reserves_on_whole_milliseconds(make().await).await;
    bucket::burst_one_callers_go_on_the_grid(make().await).await;
    bucket::max_wait_reserves_nothing(make().await).await;
    cooldown::cooldown_then_metered_restart(make().await).await;
    cooldown::cooldown_moves_waiting_callers(make().await).await;
    cooldown::cooldown_never_shortens(make().await).await;
    budget::fixed_budget_is_exact(make().await).await;
    budget::replenishing_budget_with_folded_deposits(make().await).await;
    bucket::a_left_slot_goes_back(make().await).await;
    bucket::several_limits_and_costs(make().await).await;
    cooldown::absurd_delay_closes_for_max_cooldown(make().await).await;
    layers::fifo_through_the_admission_layer(make().await).await;
    layers::over_budget_retry_ends_at_once_with_the_429(make().await).await;
    layers::deadline_abandons_at_once(make().await).await;
    shared::quota_verdict_is_shared(make().await).await;
    shared::settled_only_when_the_rule_says(make().await).await;
    bucket::headroom_delays_the_burst_s_last(make().await).await;
    bucket::headroom_at_a_short_interval_is_half_the_burst(make().await).await;
    bucket::headroom_at_burst_one_is_a_50th_of_the_interval(make().await).await;
    cooldown::a_cut_re_times_waiting_callers(make().await).await;
    shares::a_high_request_jumps_the_queue_by_one_slot(make().await).await;
    shares::a_share_moves_the_virtual_time_up_to_what_its_process_saw(make().await).await;
    shares::classes_share_by_weight(make().await).await;
    #[cfg(feature = "settle")]
    {
        settle::a_settlement_moves_waiting_callers_earlier(make().await).await;
        settle::the_layer_settles_429s_and_usage(make().await).await;
        settle::a_settlement_moves_its_class_share(make().await).await;
    }
    lease::a_lease_is_admissions_in_a_row(make().await).await;
    lease::a_lease_s_tail_goes_back(make().await).await;
    lease::a_stale_lease_call_is_refused(make().await).await;
    lease::holders_are_counted_per_window(make().await).await;
    lease::a_debit_charges_the_bucket(make().await).await;
    lease::a_rejoin_charges_the_outage_and_spaces_the_tokens(make().await).await;
    lease::a_rejoin_charges_every_limit_at_the_pace(make().await).await;
    lease::a_grant_records_its_deposits_unless_stale(make().await).await;
}
