//! [`Code`]: a gRPC status code, and what it means to the allowance.

use std::fmt;

use crate::classify::Classification;

/// A gRPC status code, as carried by `grpc-status`.
///
/// Any `u32` is kept as is: a code this crate has no name for is still a final failure.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Code(u32);

impl Code {
    /// The call succeeded.
    pub const OK: Code = Code(0);
    /// The call was cancelled, typically by the caller.
    pub const CANCELLED: Code = Code(1);
    /// Unknown error; also what a malformed `grpc-status` reads as.
    pub const UNKNOWN: Code = Code(2);
    /// The client specified an invalid argument.
    pub const INVALID_ARGUMENT: Code = Code(3);
    /// The deadline expired before the operation could complete.
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    /// Some requested entity was not found.
    pub const NOT_FOUND: Code = Code(5);
    /// The entity a client attempted to create already exists.
    pub const ALREADY_EXISTS: Code = Code(6);
    /// The caller does not have permission.
    pub const PERMISSION_DENIED: Code = Code(7);
    /// Some resource has been exhausted: a rate limit or a quota. Throttling.
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    /// The system is not in a state required for the operation.
    pub const FAILED_PRECONDITION: Code = Code(9);
    /// The operation was aborted, typically by a concurrency conflict.
    pub const ABORTED: Code = Code(10);
    /// The operation was attempted past the valid range.
    pub const OUT_OF_RANGE: Code = Code(11);
    /// The operation is not implemented or supported.
    pub const UNIMPLEMENTED: Code = Code(12);
    /// An internal error.
    pub const INTERNAL: Code = Code(13);
    /// The service is currently unavailable: transient.
    pub const UNAVAILABLE: Code = Code(14);
    /// Unrecoverable data loss or corruption.
    pub const DATA_LOSS: Code = Code(15);
    /// The request lacks valid authentication credentials.
    pub const UNAUTHENTICATED: Code = Code(16);

    const NAMES: [&'static str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];

    /// The code with this number.
    pub const fn new(code: u32) -> Self {
        Self(code)
    }

    /// The code's number.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Parses a `grpc-status` value: ASCII digits only, fitting in a `u32`; `None` for
    /// anything else.
    ///
    /// ```
    /// use tower_allowance::grpc::Code;
    ///
    /// assert_eq!(Code::from_bytes(b"14"), Some(Code::UNAVAILABLE));
    /// assert_eq!(Code::from_bytes(b"+8"), None);
    /// assert_eq!(Code::from_bytes(b""), None);
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(bytes).ok()?.parse().ok().map(Self)
    }

    /// The canonical name (`"RESOURCE_EXHAUSTED"`), for the codes 0 to 16.
    pub fn name(self) -> Option<&'static str> {
        usize::try_from(self.0)
            .ok()
            .and_then(|i| Self::NAMES.get(i).copied())
    }

    /// What this code means to the allowance: OK is a success, RESOURCE_EXHAUSTED
    /// throttling, UNAVAILABLE a transient failure, and every other code a final failure.
    pub fn classification(self) -> Classification {
        match self {
            Self::OK => Classification::Success,
            Self::RESOURCE_EXHAUSTED => Classification::Throttled,
            Self::UNAVAILABLE => Classification::Transient,
            _ => Classification::Failure,
        }
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "Code::{name}"),
            None => write!(f, "Code({})", self.0),
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "code {}", self.0),
        }
    }
}
