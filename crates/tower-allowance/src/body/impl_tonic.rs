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
