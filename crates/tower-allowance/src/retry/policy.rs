use std::{sync::Arc, time::Duration};

use http::{Request, Response};
use tokio::time::{sleep_until, Instant, Sleep};
use tower::retry::Policy;

use super::RetryConfig;
use crate::{
    classify::{Classification, Classify, StatusClassifier},
    error::{
        AbandonReason, Abandoned, Overloaded, QuotaExhausted, StoreUnavailable,
        UnrepresentableDelay,
    },
    extensions::Attempt,
    headers, Allowance, BoxError, Deadline,
};

/// A [`tower::retry::Policy`] whose extra attempts draw on the allowance's shared budget.
///
/// See the [module docs](super) for the rules. Use it with `tower::retry::RetryLayer`, or
/// through [`AllowanceLayer`](crate::AllowanceLayer).
///
/// # Clone
///
/// Tower clones the policy for every request, to count that request's attempts. The
/// allowance (and so the budget) and the config are shared through one `Arc`, never
/// copied: a clone is one reference-count increment, and it does not touch the
/// allowance's own count, which every other layer's per-request clone increments.
#[derive(Clone, Debug)]
pub struct RetryPolicy<C = StatusClassifier> {
    shared: Arc<PolicyShared>,
    classifier: C,
    /// Attempts made by this request so far.
    attempts: u32,
    rng: Option<fastrand::Rng>,
}

/// What every clone of one policy shares, behind one `Arc`.
#[derive(Debug)]
pub(crate) struct PolicyShared {
    pub(crate) allowance: Allowance,
    pub(crate) config: RetryConfig,
}

impl PolicyShared {
    pub(crate) fn new(allowance: Allowance, config: RetryConfig) -> Arc<Self> {
        Arc::new(Self { allowance, config })
    }
}

/// What the policy decided for one response.
enum Decision {
    Retry(Instant),
    Stop,
    Abandon(AbandonReason),
}

// === impl RetryPolicy ===

impl RetryPolicy {
    /// A policy spending `allowance`'s retry budget, with the default classifier.
    pub fn new(allowance: Allowance, config: RetryConfig) -> Self {
        Self::with_classifier(allowance, config, StatusClassifier::default())
    }
}

impl<C: Classify> RetryPolicy<C> {
    /// A policy with a custom classifier.
    pub fn with_classifier(allowance: Allowance, config: RetryConfig, classifier: C) -> Self {
        Self::from_shared(PolicyShared::new(allowance, config), classifier)
    }

    pub(crate) fn from_shared(shared: Arc<PolicyShared>, classifier: C) -> Self {
        Self {
            shared,
            classifier,
            attempts: 0,
            rng: None,
        }
    }

    fn allowance(&self) -> &Allowance {
        &self.shared.allowance
    }

    fn config(&self) -> &RetryConfig {
        &self.shared.config
    }

    fn replayable<B>(&self, req: &Request<B>) -> bool {
        self.config().replayable_methods.contains(req.method())
            || (self.config().idempotency_key && req.headers().contains_key(&IDEMPOTENCY_KEY))
    }

    fn jitter(&mut self, cap: Duration) -> Duration {
        let allowance = &self.shared.allowance;
        let seed = self.shared.config.jitter_seed;
        let rng = self.rng.get_or_insert_with(|| {
            // One stream per request: concurrent retries must not share a jitter sequence.
            let stream = allowance.next_jitter_seed();
            let base = seed.unwrap_or_else(|| fastrand::u64(..));
            fastrand::Rng::with_seed(base ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        });
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.u64(0..=nanos))
    }

    /// Decides whether to retry after attempt `self.attempts`, which asked for `server_delay`.
    fn decide<B>(&mut self, req: &Request<B>, server_delay: Option<Duration>) -> Decision {
        if !self.replayable(req) {
            return Decision::Abandon(AbandonReason::NotReplayable);
        }
        if self.attempts >= self.config().max_attempts.get() {
            return Decision::Abandon(AbandonReason::MaxAttempts);
        }
        // The server's delay is honoured as is; only our own backoff is capped.
        let delay = match server_delay {
            Some(d) => d,
            None => {
                let cap = self.config().backoff_cap(self.attempts);
                self.jitter(cap)
            }
        };
        let now = Instant::now();
        let Some(at) = now.checked_add(delay) else {
            return Decision::Abandon(AbandonReason::UnrepresentableDelay);
        };
        if let Some(Deadline(deadline)) = req.extensions().get::<Deadline>() {
            // Don't sleep only to fail, and don't retry exactly at the deadline.
            if at >= *deadline {
                return Decision::Abandon(AbandonReason::Deadline);
            }
        }
        if !self.allowance().retry_budget_left() {
            return Decision::Abandon(AbandonReason::BudgetExhausted);
        }
        Decision::Retry(at)
    }

    fn schedule<B>(&mut self, req: &mut Request<B>, at: Instant) -> Sleep {
        req.extensions_mut().insert(Attempt(self.attempts + 1));
        sleep_until(at)
    }
}

const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The layers' own failures are final: retrying them would only repeat them.
fn is_own_error(e: &BoxError) -> bool {
    e.is::<Abandoned>()
        || e.is::<Overloaded>()
        || e.is::<StoreUnavailable>()
        || e.is::<UnrepresentableDelay>()
        || e.is::<QuotaExhausted>()
}

impl<B, RB, C> Policy<Request<B>, Response<RB>, BoxError> for RetryPolicy<C>
where
    B: Clone,
    C: Classify,
{
    type Future = Sleep;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<RB>, BoxError>,
    ) -> Option<Sleep> {
        self.attempts = self.attempts.saturating_add(1);
        let decision = match result {
            Ok(res) => match self.classifier.classify(res.status(), res.headers()) {
                Classification::Success => {
                    self.allowance().record_success();
                    Decision::Stop
                }
                Classification::Failure => Decision::Stop,
                Classification::Throttled | Classification::Transient => {
                    match headers::retry_after(res.headers()) {
                        Ok(delay) => self.decide(req, delay),
                        Err(_) => Decision::Abandon(AbandonReason::UnrepresentableDelay),
                    }
                }
            },
            Err(e) if is_own_error(e) || !self.config().retry_transport_errors => Decision::Stop,
            Err(_) => self.decide(req, None),
        };
        match decision {
            Decision::Retry(at) => Some(self.schedule(req, at)),
            Decision::Stop => None,
            Decision::Abandon(reason) => {
                self.allowance().stats().abandon(reason);
                if let Ok(res) = result {
                    res.extensions_mut().insert(Abandoned::new(reason));
                }
                None
            }
        }
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        // Non-replayable requests are cloned too (cheaply, for `Bytes`-like bodies), so that
        // `retry` can mark a throttled POST as abandoned rather than hand it back silently.
        Some(req.clone())
    }
}
