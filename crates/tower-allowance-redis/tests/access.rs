//! Redis locked down as operators run it: ACL users lacking each permission the store needs
//! fail `connect` at once, typed, naming the permission and the fix; a password changed
//! under a running allowance fails every caller at once with the typed cause. Each test owns
//! a private `redis-server`. Real time; the upper bounds add `support::LOADED_MARGIN`.

mod support;

use std::{
    error::Error,
    process::{Child, Command, Stdio},
    time::Duration,
};

use tokio::time::Instant;
use tower_allowance::{error::AcquireError, store::StoreErrorKind, Allowance, AllowanceConfig};
use tower_allowance_redis::{
    error::{ConnectError, ConnectErrorKind, MissingPermission},
    test_util::{unique_name, TestRedis},
    RedisStore, RedisStoreOptions,
};

use support::{slack, MS};

/// Creates the ACL user `user` (password `pw`) with everything but what `rules` take away.
async fn user(redis: &TestRedis, user: &str, rules: &[&str]) -> String {
    let mut cmd = vec!["ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all"];
    cmd.extend_from_slice(rules);
    let reply = redis.command(&cmd).await;
    assert!(reply.starts_with("+OK"), "{reply}");
    redis
        .url()
        .replacen("redis://", &format!("redis://{user}:pw@"), 1)
}

async fn refused(url: &str, name: &str) -> ConnectError {
    RedisStore::connect(url, name, RedisStoreOptions::new())
        .await
        .expect_err("a permission is missing")
}

fn missing(e: &ConnectError) -> &MissingPermission {
    assert_eq!(e.kind(), ConnectErrorKind::MissingPermission, "{e:?}");
    e.source()
        .and_then(|s| s.downcast_ref::<MissingPermission>())
        .unwrap_or_else(|| panic!("no MissingPermission under {e:?}"))
}

#[tokio::test]
async fn each_missing_permission_fails_connect_naming_it_and_the_fix() {
    let redis = TestRedis::start_private().await;
    let name = unique_name("acl");
    let channel = format!("ta:{{{name}}}:ev");
    // (rules taken away, what the error must name, what the fix must grant)
    let cases: [(&str, &[&str], &str, &str); 4] = [
        ("nopub", &["-publish"], "PUBLISH", "+publish"),
        ("nosub", &["-subscribe"], "SUBSCRIBE", "+subscribe"),
        // Neither the function library nor the script can be loaded.
        (
            "noload",
            &["-script", "-function"],
            "SCRIPT LOAD",
            "+script|load",
        ),
        // Redis 7's default for new users: no channel at all.
        ("nochan", &["resetchannels"], "PUBLISH", "&"),
    ];
    for (who, rules, names, fix) in cases {
        let url = user(&redis, who, rules).await;
        let started = Instant::now();
        let e = refused(&url, &name).await;
        let took = started.elapsed();
        let m = missing(&e);
        assert!(m.permission().contains(names), "{who}: {m}");
        assert!(m.fix().contains(fix), "{who}: {m}");
        assert!(m.fix().contains(who), "{who}: {m}");
        if names == "PUBLISH" || names == "SUBSCRIBE" {
            assert!(m.permission().contains(&channel), "{who}: {m}");
        }
        assert!(m.to_string().contains("NOPERM"), "{who}: {m}");
        // Two round trips and two short connections on loopback.
        assert!(took <= slack(500 * MS), "{who}: {took:?}");
    }
    // EVALSHA and the keys: the first decision tries them (a probe EVALSHA would count as a
    // decision in the server's statistics), and fails at once, typed, naming them.
    for (who, rules) in [
        ("noeval", &["-evalsha", "-fcall"][..]),
        ("nokeys", &["resetkeys", "~other:*"][..]),
    ] {
        let url = user(&redis, who, rules).await;
        let store = RedisStore::connect(&url, &name, RedisStoreOptions::new())
            .await
            .expect("connect tries no EVALSHA");
        let allowance =
            Allowance::with_store(AllowanceConfig::per_second(5, 1).expect("valid"), store);
        let err = allowance.acquire().await.expect_err("no EVALSHA");
        let AcquireError::Store(unavailable) = &err else {
            panic!("{err:?}");
        };
        assert_eq!(unavailable.store_error().kind(), StoreErrorKind::Rejected);
        let mut cause: Option<&(dyn Error + 'static)> = Some(unavailable.store_error());
        let m = loop {
            let c = cause.unwrap_or_else(|| panic!("{who}: no MissingPermission in {err:?}"));
            if let Some(m) = c.downcast_ref::<MissingPermission>() {
                break m;
            }
            cause = c.source();
        };
        // Each named as what it is: the command, or the key pattern.
        let (permission, fix) = if who == "noeval" {
            (
                "FCALL or EVALSHA".to_owned(),
                format!("ACL SETUSER {who} +fcall"),
            )
        } else {
            let keys = format!("ta:{{{name}}}:*");
            (keys.clone(), format!("ACL SETUSER {who} ~{keys}"))
        };
        assert!(m.permission().contains(&permission), "{who}: {m}");
        assert!(m.fix().contains(&fix), "{who}: {m}");
    }
    // Everything granted: connects.
    let url = user(&redis, "all", &[]).await;
    RedisStore::connect(&url, &name, RedisStoreOptions::new())
        .await
        .expect("every permission");
}

/// A `redis-server` on `port` requiring `password`, until dropped.
struct Server(Child);

impl Server {
    async fn start(port: u16, password: &str) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                password,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (apt-get install redis-server)");
        let url = format!("redis://:{password}@127.0.0.1:{port}/");
        let client = redis::Client::open(url).expect("url");
        let started = Instant::now();
        while client.get_multiplexed_async_connection().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis never up"
            );
            tokio::time::sleep(20 * MS).await;
        }
        Self(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Restarted with another password: every caller fails at once, typed (a refusal, not an
/// outage to wait out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_another_password_fails_every_caller_at_once() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr").port()
    };
    let server = Server::start(port, "old-password").await;
    let url = format!("redis://:old-password@127.0.0.1:{port}/");
    let store = RedisStore::connect(&url, &unique_name("pw"), RedisStoreOptions::new())
        .await
        .expect("connect");
    let config = AllowanceConfig::per_second(1_000, 100).expect("valid");
    let allowance = Allowance::with_store(config, store);
    allowance.acquire().await.expect("up");

    drop(server);
    let _server = Server::start(port, "new-password").await;
    let started = Instant::now();
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let a = allowance.clone();
            tokio::spawn(async move { a.acquire().await })
        })
        .collect();
    for caller in callers {
        let err = caller
            .await
            .expect("task")
            .expect_err("the password changed");
        let AcquireError::Store(unavailable) = &err else {
            panic!("{err:?}");
        };
        assert_eq!(
            unavailable.store_error().kind(),
            StoreErrorKind::Rejected,
            "{:?}",
            unavailable.store_error()
        );
    }
    let took = started.elapsed();
    // A reconnection or two (50-500 ms of backoff) and one probe interval (500 ms).
    assert!(took <= slack(2_000 * MS), "refused after {took:?}");
}

