//! What the store needs of its Redis user: `FUNCTION LOAD` or `SCRIPT LOAD` (tried by the
//! preload, the library first), `PUBLISH`
//! and `SUBSCRIBE` on the allowance's channel (tried here, once, at connect), `EVALSHA` on
//! its keys, or `FCALL` where the library loaded (tried by the first decision: a probe `EVALSHA` would count as a decision in
//! every server's statistics). An ACL user without one of them would otherwise break the
//! cross-process cooldown silently (a cooldown nobody else hears of), so connecting (or the
//! first decision) fails, naming the permission and the `ACL SETUSER` that grants it.
//! (`ACL DRYRUN` would say without trying, but needs admin rights.)

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::{
    is_outage, CallError, CallErrorKind, ConnectError, ConnectErrorKind, MissingPermission,
    RedisCause,
};

/// Tries each permission over short-lived connections of `client` (the events' client: the
/// same server and credentials as the store's; they are not the store's counted round trips).
/// `channel` is the allowance's event channel.
///
/// A Redis that does not answer here is left to the store's own failure handling (the
/// script loaded already); only refusals fail.
pub(crate) async fn check(
    client: &redis::Client,
    channel: &str,
    timeout: Duration,
) -> Result<(), ConnectError> {
    let user = user_of(Some(client));
    let mut conn = match connection(
        tokio::time::timeout(timeout, client.get_multiplexed_async_connection()).await,
    )? {
        Some(conn) => conn,
        None => return Ok(()),
    };
    let mut pipe = redis::pipe();
    // An empty message: listeners read no event in it.
    pipe.ignore_errors().cmd("PUBLISH").arg(channel).arg("");
    let replies = tokio::time::timeout(
        timeout,
        pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut conn),
    )
    .await;
    let replies = match connection(replies)? {
        Some(replies) => replies,
        None => return Ok(()),
    };
    let needs = [(
        format!("PUBLISH to {channel}"),
        format!("ACL SETUSER {user} +publish &{channel}"),
    )];
    for (reply, (permission, fix)) in replies.into_iter().zip(needs) {
        if let Err(e) = reply {
            refused(&e, permission, fix)?;
        }
    }
    drop(conn);

    let pubsub = tokio::time::timeout(timeout, client.get_async_pubsub()).await;
    let Some(mut pubsub) = connection(pubsub)? else {
        return Ok(());
    };
    let subscribed = tokio::time::timeout(timeout, pubsub.subscribe(channel)).await;
    if let Ok(Err(e)) = subscribed {
        refused(
            &e,
            format!("SUBSCRIBE to {channel}"),
            format!("ACL SETUSER {user} +subscribe &{channel}"),
        )?;
    }
    Ok(())
}

/// A connection (or reply) that came, `None` for one that did not (an outage or a timeout:
/// left to the store), or the refusal.
fn connection<T>(
    made: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
) -> Result<Option<T>, ConnectError> {
    match made {
        Ok(Ok(conn)) => Ok(Some(conn)),
        Ok(Err(e)) if is_outage(&e) => Ok(None),
        Ok(Err(e)) => Err(refusal(e)),
        Err(_) => Ok(None),
    }
}

/// `Err` when `e` says the user lacks the permission; other errors pass (a cluster's
/// `MOVED` comes after the ACL check, so it means allowed).
fn refused(e: &RedisError, permission: String, fix: String) -> Result<(), ConnectError> {
    if is_no_perm(e) {
        return Err(missing(e, permission, fix));
    }
    Ok(())
}

fn missing(e: &RedisError, permission: String, fix: String) -> ConnectError {
    ConnectError::new(
        ConnectErrorKind::MissingPermission,
        MissingPermission::new(permission, fix, said(e)),
    )
}

/// The ACL user `client` logs in as (`default` without one; `<user>` when unknown).
pub(crate) fn user_of(client: Option<&redis::Client>) -> String {
    client.map_or_else(
        || "<user>".to_owned(),
        |c| {
            c.get_connection_info()
                .redis_settings()
                .username()
                .unwrap_or("default")
                .to_owned()
        },
    )
}

