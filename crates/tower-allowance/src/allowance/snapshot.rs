use std::{fmt, sync::atomic::Ordering, time::Duration};

use tokio::time::Instant;

#[cfg(feature = "dialects")]
pub use crate::signals::RateLimitObservation;
use crate::{error::AbandonReason, shared::Shared};

/// A point-in-time copy of an allowance's counters in this process, and of the shared state.
///
/// [`Allowance::snapshot`](crate::Allowance::snapshot) is synchronous: it asks the store
/// nothing, and gives the shared state as this process last learned it.
/// [`Allowance::refresh`](crate::Allowance::refresh) reads the store first (every process's
/// cooldown, closure, retry budget and adaptive rate).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// The allowance's name.
    pub name: String,
    /// Attempts admitted (first tries and retries).
    pub admitted: u64,
    /// Of those, attempts that waited for a reserved slot.
    pub waited: u64,
    /// Times a response extended the cooldown.
    pub deferred: u64,
    /// Retries admitted (each spent one unit of budget, if the budget is limited).
    pub retries_spent: u64,
    /// Requests given up on, by reason.
    pub abandoned: AbandonedCounts,
    /// Callers waiting right now (for a reserved slot, or for the store).
    pub waiting: usize,
    /// Time left in the cooldown, as last learned here; `None` when not cooling down.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub cooling_for: Option<Duration>,
    /// The closed (exhausted) state, as last learned here.
    pub closed: Option<ClosedState>,
    /// The last `X-RateLimit-*` headers seen on a response, if any.
    #[cfg(feature = "dialects")]
    pub rate_limit: Option<RateLimitObservation>,
    /// Retries the shared budget could pay for now; `None` for an unlimited budget, and in
    /// [`Allowance::snapshot`](crate::Allowance::snapshot) (only the store knows).
    pub retries_remaining: Option<u64>,
    /// The adaptive rate now, in requests per second; `None` when the allowance is not
    /// adaptive, and in [`Allowance::snapshot`](crate::Allowance::snapshot) (only the store
    /// knows).
    pub adaptive_rate: Option<f64>,
    /// Each class of the allowance, in this process (feature `shares`; empty without classes).
    #[cfg(feature = "shares")]
    pub classes: Vec<crate::shared::classes::ClassSnapshot>,
}

/// A closed allowance, in a [`Snapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClosedState {
    /// Time until it reopens by itself; `None`: until cleared.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub reopens_in: Option<Duration>,
    /// Why: [`AbandonReason::QuotaExhausted`] or [`AbandonReason::CooldownTooLong`], what
    /// every caller refused while it stays closed is told.
    pub reason: AbandonReason,
}

impl Snapshot {
    pub(crate) fn of(shared: &Shared) -> Self {
        let s = &shared.stats();
        let mut abandoned = AbandonedCounts::default();
        for (slot, counter) in abandoned.0.iter_mut().zip(&s.abandoned) {
            *slot = counter.load(Ordering::Relaxed);
        }
        let (admitted, waited, retries_spent) = s.admissions.totals();
        let now = Instant::now();
        let known = shared.holders().known();
        Snapshot {
            name: shared.name().to_string(),
            admitted,
            waited,
            deferred: s.deferred.load(Ordering::Relaxed),
            retries_spent,
            abandoned,
            waiting: shared.holders().waiting(),
            cooling_for: known.blocked_until.filter(|b| *b > now).map(|b| b - now),
            closed: known
                .closed
                .filter(|c| c.until().is_none_or(|u| u > now))
                .map(|c| ClosedState {
                    reopens_in: c.until().map(|u| u.saturating_duration_since(now)),
                    reason: c.reason(),
                }),
            #[cfg(feature = "dialects")]
            rate_limit: s.last_observation(),
            retries_remaining: None,
            adaptive_rate: None,
            #[cfg(feature = "shares")]
            classes: shared.class_snapshots(),
        }
    }
}

/// One line for a log or a status page: the counters, then the shared state as last
/// learned here (what is known of it).
///
/// ```
/// use tower_allowance::{Allowance, AllowanceConfig};
///
/// let allowance = Allowance::builder(AllowanceConfig::per_second(2, 2)?).name("odds-api").build();
/// assert_eq!(
///     allowance.snapshot().to_string(),
///     "odds-api: 0 admitted (0 waited, 0 retries), 0 cooldowns, 0 waiting, 0 abandoned"
/// );
/// # Ok::<(), tower_allowance::ConfigError>(())
/// ```
impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self;
        write!(f, "{}: {} admitted", s.name, s.admitted)?;
        write!(f, " ({} waited, {} retries)", s.waited, s.retries_spent)?;
        write!(f, ", {} cooldowns, {} waiting", s.deferred, s.waiting)?;
        write!(f, ", {}", s.abandoned)?;
        let closed = s.closed.map(|c| match c.reopens_in {
            Some(d) => format!("closed ({}) for {d:?}", c.reason),
            None => format!("closed ({}) until cleared", c.reason),
        });
        [
            s.cooling_for.map(|d| format!("cooling down for {d:?}")),
            closed,
            s.retries_remaining.map(|n| format!("{n} retries left")),
            s.adaptive_rate.map(|r| format!("adaptive rate {r:.2}/s")),
        ]
        .iter()
        .flatten()
        .try_for_each(|part| write!(f, ", {part}"))
    }
}

/// Abandonment counters by [`AbandonReason`]. `Debug` names each reason
/// (`AbandonedCounts { max_attempts: 0, budget_exhausted: 2, .. }`); `Display` gives the
/// total and the reasons counted (`3 abandoned (budget_exhausted 2, deadline 1)`).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct AbandonedCounts([u64; AbandonReason::COUNT]);

impl fmt::Debug for AbandonedCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut counts = f.debug_struct("AbandonedCounts");
        AbandonReason::each().for_each(|r| _ = counts.field(r.as_str(), &self.get(r)));
        counts.finish()
    }
}

impl fmt::Display for AbandonedCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counted: Vec<_> = self.iter().map(|(r, n)| format!("{r} {n}")).collect();
        write!(f, "{} abandoned", self.total())?;
        match counted.is_empty() {
            true => Ok(()),
            false => write!(f, " ({})", counted.join(", ")),
        }
    }
}

impl AbandonedCounts {
    /// The count for one reason.
    pub fn get(&self, reason: AbandonReason) -> u64 {
        self.0[reason.index()]
    }

    /// The sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every reason with a non-zero count.
    pub fn iter(&self) -> impl Iterator<Item = (AbandonReason, u64)> + '_ {
        let counts = AbandonReason::each().map(|r| (r, self.get(r)));
        counts.filter(|(_, n)| *n > 0)
    }
}

#[cfg(feature = "serde")]
mod ser;