/// A free port on the loopback.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    l.local_addr().expect("addr").port()
}

/// A server that wants a password the URL does not give: refused at connect (NOAUTH, from
/// the authenticated cheap command the store sends first), never an outage, and never masked
/// by the local fallback.
#[tokio::test]
async fn a_missing_password_is_refused_under_the_local_fallback_too() {
    let port = free_port();
    let _server = Server::start(port, "wanted").await;
    let url = format!("redis://127.0.0.1:{port}/");
    let options = RedisStoreOptions::new().failure_policy(
        tower_allowance_redis::FailurePolicy::LocalFallback {
            expected_processes: std::num::NonZeroU32::MIN,
        },
    );
    let err = RedisStore::connect(&url, &unique_name("noauth"), options)
        .await
        .expect_err("no password");
    assert_eq!(err.kind(), ConnectErrorKind::Refused, "{err:?}");
    let chain = format!("{err} {:?}", err.source());
    assert!(
        chain.contains("NOAUTH") || chain.contains("Authentication"),
        "{chain}"
    );
}

/// What the store logs, for the tests that read it.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

/// A password rotated on the server leaves the live connection authenticated: the periodic
/// re-authentication on a fresh connection turns it into a WARN within an interval or two,
/// while calls still go through (not an outage at the next reconnect, hours later).
#[tokio::test]
async fn a_rotated_password_is_warned_at_rotation_time() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The current-thread runtime runs the re-authentication task on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);
    let port = free_port();
    let _server = Server::start(port, "before").await;
    let url = format!("redis://:before@127.0.0.1:{port}/");
    let options = RedisStoreOptions::new().reauth_interval(Some(100 * MS));
    let store = RedisStore::connect(&url, &unique_name("rotate"), options)
        .await
        .expect("connect");
    let allowance = Allowance::with_store(
        AllowanceConfig::per_second(1_000, 100).expect("valid"),
        store,
    );
    allowance.acquire().await.expect("up");
    tokio::time::sleep(300 * MS).await;
    assert!(!logs.text().contains("credentials"), "{}", logs.text());

    let admin = redis::Client::open(url.as_str()).expect("url");
    let mut conn = admin
        .get_multiplexed_async_connection()
        .await
        .expect("admin");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("after")
        .query_async(&mut conn)
        .await
        .expect("rotated");
    let started = Instant::now();
    while !logs.text().contains("refuses this process's credentials") {
        assert!(
            started.elapsed() < slack(2_000 * MS),
            "never warned: {}",
            logs.text()
        );
        tokio::time::sleep(50 * MS).await;
    }
    assert!(logs.text().contains("WARN"), "{}", logs.text());
    allowance
        .acquire()
        .await
        .expect("the live connection still works");
}
