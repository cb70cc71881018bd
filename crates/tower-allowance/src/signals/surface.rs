//! Accessors the cooldown does not need: public with `dialects`, used by the tests too.

use std::time::{Duration, SystemTime};

use super::{Dialect, ReadContext, Reader, Wait};

impl Dialect {
    /// This dialect without `reader`.
    pub const fn without(self, reader: Reader) -> Self {
        Self {
            readers: self.readers & !reader.bit(),
        }
    }
}

impl ReadContext {
    /// The local wall-clock time.
    pub const fn now(&self) -> SystemTime {
        self.now
    }

    /// How far a response's `Date` may be from [`now`](Self::now) and still be trusted.
    pub const fn max_skew(&self) -> Duration {
        self.max_skew
    }
}

impl Wait {
    /// The wait as a duration, `None` when it is [`Wait::TooLong`].
    pub fn duration(&self) -> Option<Duration> {
        match self {
            Wait::For(d) => Some(*d),
            Wait::TooLong { .. } => None,
        }
    }
}
