//! `rediss://` through rustls against a private `redis-server` that serves TLS only, with a
//! CA and certificates this test generates: admissions, a cooldown seen by a second
//! connection, events over the TLS subscription, the conformance suite (whose blocking
//! connection is TLS too), mutual TLS, and the errors for an untrusted server or bad PEM.

mod support;

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use tokio::time::Instant;
use tower_allowance::{Allowance, AllowanceConfig};
use tower_allowance_redis::{
    error::ConnectErrorKind,
    test_util::{unique_name, TestRedis, TlsServerFiles},
    FailurePolicy, RedisStore, RedisStoreOptions,
};

use support::MS;

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it.
struct Pki {
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

fn new_pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tower-allowance-redis test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    let server_key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&server_key, &ca)
        .expect("server certificate");
    let client_key = KeyPair::generate().expect("client key");
    let mut client_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    client_params
        .distinguished_name
        .push(DnType::CommonName, "allowance worker");
    let client = client_params
        .signed_by(&client_key, &ca)
        .expect("client certificate");
    Pki {
        ca_pem: ca.pem(),
        server_cert_pem: server.pem(),
        server_key_pem: server_key.serialize_pem(),
        client_cert_pem: client.pem(),
        client_key_pem: client_key.serialize_pem(),
    }
}

fn files(pki: &Pki, require_client_cert: bool) -> TlsServerFiles {
    TlsServerFiles {
        cert_pem: pki.server_cert_pem.clone(),
        key_pem: pki.server_key_pem.clone(),
        ca_pem: pki.ca_pem.clone(),
        require_client_cert,
    }
}

fn trusting(pki: &Pki) -> RedisStoreOptions {
    RedisStoreOptions::new().tls_ca_cert(pki.ca_pem.clone())
}

/// A client for inspection commands over TLS.
fn inspector(redis: &TestRedis, pki: &Pki) -> redis::Client {
    redis::Client::build_with_tls(
        redis.url(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pki.ca_pem.clone().into_bytes()),
        },
    )
    .expect("TLS client")
}

#[tokio::test]
async fn admissions_and_a_shared_cooldown_over_tls() {
    let pki = new_pki();
    let redis = TestRedis::start_tls(&files(&pki, false)).await;
    assert!(redis.url().starts_with("rediss://"));
    let name = unique_name("tls");
    let connect = || RedisStore::connect(redis.url(), &name, trusting(&pki));
    let a_store = connect().await.expect("connect over TLS");
    let b_store = connect().await.expect("a second connection");
    let config = AllowanceConfig::per_second(10, 3).expect("valid").exact();
    let a = Allowance::with_store(config.clone(), a_store.clone());
    let b = Allowance::with_store(config, b_store.clone());

    // The burst of 3, shared: A takes 2, B 1, and B's next one waits for a token.
    a.acquire().await.expect("admitted");
    a.acquire().await.expect("admitted");
    b.acquire().await.expect("admitted");
    assert_eq!(
        (a.snapshot().waited, b.snapshot().waited),
        (0, 0),
        "the burst is admitted at once"
    );
    b.acquire().await.expect("admitted after a token");
    assert_eq!(
        b.snapshot().waited,
        1,
        "the fourth admission waited for a token"
    );
    assert_eq!(
        a_store.round_trips(),
        1 + 2,
        "preload, then one per admission"
    );

    // A cooldown raised over one TLS connection holds the other.
    a.extend_cooldown(1_000 * MS).await.expect("defer");
    let held = Instant::now();
    b.acquire().await.expect("admitted after the cooldown");
    let waited = held.elapsed();
    // At least the cooldown (load only delays); at most 300 ms past it in the real-time
    // runner, 5 s more in the default suite (`support::slack`).
    assert!(
        waited >= 950 * MS && waited <= 1_000 * MS + support::slack(300 * MS),
        "B waited {waited:?}, want ~1 s"
    );
    // The state is a key on the TLS server.
    let mut conn = inspector(&redis, &pki)
        .get_multiplexed_async_connection()
        .await
        .expect("inspection over TLS");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(a_store.key())
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 1);
}

#[tokio::test]
async fn events_reach_a_holder_over_the_tls_subscription() {
    let pki = new_pki();
    let redis = TestRedis::start_tls(&files(&pki, false)).await;
    let name = unique_name("tls-events");
    let a = RedisStore::connect(redis.url(), &name, trusting(&pki))
        .await
        .expect("A");
    let b = RedisStore::connect(redis.url(), &name, trusting(&pki))
        .await
        .expect("B");
    support::a_cooldown_moves_a_slot_held_elsewhere(a, b, &inspector(&redis, &pki)).await;
}

