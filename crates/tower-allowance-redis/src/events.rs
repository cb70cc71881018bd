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
//!
//! A store's first operation waits until its channel is subscribed (for at most the connect
//! timeout, see `gate`): a reservation made before could miss an event
//! published in between, and catching up would cost a read. So a catch-up read happens only
//! where an event can really have been missed: after a dropped subscription comes back (or
//! for holders made while the subscription could not be had at all).

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

/// A store listening on its channel, as the subscription sees it (the store implements it, so
/// this module needs nothing of the store's).
pub(crate) trait Listener: Send + Sync {
    /// The channel it listens on.
    fn channel(&self) -> &str;
    /// The subscription confirmed its channel. Returns whether it was listening before:
    /// then events may have been missed, and it is sent a catch-up (`deliver(None)`).
    fn listening(&self) -> bool;
    /// An event on its channel, or `None`: events may have been missed, resync.
    fn deliver(&self, event: Option<Event>);
    /// A newer configuration took over the name (`VERSION;TEXT`, see `config_check`).
    fn configured(&self, _config: &str) {}
}

/// The stores listening on one channel.
#[derive(Default)]
struct Route {
    listeners: Vec<Weak<dyn Listener>>,
    /// Whether the live subscription has confirmed this channel.
    subscribed: bool,
}

/// The subscription shared by the allowances of one connection.
pub(crate) struct Events {
    /// Where the subscription can be made, tried in turn; none: no events are heard.
    sources: Vec<redis::Client>,
    connect_timeout: Duration,
    /// The stores listening on each channel, and whether it is subscribed now.
    routes: Mutex<HashMap<String, Route>>,
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

    /// The first place the subscription is made (the connect-time permission check uses it).
    pub(crate) fn source(&self) -> Option<&redis::Client> {
        self.sources().first()
    }

    /// Every place the subscription can be made, in the order they are tried.
    pub(crate) fn sources(&self) -> &[redis::Client] {
        &self.sources
    }

    /// Delivers `store`'s channel to it from now on; starts the subscription on `handle` the
    /// first time. Returns whether the store is (or will be) subscribed.
    pub(crate) fn register<L: Listener + 'static>(
        self: &Arc<Self>,
        store: &Arc<L>,
        handle: &tokio::runtime::Handle,
    ) -> bool {
        if !self.enabled() {
            return false;
        }
        let channel = store.channel().to_owned();
        let (new_channel, subscribed) = {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            let route = routes.entry(channel.clone()).or_default();
            route.listeners.retain(|w| w.strong_count() > 0);
            let listener: Weak<L> = Arc::downgrade(store);
            route.listeners.push(listener);
            (route.listeners.len() == 1, route.subscribed)
        };
        if subscribed {
            // Another store of this channel brought the subscription up already.
            store.listening();
        }
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
                let events = Arc::downgrade(self);
                handle.spawn(async move {
                    // A failure here is a failed connection: the task resubscribes everything.
                    let subscribed = tokio::time::timeout(timeout, sink.subscribe(&channel)).await;
                    if matches!(subscribed, Ok(Ok(()))) {
                        if let Some(events) = events.upgrade() {
                            events.confirmed(&[channel]);
                        }
                    } else if let Ok(Err(e)) = &subscribed {
                        log_refusal(e, std::slice::from_ref(&channel));
                    }
                });
            }
        }
        if !self.started.swap(true, Ordering::AcqRel) {
            handle.spawn(run(Arc::downgrade(self)));
        }
        true
    }

    /// The subscription took effect for `channels`: their stores are listening from now on.
    /// A store that was listening before (a subscription that dropped and came back) may have
    /// missed events meanwhile, and catches up.
    fn confirmed(&self, channels: &[String]) {
        let mut stores: Vec<Arc<dyn Listener>> = Vec::new();
        {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            for channel in channels {
                let Some(route) = routes.get_mut(channel) else {
                    continue;
                };
                // Confirmed twice (the task and a late registration both subscribed it): the
                // second confirmation is not news.
                if std::mem::replace(&mut route.subscribed, true) {
                    continue;
                }
                stores.extend(route.listeners.iter().filter_map(Weak::upgrade));
            }
        }
        for store in stores {
            if store.listening() {
                store.deliver(None);
            }
        }
    }

    /// The stores listening on `channel` now (the lock released before they are called).
    fn listeners(&self, channel: &str) -> Vec<Arc<dyn Listener>> {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(channel)
            .map(|r| r.listeners.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    }

    fn dispatch(&self, channel: &str, event: Event) {
        let stores = self.listeners(channel);
        for store in stores {
            store.deliver(Some(event));
        }
    }

    fn configured(&self, channel: &str, config: &str) {
        let stores = self.listeners(channel);
        for store in stores {
            store.configured(config);
        }
    }

    /// Forgets stores that are gone (their channels stay subscribed: a stray message for
    /// a channel nobody listens to is dropped).
    fn prune(&self) {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, route| {
                route.listeners.retain(|w| w.strong_count() > 0);
                !route.listeners.is_empty()
            });
    }

    fn set_sink(&self, sink: Option<PubSubSink>) {
        if sink.is_none() {
            // The connection is gone: no channel is subscribed until it is back.
            for route in self
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values_mut()
            {
                route.subscribed = false;
            }
        }
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
            if let Ok(Err(e)) = &connected {
                if log_refusal(e, &[]) {
                    backoff = REFUSED_BACKOFF;
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2).max(backoff));
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
                if let Ok(Err(e)) = &subscribed {
                    if log_refusal(e, &channels) {
                        backoff = REFUSED_BACKOFF;
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2).max(backoff));
                continue;
            }
        }
        backoff = Duration::from_millis(50);
        // Subscribed: stores waiting for their first operation go ahead; stores that listened
        // before (the connection dropped) may have missed events, and catch up.
        if let Some(hub) = events.upgrade() {
            hub.confirmed(&channels);
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
                    } else if let Some(config) = payload.strip_prefix("k:") {
                        hub.configured(msg.get_channel_name(), config);
                    }
                }
            }
        }
    }
}

/// How long the subscription waits after Redis refused it (a missing ACL permission, a
/// changed password) before trying again: waiting will not help until an operator acts.
const REFUSED_BACKOFF: Duration = Duration::from_secs(30);

/// Logs a refused subscription (`NOPERM`, a wrong password) as an error naming the fix, and
/// returns whether it was one: never retried silently. Outages return `false` (the reconnect
/// loop is for them).
fn log_refusal(e: &redis::RedisError, channels: &[String]) -> bool {
    if crate::error::is_outage(e) {
        return false;
    }
    tracing::error!(
        error = %e,
        channels = ?channels,
        "redis refused the event subscription: other processes' cooldowns do not reach the \
         callers waiting here; grant `ACL SETUSER <user> +subscribe &<channel>` (or fix the \
         password); retrying in {REFUSED_BACKOFF:?}"
    );
    true
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
