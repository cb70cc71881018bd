//! The providers' dialects (feature `dialects`): their readers, the offers only they make, their
//! names, and the dispatch to them. The readers' files sit beside the parent's.

use super::{Collector, Dialect, Reader};

#[path = "anthropic.rs"]
mod anthropic;
// The offers only the providers' readers make (remaining counts, limits, policies, buckets).
#[path = "collect_dialects.rs"]
mod collect_dialects;
#[path = "github.rs"]
mod github;
// The providers' value grammars (counts, epoch seconds, Go durations, RFC 3339).
#[path = "values_dialects.rs"]
mod grammars;
#[path = "ietf.rs"]
mod ietf;
#[path = "openai.rs"]
mod openai;
#[path = "x_ratelimit.rs"]
mod x_ratelimit;

pub use self::x_ratelimit::{EPOCH_MILLIS_THRESHOLD, EPOCH_THRESHOLD};

impl Dialect {
    /// For a provider whose headers you do not know: [`Dialect::standard`], the IETF fields
    /// (current and older drafts) and the generic `X-RateLimit-*`.
    pub const fn generic() -> Self {
        Self::standard()
            .with(Reader::Ietf)
            .with(Reader::IetfLegacy)
            .with(Reader::XRateLimit)
    }

    /// GitHub's REST API: `Retry-After` (secondary limits) and `x-ratelimit-*`.
    pub const fn github() -> Self {
        Self::none().with(Reader::RetryAfter).with(Reader::Github)
    }

    /// OpenAI's API: `Retry-After`, `retry-after-ms` and `x-ratelimit-*-{requests,tokens}`.
    pub const fn openai() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::RetryAfterMs)
            .with(Reader::OpenAi)
    }

    /// Anthropic's API: `Retry-After` and `anthropic-ratelimit-*`.
    pub const fn anthropic() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::Anthropic)
    }

    /// `Retry-After` and the generic `X-RateLimit-*` (`-Limit`, `-Remaining`, `-Bucket`,
    /// `-Reset`), the shape many APIs send (the Odds API's among them).
    pub const fn x_ratelimit() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::XRateLimit)
    }

    /// The IETF fields only (current and older drafts), with `Retry-After`.
    pub const fn ietf() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::Ietf)
            .with(Reader::IetfLegacy)
    }
}

impl Reader {
    /// Every reader, in order. A slice, so that adding a reader is not a breaking change.
    pub const ALL: &'static [Reader] = &[
        Reader::RetryAfter,
        Reader::RetryAfterMs,
        Reader::Ietf,
        Reader::IetfLegacy,
        Reader::Github,
        Reader::OpenAi,
        Reader::Anthropic,
        Reader::XRateLimit,
    ];
}

/// Reads with one of the providers' readers (the parent reads `Retry-After` and
/// `retry-after-ms` itself).
pub(super) fn read(reader: Reader, c: &mut Collector<'_>) {
    match reader {
        Reader::RetryAfter | Reader::RetryAfterMs => {}
        Reader::Ietf => ietf::read(c),
        Reader::IetfLegacy => ietf::read_legacy(c),
        Reader::Github => github::read(c),
        Reader::OpenAi => openai::read(c),
        Reader::Anthropic => anthropic::read(c),
        Reader::XRateLimit => x_ratelimit::read(c),
    }
}