/// `EVALSHA` (or the keys) refused to the decisions of the allowance `name`, as a call's
/// cause; `None` for another error.
pub(crate) fn no_evalsha(e: &RedisError, name: &str, user: &str) -> Option<MissingPermission> {
    is_no_perm(e).then(|| {
        let keys = format!("ta:{{{name}}}:*");
        // Redis says which: "No permissions to access a key", or "... to run the 'fcall'
        // command".
        let what = said(e).to_ascii_lowercase();
        if what.contains("key") {
            MissingPermission::new(
                format!("access the allowance's keys {keys}"),
                format!("ACL SETUSER {user} ~{keys} (or ~ta:*)"),
                said(e),
            )
        } else {
            MissingPermission::new(
                "run FCALL or EVALSHA".to_owned(),
                format!("ACL SETUSER {user} +fcall +evalsha +eval"),
                said(e),
            )
        }
    })
}

/// A decision's Redis error for the allowance `name`, whose events subscribe with `client`:
/// a `NOPERM` names the permission and the fix.
pub(crate) fn call_error(e: RedisError, name: &str, client: Option<&redis::Client>) -> CallError {
    match no_evalsha(&e, name, &user_of(client)) {
        Some(missing) => CallError::with_source(CallErrorKind::Refused, missing),
        None => CallError::redis(e),
    }
}

/// `SCRIPT LOAD` refused by the store's own preload (`e` is a `NOPERM`).
pub(crate) fn no_script_load(e: &RedisError, user: &str) -> ConnectError {
    missing(
        e,
        "FUNCTION LOAD or SCRIPT LOAD".to_owned(),
        format!("ACL SETUSER {user} +function|load +fcall (or +script|load +evalsha)"),
    )
}

/// A `NOPERM` reply.
pub(crate) fn is_no_perm(e: &RedisError) -> bool {
    // A pipeline's failures come as one error listing each command's.
    e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || e.code() == Some("NOPERM")
        || e.to_string().contains("NoPerm:")
}

/// What Redis said, for the message.
fn said(e: &RedisError) -> String {
    match e.detail() {
        Some(detail) => format!("NOPERM {detail}"),
        None => e.to_string(),
    }
}

/// A refusal while connecting: the password (`WRONGPASS`), a certificate, a database index.
pub(crate) fn refusal(e: RedisError) -> ConnectError {
    ConnectError::new(ConnectErrorKind::Refused, RedisCause(e))
}

/// A connect failure with what it most likely means in front (`WRONGPASS`, `NOAUTH`, a TLS
/// URL to a plain port or the other way round), the client's error kept as the source.
#[derive(Debug)]
struct Hinted {
    hint: &'static str,
    error: CallError,
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.hint)
    }
}

impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// `error` (from connecting to a `rediss://` URL when `tls`), with a hint when its causes
/// tell one.
pub(crate) fn hinted(error: CallError, tls: bool) -> tower_allowance::BoxError {
    let mut text = String::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(c) = cause {
        text.push_str(&c.to_string());
        text.push('\n');
        cause = c.source();
    }
    let hint = if text.contains("AuthenticationFailed") || text.contains("WRONGPASS") {
        "WRONGPASS: redis refused the user name or password of the url (a wrong password, \
         an unknown or disabled user)"
    } else if text.contains("NOAUTH") || text.contains("unauthenticated") {
        "NOAUTH: redis requires a password and the url has none \
         (redis://:PASSWORD@host/ or redis://USER:PASSWORD@host/)"
    } else if tls && error.kind() == CallErrorKind::Timeout {
        "no answer to the TLS handshake: a plain (non-TLS) port says nothing to it; \
         use redis:// for a plain port, rediss:// for the server's tls-port"
    } else if tls && (text.contains("corrupt message") || text.contains("InvalidContentType")) {
        "the server does not speak TLS there: use redis:// for a plain port"
    } else if !tls && (text.contains("reset by peer") || text.contains("onnection closed")) {
        "the server closed the connection at once: a TLS-only port does that to plain \
         text; use rediss:// for a tls-port"
    } else if text.contains("UnknownIssuer") {
        "the server's certificate is not signed by a trusted CA: trust its CA with \
         RedisStoreOptions::tls_ca_cert (allowance-sim: --redis-ca-cert FILE)"
    } else {
        return Box::new(error);
    };
    Box::new(Hinted { hint, error })
}
