//! `allowance-sim http` against an https endpoint: a TLS server on loopback whose certificate
//! (for 127.0.0.1) is signed by a CA the test generates. With `--ca-cert CA.pem` every job
//! completes, in-process and through the built binary (also spread over processes); without
//! it the system's roots do not trust the server, every job fails and the run says why.

use std::{
    path::PathBuf,
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::{pki_types::PrivateKeyDer, ServerConfig};
use serde_json::Value;
use tokio_rustls::TlsAcceptor;

/// A TLS server answering 200 to every GET, on its own runtime; the CA that signed its
/// certificate is written to `ca_pem`.
struct TlsServer {
    port: u16,
    served: Arc<AtomicUsize>,
    ca_pem: PathBuf,
    dir: PathBuf,
    _rt: tokio::runtime::Runtime,
}

impl TlsServer {
    fn start(name: &str) -> Self {
        // A CA, and a certificate for 127.0.0.1 signed by it.
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "allowance-sim test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
        let leaf_key = KeyPair::generate().expect("server key");
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("params")
            .signed_by(&leaf_key, &ca)
            .expect("server certificate");

        let dir =
            std::env::temp_dir().join(format!("allowance-sim-https-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).expect("CA written");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone(), ca.der().clone()],
                PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("binds");
        let port = listener.local_addr().expect("address").port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing served.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |req: Request<Incoming>| {
                        count.fetch_add(1, Ordering::SeqCst);
                        let body = format!("{{\"path\":\"{}\"}}", req.uri().path());
                        async move { Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(body)))) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            port,
            served,
            ca_pem,
            dir,
            _rt: rt,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/v1/items/{{job}}", self.port)
    }

    fn ca_pem(&self) -> &str {
        self.ca_pem.to_str().expect("utf-8 path")
    }

    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const JOBS: u64 = 6;

/// `http --url URL` with six jobs for four shared workers at 50/s, plus `extra`.
fn http_args(url: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "allowance-sim",
        "http",
        "--url",
        url,
        "--mode",
        "shared",
        "--workers",
        "4",
        "--jobs",
        "6",
        "--burst",
        "2",
        "--rate",
        "50",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

fn run_in_process(args: Vec<String>) -> String {
    let mut out = Vec::new();
    allowance_sim::cli::run_args(args, &mut out).expect("runs");
    String::from_utf8(out).expect("utf-8")
}

/// Runs a command whose jobs all fail: the report is printed all the same, and the run
/// ends with [`JobsFailed`](allowance_sim::cli::JobsFailed) (exit status 3 in the binary).
fn run_in_process_failing(args: Vec<String>) -> (String, allowance_sim::cli::JobsFailed) {
    let mut out = Vec::new();
    let err = allowance_sim::cli::run_args(args, &mut out).expect_err("jobs failed");
    let failed = err
        .downcast_ref::<allowance_sim::cli::JobsFailed>()
        .cloned()
        .unwrap_or_else(|| panic!("not a JobsFailed: {err}"));
    (String::from_utf8(out).expect("utf-8"), failed)
}

fn figures(v: &Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    (n("attempts"), n("completed"), n("abandoned"), n("failed"))
}

#[test]
fn https_with_the_test_ca_completes_in_process() {
    let server = TlsServer::start("in-process");
    let out = run_in_process(http_args(
        &server.url(),
        &["--ca-cert", server.ca_pem(), "--json"],
    ));
    let v: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(figures(&v), (JOBS, JOBS, 0, 0), "{v}");
    assert!(v.get("first_error").is_none(), "{v}");
    assert_eq!(server.served(), 6);
}

#[test]
fn https_with_the_test_ca_completes_through_the_binary() {
    let server = TlsServer::start("binary");
    let bin = env!("CARGO_BIN_EXE_allowance-sim");
    // One process, then the workers spread over two (each child gets --ca-cert).
    for processes in ["1", "2"] {
        let before = server.served();
        let args = http_args(
            &server.url(),
            &[
                "--ca-cert",
                server.ca_pem(),
                "--processes",
                processes,
                "--json",
            ],
        );
        let output = Command::new(bin).args(&args[1..]).output().expect("runs");
        assert!(output.status.success(), "{output:?}");
        // Not a terminal: no progress bar, nothing but the report.
        assert!(output.stderr.is_empty(), "{output:?}");
        let v: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
        assert_eq!(
            figures(&v),
            (JOBS, JOBS, 0, 0),
            "{processes} process(es): {v}"
        );
        assert_eq!(server.served() - before, 6);
    }
}

#[test]
fn without_the_ca_the_server_is_refused_and_the_run_says_why() {
    let server = TlsServer::start("refused");
    let (out, failed) = run_in_process_failing(http_args(&server.url(), &["--json"]));
    let v: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["completed"], 0, "{v}");
    assert_eq!(v["failed"], JOBS, "{v}");
    assert_eq!(v["failed_by_cause"]["transport"], JOBS, "{v}");
    assert_eq!(failed.failed as u64, JOBS);
    assert!(failed.to_string().contains("certificate"), "{failed}");
    let error = v["first_error"]
        .as_str()
        .expect("the first error is reported");
    assert!(error.contains("certificate"), "{error}");
    assert_eq!(server.served(), 0);

    // The table says so too.
    let (table, _) = run_in_process_failing(http_args(&server.url(), &[]));
    assert!(table.contains("failed: 6 (first error: "), "{table}");
    assert!(table.contains("failed by cause: transport: 6"), "{table}");
    assert!(table.contains("UnknownIssuer"), "{table}");
}

#[test]
fn a_ca_file_without_certificates_is_refused_up_front() {
    let dir = std::env::temp_dir().join(format!("allowance-sim-https-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("not-a-ca.pem");
    std::fs::write(&path, "hello\n").expect("written");
    let args = http_args(
        "https://127.0.0.1:9/{job}",
        &["--ca-cert", path.to_str().expect("utf-8")],
    );
    let err = allowance_sim::cli::run_args(args, &mut Vec::new()).expect_err("refused");
    std::fs::remove_dir_all(&dir).expect("cleaned up");
    assert!(err.to_string().contains("no PEM certificate"), "{err}");
}
