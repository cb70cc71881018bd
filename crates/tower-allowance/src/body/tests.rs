use std::{
    pin::Pin,
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame};
use http_body_util::{
    combinators::{BoxBody, UnsyncBoxBody},
    BodyExt, Either, Empty, Full, StreamBody,
};
use proptest::prelude::*;

use super::*;
use crate::BoxError;

type Item = Result<Frame<Bytes>, BoxError>;
type Frames = StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Item>>>;

/// A body of several frames, each ready at once: data chunks, then trailers if any.
fn frames(chunks: &[&[u8]], trailers: Option<HeaderMap>) -> Frames {
    let mut items: Vec<Item> = chunks
        .iter()
        .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
        .collect();
    items.extend(trailers.map(|t| Ok(Frame::trailers(t))));
    StreamBody::new(futures_util::stream::iter(items))
}

fn trailers(status: &'static str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", HeaderValue::from_static(status));
    map
}

/// What a body yielded, polled to its end (or first error) with a no-op waker.
#[derive(Debug, PartialEq)]
struct Drained<E> {
    data: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    error: Option<E>,
}

fn poll<B: Body + Unpin>(body: &mut B) -> Option<Result<Frame<B::Data>, B::Error>> {
    match Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(frame) => frame,
        Poll::Pending => panic!("test bodies are always ready"),
    }
}

/// Reads at most `limit` frames.
fn drain_some<B>(body: &mut B, limit: usize) -> Drained<B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut drained = Drained {
        data: Vec::new(),
        trailers: None,
        error: None,
    };
    for _ in 0..limit {
        match poll(body) {
            None => break,
            Some(Err(err)) => {
                drained.error = Some(err);
                break;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => drained.data.push(data),
                Err(frame) => drained.trailers = frame.into_trailers().ok(),
            },
        }
    }
    drained
}

fn drain<B>(mut body: B) -> Drained<B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    drain_some(&mut body, usize::MAX)
}

fn chunks(parts: &[&[u8]]) -> Vec<Bytes> {
    parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
}

fn refusal<E: std::fmt::Debug>(drained: Drained<ReplayError<E>>) -> Option<ReplayRefused> {
    match drained.error {
        Some(ReplayError::Refused(refused)) => Some(refused),
        _ => None,
    }
}

// === ReplayBody ===

#[test]
fn a_streamed_body_under_the_cap_replays_frame_for_frame_with_its_trailers() {
    let parts: &[&[u8]] = &[b"one", b"", b"three", b"four"];
    let body = ReplayBody::new(frames(parts, Some(trailers("8"))), 12);
    let retry = body.clone();

    let first = drain(body);
    assert_eq!(first.data, chunks(parts));
    assert_eq!(first.trailers, Some(trailers("8")));
    assert!(first.error.is_none());
    assert!(!retry.is_capped(), "12 bytes fit a cap of 12");

    let later = retry.clone();
    for replay in [retry, later] {
        let replayed = drain(replay);
        assert_eq!(replayed.data, chunks(parts));
        assert_eq!(replayed.trailers, Some(trailers("8")));
        assert!(replayed.error.is_none());
    }
}

#[test]
fn over_the_cap_the_first_attempt_streams_on_and_a_replay_is_refused() {
    let parts: &[&[u8]] = &[b"0123456789", b"0123456789", b"0123456789"];
    let body = ReplayBody::new(frames(parts, Some(trailers("0"))), 25);
    let retry = body.clone();

    let first = drain(body);
    assert_eq!(
        first.data,
        chunks(parts),
        "the attempt in flight loses nothing"
    );
    assert_eq!(first.trailers, Some(trailers("0")));
    assert!(retry.is_capped());
    assert_eq!(retry.cap(), 25);

    let replayed = drain(retry);
    assert!(replayed.data.is_empty());
    assert_eq!(refusal(replayed), Some(ReplayRefused::Capped { cap: 25 }));
}

#[test]
fn a_body_whose_size_hint_exceeds_the_cap_is_capped_from_the_start() {
    let body = ReplayBody::new(Full::new(Bytes::from_static(b"0123456789")), 9);
    assert!(body.is_capped());
    let retry = body.clone();
    assert_eq!(drain(body).data, chunks(&[b"0123456789"]));
    assert_eq!(
        refusal(drain(retry)),
        Some(ReplayRefused::Capped { cap: 9 })
    );
}