/// The public conformance suite over TLS: stores made on a real-time runtime, the suite on
/// a paused one through each store's blocking TLS connection (`follow_tokio_clock`).
#[test]
fn conformance_over_tls() {
    let pki = new_pki();
    let made = support::real().block_on(async {
        let redis = TestRedis::start_tls(&files(&pki, false)).await;
        let store = RedisStore::connect(redis.url(), &unique_name("tls-conf"), trusting(&pki))
            .await
            .expect("connect over TLS");
        (redis, store)
    });
    let (_redis, base) = made;
    support::run_conformance(&base);
}

#[tokio::test]
async fn mutual_tls_presents_the_client_certificate() {
    let pki = new_pki();
    let redis = TestRedis::start_tls(&files(&pki, true)).await;
    let name = unique_name("mtls");
    let options =
        trusting(&pki).tls_client_cert(pki.client_cert_pem.clone(), pki.client_key_pem.clone());
    assert!(
        !format!("{options:?}").contains("PRIVATE KEY"),
        "the key never shows"
    );
    let store = RedisStore::connect(redis.url(), &name, options)
        .await
        .expect("connect with a client certificate");
    let allowance = Allowance::with_store(AllowanceConfig::per_second(5, 1).expect("valid"), store);
    allowance.acquire().await.expect("admitted");

    // Without one, the server refuses us: a refusal, not an outage, even with a fallback.
    let options = trusting(&pki)
        .connect_timeout(Duration::from_secs(1))
        .failure_policy(FailurePolicy::LocalFallback {
            expected_processes: std::num::NonZeroU32::MIN,
        });
    let err = RedisStore::connect(redis.url(), &name, options)
        .await
        .expect_err("no client certificate");
    eprintln!(
        "without a client certificate: {err}: {:?}",
        std::error::Error::source(&err)
    );
    assert_eq!(err.kind(), ConnectErrorKind::Refused);
}

#[tokio::test]
async fn an_untrusted_server_is_refused_not_an_outage() {
    let pki = new_pki();
    let redis = TestRedis::start_tls(&files(&pki, false)).await;
    // The system's roots do not vouch for the test CA. Waiting will not change that: refused
    // at once, whatever the failure policy.
    let options = RedisStoreOptions::new()
        .connect_timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::LocalFallback {
            expected_processes: std::num::NonZeroU32::MIN,
        });
    let started = Instant::now();
    let err = RedisStore::connect(redis.url(), &unique_name("untrusted"), options)
        .await
        .expect_err("untrusted certificate");
    eprintln!("untrusted: {err}: {:?}", std::error::Error::source(&err));
    assert_eq!(err.kind(), ConnectErrorKind::Refused);
    // A refused handshake takes milliseconds on loopback; the 2 s connect timeout is a
    // margin of some hundred times over it even on a loaded machine, and is what the check
    // is about (refused, not timed out).
    assert!(
        started.elapsed() < 2_000 * MS,
        "refused before the connect timeout"
    );

    // Another CA than the one that signed the server's certificate: refused too.
    let other = new_pki();
    let err = RedisStore::connect(redis.url(), &unique_name("untrusted"), trusting(&other))
        .await
        .expect_err("a CA that did not sign it");
    assert_eq!(err.kind(), ConnectErrorKind::Refused);
}

#[tokio::test]
async fn bad_tls_options_are_refused_before_connecting() {
    let pki = new_pki();
    // No server needed: nothing is sent.
    let cases = [
        (
            "rediss://127.0.0.1:1/",
            RedisStoreOptions::new().tls_ca_cert("not a certificate"),
        ),
        (
            "rediss://127.0.0.1:1/",
            RedisStoreOptions::new().tls_ca_cert(
                "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
            ),
        ),
        (
            "rediss://127.0.0.1:1/",
            trusting(&pki).tls_client_cert(pki.client_cert_pem.clone(), "no key"),
        ),
        ("redis://127.0.0.1:1/", trusting(&pki)),
    ];
    for (url, options) in cases {
        let err = RedisStore::connect(url, "tls-options", options.clone())
            .await
            .expect_err("refused");
        assert_eq!(
            err.kind(),
            ConnectErrorKind::InvalidTls,
            "{url} {options:?}: {err}"
        );
    }
}
