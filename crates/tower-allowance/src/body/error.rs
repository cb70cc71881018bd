//! Errors a [`ReplayBody`](super::ReplayBody) adds to its inner body's.

use std::{error::Error, fmt};

use crate::BoxError;

/// Why a [`ReplayBody`](super::ReplayBody) cannot give back the original bytes.
///
/// Returned (inside [`ReplayError::Refused`]) by a replay that is polled past what it can
/// still produce. [`Replay::body`](super::Replay::body) returns `None` in both cases, so a
/// retry layer that asks first never sends such a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplayRefused {
    /// The body outgrew the cap, so its copy was dropped.
    Capped {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The original body failed before its end: what followed is lost.
    Interrupted,
}

impl fmt::Display for ReplayRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Capped { cap } => write!(f, "the body outgrew the replay cap of {cap} bytes"),
            Self::Interrupted => f.write_str("the original body failed before its end"),
        }
    }
}

impl Error for ReplayRefused {}

/// The error of a [`ReplayBody`](super::ReplayBody): the inner body's own, or a refused
/// replay.
///
/// Not a `std::error::Error` itself, so that it converts into [`BoxError`] (as hyper, axum
/// and tonic ask of a body's error) for any inner error that does, `BoxError` included,
/// and unwraps on the way: the boxed error is the inner body's own or a [`ReplayRefused`].
///
/// ```
/// use tower_allowance::{body::{ReplayError, ReplayRefused}, BoxError};
///
/// let err: BoxError = ReplayError::<std::io::Error>::Refused(ReplayRefused::Interrupted).into();
/// assert_eq!(err.downcast_ref(), Some(&ReplayRefused::Interrupted));
/// ```
#[derive(Debug)]
pub enum ReplayError<E> {
    /// The wrapped body failed; its error is passed through unchanged.
    Body(E),
    /// This clone cannot replay the body.
    Refused(ReplayRefused),
}

impl<E> ReplayError<E> {
    /// One error type again, for a body that must keep its error type (a re-boxed
    /// `BoxBody<Bytes, E>`): the inner error as is, a refusal through `E::from`.
    ///
    /// ```
    /// use tower_allowance::{body::{ReplayError, ReplayRefused}, BoxError};
    ///
    /// let err: BoxError = ReplayError::<BoxError>::Refused(ReplayRefused::Interrupted).into_body_error();
    /// assert!(err.downcast_ref::<ReplayRefused>().is_some());
    /// ```
    pub fn into_body_error(self) -> E
    where
        E: From<ReplayRefused>,
    {
        match self {
            Self::Body(err) => err,
            Self::Refused(refused) => E::from(refused),
        }
    }
}

impl<E: fmt::Display> fmt::Display for ReplayError<E> {
    /// Both parts: this is not an `Error` with a `source()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Body(err) => write!(f, "request body failed: {err}"),
            Self::Refused(refused) => write!(f, "request body replay refused: {refused}"),
        }
    }
}

impl<E: Into<BoxError>> From<ReplayError<E>> for BoxError {
    /// The inner body's error as it was, or the [`ReplayRefused`] itself: either can be
    /// downcast.
    fn from(err: ReplayError<E>) -> Self {
        match err {
            ReplayError::Body(err) => err.into(),
            ReplayError::Refused(refused) => Box::new(refused),
        }
    }
}
