//! `Replayable`: the request bodies a retry can send again, as the same type.

use std::{fmt, sync::Arc};

use bytes::Bytes;
use http_body::Body;
use http_body_util::{
    combinators::{BoxBody, UnsyncBoxBody},
    BodyExt, Either, Empty, Full,
};

use super::{ReplayBody, ReplayError, ReplayRefused};

/// A request body type the allowance stack can send again for a retry, as the same type,
/// so the inner service keeps receiving the body type it declared.
///
/// [`prepare`](Self::prepare) runs once per request, before the first attempt. It returns
/// the body to send first and, when a retry will be possible, a [`Replay`] handle that
/// makes the body of each further attempt.
///
/// | body | how it is replayed |
/// |------|--------------------|
/// | `Full<Bytes>`, `Empty<Bytes>`, `Bytes`, `()` | cloned by [`try_clone`](Self::try_clone) (the clone shares the bytes; the cap does not apply) |
/// | `String` | cloned by [`try_clone`](Self::try_clone) (a copy: not replayed when longer than the cap) |
/// | `Either<L, R>` | as `L` or `R` |
/// | `BoxBody<Bytes, E>`, `UnsyncBoxBody<Bytes, E>` | through a [`ReplayBody`], re-boxed; needs `E: From<ReplayRefused>`, as `BoxError` is |
/// | `hyper::body::Incoming` (feature `hyper`, on by default) | not replayed: sent once, never retried |
/// | `axum::body::Body` (feature `axum`) | through a [`ReplayBody`], in `Body::new` |
/// | `tonic::body::Body` (feature `tonic`) | through a [`ReplayBody`], in `Body::new` |
///
/// # Your own body type
///
/// Box it (`BodyExt::boxed`), or implement this trait with [`Replay::from_fn`] (a body you
/// can rebuild) or [`Replay::wrap`] (a body that keeps a copy while it streams):
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{combinators::UnsyncBoxBody, BodyExt};
/// use tower_allowance::body::{Replay, ReplayError, Replayable};
/// use tower_allowance::BoxError;
///
/// /// A body that must be `MyBody` all the way down.
/// struct MyBody(UnsyncBoxBody<Bytes, BoxError>);
/// # impl http_body::Body for MyBody {
/// #     type Data = Bytes;
/// #     type Error = BoxError;
/// #     fn poll_frame(
/// #         mut self: std::pin::Pin<&mut Self>,
/// #         cx: &mut std::task::Context<'_>,
/// #     ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
/// #         std::pin::Pin::new(&mut self.0).poll_frame(cx)
/// #     }
/// # }
///
/// impl Replayable for MyBody {
///     fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>) {
///         Replay::wrap(self, cap, |copy| {
///             MyBody(copy.map_err(ReplayError::into_body_error).boxed_unsync())
///         })
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a request body the allowance can replay for a retry",
    label = "`Replayable` is not implemented for this body type",
    note = "`AllowanceLayer` (and `RetryPolicy`) wrap services of `http::Request<B>` where `B: tower_allowance::body::Replayable`: check the request body type of the service given to `.layer()`",
    note = "replayable bodies: `Full<Bytes>`, `Empty<Bytes>`, `Bytes`, `()`, `String`, `Either<L, R>`, `BoxBody<Bytes, E>` and `UnsyncBoxBody<Bytes, E>` (with `E: From<ReplayRefused>`, such as `BoxError`); with crate features: `hyper::body::Incoming` (`hyper`, on by default; sent once), `axum::body::Body` (`axum`), `tonic::body::Body` (`tonic`)",
    note = "for your own body: box it with `BodyExt::boxed`, or implement `Replayable` with `Replay::from_fn` (a body you can rebuild) or `Replay::wrap` (a copy kept while it streams)"
)]
pub trait Replayable: Sized {
    /// The body for the first attempt, and a [`Replay`] for the next ones, if a retry is
    /// possible. `cap` bounds the bytes a body that has to keep a copy may keep.
    fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>);

    /// A copy of this body for another attempt, taken by reference, for a body that is cheap
    /// to copy: `Full<Bytes>` and `Empty<Bytes>` (the copy shares the bytes), a `String` of
    /// at most `cap` bytes, an `Either` of those. `None`, the default, for every other body,
    /// which goes through [`prepare`](Self::prepare) instead.
    ///
    /// The retry layers ask this first: a body copied this way needs no [`Replay`] handle,
    /// so the stack's fast path stays free of allocations.
    fn try_clone(&self, cap: usize) -> Option<Self> {
        let _ = cap;
        None
    }
}

/// Makes the body of each retry of one request.
///
/// `Clone + Send + Sync + 'static` for any body type, so it can travel in the request's
/// extensions.
///
/// # Clone
///
/// Clones share one source (behind an `Arc`): the same copy, the same rebuild function.
/// Cloning never copies the body.
pub struct Replay<B> {
    source: Arc<dyn Source<B> + Send + Sync>,
}

/// Where a [`Replay`] gets its bodies from.
trait Source<B> {
    fn body(&self) -> Option<B>;
    fn is_capped(&self) -> bool;
}

// === impl Replay ===

