//! Other processes' events: one subscription per connection, whatever the number of
//! allowances over it.
//!
//! The script publishes each cooldown, closure and clearing on the allowance's channel
//! (`ta:{name}:ev`). Every allowance made from one constructor call (and
//! [`for_allowance`](crate::RedisStore::for_allowance)) shares one pub/sub connection, which
//! subscribes to each allowance's channel when the allowance is first used and delivers each
//! message to the stores listening on that channel.
//!
//! On a Redis Cluster a plain `PUBLISH` reaches the subscribers of every node (the cluster
//! bus forwards it), so the subscription may sit on any node: the first seed URL, then the
//! next ones in turn after a failure.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError, Weak,
    },
    time::Duration,
};

use redis::aio::PubSubSink;
use tower_allowance::rule::{Event, EVENT_WORDS};

use crate::store::Inner;

/// The subscription shared by the allowances of one connection.
pub(crate) struct Events {
    /// Where the subscription can be made, tried in turn; none: no events are heard.
    sources: Vec<redis::Client>,
    connect_timeout: Duration,
    /// The stores listening on each channel.
    routes: Mutex<HashMap<String, Vec<Weak<Inner>>>>,
    /// The live subscription's command half, to subscribe channels registered later.
    sink: Mutex<Option<PubSubSink>>,
    started: AtomicBool,
}

impl Events {
    pub(crate) fn new(sources: Vec<redis::Client>, connect_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            sources,
            connect_timeout,
            routes: Mutex::new(HashMap::new()),
            sink: Mutex::new(None),
            started: AtomicBool::new(false),
        })
    }

    /// Whether events can be heard at all (a source was given).
    pub(crate) fn enabled(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Delivers `store`'s channel to it from now on; starts the subscription on `handle` the
    /// first time. Returns whether the store is (or will be) subscribed.
    pub(crate) fn register(
        self: &Arc<Self>,
        store: &Arc<Inner>,
        handle: &tokio::runtime::Handle,
    ) -> bool {
        if !self.enabled() {
            return false;
        }
        let channel = store.channel.clone();
        let new_channel = {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            let listeners = routes.entry(channel.clone()).or_default();
            listeners.retain(|w| w.strong_count() > 0);
            listeners.push(Arc::downgrade(store));
            listeners.len() == 1
        };
        // Registered before the sink is read: either the sink is there and subscribes the
        // channel here, or the subscription task publishes its sink later and then reads
        // every channel registered (this one included).
        if new_channel {
            let sink = self
                .sink
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(mut sink) = sink {
                let timeout = self.connect_timeout;
                let store = Arc::downgrade(store);
                handle.spawn(async move {
                    // A failure here is a failed connection: the task resubscribes everything.
                    let subscribed = tokio::time::timeout(timeout, sink.subscribe(&channel)).await;
                    if matches!(subscribed, Ok(Ok(()))) {
                        // Events published before the subscription took effect were missed:
                        // the store reads the state and its holders catch up.
                        if let Some(store) = store.upgrade() {
                            store.deliver(None);
                        }
                    }
                });
            }
        }
        if !self.started.swap(true, Ordering::AcqRel) {
            handle.spawn(run(Arc::downgrade(self)));
        }
        true
    }

    /// Every live store listening on some channel.
    fn listeners(&self) -> Vec<Arc<Inner>> {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .flatten()
            .filter_map(Weak::upgrade)
            .collect()
    }

    fn dispatch(&self, channel: &str, event: Event) {
        let stores: Vec<Arc<Inner>> = self
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(channel)
            .map(|l| l.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for store in stores {
            store.deliver(Some(event));
        }
    }

    /// Forgets stores that are gone (their channels stay subscribed: a stray message for
    /// a channel nobody listens to is dropped).
    fn prune(&self) {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, listeners| {
                listeners.retain(|w| w.strong_count() > 0);
                !listeners.is_empty()
            });
    }

    fn set_sink(&self, sink: Option<PubSubSink>) {
        *self.sink.lock().unwrap_or_else(PoisonError::into_inner) = sink;
    }

    fn channels(&self) -> Vec<String> {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }
}

/// The subscription task: connects, subscribes every registered channel, delivers messages,
/// and after a dropped connection tells every store to resync (events may have been lost),
/// then reconnects with backoff. Ends when the last store of the connection is dropped.
async fn run(events: Weak<Events>) {
    let mut backoff = Duration::from_millis(50);
    let mut source = 0;
    loop {
        let Some(hub) = events.upgrade() else {
            return;
        };
        let client = hub.sources[source % hub.sources.len()].clone();
        source += 1;
        let timeout = hub.connect_timeout;
        drop(hub);

        let connected = tokio::time::timeout(timeout, client.get_async_pubsub()).await;
        let Ok(Ok(pubsub)) = connected else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        };
        let (mut sink, mut messages) = pubsub.split();
        let Some(hub) = events.upgrade() else {
            return;
        };
        hub.set_sink(Some(sink.clone()));
        let channels = hub.channels();
        drop(hub);
        if !channels.is_empty() {
            let subscribed = tokio::time::timeout(timeout, sink.subscribe(&channels)).await;
            if !matches!(subscribed, Ok(Ok(()))) {
                if let Some(hub) = events.upgrade() {
                    hub.set_sink(None);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        }
        backoff = Duration::from_millis(50);
        // Subscribed (first time, or again after a dropped connection): whatever was published
        // before now was missed, so every store reads the state and its holders catch up.
        if let Some(hub) = events.upgrade() {
            for store in hub.listeners() {
                store.deliver(None);
            }
        }
        loop {
            // Wake now and then to notice that every store is gone.
            let next = tokio::time::timeout(
                Duration::from_secs(1),
                futures_util::StreamExt::next(&mut messages),
            )
            .await;
            let Some(hub) = events.upgrade() else {
                return;
            };
            match next {
                Err(_) => hub.prune(),
                Ok(None) => {
                    hub.set_sink(None);
                    break;
                }
                Ok(Some(msg)) => {
                    let payload: String = msg.get_payload().unwrap_or_default();
                    if let Some(event) = parse_event(&payload) {
                        hub.dispatch(msg.get_channel_name(), event);
                    }
                }
            }
        }
    }
}

/// `generation,epoch,rebased,kind,w4,w5,...` as published by `apply.lua`.
pub(crate) fn parse_event(payload: &str) -> Option<Event> {
    let words: Vec<u64> = payload
        .split(',')
        .enumerate()
        .map(|(i, w)| match (i, w) {
            (4, "-1") => Some(tower_allowance::rule::FOREVER),
            (_, w) => w.parse().ok(),
        })
        .collect::<Option<_>>()?;
    if words.len() != EVENT_WORDS {
        return None;
    }
    Event::from_words(&words)
}
