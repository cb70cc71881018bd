//! `Replayable` for tonic's `Body` (feature `tonic`).

use http_body::Body as _;

use super::{Replay, Replayable};

impl Replayable for tonic::body::Body {
    /// Wrapped in a [`ReplayBody`](super::ReplayBody), inside `Body::new`; an empty body is made afresh.
    fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>) {
        if self.is_end_stream() {
            return (Self::empty(), Some(Replay::from_fn(Self::empty)));
        }
        Replay::wrap(self, cap, Self::new)
    }
}

/// What the first `tonic::Status` in `e`'s `source()` chain (`e` included) names in its
/// `x-allowance-abandoned` metadata: the reason `GrpcLayer` gave up on a call, for
/// `Outcome::of_error` to parse. (The chain is walked here rather than with `error::find`, so
/// that `body` stays a leaf module: no circle through `error`.)
pub(crate) fn abandoned<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a str> {
    let status = std::iter::successors(Some(e), |e| e.source())
        .find_map(|e| e.downcast_ref::<tonic::Status>())?;
    status
        .metadata()
        .get("x-allowance-abandoned")?
        .to_str()
        .ok()
}
