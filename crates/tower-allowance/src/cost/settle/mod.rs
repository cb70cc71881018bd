//! Reserve, then settle: costs known only after the answer (feature `settle`).
//!
//! An LLM provider limits tokens per minute, and a request's cost is known only when its answer
//! says how many tokens it used. The provider *reserves* at admission what the request may use
//! (OpenAI: the prompt plus `max_tokens`), so the allowance does the same: the request's
//! [`Cost`](crate::Cost) is that reservation, charged at admission like any cost. When the
//! answer arrives, a [`SettleLayer`] (under the [`AllowanceLayer`](crate::AllowanceLayer), so
//! that it sees every attempt) settles the reservation to what the answer used, read by a
//! [`UsageReader`] (ready: [`OpenAiUsage`], [`AnthropicUsage`]) from the headers, or from the
//! body as it streams to the caller (never taken from it):
//!
//! - the unused part comes back to the bucket in the share the provider gives back
//!   ([`Settlement`]: learned from its `x-ratelimit-remaining-tokens`, or configured), no
//!   earlier than now and never fuller than the bucket's bound;
//! - an under-estimate (more used than reserved) is debited;
//! - a 429 gives the whole reservation back (the provider charged nothing); a failure, a
//!   cancellation (the future or the body dropped) or an unreadable answer settles to the whole
//!   reservation (charged, nothing back) unless a reading says otherwise.
//!
//! The settlement is one store call (`Op::Settle`, one script call on Redis), so every process
//! sees it at its next admission; a credit moves the pending schedule earlier, and holders of
//! reserved slots, in every process, move up with it.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt};
//! use http_body_util::{BodyExt, Full};
//! use tower_allowance::{
//!     cost::settle::{OpenAiUsage, SettleLayer, Settlement},
//!     Allowance, AllowanceConfig, Cost, Limit,
//! };
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_allowance::BoxError> {
//! // 500 requests and 30,000 tokens per minute; unused reservations come back as the provider's
//! // remaining tokens show (learned).
//! let config = AllowanceConfig::per_minute(500, 500)?
//!     .with_limit(Limit::per_minute(30_000, 30_000)?.exact().counting_cost())?
//!     .with_settlement(Settlement::learned());
//! let allowance = Allowance::new(config);
//! let client = ServiceBuilder::new()
//!     .layer(allowance.layer())
//!     .layer(SettleLayer::new(&allowance, OpenAiUsage::new()))
//!     .service_fn(|_req: Request<String>| async {
//!         let body = r#"{"usage":{"prompt_tokens":200,"completion_tokens":300,"total_tokens":500}}"#;
//!         Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::from(body))))
//!     });
//!
//! // Reserve the prompt estimate plus max_tokens: 200 + 4,000.
//! let mut request = Request::new(String::new());
//! request.extensions_mut().insert(Cost(4_200));
//! let response = client.oneshot(request).await?;
//! // The caller reads the whole body; at its end the reservation settles to 500 tokens.
//! let body = response.into_body().collect().await?.to_bytes();
//! assert!(body.starts_with(b"{\"usage\""));
//! # Ok(())
//! # }
//! ```
//!
//! # Which rule the provider follows
//!
//! Whether the unused part of a reservation comes back is the provider's rule, and providers
//! differ (and rarely document it). [`Settlement::learned`] finds it: each answer reporting the
//! provider's remaining tokens (`x-ratelimit-remaining-tokens`, read by the [`UsageReader`])
//! is compared with what the allowance counts, and the share of unused tokens that came back
//! (all, none or a part) is learned and kept in the store's state, so every process settles
//! with it. The same reading also bounds every credit: the allowance never believes it has more
//! than the provider says, less what it admitted that the provider may not have seen yet. Where
//! the provider reports nothing, configure the rule: [`Settlement::all`], [`Settlement::none`],
//! [`Settlement::share`].
//!
//! For the comparison to hold, the limit counted in cost must be the provider's own, exactly
//! ([`Limit::exact`](crate::Limit::exact)).
//!
//! # With the other features
//!
//! - Several limits: every limit counted in cost is settled; the reading bounds the first.
//! - Retries: each attempt reserves again at admission and is settled by its own answer (a 429
//!   gives its reservation back whole); a retry the admission layer refuses reserved nothing.
//! - The adaptive rate: unchanged (it adapts the main limit, which counts requests); a
//!   settlement keeps the slots of a main limit whose rate adapts.
//! - Classes (feature `shares`): a class's share counts the tokens settled, not those
//!   reserved. The settlement moves its request's class's virtual finish time by what it gives
//!   back to the bucket (at most the request's own unused part) or debits (at most its own
//!   under-estimate), in the same store call, and in this process's class queues: a class
//!   whose requests use a tenth of what they reserve gets ten times as many requests as one
//!   that uses all of it, at equal weights. What the provider keeps, the class is charged.

mod body;
mod layer;
mod reader;
#[cfg(test)]
mod tests;

pub use self::{
    body::SettleBody,
    layer::{SettleFuture, SettleLayer, SettleService},
    reader::{AnthropicUsage, OpenAiUsage, UsageReader},
};
pub use crate::config::settle::Settlement;

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use tokio::time::Instant;

use crate::{
    rule::{
        settle::{Settle, Settled},
        Op, Reply,
    },
    shared::{spawn, Applying, Shared},
};

/// The class of a request (index, weight) when the allowance has classes (feature `shares`).
#[cfg(feature = "shares")]
pub(crate) fn class_of(shared: &Shared, extensions: &http::Extensions) -> Option<(u8, u32)> {
    shared.classes()?;
    let key = crate::config::classes::Class::key_of(extensions);
    let (i, _, share) = shared.config().classes.find(key)?;
    Some((i, share.weight_of()))
}

/// Applies one settlement at `now`; the event (a schedule moved earlier) goes to this
/// process's holders, and the units given back to (or charged to) its class to this
/// process's class queues. Best effort: a store that fails leaves the reservation charged
/// (the safe side).
pub(crate) fn apply(shared: &Arc<Shared>, settle: Settle, now: Instant, share: &Arc<AtomicU64>) {
    let done = move |shared: &Shared, share: &AtomicU64, reply| match reply {
        Ok(Reply::Settled(Settled {
            share_milli,
            event,
            moved,
        })) => {
            tracing::debug!(
                moved,
                share_milli,
                moves_holders = event.is_some(),
                "settled"
            );
            share.store(share_milli, Ordering::Relaxed);
            #[cfg(feature = "shares")]
            if let Some(gate) = shared.classes() {
                gate.settled(shared, &settle, moved);
            }
            if let Some(event) = event {
                shared.holders().event(event);
            }
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "could not settle a reservation"),
    };
    tracing::debug!(?settle, "settling");
    match shared.apply(now, Op::Settle(settle)) {
        Applying::Done(r) => done(shared, share, r),
        Applying::Pending(fut) => {
            let (shared, share) = (shared.clone(), share.clone());
            spawn(async move { done(&shared, &share, fut.await) });
        }
    }
}