impl<B: 'static> Replay<B> {
    /// Replays by calling `rebuild` for each attempt: for a body that is cheap to make again,
    /// such as `move || body.clone()`.
    pub fn from_fn<F>(rebuild: F) -> Self
    where
        F: Fn() -> B + Send + Sync + 'static,
    {
        Self::of(FromFn(rebuild))
    }

    /// Replays `body` through a [`ReplayBody`] that keeps a copy of up to `cap` bytes while
    /// the first attempt streams; `rebuild` turns a `ReplayBody<B>` back into a `B` (for the
    /// first attempt too).
    ///
    /// Returns `body` untouched, and no `Replay`, when its size hint already exceeds the
    /// cap.
    pub fn wrap<F>(body: B, cap: usize, rebuild: F) -> (B, Option<Self>)
    where
        B: Body + Send + Unpin,
        F: Fn(ReplayBody<B>) -> B + Send + Sync + 'static,
    {
        if body.size_hint().lower() > cap as u64 {
            return (body, None);
        }
        let body = ReplayBody::new(body, cap);
        let copy = Copied {
            body: body.clone(),
            rebuild,
        };
        let first = (copy.rebuild)(body);
        (first, Some(Self::of(copy)))
    }

    /// A `Replay<C>` that makes each body with `f` from one of these, for wrapper types.
    pub fn map<C, F>(self, f: F) -> Replay<C>
    where
        C: 'static,
        F: Fn(B) -> C + Send + Sync + 'static,
    {
        Replay::of(Mapped { replay: self, f })
    }

    fn of(source: impl Source<B> + Send + Sync + 'static) -> Self {
        let source = Arc::new(source);
        Self { source }
    }
}

impl<B> Replay<B> {
    /// A body for the next attempt, from the first byte; `None` when the body cannot be
    /// replayed: it outgrew the cap, or it failed before its end.
    ///
    /// While an earlier attempt is still streaming, the body returned may still fail with
    /// [`ReplayRefused`] if that attempt goes past the cap before the replay catches up;
    /// ask once the earlier attempt is over (a retry policy does).
    pub fn body(&self) -> Option<B> {
        self.source.body()
    }

    /// Whether the body outgrew the cap, so no retry can send it.
    pub fn is_capped(&self) -> bool {
        self.source.is_capped()
    }
}

impl<B> Clone for Replay<B> {
    fn clone(&self) -> Self {
        Self {
            source: Arc::clone(&self.source),
        }
    }
}

impl<B> fmt::Debug for Replay<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("capped", &self.source.is_capped())
            .finish_non_exhaustive()
    }
}

struct FromFn<F>(F);

impl<B, F: Fn() -> B> Source<B> for FromFn<F> {
    fn body(&self) -> Option<B> {
        Some((self.0)())
    }

    fn is_capped(&self) -> bool {
        false
    }
}

struct Copied<B, F> {
    /// Never polled: each replay is a fresh clone of it.
    body: ReplayBody<B>,
    rebuild: F,
}

impl<B, F: Fn(ReplayBody<B>) -> B> Source<B> for Copied<B, F> {
    fn body(&self) -> Option<B> {
        let body = &self.body;
        body.can_replay().then(|| (self.rebuild)(body.clone()))
    }

    fn is_capped(&self) -> bool {
        self.body.is_capped()
    }
}

struct Mapped<B, F> {
    replay: Replay<B>,
    f: F,
}

impl<B: 'static, C, F: Fn(B) -> C> Source<C> for Mapped<B, F> {
    fn body(&self) -> Option<C> {
        self.replay.body().map(&self.f)
    }

    fn is_capped(&self) -> bool {
        self.replay.is_capped()
    }
}

// === impl Replayable ===

/// The bodies that are cheap to copy: each retry sends a clone (the clones share the
/// bytes, or hold none), so the cap does not apply.
macro_rules! cloned {
    ($($body:ty),*) => {$(
        #[allow(clippy::clone_on_copy)]
        impl Replayable for $body {
            /// Cloned: the clones share the bytes (or hold none), so the cap does not apply.
            fn prepare(self, _cap: usize) -> (Self, Option<Replay<Self>>) {
                let copy = self.clone();
                (self, Some(Replay::from_fn(move || copy.clone())))
            }

            fn try_clone(&self, _cap: usize) -> Option<Self> {
                Some(self.clone())
            }
        }
    )*};
}

cloned!(Full<Bytes>, Bytes, Empty<Bytes>, ());

impl Replayable for String {
    /// Cloned, which copies it: not replayed when longer than the cap.
    fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>) {
        let copy = self.try_clone(cap);
        (self, copy.map(|copy| Replay::from_fn(move || copy.clone())))
    }

    fn try_clone(&self, cap: usize) -> Option<Self> {
        (self.len() <= cap).then(|| self.clone())
    }
}

impl<L, R> Replayable for Either<L, R>
where
    L: Replayable + 'static,
    R: Replayable + 'static,
{
    fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>) {
        match self {
            Either::Left(body) => {
                let (body, replay) = body.prepare(cap);
                (Either::Left(body), replay.map(|r| r.map(Either::Left)))
            }
            Either::Right(body) => {
                let (body, replay) = body.prepare(cap);
                (Either::Right(body), replay.map(|r| r.map(Either::Right)))
            }
        }
    }

    fn try_clone(&self, cap: usize) -> Option<Self> {
        match self {
            Either::Left(body) => body.try_clone(cap).map(Either::Left),
            Either::Right(body) => body.try_clone(cap).map(Either::Right),
        }
    }
}

impl<E> Replayable for BoxBody<Bytes, E>
where
    E: From<ReplayRefused> + 'static,
{
    /// Wrapped in a [`ReplayBody`] and boxed again.
    fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>) {
        Replay::wrap(self, cap, |body| {
            BoxBody::new(body.map_err(ReplayError::into_body_error))
        })
    }
}

impl<E> Replayable for UnsyncBoxBody<Bytes, E>
where
    E: From<ReplayRefused> + 'static,
{
    /// Wrapped in a [`ReplayBody`] and boxed again.
    fn prepare(self, cap: usize) -> (Self, Option<Replay<Self>>) {
        Replay::wrap(self, cap, |body| {
            UnsyncBoxBody::new(body.map_err(ReplayError::into_body_error))
        })
    }
}
