//! The dialect's setter and getter (feature `dialects`).

use super::AllowanceConfig;
use crate::signals::Dialect;

impl AllowanceConfig {
    /// Which rate-limit headers responses are read with (default [`Dialect::standard`]:
    /// `Retry-After` and `retry-after-ms`; [`Dialect::generic`] adds the IETF fields and
    /// `X-RateLimit-*`, and each provider has its own); see [`signals`](crate::signals).
    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// The header dialect.
    #[cfg_attr(docsrs, doc(cfg(feature = "dialects")))]
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }
}
