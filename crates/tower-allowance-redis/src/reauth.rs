//! Periodic re-authentication: every [`RedisStoreOptions::reauth_interval`]
//! (crate::RedisStoreOptions::reauth_interval) while the store is in use, a fresh connection
//! authenticates with the URL's credentials and sends `PING`, off the request path. The live
//! connection stays authenticated after a password is rotated on the server, so without this
//! the rotation is invisible until the next reconnect (hours later, when every process fails
//! within seconds); with it, it is a WARN within one interval, naming the cause, and an INFO
//! once the credentials are accepted again. An outage is not this check's business (the
//! store's calls report it).

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use crate::{error::is_outage, link::Link};

/// Starts the re-authentication of `link` on `handle`, once per link, when an interval is
/// set and the link has a client to connect with; it ends when the link is dropped.
pub(crate) fn start(link: &Arc<Link>, handle: &tokio::runtime::Handle) {
    let Some(interval) = link.options.reauth_interval.filter(|i| !i.is_zero()) else {
        return;
    };
    let Some(client) = link.events.source().cloned() else {
        return;
    };
    if link.reauth_started.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = Arc::downgrade(link);
    handle.spawn(async move {
        let mut refused = false;
        loop {
            tokio::time::sleep(interval).await;
            let Some(link) = weak.upgrade() else { return };
            let (timeout, url) = (link.options.connect_timeout, link.redacted.clone());
            drop(link);
            match authenticate(&client, timeout).await {
                Some(Err(why)) if !refused => {
                    refused = true;
                    tracing::warn!(
                        redis = %url,
                        error = %why,
                        "redis refuses this process's credentials on a fresh connection (a \
                         rotated password, a disabled user?): the live connection still \
                         works, but its next reconnect will fail every call; update the \
                         credentials"
                    );
                }
                Some(Ok(())) if refused => {
                    refused = false;
                    tracing::info!(redis = %url, "redis accepts this process's credentials again");
                }
                _ => {}
            }
        }
    });
}

/// A fresh connection's `AUTH` (from the URL) and `PING`: `None` when Redis could not be
/// asked (an outage, a timeout), else whether it accepted them.
pub(crate) async fn authenticate(
    client: &redis::Client,
    timeout: Duration,
) -> Option<Result<(), String>> {
    let conn = tokio::time::timeout(timeout, client.get_multiplexed_async_connection()).await;
    let mut conn = match conn {
        Err(_) => return None,
        Ok(Err(e)) if is_outage(&e) => return None,
        Ok(Err(e)) => return Some(Err(e.to_string())),
        Ok(Ok(conn)) => conn,
    };
    let ping = redis::cmd("PING");
    match tokio::time::timeout(timeout, ping.query_async::<String>(&mut conn)).await {
        Err(_) => None,
        Ok(Err(e)) if is_outage(&e) => None,
        Ok(Err(e)) => Some(Err(e.to_string())),
        Ok(Ok(_)) => Some(Ok(())),
    }
}
