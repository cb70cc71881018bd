//! `ReplayBody`: a body that keeps a copy of what it streams, for a retry.

use std::{
    fmt,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{ready, Context, Poll},
};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::{ReplayError, ReplayRefused};

/// The default cap on the copy a [`ReplayBody`] keeps (`RetryConfig::replay_cap`): 64 KiB.
pub(crate) const DEFAULT_REPLAY_CAP: usize = 64 * 1024;

/// Wraps a request body so that a retry can send it again, without `B: Clone`.
///
/// The first attempt streams the inner body frame by frame, as it comes, and keeps a copy
/// of each data frame (a `Bytes` clone, not a copy of the memory when the inner body yields
/// `Bytes`) and of the trailers. A clone made for a retry replays that copy frame for
/// frame, then the trailers. If the first attempt was dropped before the inner body ended
/// (a server often answers 429 before it has read the whole request), the replay goes on
/// to stream the rest of the inner body, keeping a copy of it in turn.
///
/// # The cap
///
/// Once the data read from the inner body exceeds `cap` bytes, the copy is dropped and the
/// body is *capped*: [`is_capped`](Self::is_capped) turns true and stays true. The body
/// that is streaming carries on to the end (nothing is lost for the attempt in flight),
/// but a clone that would need the copy fails with [`ReplayRefused::Capped`]. A body whose
/// size hint already exceeds the cap is capped from the start and never copies anything.
///
/// # Clone
///
/// Clones share one state, behind an `Arc` and a `Mutex`: the inner body, the copy, and
/// whether it is capped. Cloning never copies data; each clone has its own position and
/// starts from the first byte. Attempts are expected to run one after another: polling two
/// clones at the same time neither loses nor duplicates a byte, but only the last one to
/// wait on the inner body is woken when it has more.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower_allowance::body::ReplayBody;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_allowance::BoxError> {
/// let body = ReplayBody::new(Full::new(Bytes::from_static(b"order=42")), 64 * 1024);
/// let retry = body.clone();
/// assert_eq!(body.collect().await?.to_bytes(), "order=42");
/// assert_eq!(retry.collect().await?.to_bytes(), "order=42");
/// # Ok(())
/// # }
/// ```
pub struct ReplayBody<B> {
    shared: Arc<Shared<B>>,
    /// Data frames this body has yielded: its position in the copy.
    frames: usize,
    /// Bytes this body has yielded, for `size_hint`.
    bytes: u64,
    /// Whether this body has yielded the trailers.
    trailers_sent: bool,
}

struct Shared<B> {
    cap: usize,
    state: Mutex<State<B>>,
}

struct State<B> {
    /// The wrapped body, until it ends or fails.
    inner: Option<B>,
    /// A copy of every data frame read so far, unless capped or failed.
    copy: Vec<Bytes>,
    /// Data frames read from the inner body.
    frames_read: usize,
    /// Bytes read from the inner body.
    bytes_read: u64,
    trailers: Option<HeaderMap>,
    capped: bool,
    failed: bool,
}

// === impl ReplayBody ===

impl<B: Body> ReplayBody<B> {
    /// Wraps `body`, keeping a copy of up to `cap` bytes for replays.
    pub fn new(body: B, cap: usize) -> Self {
        let capped = body.size_hint().lower() > cap as u64;
        let state = State {
            inner: Some(body),
            copy: Vec::new(),
            frames_read: 0,
            bytes_read: 0,
            trailers: None,
            capped,
            failed: false,
        };
        Self::at_start(Arc::new(Shared {
            cap,
            state: Mutex::new(state),
        }))
    }
}

impl<B> ReplayBody<B> {
    /// A reader of `shared` from its first frame.
    fn at_start(shared: Arc<Shared<B>>) -> Self {
        Self {
            shared,
            frames: 0,
            bytes: 0,
            trailers_sent: false,
        }
    }

    /// Whether the body outgrew its cap: no clone can replay it from the start any more.
    pub fn is_capped(&self) -> bool {
        self.shared.lock().capped
    }