#[test]
fn a_replay_takes_over_the_rest_of_an_unfinished_first_attempt() {
    let parts: &[&[u8]] = &[b"a", b"bb", b"ccc", b"dddd"];
    let mut body = ReplayBody::new(frames(parts, Some(trailers("14"))), 64);
    let retry = body.clone();

    // The server answered after two frames; the first attempt is dropped.
    let first = drain_some(&mut body, 2);
    assert_eq!(first.data, chunks(&parts[..2]));
    drop(body);

    let later = retry.clone();
    let replayed = drain(retry);
    assert_eq!(replayed.data, chunks(parts), "copy, then the unread rest");
    assert_eq!(replayed.trailers, Some(trailers("14")));
    assert_eq!(drain(later).data, chunks(parts), "the rest was copied too");
}

#[test]
fn a_takeover_may_pass_the_cap_itself_and_then_no_one_can_replay() {
    let parts: &[&[u8]] = &[b"01234", b"56789", b"abcde"];
    let mut body = ReplayBody::new(frames(parts, None), 8);
    let retry = body.clone();
    let last = body.clone();
    assert_eq!(drain_some(&mut body, 1).data, chunks(&parts[..1]));
    drop(body);
    assert!(!retry.is_capped());

    let replayed = drain(retry);
    assert_eq!(
        replayed.data,
        chunks(parts),
        "the streaming body carries on"
    );
    assert!(replayed.error.is_none());
    assert!(last.is_capped());
    assert_eq!(refusal(drain(last)), Some(ReplayRefused::Capped { cap: 8 }));
}

#[test]
fn an_inner_error_reaches_the_attempt_and_later_replays_are_refused() {
    let items: Vec<Item> = vec![
        Ok(Frame::data(Bytes::from_static(b"a"))),
        Err("reset".into()),
    ];
    let body = ReplayBody::new(StreamBody::new(futures_util::stream::iter(items)), 64);
    let retry = body.clone();
    let first = drain(body);
    assert_eq!(first.data, chunks(&[b"a"]));
    assert!(matches!(first.error, Some(ReplayError::Body(ref e)) if e.to_string() == "reset"));
    assert!(!retry.is_capped());
    assert_eq!(refusal(drain(retry)), Some(ReplayRefused::Interrupted));
}

#[test]
fn size_hints_and_end_of_stream_follow_each_clones_position() {
    let body = ReplayBody::new(Full::new(Bytes::from_static(b"0123456789")), 64);
    assert_eq!(body.size_hint().exact(), Some(10));
    assert!(!body.is_end_stream());
    let retry = body.clone();
    let first = drain(body.clone());
    assert_eq!(first.data, chunks(&[b"0123456789"]));
    assert_eq!(
        retry.size_hint().exact(),
        Some(10),
        "all of it still to replay"
    );
    assert!(!retry.is_end_stream());
    let mut retry = retry;
    assert!(poll(&mut retry).is_some());
    assert_eq!(retry.size_hint().exact(), Some(0));
    assert!(retry.is_end_stream());
    assert!(poll(&mut retry).is_none());

    // Unknown length: what was read is known exactly, the rest is the inner hint.
    let parts: &[&[u8]] = &[b"abc", b"de", b"f"];
    let mut body = ReplayBody::new(frames(parts, None), 64);
    let retry = body.clone();
    assert_eq!(body.size_hint().lower(), 0);
    assert_eq!(body.size_hint().upper(), None);
    drain_some(&mut body, 2);
    assert_eq!(retry.size_hint().lower(), 5);
    assert_eq!(retry.size_hint().upper(), None);
    assert_eq!(body.size_hint().lower(), 0);

    // Empty: the end from the start, for every clone.
    let body = ReplayBody::new(Empty::<Bytes>::new(), 64);
    assert!(body.is_end_stream());
    assert!(body.clone().is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));

    // Trailers still to replay are not the end.
    let body = ReplayBody::new(frames(&[], Some(trailers("0"))), 64);
    let retry = body.clone();
    assert_eq!(drain(body).trailers, Some(trailers("0")));
    assert!(!retry.is_end_stream());
    assert_eq!(drain(retry).trailers, Some(trailers("0")));
}

#[test]
fn errors_convert_into_the_inner_error_or_the_refusal() {
    let err = ReplayError::<BoxError>::Refused(ReplayRefused::Capped { cap: 10 });
    assert_eq!(
        err.to_string(),
        "request body replay refused: the body outgrew the replay cap of 10 bytes"
    );
    let boxed = BoxError::from(err);
    assert_eq!(
        boxed.downcast_ref(),
        Some(&ReplayRefused::Capped { cap: 10 })
    );

    let err = ReplayError::Body(std::io::Error::other("reset"));
    assert_eq!(err.to_string(), "request body failed: reset");
    let boxed = BoxError::from(err);
    assert_eq!(
        boxed
            .downcast_ref::<std::io::Error>()
            .map(ToString::to_string)
            .as_deref(),
        Some("reset")
    );
}

