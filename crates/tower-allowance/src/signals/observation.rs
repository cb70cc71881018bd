//! The provider's own view of the allowance, as its headers state it (feature `dialects`).

use super::Reading;

/// The provider's own view, from the last response's `X-RateLimit-Limit`,
/// `X-RateLimit-Remaining` and `X-RateLimit-Bucket` (or whatever the allowance's
/// `signals::Dialect` (feature `dialects`) reads as a limit, a remaining count and a bucket),
/// in a [`Snapshot`](crate::Snapshot).
///
/// `remaining` is approximate and shared by everyone using the key: it is an observation,
/// never a reservation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RateLimitObservation {
    /// `X-RateLimit-Limit`.
    pub limit: Option<u64>,
    /// `X-RateLimit-Remaining`.
    pub remaining: Option<u64>,
    /// `X-RateLimit-Bucket`.
    pub bucket: Option<String>,
}

impl RateLimitObservation {
    /// What a reading says of the provider's own view, if anything.
    pub(crate) fn of(reading: &mut Reading) -> Option<Self> {
        (reading.limit.is_some() || reading.remaining.is_some() || reading.bucket.is_some()).then(
            || Self {
                limit: reading.limit,
                remaining: reading.remaining,
                bucket: reading.bucket.take(),
            },
        )
    }
}
