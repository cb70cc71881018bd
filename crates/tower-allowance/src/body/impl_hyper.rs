//! `Replayable` for hyper's `Incoming` (feature `hyper`).

use super::{Replay, Replayable};

impl Replayable for hyper::body::Incoming {
    /// Not replayable: an `Incoming` cannot be built from a copy, so the request is sent
    /// once and never retried. Convert it (`BodyExt::boxed`) to make it replayable.
    fn prepare(self, _cap: usize) -> (Self, Option<Replay<Self>>) {
        (self, None)
    }
}