    /// The cap this body was created with, in bytes.
    pub fn cap(&self) -> usize {
        self.shared.cap
    }

    /// Whether a fresh clone would give back the whole body: neither capped nor cut short
    /// by an error of the inner body.
    pub(crate) fn can_replay(&self) -> bool {
        let state = self.shared.lock();
        !state.capped && !state.failed
    }
}

impl<B> Clone for ReplayBody<B> {
    /// A replay from the first byte; see [`ReplayBody`]'s `# Clone` section.
    fn clone(&self) -> Self {
        Self::at_start(Arc::clone(&self.shared))
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("ReplayBody")
            .field("cap", &self.shared.cap)
            .field("capped", &state.capped)
            .field("bytes_read", &state.bytes_read)
            .field("position", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = ReplayError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let cap = this.shared.cap;
        let mut state = this.shared.lock();

        // Behind the inner body: replay the copy.
        if this.frames < state.frames_read {
            let Some(chunk) = state.copy.get(this.frames).cloned() else {
                let refused = state.refusal(cap);
                return Poll::Ready(Some(Err(ReplayError::Refused(refused))));
            };
            this.frames += 1;
            this.bytes += chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if !this.trailers_sent {
            if let Some(trailers) = &state.trailers {
                this.trailers_sent = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
            }
        }
        if state.failed {
            return Poll::Ready(Some(Err(ReplayError::Refused(ReplayRefused::Interrupted))));
        }

        // Caught up: stream the inner body, keeping a copy.
        loop {
            let Some(inner) = state.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(inner).poll_frame(cx)) {
                None => {
                    state.inner = None;
                    return Poll::Ready(None);
                }
                Some(Err(err)) => {
                    state.inner = None;
                    state.failed = true;
                    state.copy = Vec::new();
                    return Poll::Ready(Some(Err(ReplayError::Body(err))));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let chunk = data.copy_to_bytes(data.remaining());
                        state.record(chunk.clone(), cap);
                        this.frames = state.frames_read;
                        this.bytes = state.bytes_read;
                        return Poll::Ready(Some(Ok(Frame::data(chunk))));
                    }
                    Err(frame) => {
                        // A frame is data or trailers; anything else has nothing to replay.
                        if let Ok(trailers) = frame.into_trailers() {
                            state.trailers = Some(trailers.clone());
                            this.trailers_sent = true;
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let state = self.shared.lock();
        if self.frames < state.frames_read
            || (!self.trailers_sent && state.trailers.is_some())
            || state.failed
        {
            return false;
        }
        state.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let state = self.shared.lock();
        let behind = state.bytes_read.saturating_sub(self.bytes);
        let Some(inner) = state.inner.as_ref() else {
            return SizeHint::with_exact(behind);
        };
        let rest = inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(behind.saturating_add(rest.lower()));
        if let Some(upper) = rest.upper() {
            // `upper >= lower` for the inner hint, so for the sums too.
            hint.set_upper(behind.saturating_add(upper));
        }
        hint
    }
}

// === impl Shared ===

impl<B> Shared<B> {
    /// The state, even if a panic in an inner body's `poll_frame` poisoned the lock: every
    /// field is left consistent between two statements that could panic.
    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === impl State ===

impl<B> State<B> {
    /// Counts a data frame read from the inner body, and copies it while under the cap.
    fn record(&mut self, chunk: Bytes, cap: usize) {
        self.frames_read += 1;
        self.bytes_read = self.bytes_read.saturating_add(chunk.len() as u64);
        if self.capped || self.failed {
            return;
        }
        if self.bytes_read > cap as u64 {
            tracing::debug!(
                cap,
                "request body outgrew the replay cap; it cannot be replayed"
            );
            self.capped = true;
            self.copy = Vec::new();
        } else {
            self.copy.push(chunk);
        }
    }

    /// Why a clone behind the inner body finds no copy to replay.
    fn refusal(&self, cap: usize) -> ReplayRefused {
        if self.failed {
            ReplayRefused::Interrupted
        } else {
            ReplayRefused::Capped { cap }
        }
    }
}
