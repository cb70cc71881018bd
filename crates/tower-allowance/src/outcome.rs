//! One check to tell how a request through the stack ended.

use http::{Response, StatusCode};

use crate::{
    classify::{Classification, Classified},
    error::{AbandonReason, Abandoned},
    BoxError,
};

/// How a request through the allowance stack ended.
///
/// ```
/// use http::{Response, StatusCode};
/// use tower_allowance::{error::{AbandonReason, Abandoned}, BoxError, Outcome};
///
/// let ok: Result<Response<()>, BoxError> = Ok(Response::new(()));
/// assert_eq!(Outcome::of(&ok), Outcome::Completed);
///
/// let mut gone = Response::new(());
/// *gone.status_mut() = StatusCode::GONE;
/// let gone: Result<Response<()>, BoxError> = Ok(gone);
/// assert_eq!(Outcome::of(&gone), Outcome::Unsuccessful(StatusCode::GONE));
///
/// let gave_up: Result<Response<()>, BoxError> = Err(Abandoned::new(AbandonReason::Deadline).into());
/// assert_eq!(Outcome::of(&gave_up), Outcome::Abandoned(AbandonReason::Deadline));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The server answered with success (as the classifier sees it: 2xx and 3xx by default).
    Completed,
    /// The server's final answer was a failure status that is not retried (a 404, a 401...):
    /// the request ended, unsuccessfully. A retryable one (a 429, a 503) that ran out of
    /// attempts is [`Abandoned`](Self::Abandoned) with reason `MaxAttempts` instead, the last
    /// response kept.
    Unsuccessful(StatusCode),
    /// Given up on, and why. A response may still be present (the last 429, say).
    Abandoned(AbandonReason),
    /// Another error (transport, store), available in the `Err`.
    Failed,
}

impl Outcome {
    /// Classifies a stack's result: an [`Abandoned`] error or response extension, an
    /// [`Overloaded`](crate::error::Overloaded) (ours, or tower's `LoadShed` refusal: nothing was sent) or
    /// [`Exhausted`](crate::error::Exhausted) error (also behind wrappers such as `Buffer` or
    /// `MapErr`: the `source()` chain is searched), another error, or a response, which is a
    /// success or not as the stack classified it.
    pub fn of<B>(result: &Result<Response<B>, BoxError>) -> Self {
        match result {
            Ok(res) => {
                if let Some(a) = res.extensions().get::<Abandoned>() {
                    return Self::Abandoned(a.reason());
                }
                let success = match res.extensions().get::<Classified>() {
                    Some(c) => c.class == Classification::Success,
                    // The stack marks every response that is not plainly a success.
                    None => crate::classify::plainly_successful(res.status()),
                };
                if success {
                    Self::Completed
                } else {
                    Self::Unsuccessful(res.status())
                }
            }
            Err(e) => Self::of_error(&**e),
        }
    }

    /// Classifies an error alone: the layers' errors as [`Outcome::of`] does. With the
    /// `tonic` feature, a `tonic::Status` whose metadata has `x-allowance-abandoned` (what
    /// `grpc::GrpcLayer` (feature `grpc`) adds to a call it gave up on, or refused) is
    /// `Abandoned` with that reason; any other `Status` is the server's own answer:
    /// `Failed` (read its `code()`).
    ///
    /// ```
    /// use tower_allowance::{error::{AbandonReason, Overloaded}, Outcome};
    ///
    /// let full = Overloaded::default();
    /// assert_eq!(Outcome::of_error(&full), Outcome::Abandoned(AbandonReason::Overloaded));
    /// # #[cfg(feature = "tonic")] {
    /// let mut status = tonic::Status::resource_exhausted("quota exceeded");
    /// assert_eq!(Outcome::of_error(&status), Outcome::Failed);
    /// status.metadata_mut().insert("x-allowance-abandoned", "deadline".parse().expect("ascii"));
    /// assert_eq!(Outcome::of_error(&status), Outcome::Abandoned(AbandonReason::Deadline));
    /// # }
    /// ```
    pub fn of_error(e: &(dyn std::error::Error + 'static)) -> Self {
        #[cfg(feature = "tonic")]
        let tonic = crate::body::impl_tonic::abandoned(e).and_then(|r| r.parse().ok());
        #[cfg(not(feature = "tonic"))]
        let tonic = None;
        match Abandoned::of_error(e) {
            Some(a) => Self::Abandoned(a.reason()),
            None => tonic.map_or(Self::Failed, Self::Abandoned),
        }
    }

    /// Whether the request completed successfully.
    pub fn is_completed(&self) -> bool {
        matches!(self, Self::Completed)
    }
}
