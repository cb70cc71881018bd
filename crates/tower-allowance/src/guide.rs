//! A short guide: what the allowance promises, what it does when something fails, and which
//! knobs matter. Documentation only; this module has no items.
//!
//! - [Semantics in brief](#semantics-in-brief): [admission](#admission),
//!   [reservations](#reservations), [cooldown](#cooldown), [retry](#retry),
//!   [deadlines](#deadlines), [cancellation](#cancellation)
//! - [Failure policies](#failure-policies): the [store's outage](#when-the-store-does-not-answer),
//!   [Redis](#redis-report-or-local-fallback), [a closed allowance](#a-closed-allowance)
//! - [Tuning](#tuning): [burst](#burst), [`max_waiters`](#max_waiters),
//!   [`max_cooldown`](#max_cooldown), [retry budgets](#retry-budgets),
//!   [adaptive rate](#adaptive-rate), [dialects](#dialects)
//! - [Observing it](#observing-it): snapshots, store state, metrics
//!
//! # Semantics in brief
//!
//! An [`Allowance`](crate::Allowance) is a handle on one shared state, kept by a
//! [`Store`](crate::store::Store): in this process ([`MemoryStore`](crate::store::MemoryStore),
//! the default) or in Redis (`tower-allowance-redis`), where every process using the same name
//! shares it. Every decision is one pure function of (state, the store's clock, the
//! configuration) applied atomically by the store ([`State::apply`](crate::store::State::apply)); the memory store and
//! the Redis script apply the same rule, and one conformance suite checks both.
//! [`AllowanceLayer`](crate::AllowanceLayer) stacks Retry → Cooldown → Admission around your
//! client, so every attempt, first or retried, is admitted, and every response is read.
//!
//! ## Admission
//!
//! Every attempt asks the store once. Each limit of the allowance is a token bucket (GCRA in
//! whole microseconds): `burst` attempts may go back to back, then one per `period / rate`.
//! With several limits ([`AllowanceConfig::with_limit`](crate::AllowanceConfig::with_limit):
//! per second *and* per month, requests *and* tokens), an attempt is admitted by all of them
//! or by none, in one step. A limit that [counts cost](crate::Limit::counting_cost) charges
//! the request's [`Cost`](crate::Cost) (1 without one); a cost above that limit's burst can
//! never be admitted and fails at once ([`AbandonReason::TooCostly`]).
//!
//! Admission begins in `call`, never in `poll_ready`, so a load balancer probing readiness
//! spends nothing. The layers are always ready and ready the inner service only once a
//! request is admitted: a request waiting out a cooldown holds no permit, connection or
//! buffer slot of the inner service ([readiness](crate::admission#readiness)).
//!
//! ## Reservations
//!
//! An attempt that cannot go now is not refused and does not poll: the store reserves its
//! slot, at the earliest instant every limit conforms and the cooldown is over, in the same
//! step, and answers "yours in `wait`". The caller sleeps on its own timer and sends at that
//! instant without asking again. One admission is one store call (one Redis round trip)
//! however many callers wait, and callers are served in the order they reached the store.
//!
//! Waiting callers are bounded per process by
//! [`max_waiters`](crate::AllowanceConfig::with_max_waiters) (see [Tuning](#max_waiters)).
//!
//! ## Cooldown
//!
//! A response the classifier calls *throttled* (429 and 503 by default; see
//! [`StatusClassifier`](crate::classify::StatusClassifier) and
//! [`Classify`](crate::classify::Classify)) raises the shared cooldown to the wait it asks
//! for: the longest of what the allowance's [dialect](#dialects) reads (`Retry-After`,
//! `retry-after-ms`, a provider's reset headers) and what the classifier reads. The
//! cooldown only moves later, never earlier: a shorter wait arriving afterwards changes
//! nothing. Pending reservations move by the part of the cooldown that was added, keeping
//! their order and spacing, so the restart after a cooldown is metered, never the whole
//! queue at once; with a shared store, the store publishes the move and every process's
//! waiting callers follow it without asking.
//!
//! - A throttling response that states no usable wait raises no cooldown (none is invented:
//!   it may be a spent quota, see `quota` (feature `quota`)); it is retried after a backoff.
//! - A *transient* response (none by default; `transient = [502, 504]`) is retried with
//!   backoff, or after its own `Retry-After` for that request only, and cools nobody down.
//! - A success that says the allowance is spent until a reset (the dialect reads
//!   `remaining: 0` and a reset time) raises the cooldown until that reset.
//! - A wait longer than [`max_cooldown`](#max_cooldown) closes the allowance instead, for
//!   `max_cooldown` (see [a closed allowance](#a-closed-allowance)).
//!
//! ## Retry
//!
//! The [`RetryPolicy`](crate::retry::RetryPolicy) retries throttled and transient responses
//! (and transport errors, if [configured](crate::retry::RetryConfig::with_transport_errors)),
//! up to [`max_attempts`](crate::retry::RetryConfig::with_max_attempts) per request, only for
//! replayable requests (idempotent methods, or an `Idempotency-Key` header), and only while
//! the allowance's shared [retry budget](#retry-budgets) lasts. When a throttling response
//! states a wait, the retry's slot is reserved as soon as the response arrives, no earlier
//! than that wait, and one unit of the budget is spent in the same store call; without a
//! stated wait, the retry first sleeps a full-jitter backoff
//! ([`with_backoff`](crate::retry::RetryConfig::with_backoff)), then asks. The server's wait
//! is never shortened by a local cap.
//!
//! Giving up is never reported as success: a response that asked for a retry that will not
//! happen is returned marked [`Abandoned`](crate::error::Abandoned) with its reason
//! ([`AbandonReason`]: `MaxAttempts`, `BudgetExhausted`, `Deadline`, `NotReplayable`...), and
//! [`Outcome::of`](crate::Outcome::of) tells completed, unsuccessful, abandoned and failed
//! apart in one call.
//!
//! ## Deadlines
//!
//! A request may carry a [`Deadline`](crate::Deadline). When its slot would come after the
//! deadline, it fails at once with [`AbandonReason::Deadline`] and nothing is reserved; when a
//! cooldown arriving later pushes a waiting request past it, it fails then, not at the
//! deadline; and the retry policy stops rather than wait past it (or retry exactly at it).
//!
//! ```
//! use std::{convert::Infallible, time::Duration};
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_allowance::{error::AbandonReason};
//! use tower_allowance::{Allowance, AllowanceConfig, AllowanceLayer, Deadline, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! let allowance = Allowance::new(AllowanceConfig::per_second(1, 1)?);
//! let client = ServiceBuilder::new()
//!     .layer(allowance.layer())
//!     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new("ok")) });
//!
//! client.clone().oneshot(Request::new(String::new())).await?; // the burst of 1
//! // The next slot is a second away: a caller with 100 ms to spare is told at once.
//! let mut request = Request::new(String::new());
//! request.extensions_mut().insert(Deadline::after(Duration::from_millis(100)));
//! let result = client.oneshot(request).await;
//! assert_eq!(Outcome::of(&result), Outcome::Abandoned(AbandonReason::Deadline));
//! assert_eq!(allowance.snapshot().admitted, 1); // nothing was reserved for it
//! # Ok(())
//! # }
//! ```
//!
//! An abandonment says when to come back ([`Abandoned::retry_after`]: the end of the
//! cooldown that held it, the slot the store offered, the server's wait), from the store's
//! answer rather than this process's view, which learns of a cooldown only when the call
//! that raised it returns. With the `axum` feature, `inbound::Unavailable` turns it into a
//! `503` with that `Retry-After`, from a handler or through `HandleErrorLayer`.
//!
//! [`Abandoned::retry_after`]: crate::error::Abandoned::retry_after
//!
//! ## Cancellation
//!
//! Dropping a request that waits for its slot (a timeout, a client that hung up) gives the
//! slot back to the store when it is still the last one scheduled, and refunds the retry
//! budget a waiting retry had spent; when later callers were scheduled behind it, the slot
//! is lost rather than reshuffle theirs (at most one slot per dropped caller, erring on the
//! side of sending less). A request dropped after it was sent keeps its token spent: the
//! provider may have counted it.
//!
//! # Failure policies
//!
//! ## When the store does not answer
//!
//! No policy sends a request the store did not admit. What an admission does while the store
//! is unreachable is the allowance's [`OutagePolicy`](crate::OutagePolicy):
//!
//! - [`Wait { max }`](crate::OutagePolicy::Wait) (the default, `max` one minute): the caller
//!   waits, probing the store again after 50 ms, doubling up to 1 s, until it answers, the
//!   request's deadline would pass, or `max` has passed; then it fails with
//!   [`StoreUnavailable`](crate::error::StoreUnavailable). Work is delayed, not lost.
//!   Callers waiting for the store count as waiting callers ([`max_waiters`](#max_waiters)).
//! - [`FailFast`](crate::OutagePolicy::FailFast): fails at once with `StoreUnavailable`.
//!
//! Only an outage is waited for ([`StoreErrorKind::Unavailable`](crate::store::StoreErrorKind::Unavailable));
//! a store that refuses (`Rejected`: a wrong password, a missing permission) or answers
//! nonsense (`Protocol`) fails the call at once under either policy. A cooldown that cannot be
//! recorded is logged, and the response is still delivered.
//!
//! ```
//! use std::time::Duration;
//! use tower_allowance::{AllowanceConfig, OutagePolicy};
//!
//! // A batch job that would rather stop than wait for Redis:
//! let batch = AllowanceConfig::per_second(10, 10)?.with_outage_policy(OutagePolicy::FailFast);
//! // A service that rides out a Redis failover:
//! let service = AllowanceConfig::per_second(10, 10)?
//!     .with_outage_policy(OutagePolicy::Wait { max: Duration::from_secs(15) });
//! # let _ = (batch, service);
//! # Ok::<(), tower_allowance::ConfigError>(())
//! ```
//!
//! ## Redis: report, or local fallback
//!
//! The Redis store (`tower-allowance-redis`) has its own `FailurePolicy`, which decides what
//! an outage *is* to the allowance:
//!
//! - `Report` (the default): a call Redis does not answer in time is reported as unavailable,
//!   and the allowance's outage policy above applies. Every promise is kept (the shared
//!   rate, cooldown and exact budget), at the price of waiting or failing.
//! - `LocalFallback { expected_processes }`: while Redis fails, this process decides with an
//!   in-memory allowance at the configured rate divided by `expected_processes` (burst too, at
//!   least 1), a replenishing budget's floor divided likewise, and no retries from a fixed
//!   budget. Requests keep flowing, and the total cannot exceed the shared rate as long as no
//!   more than `expected_processes` processes share it; what is lost is what only Redis
//!   knows, such as cooldowns other processes raised during the outage. A refusal (a wrong
//!   password) is never treated as an outage.
//!
//! ## A closed allowance
//!
//! Some waits are not worth waiting for. A server asking for more than
//! [`max_cooldown`](#max_cooldown), or for a wait too long to represent, and a
//! quota probe (`quota`, feature `quota`) finding the provider's quota spent, *close* the allowance:
//! every waiting and new call fails at once with [`Exhausted`](crate::error::Exhausted),
//! which says until when. Every caller the closure refuses (a first try, a retry, a waiter)
//! is abandoned with the closure's reason, `CooldownTooLong` or `QuotaExhausted`, whatever
//! its own deadline or `max_attempts`.
//!
//! Closures are bounded: a server's wait beyond `max_cooldown`, or too long to represent
//! (one bad header: an epoch in milliseconds, twenty digits), closes the allowance for
//! exactly `max_cooldown` from that response, with a warning naming the allowance, the value
//! and the reopening time, and `tower_allowance_closures_total` counted. It then reopens by
//! itself, metered as ever (the burst, then the rate), and closes again if the server says
//! so again. Only a quota probe's verdict without a known reset closes it until an operator
//! calls [`Allowance::clear`](crate::Allowance::clear) (which reopens any closure early). A
//! closed allowance is visible in [`Snapshot::closed`](crate::Snapshot::closed), so it is
//! never a silent hang.
//!
//! # Tuning
//!
//! ## Burst
//!
//! `burst` is how many attempts may go back to back after a quiet spell, and how far the
//! allowance may run ahead of its rate. Set the rate and the burst the provider documents:
//! the allowance paces *sends*, and the network (or a busy client) can bunch deliveries
//! together, so by default a limit counting requests with a burst above 1 lets the burst's
//! last request wait 10 ms (burst 4 at 20/s: 3 at once, the 4th 10 ms later, then the rate),
//! which absorbs an arrival up to 10 ms early at a strict token bucket (where the interval is
//! shorter, one interval: the steady rate stays the configured one at every rate); at burst 1
//! two sends are a 50th of the interval further apart, and each reserved slot is paced from
//! when the one before actually left or was answered (2% of the throughput; 10 ms between
//! sends over a store other processes share, which cannot see their sends). Against a strict bucket at burst 4 and 20/s,
//! 32 workers, on a loaded 2-core machine: a 429 in 3 of 10 runs exact, in 0 or 1 of 10
//! with 10 ms of headroom (`BENCHMARKS.md` §12). [`Limit::exact`](crate::Limit::exact)
//! and [`AllowanceConfig::exact`](crate::AllowanceConfig::exact) turn it off, for a provider
//! that tolerates some jitter or a limit already set below the provider's. A burst of 1
//! spaces every attempt evenly.
//!
//! ## `max_waiters`
//!
//! The most callers that may wait at once in one process (default
//! 1024). Past it, a call that would
//! have to wait fails at once with [`Overloaded`](crate::error::Overloaded) (one admitted
//! without waiting still goes): a backlog that can never drain in time is shed at the door
//! instead of growing memory and latency. Size it as the rate times the longest wait you
//! accept; zero means "never wait".
//!
//! ## `max_cooldown`
//!
//! The longest cooldown a server may impose before the allowance closes (default one
//! hour). Beyond it the allowance closes visibly instead of parking every worker, **until
//! the server's time**: a delay the server states validly (up to a year) is never
//! shortened, and callers are refused at once naming the reopening time. Only a delay that
//! cannot be trusted (unrepresentable, or beyond a year) closes it for `max_cooldown`.
//! Lower it for interactive traffic (callers are then refused sooner rather than queued).
//!
//! ## Retry budgets
//!
//! Per-request `max_attempts` bounds one request; the
//! [`RetryBudgetConfig`](crate::RetryBudgetConfig) bounds the whole group, so that a
//! throttled provider is not answered with a retry storm. Every retry, whichever process
//! makes it, spends from one budget atomically with its admission; first attempts never
//! spend. The admission layer spends it, for each retry the policy marks: with
//! `tower::retry::RetryLayer` and the policy alone (no admission layer under it), nothing
//! spends it and attempts are bounded by `max_attempts` only (the [`retry`](crate::retry)
//! module's docs, "Budget and stack order").
//!
//! - `Unlimited` (the default): only `max_attempts` limits retries.
//! - [`Fixed`](crate::RetryBudgetConfig::fixed): so many retries for the whole run (a batch).
//! - [`Replenishing`](crate::ReplenishingBudget): over a sliding window, a floor of retries
//!   per second plus a ratio of successes (0.2: one retry per five successes), for
//!   long-running services.
//!
//! ## Adaptive rate
//!
//! When nobody states the limit, or it changes,
//! `AllowanceConfig::with_adaptive_rate` (feature `adaptive`) lets the main limit
//! find it: doubling every second from `initial` until the first throttling response, then
//! cut to 85% (70% when throttling persists within 2.5 s) and grown by 1% per second, always
//! within `floor..=ceiling` and never above a rate the server advertises (see
//! `AdaptiveRate`, feature `adaptive`). The rate lives in the store: every process follows
//! one. Expect a few throttling responses while it searches; prefer a fixed rate when the
//! provider documents one.
//!
//! ## Dialects
//!
//! A `signals::Dialect` (feature `dialects`) says which rate-limit headers responses are read
//! with: `standard` (the default: `Retry-After`, `retry-after-ms`, the IETF fields and
//! `X-RateLimit-*`), `github`, `openai`, `anthropic`, `ietf`, `odds`. Choosing the provider's
//! own makes its reset headers count: a 429 without `Retry-After` still gets a cooldown from
//! the reset time, and a success that spends the last request of a window cools the
//! allowance down until the reset instead of drawing a 429. Absolute reset times are measured
//! against the response's `Date` when it is within
//! [`max_date_skew`](crate::AllowanceConfig::with_max_date_skew) of the local clock.
//!
//! The classifier and the retry rules are the allowance's, set once with
//! [`AllowanceConfig::with_classifier`](crate::AllowanceConfig::with_classifier) and
//! [`with_retry`](crate::AllowanceConfig::with_retry) and inherited by every layer built on it
//! (a layer's `with_classifier` or `with_retry` overrides them for that layer alone), so the
//! shared cooldown reacts to a response the same way whichever client received it.
//!
//! All of this can be written in a configuration file with the `serde` feature: see
//! [`AllowanceConfig`](crate::AllowanceConfig),
//! [`RetryConfig`](crate::retry::RetryConfig#configuration-files) and
//! [`StatusClassifier`](crate::classify::StatusClassifier#configuration-files); an
//! `AllowanceSpec` (feature `serde`) adds the store and builds the allowance in one call.
//!
//! # Observing it
//!
//! - [`Allowance::snapshot`](crate::Allowance::snapshot): this process's counters (admitted,
//!   waited, retries, abandonments by reason) and what it last learned of the shared state
//!   (cooldown left, closed), without asking the store. `Serialize` with the `serde` feature.
//! - [`Allowance::refresh`](crate::Allowance::refresh): the same snapshot with the shared
//!   state asked of the store (cooldown left, closed, retries remaining, the adaptive rate).
//! - The `metrics` feature records, through the [`metrics`](https://docs.rs/metrics) facade,
//!   the metrics below, each labelled `allowance` with the allowance's
//!   [name](crate::AllowanceBuilder::name); any exporter (Prometheus, StatsD...) can
//!   publish them. The handles are registered when the allowance is built, so install the
//!   recorder first. The counters and histograms are recorded as things happen; the gauges
//!   of the shared state are set by each [`refresh`](crate::Allowance::refresh) call
//!   (the cooldown's also by each raise), so call it before a scrape or on a timer.
//!
//! | metric | kind | more labels | what |
//! | --- | --- | --- | --- |
//! | `tower_allowance_admissions_total` | counter | `waited` (`true`/`false`) | attempts admitted, first tries and retries |
//! | `tower_allowance_retries_total` | counter | | retries admitted |
//! | `tower_allowance_abandoned_total` | counter | `reason` ([`AbandonReason::as_str`]) | requests given up on |
//! | `tower_allowance_cooldowns_total` | counter | | times a response extended the shared cooldown |
//! | `tower_allowance_closures_total` | counter | `reason` (`cooldown_too_long`, `quota_exhausted`) | times this process closed the allowance (a wait beyond `max_cooldown`, a quota probe) |
//! | `tower_allowance_throttled_responses_total` | counter | `status` | throttling responses |
//! | `tower_allowance_store_errors_total` | counter | `kind` (`unavailable`, `rejected`, `protocol`) | store calls that failed |
//! | `tower_allowance_wait_seconds` | histogram | | time an admitted attempt waited for its slot |
//! | `tower_allowance_store_call_duration_seconds` | histogram | | store calls answered asynchronously (a Redis round trip) |
//! | `tower_allowance_cooldown_remaining_seconds` | gauge | | cooldown left, at the last raise or `refresh` |
//! | `tower_allowance_retry_budget_remaining` | gauge | | retries left in a limited budget, at the last `refresh` |
//! | `tower_allowance_waiting` | gauge | | callers waiting in this process, at the last `refresh` |
//! | `tower_allowance_rate_per_second` | gauge | | the adaptive rate, at the last `refresh` |
//!
//! [`AbandonReason`]: crate::error::AbandonReason
//! [`AbandonReason::TooCostly`]: crate::error::AbandonReason::TooCostly
//! [`AbandonReason::Deadline`]: crate::error::AbandonReason::Deadline
//! [`AbandonReason::as_str`]: crate::error::AbandonReason::as_str
//!
//! # Reserve, then settle (tokens known after the answer)
//!
//! An LLM provider limits tokens per minute, reserves at admission what a request may use
//! (OpenAI: the prompt plus `max_tokens`) and learns its real cost only from the answer. With
//! the feature `settle`, the allowance does the same: the request's [`Cost`](crate::Cost) is
//! the reservation, charged at admission; a `cost::settle::SettleLayer` under the allowance's
//! layer reads what the answer used (a `cost::settle::UsageReader`: `OpenAiUsage`, `AnthropicUsage`, or
//! your own; the body is read as it streams to the caller, never taken from it) and settles
//! the reservation in one store call: the unused part comes back (no earlier than now, never
//! fuller than the bucket's bound once everything outstanding is counted), an under-estimate is
//! debited, a 429 gives the whole reservation back, a failure or a cancellation keeps it
//! charged. Callers waiting on reserved slots move earlier when tokens come back, in every
//! process.
//!
//! Whether unused reservations come back is the provider's rule. `Settlement::learned()` (set
//! with `AllowanceConfig::with_settlement`) learns it from the `x-ratelimit-remaining-tokens`
//! the answers carry (all, none, or a share), keeps it in the store's state for every process,
//! and never lets the allowance believe it has more than the provider says, less what the
//! provider may not have seen yet. Configure the limit counted in cost exactly as the provider
//! states it (`Limit::exact`). For OpenAI: requests and tokens per minute, `Cost` = prompt
//! estimate + `max_tokens`, `OpenAiUsage`, `Settlement::learned()` (streams: ask for
//! `include_usage`). For Anthropic: a limit on the tokens its `anthropic-ratelimit-tokens-*`
//! headers report, `AnthropicUsage`, `Settlement::learned()` or `Settlement::all()` (Anthropic
//! documents adjusting its output-token estimate to the tokens used). The repository's
//! `docs/settle.md` has the details and `allowance-sim tokens` the measurements.
//! # Operations
//!
//! - **Rolling deploys** (Redis): the newest configuration on an allowance's name decides
//!   for every process on it, from each process's next decision; nobody is refused
//!   (`tower-allowance-redis`'s `RedisStoreOptions::pin_config` refuses instead).
//! - **Why an answer waited**: a response carries the attempt record
//!   ([`Attempt`](crate::Attempt)) when its request queued, was retried, or the rate is
//!   adaptive: [`Attempt::queued`](crate::Attempt::queued) is the time queued over all
//!   attempts, [`Attempt::number`](crate::Attempt::number) the attempts; under gRPC, the
//!   `x-allowance-waited` metadata (milliseconds).
//! - More in `docs/operations.md`.
//! # One key, several kinds of traffic
//!
//! An odds backend refreshes live events (urgent: a price that is seconds old is wrong) and
//! pre-match markets (bulk: thousands of them, minutes of slack) on one provider key. One
//! FIFO allowance lets a backlog of pre-match refreshes hold a live one for minutes; two
//! allowances on one key keep exceeding it. With the `shares` feature, **classes** share the
//! one allowance instead:
//!
//! ```ignore
//! // Feature `shares`.
//! use tower_allowance::{shares::{Class, Share}, Allowance, AllowanceConfig};
//!
//! let config = AllowanceConfig::per_second(20, 4)?
//!     .with_class("live", Share::weight(1)?.high())?
//!     .with_class("prematch", Share::weight(3)?)?;
//! let allowance = Allowance::new(config);
//! // The pre-match refresher's stack: its requests are "prematch".
//! let prematch = allowance.layer().class("prematch");
//! // A live refresh says so on the request.
//! let mut req = http::Request::new(());
//! req.extensions_mut().insert(Class::new("live"));
//! ```
//!
//! The rule ([`docs/shares.md`](https://github.com/tower-allowance/tower-allowance/blob/main/docs/shares.md)):
//!
//! - **Weights.** While several classes wait, admissions go to them in proportion to their
//!   weights: each class keeps a virtual finish time next to the bucket (in Redis, in the same
//!   key and script call), and the next caller to ask is of the class whose next admission
//!   finishes first. A request's cost counts in its class's share. Inside a class: first come,
//!   first served. A class with nothing waiting lends its share at once, and gets it back
//!   from its next request on (no credit for the idle time).
//! - **Priority.** A request of a `high` class takes the slot after the one being served; the
//!   reservations already made move two slots later (one for it, one to keep the bucket's
//!   bound). It waits about one interval whatever the backlog (measured: at most 57 ms at
//!   20/s, across 4 processes on Redis).
//! - **Bounds.** The share decides who gets the next slot, never how many slots there are:
//!   nothing goes beyond the bucket. A high class jumps the queue only while it is less than
//!   8 of its own admissions ahead of its weighted share; beyond that it queues by weight, so
//!   the others are never starved.
//! - **Cost.** Each process lets one of its callers at a time ask the store (the others wait
//!   in their class's queue), so the share is decided when the slot is near, still with one
//!   store call per admission; a jump costs the bucket one slot. Each process shares its own
//!   turns by weight, so across processes the shares hold to a few admissions per window
//!   (measured, 3:2:1 per 10 s window at 20/s: within 3.5–5% of each class's share in one
//!   process, 5.4–8% across 4 processes on Redis, on a loaded 2-core machine).
//!
//! The snapshot lists each class (`Snapshot::classes`), the `metrics` feature adds
//! `tower_allowance_class_admitted_total`, `tower_allowance_class_wait_seconds` and
//! `tower_allowance_class_waiting` (labels `allowance` and `class`), and the debug logs name
//! the class.
//! # Leases (feature `lease`)
//!
//! Many processes at a high rate on one Redis allowance: wrap the store in a
//! `lease::LeaseStore` with `Lease::auto()`. A process then takes several tokens of the
//! shared bucket in one store call (taken up front, so the bucket's bound holds) and admits
//! from them locally, in arrival order; about one call per half second per process instead of
//! one per admission. Cooldowns, closures and lost states reach the tokens at once; retries,
//! costs above one and adaptive rates still go to the store. `Lease::local_fallback(true)`
//! keeps admitting at the process's share of the rate while Redis does not answer.
//! In a file: `lease = "auto"`. See `docs/leases.md`.
