//! The providers' dialects by name (feature `dialects`), and the dispatch to their readers.

use super::{anthropic, github, ietf, openai, x_ratelimit, Collector, Dialect, Reader};

impl Dialect {
    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
    /// GitHub's REST API: `Retry-After` (secondary limits) and `x-ratelimit-*`.
    pub const fn github() -> Self {
        Self::none().with(Reader::RetryAfter).with(Reader::Github)
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
    /// OpenAI's API: `Retry-After`, `retry-after-ms` and `x-ratelimit-*-{requests,tokens}`.
    pub const fn openai() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::RetryAfterMs)
            .with(Reader::OpenAi)
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
    /// Anthropic's API: `Retry-After` and `anthropic-ratelimit-*`.
    pub const fn anthropic() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::Anthropic)
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
    /// `Retry-After` and the generic `X-RateLimit-*` (the odds API's shape, which this
    /// project started from).
    pub const fn x_ratelimit() -> Self {
        Self::none()
            .with(Reader::RetryAfter)
            .with(Reader::XRateLimit)
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
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