// === Replayable ===

fn assert_handle<T: Clone + Send + Sync + 'static>(_: &T) {}

/// The first attempt, drained, and two replays (`None`: not replayable), drained.
type Attempts<E> = (Drained<E>, Vec<Option<Drained<E>>>);

/// Prepares `body` and drains the body of the first attempt and of two replays.
fn attempts<B>(body: B, cap: usize) -> Attempts<B::Error>
where
    B: Replayable + Body<Data = Bytes> + Unpin + 'static,
{
    let (first, replay) = body.prepare(cap);
    if let Some(replay) = &replay {
        assert_handle(replay);
    }
    let first = drain(first);
    let replays = (0..2)
        .map(|_| replay.as_ref().and_then(Replay::body).map(drain))
        .collect();
    (first, replays)
}

#[test]
fn clonable_bodies_replay_by_cloning() {
    let (first, replays) = attempts(Full::new(Bytes::from_static(b"0123456789")), 4);
    assert_eq!(first.data, chunks(&[b"0123456789"]));
    for replay in replays {
        assert_eq!(
            replay.map(|r| r.data),
            Some(first.data.clone()),
            "shared, not capped"
        );
    }

    let (first, replays) = attempts(Empty::<Bytes>::new(), 0);
    assert!(first.data.is_empty());
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data.is_empty())));

    let (first, replays) = attempts(String::from("hello"), 5);
    assert_eq!(first.data, chunks(&[b"hello"]));
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data == first.data)));
    let (_, replays) = attempts(String::from("hello"), 4);
    assert!(
        replays.iter().all(Option::is_none),
        "a copy over the cap is not kept"
    );

    type Choice = Either<Full<Bytes>, String>;
    let (first, replays) = attempts(Choice::Right(String::from("right")), 64);
    assert_eq!(first.data, chunks(&[b"right"]));
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data == first.data)));
}

#[test]
fn boxed_bodies_replay_through_a_copy_and_stay_boxed() {
    let parts: &[&[u8]] = &[b"one", b"two", b"three"];
    let body: BoxBody<Bytes, BoxError> = frames(parts, Some(trailers("8"))).boxed();
    let (first, replays) = attempts(body, 64);
    assert_eq!(first.data, chunks(parts));
    for replay in replays {
        let replay = replay.expect("under the cap");
        assert_eq!(replay.data, chunks(parts));
        assert_eq!(replay.trailers, Some(trailers("8")));
    }

    let body: UnsyncBoxBody<Bytes, BoxError> = frames(parts, None).boxed_unsync();
    let (first, replays) = attempts(body, 64);
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data == first.data)));

    // Over the cap: sent once.
    let body: BoxBody<Bytes, BoxError> = frames(parts, None).boxed();
    let (first, replay) = body.prepare(10);
    let replay = replay.expect("the size is unknown until streamed");
    assert_eq!(drain(first).data, chunks(parts));
    assert!(replay.is_capped());
    assert!(replay.body().is_none());

    // Known to be over the cap: not even wrapped.
    let body: BoxBody<Bytes, BoxError> = Full::new(Bytes::from_static(b"0123456789"))
        .map_err(Into::into)
        .boxed();
    let (first, replay) = body.prepare(9);
    assert!(replay.is_none());
    assert_eq!(drain(first).data, chunks(&[b"0123456789"]));
}

#[test]
fn a_refused_replay_surfaces_as_the_boxed_bodys_own_error_type() {
    let parts: &[&[u8]] = &[b"01234", b"56789"];
    let body: UnsyncBoxBody<Bytes, BoxError> = frames(parts, None).boxed_unsync();
    let (first, replay) = body.prepare(6);
    let replay = replay.expect("not capped yet");
    // Taken too early: the first attempt then streams past the cap.
    let early = replay.body().expect("not capped yet");
    assert_eq!(drain(first).data, chunks(parts));
    let err = drain(early).error.expect("refused");
    assert_eq!(
        err.downcast_ref::<ReplayRefused>(),
        Some(&ReplayRefused::Capped { cap: 6 })
    );
}

#[test]
fn replay_handles_can_travel_in_extensions() {
    let (_, replay) = frames(&[b"x"], None).boxed_unsync().prepare(64);
    let replay: Replay<UnsyncBoxBody<Bytes, BoxError>> = replay.expect("replayable");
    let mut request = http::Request::new(());
    request.extensions_mut().insert(replay);
    assert!(request
        .extensions()
        .get::<Replay<UnsyncBoxBody<Bytes, BoxError>>>()
        .is_some_and(|r| !r.is_capped()));
    assert_eq!(
        format!("{:?}", Replay::from_fn(String::new)),
        "Replay { capped: false, .. }"
    );
}

