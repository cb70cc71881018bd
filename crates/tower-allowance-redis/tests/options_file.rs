//! `RedisStoreOptions` from configuration files (feature `serde`): every field, the defaults,
//! and errors that name their field.

use std::{num::NonZeroU32, time::Duration};

use tower_allowance_redis::{FailurePolicy, RedisStoreOptions};

fn parse(text: &str) -> Result<RedisStoreOptions, String> {
    toml::from_str::<RedisStoreOptions>(text).map_err(|e| e.to_string())
}

#[test]
fn every_field_reads_as_people_write_it() {
    let options = parse(
        r#"
        timeout = "100ms"
        connect_timeout = "3s"
        probe_interval = "1s 500ms"
        idle_ttl = "2h"
        failure_policy = { local_fallback = { expected_processes = 4 } }
        "#,
    )
    .expect("valid");
    let expected = RedisStoreOptions::new()
        .timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(3))
        .probe_interval(Duration::from_millis(1500))
        .idle_ttl(Duration::from_secs(7200))
        .failure_policy(FailurePolicy::LocalFallback {
            expected_processes: NonZeroU32::new(4).expect("non-zero"),
        });
    assert_eq!(options, expected);
    assert_eq!(
        parse("").expect("empty is the defaults"),
        RedisStoreOptions::new()
    );
    assert_eq!(
        parse(r#"failure_policy = "report""#).expect("valid"),
        RedisStoreOptions::new()
    );
}

#[test]
fn mistakes_name_their_field() {
    for (text, needle) in [
        (r#"timeout = "0s""#, "timeout: must be longer than zero"),
        (
            r#"connect_timeout = "0ms""#,
            "connect_timeout: must be longer than zero",
        ),
        (
            r#"probe_interval = "0s""#,
            "probe_interval: must be longer than zero",
        ),
        (r#"timeout = "soon""#, "timeout"),
        (r#"timeout = 250"#, "timeout"),
        (r#"timout = "1s""#, "unknown field `timout`"),
        (r#"failure_policy = "fail_closed""#, "failure_policy"),
        (
            r#"failure_policy = { local_fallback = { expected_processes = 0 } }"#,
            "expected_processes",
        ),
        (r#"tls = { ca_cert = "x" }"#, "unknown field `ca_cert`"),
        (
            r#"tls = { ca_cert_file = "/nonexistent/ca.crt" }"#,
            "tls.ca_cert_file: cannot read /nonexistent/ca.crt",
        ),
        (
            r#"tls = { client_cert_file = "/nonexistent/c.crt" }"#,
            "tls.client_key_file: a client certificate needs its key",
        ),
    ] {
        let err = parse(text).expect_err(text);
        assert!(err.contains(needle), "{text}: {err:?} lacks {needle:?}");
    }
}

#[test]
fn certificates_are_read_from_their_files() {
    let dir = std::env::temp_dir().join(format!("ta-options-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (ca, cert, key) = (dir.join("ca.pem"), dir.join("c.pem"), dir.join("k.pem"));
    std::fs::write(&ca, "CA PEM").expect("write");
    std::fs::write(&cert, "CERT PEM").expect("write");
    std::fs::write(&key, "KEY PEM").expect("write");
    let text = format!(
        "tls = {{ ca_cert_file = {:?}, client_cert_file = {:?}, client_key_file = {:?} }}",
        ca.display().to_string(),
        cert.display().to_string(),
        key.display().to_string()
    );
    let options = parse(&text).expect("valid");
    let expected = RedisStoreOptions::new()
        .tls_ca_cert("CA PEM")
        .tls_client_cert("CERT PEM", "KEY PEM");
    assert_eq!(options, expected);
    // The key stays out of Debug output, from a file as from code.
    assert!(!format!("{options:?}").contains("KEY PEM"));
    let _ = std::fs::remove_dir_all(&dir);
}
