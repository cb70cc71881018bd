//! One check to tell a completed request from an abandoned one.

use http::Response;

use crate::{
    error::{AbandonReason, Abandoned, Overloaded},
    BoxError,
};

/// How a request through the allowance stack ended.
///
/// ```
/// use http::Response;
/// use tower_allowance::{error::{AbandonReason, Abandoned}, BoxError, Outcome};
///
/// let ok: Result<Response<()>, BoxError> = Ok(Response::new(()));
/// assert_eq!(Outcome::of(&ok), Outcome::Completed);
///
/// let gave_up: Result<Response<()>, BoxError> = Err(Abandoned::new(AbandonReason::Deadline).into());
/// assert_eq!(Outcome::of(&gave_up), Outcome::Abandoned(AbandonReason::Deadline));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server's final answer arrived and the policy did not give up on it. Check the
    /// status: a 404 is "completed" too.
    Completed,
    /// Given up on, and why. A response may still be present (the last 429, say).
    Abandoned(AbandonReason),
    /// Another error (transport, store), available in the `Err`.
    Failed,
}

impl Outcome {
    /// Classifies a stack's result: an [`Abandoned`] error or response extension, an
    /// [`Overloaded`] error, another error, or a completed response.
    pub fn of<B>(result: &Result<Response<B>, BoxError>) -> Self {
        match result {
            Ok(res) => match res.extensions().get::<Abandoned>() {
                Some(a) => Self::Abandoned(a.reason()),
                None => Self::Completed,
            },
            Err(e) => {
                if let Some(a) = e.downcast_ref::<Abandoned>() {
                    Self::Abandoned(a.reason())
                } else if e.is::<Overloaded>() {
                    Self::Abandoned(AbandonReason::Overloaded)
                } else if e.is::<crate::error::QuotaExhausted>() {
                    Self::Abandoned(AbandonReason::QuotaExhausted)
                } else if e.is::<crate::error::UnrepresentableDelay>() {
                    Self::Abandoned(AbandonReason::UnrepresentableDelay)
                } else {
                    Self::Failed
                }
            }
        }
    }

    /// Whether the request completed.
    pub fn is_completed(&self) -> bool {
        matches!(self, Self::Completed)
    }
}