#[cfg(feature = "axum")]
#[test]
fn axum_bodies_replay_as_axum_bodies() {
    use axum_core::body::Body as AxumBody;
    let parts: &[&[u8]] = &[b"one", b"two"];
    let (first, replays) = attempts(AxumBody::new(frames(parts, Some(trailers("0")))), 64);
    assert_eq!(first.data, chunks(parts));
    for replay in replays {
        let replay = replay.expect("under the cap");
        assert_eq!(replay.data, chunks(parts));
        assert_eq!(replay.trailers, Some(trailers("0")));
    }
    let (_, replays) = attempts(AxumBody::empty(), 0);
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data.is_empty())));
    let (first, replays) = attempts(AxumBody::new(frames(parts, None)), 5);
    assert_eq!(first.data, chunks(parts));
    assert!(replays.iter().all(Option::is_none));
}

#[cfg(feature = "tonic")]
#[test]
fn tonic_bodies_replay_as_tonic_bodies() {
    use tonic::body::Body as TonicBody;
    let parts: &[&[u8]] = &[b"\0\0\0\0\x03abc", b"\0\0\0\0\x01d"];
    let (first, replays) = attempts(TonicBody::new(frames(parts, None)), 64);
    assert_eq!(first.data, chunks(parts));
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data == first.data)));
    let (_, replays) = attempts(TonicBody::empty(), 0);
    assert!(replays
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.data.is_empty())));
    let (first, replays) = attempts(TonicBody::new(frames(parts, None)), 10);
    assert_eq!(first.data, chunks(parts));
    assert!(replays.iter().all(Option::is_none));
}

/// A real `Incoming` on both sides of an HTTP/1 exchange over an in-memory pipe: it is
/// sent once (no replay) and streams untouched.
#[cfg(feature = "hyper")]
#[tokio::test]
async fn hyper_incoming_is_sent_once_and_streams_untouched() -> Result<(), BoxError> {
    use hyper::{body::Incoming, service::service_fn, Request, Response};
    use hyper_util::rt::TokioIo;

    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let echo = service_fn(|request: Request<Incoming>| async move {
            let (body, replay) = request.into_body().prepare(DEFAULT_REPLAY_CAP);
            assert!(replay.is_none());
            let bytes = body.collect().await?.to_bytes();
            Ok::<_, hyper::Error>(Response::new(Full::new(bytes)))
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), echo)
            .await
    });
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(client_io)).await?;
    let client = tokio::spawn(connection);

    let request = Request::post("/").body(frames(&[b"stream", b"ed"], None))?;
    let response = sender.send_request(request).await?;
    let (body, replay) = response.into_body().prepare(DEFAULT_REPLAY_CAP);
    assert!(replay.is_none());
    assert_eq!(body.collect().await?.to_bytes(), "streamed");

    drop(sender);
    client.await??;
    server.await??;
    Ok(())
}

// === properties ===

fn arb_chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..8)
}

proptest! {
    /// Any chunking, any cap, a first attempt dropped after any number of frames: the
    /// replay gives back exactly the original frames and trailers whenever the copy was
    /// still under the cap when it was asked for, and the body is capped exactly when it is
    /// larger than the cap.
    #[test]
    fn replays_are_exact_or_refused(
        parts in arb_chunks(),
        with_trailers in any::<bool>(),
        cap in 0usize..160,
        read_first in 0usize..10,
    ) {
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let original = chunks(&slices);
        let trailers = with_trailers.then(|| trailers("8"));
        let total: usize = parts.iter().map(Vec::len).sum();
        let body: BoxBody<Bytes, BoxError> = frames(&slices, trailers.clone()).boxed();

        let (mut first, replay) = body.prepare(cap);
        let replay = replay.expect("unknown size: wrapped");
        let partial = drain_some(&mut first, read_first);
        prop_assert!(partial.error.is_none());
        prop_assert_eq!(&partial.data[..], &original[..partial.data.len()]);
        drop(first);

        let read: usize = original.iter().take(read_first).map(Bytes::len).sum();
        prop_assert_eq!(replay.is_capped(), read > cap);
        match replay.body() {
            None => prop_assert!(read > cap),
            Some(next) => {
                let replayed = drain(next);
                prop_assert!(replayed.error.is_none());
                prop_assert_eq!(replayed.data, original.clone());
                prop_assert_eq!(replayed.trailers, trailers.clone());
                prop_assert_eq!(replay.is_capped(), total > cap);
                prop_assert_eq!(replay.body().is_some(), total <= cap);
            }
        }
    }
}
