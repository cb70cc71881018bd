//! The response body, passed on whole, whose end settles the reservation.

use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::UsageReader;
use crate::{
    rule::settle::{refill_excess_ppm, Settle},
    shared::Shared,
};

/// An attempt not settled yet: settles on drop with what is known (the whole reservation,
/// unless a reading or usage says otherwise), exactly once.
pub(crate) struct Pending {
    pub(crate) shared: Arc<Shared>,
    pub(crate) reserved: u32,
    pub(crate) reading: Option<(u64, u64)>,
    /// When the attempt was sent.
    pub(crate) sent: tokio::time::Instant,
    pub(crate) done: bool,
    /// Where the share in force is noted (`SettleLayer::share`).
    pub(crate) share: Arc<std::sync::atomic::AtomicU64>,
    /// The request's class index and weight, when the allowance has classes (feature
    /// `shares`): its settlement moves the class's share.
    #[cfg(feature = "shares")]
    pub(crate) class: Option<(u8, u32)>,
}

impl Pending {
    /// Settles with `used` (`None`: unknown, the whole reservation is taken as used).
    pub(crate) fn settle(mut self, used: Option<u32>) {
        self.send(Settle::used(self.reserved, used.unwrap_or(self.reserved)));
    }

    /// Settles as refused: the provider charged nothing.
    pub(crate) fn refused(mut self) {
        self.send(Settle::refused(self.reserved));
    }

    fn send(&mut self, mut s: Settle) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some((limit, remaining)) = self.reading {
            s = s.observed(limit, remaining);
        }
        // The provider refills the first cost limit faster than the bucket's whole
        // microseconds count (the share learned leaves the difference out).
        let limits = self.shared.config().limits();
        if let Some(l) = limits.iter().find(|l| l.counts_cost()) {
            s = s.refill_excess(refill_excess_ppm(l.rate(), l.period()));
        }
        #[cfg(feature = "shares")]
        if let Some((class, weight)) = self.class {
            s = s.class(class, weight);
        }
        // How long ago it was sent, as of the instant the store decides at: a later
        // instant would date the sending later than it was (a settlement made meanwhile
        // would pass for one made before it, and its reading for a fresh one).
        let now = tokio::time::Instant::now();
        s = s.sent(now.saturating_duration_since(self.sent));
        super::apply(&self.shared, s, now, &self.share);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.send(Settle::used(self.reserved, self.reserved));
    }
}

/// What a body being read keeps until its end.
pub(crate) struct Tail<R> {
    pending: Pending,
    reader: R,
    kept: Vec<u8>,
    max: usize,
    /// `R::used_from_body`, so that a drop (which cannot name the bound) can call it.
    used: fn(&R, &[u8]) -> Option<u32>,
}

impl<R: UsageReader> Tail<R> {
    pub(crate) fn new(pending: Pending, reader: R, max: usize) -> Self {
        Self {
            pending,
            reader,
            kept: Vec::new(),
            max,
            used: R::used_from_body,
        }
    }
}

impl<R> Tail<R> {
    fn keep(&mut self, mut data: impl Buf) {
        while data.has_remaining() {
            let chunk = data.chunk();
            let n = chunk.len();
            self.kept.extend_from_slice(chunk);
            data.advance(n);
        }
        if self.kept.len() > self.max {
            let cut = self.kept.len() - self.max;
            self.kept.drain(..cut);
        }
    }

    fn finish(self) {
        let used = (self.used)(&self.reader, &self.kept);
        self.pending.settle(used);
    }
}

pin_project! {
    /// The response body of a [`SettleService`](super::SettleService): the inner body, frame
    /// for frame, keeping its last bytes to read the usage from when it ends (or is dropped).
    pub struct SettleBody<B, R> {
        #[pin]
        inner: B,
        tail: Option<Tail<R>>,
    }

    impl<B, R> PinnedDrop for SettleBody<B, R> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before its end: what was kept may say the usage already.
            if let Some(tail) = this.project().tail.take() {
                tail.finish();
            }
        }
    }
}

impl<B, R> SettleBody<B, R> {
    pub(crate) fn new(inner: B, tail: Option<Tail<R>>) -> Self {
        Self { inner, tail }
    }
}

impl<B: fmt::Debug, R> fmt::Debug for SettleBody<B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleBody")
            .field("inner", &self.inner)
            .field("settled", &self.tail.is_none())
            .finish()
    }
}

impl<B, R> Body for SettleBody<B, R>
where
    B: Body,
    R: UsageReader,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(tail), Some(data)) = (this.tail.as_mut(), frame.data_ref()) {
                    tail.keep(data.chunk());
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                if let Some(tail) = this.tail.take() {
                    tail.finish();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
