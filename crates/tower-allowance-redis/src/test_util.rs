//! Test support: a private `redis-server` child process that tests can kill and restart, a
//! TLS one, and a three-node Redis Cluster.
//!
//! [`TestRedis::start`] spawns `redis-server` (or `$REDIS_SERVER_BIN`) on a free loopback
//! port with persistence off, and kills it on drop. When that is impossible it falls back to
//! `$ALLOWANCE_REDIS_URL` if that Redis answers; when neither works it panics with a message
//! naming the fix, CI or not: a test that needs Redis never passes without one.
//! [`TestRedis::start_tls`] serves TLS only, with certificates the test provides;
//! [`TestCluster::start`] makes a cluster of three primaries with `redis-cli --cluster
//! create` (or `$REDIS_CLI_BIN`). Neither falls back to a shared server.
//!
//! ```no_run
//! use tower_allowance_redis::test_util::TestRedis;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let redis = TestRedis::start().await;
//! println!("testing against {}", redis.url());
//! # }
//! ```

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A Redis server for one test: a private child process, or the one at `$ALLOWANCE_REDIS_URL`.
#[derive(Debug)]
pub struct TestRedis {
    url: String,
    server: Option<Private>,
    /// The TLS server's certificate files.
    _dir: Option<TempDir>,
}

#[derive(Debug)]
struct Private {
    port: u16,
    /// Arguments beyond the port and persistence (TLS, cluster).
    args: Vec<String>,
    /// Serves TLS only: ready when it accepts a TCP connection (no plain `PING`).
    tls: bool,
    child: Option<Child>,
}

/// The certificates of a TLS test server, in PEM, as
/// [`TestRedis::start_tls`] gives them to `redis-server`.
#[derive(Clone)]
pub struct TlsServerFiles {
    /// The server's certificate (chain), valid for `127.0.0.1`.
    pub cert_pem: String,
    /// The server certificate's private key.
    pub key_pem: String,
    /// The CA that client certificates must chain to.
    pub ca_pem: String,
    /// Whether clients must present a certificate (`--tls-auth-clients yes`).
    pub require_client_cert: bool,
}

impl std::fmt::Debug for TlsServerFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServerFiles")
            .field("require_client_cert", &self.require_client_cert)
            .finish_non_exhaustive()
    }
}

/// A directory of its own under the system's temporary directory, removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Option<Self> {
        let dir = std::env::temp_dir().join(unique_name(prefix));
        std::fs::create_dir_all(&dir).ok()?;
        Some(Self(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

impl TestRedis {
    /// A private server if one can be spawned, else the one at `$ALLOWANCE_REDIS_URL` once it
    /// answers `PING`.
    ///
    /// # Panics
    ///
    /// When neither is there, CI or not, with a message naming the fix (install
    /// `redis-server`, or point `ALLOWANCE_REDIS_URL` at a running Redis): a test that needs
    /// Redis never passes without one.
    pub async fn start() -> Self {
        if let Some(redis) = Self::spawn().await {
            return redis;
        }
        match std::env::var("ALLOWANCE_REDIS_URL") {
            Ok(url) => {
                if let Err(why) = answers(&url).await {
                    unavailable(&format!(
                        "no redis-server could be spawned and ALLOWANCE_REDIS_URL={url} does not answer PING ({why})"
                    ))
                }
                Self {
                    url,
                    server: None,
                    _dir: None,
                }
            }
            Err(_) => {
                unavailable("no redis-server could be spawned and ALLOWANCE_REDIS_URL is not set")
            }
        }
    }

    /// A private server only (for tests that kill, freeze or restart it).
    ///
    /// # Panics
    ///
    /// When it cannot be spawned, naming the fix (install `redis-server`).
    pub async fn start_private() -> Self {
        match Self::spawn().await {
            Some(redis) => redis,
            None => unavailable(
                "this test kills or restarts its Redis, so it needs a private redis-server, and none could be spawned",
            ),
        }
    }

    /// A private server that speaks TLS only (`--port 0 --tls-port P`), with the given
    /// certificates; its [`url`](Self::url) is `rediss://127.0.0.1:P/`. Clients must trust
    /// `files`' server certificate's CA (`RedisStoreOptions::tls_ca_cert`, feature `tls`).
    ///
    /// [`command`](Self::command) speaks plain TCP and cannot reach it: use a TLS client.
    ///
    /// # Panics
    ///
    /// When it cannot be spawned (no `redis-server`, or one built without TLS), naming the fix.
    pub async fn start_tls(files: &TlsServerFiles) -> Self {
        let Some(dir) = TempDir::new("redis-tls") else {
            unavailable("cannot create a directory for the certificates")
        };
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).ok()?;
            path.to_str().map(str::to_owned)
        };
        let (Some(cert), Some(key), Some(ca)) = (
            write("server.crt", &files.cert_pem),
            write("server.key", &files.key_pem),
            write("ca.crt", &files.ca_pem),
        ) else {
            unavailable("cannot write the certificates")
        };
        let auth = if files.require_client_cert {
            "yes"
        } else {
            "no"
        };
        for _ in 0..3 {
            let Some(port) = free_port() else { break };
            let args = [
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                auth,
            ];
            let mut server = Private {
                port,
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                tls: true,
                child: None,
            };
            if server.launch().await {
                return Self {
                    url: format!("rediss://127.0.0.1:{port}/"),
                    server: Some(server),
                    _dir: Some(dir),
                };
            }
        }
        unavailable("no TLS redis-server could be spawned (is it built with TLS?)")
    }

    async fn spawn() -> Option<Self> {
        for _ in 0..3 {
            let port = free_port()?;
            let mut server = Private::plain(port);
            if server.launch().await {
                return Some(Self {
                    url: format!("redis://127.0.0.1:{port}/"),
                    server: Some(server),
                    _dir: None,
                });
            }
        }
        None
    }

    /// The URL to connect to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether this is a private server that [`kill`](Self::kill) and
    /// [`restart`](Self::restart) control.
    pub fn is_private(&self) -> bool {
        self.server.is_some()
    }

    /// Kills the private server (SIGKILL) and waits for it to exit.
    ///
    /// # Panics
    ///
    /// When the server is not private.
    pub fn kill(&mut self) {
        self.private().stop();
    }

    /// Starts the private server again on the same port and waits until it answers.
    ///
    /// # Panics
    ///
    /// When the server is not private or does not come back within 5 seconds.
    pub async fn restart(&mut self) {
        let server = self.private();
        server.stop();
        assert!(server.launch().await, "redis-server did not restart");
    }

    /// Stops the private server's process (SIGSTOP) without closing its connections: a Redis
    /// that hangs. [`thaw`](Self::thaw) resumes it.
    ///
    /// # Panics
    ///
    /// When the server is not private or not running.
    pub fn freeze(&mut self) {
        self.private().signal("-STOP");
    }

    /// Resumes a server stopped by [`freeze`](Self::freeze) (SIGCONT).
    ///
    /// # Panics
    ///
    /// When the server is not private or not running.
    pub fn thaw(&mut self) {
        self.private().signal("-CONT");
    }

    fn private(&mut self) -> &mut Private {
        self.server
            .as_mut()
            .expect("only a private redis-server can be killed or restarted")
    }

    /// Sends one command (inline protocol) and returns the raw reply, for inspection and
    /// fault injection (`SCRIPT FLUSH`, `PTTL key`).
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    pub async fn command(&self, args: &[&str]) -> String {
        self.commands(&[args]).await
    }

    /// Sends several commands on one connection (so that an `AUTH` applies to the next ones)
    /// and returns the raw replies, one per line. Replies must be one line each.
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    pub async fn commands(&self, commands: &[&[&str]]) -> String {
        assert!(
            self.url.starts_with("redis://"),
            "command() speaks plain TCP: use a TLS client for {}",
            self.url
        );
        let addr = self
            .url
            .trim_start_matches("redis://")
            .split(['/', '?'])
            .next()
            .map(|a| a.rsplit('@').next().unwrap_or(a).to_owned())
            .expect("a host:port in the URL");
        exchange(&addr, commands).await
    }
}

/// Sends `commands` (inline protocol) on one connection to `addr` and returns the raw
/// replies, one per line.
///
/// # Panics
///
/// When `addr` does not answer within 5 seconds.
async fn exchange(addr: &str, commands: &[&[&str]]) -> String {
    let mut cmd = String::new();
    for args in commands {
        cmd.push_str(&format!("*{}\r\n", args.len()));
        for a in *args {
            cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
    }
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(cmd.as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 4096];
        // The first reply may span lines (`KEYS`): one read for a single command.
        loop {
            let n = stream.read(&mut chunk).await?;
            buf.extend_from_slice(&chunk[..n]);
            let lines = buf.windows(2).filter(|w| w == b"\r\n").count();
            if n == 0 || commands.len() == 1 || lines >= commands.len() {
                break;
            }
        }
        Ok::<_, std::io::Error>(buf)
    };
    let reply = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .expect("redis answers within 5 s")
        .expect("redis reachable");
    String::from_utf8_lossy(&reply).trim_end().to_owned()
}

impl Private {
    fn plain(port: u16) -> Self {
        Self {
            port,
            args: vec!["--port".to_owned(), port.to_string()],
            tls: false,
            child: None,
        }
    }

    /// Spawns the server and polls (bounded) until it answers PING (accepts a connection,
    /// for a TLS-only server).
    async fn launch(&mut self) -> bool {
        let child = Command::new(bin())
            .args(&self.args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else { return false };
        self.child = Some(child);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        for _ in 0..500 {
            let ready = if self.tls {
                tokio::net::TcpStream::connect(addr).await.is_ok()
            } else {
                ping(addr).await
            };
            if ready {
                return true;
            }
            if let Some(child) = &mut self.child {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    // Exited, e.g. the port was taken meanwhile.
                    self.child = None;
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.stop();
        false
    }

    fn signal(&mut self, signal: &str) {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What to do when a test cannot have the server it needs.
const FIX: &str = "install redis-server (Debian: `apt-get install redis-server redis-tools`; \
     or set REDIS_SERVER_BIN to its path), or set ALLOWANCE_REDIS_URL to a Redis that answers \
     (tests that kill their server, TLS and Cluster tests need redis-server itself)";

/// Fails the test, naming the fix: a test that needs Redis never passes without one.
fn unavailable(why: &str) -> ! {
    panic!("{why}: {FIX}")
}

/// Whether the Redis at `url` answers `PING` within 2 seconds.
async fn answers(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let ping = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2 s".to_owned()),
    }
}

/// A Redis Cluster of three primaries (no replicas) on loopback, each a private
/// `redis-server --cluster-enabled yes` with its own `cluster-config-file` in a temporary
/// directory, joined by `redis-cli --cluster create`. Killed on drop.
///
/// ```no_run
/// use tower_allowance_redis::{test_util::TestCluster, RedisStore, RedisStoreOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cluster = TestCluster::start().await;
/// let store = RedisStore::connect_cluster(cluster.urls(), "api", RedisStoreOptions::new())
///     .await
///     .expect("connect");
/// # drop(store);
/// # }
/// ```
#[derive(Debug)]
pub struct TestCluster {
    nodes: Vec<Private>,
    _dir: TempDir,
}

fn cli_bin() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned())
}

impl TestCluster {
    /// Starts the three nodes, creates the cluster and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When it cannot (no `redis-server` or `redis-cli`: the message names the fix), or when
    /// the cluster does not form within 20 seconds.
    pub async fn start() -> Self {
        const NODES: usize = 3;
        let Some(dir) = TempDir::new("redis-cluster") else {
            unavailable("cannot create a directory for the cluster's files")
        };
        let mut nodes = Vec::new();
        for _ in 0..NODES {
            let Some(node) = Self::launch_node(dir.path()).await else {
                unavailable("no cluster-enabled redis-server could be spawned")
            };
            nodes.push(node);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let create = tokio::task::spawn_blocking(move || {
            Command::new(cli_bin())
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null())
                .output()
        })
        .await;
        match create {
            Ok(Ok(out)) if out.status.success() => {}
            Ok(Ok(out)) => panic!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            _ => unavailable("redis-cli could not be run (it is in Debian's redis-tools)"),
        }
        let cluster = Self { nodes, _dir: dir };
        for _ in 0..200 {
            let mut ok = 0;
            for node in 0..NODES {
                let info = cluster.command(node, &["CLUSTER", "INFO"]).await;
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    ok += 1;
                }
            }
            if ok == NODES {
                return cluster;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the test cluster did not reach cluster_state:ok within 20 s");
    }

    /// One cluster-enabled node on a free port, its cluster bus on another.
    async fn launch_node(dir: &Path) -> Option<Private> {
        for _ in 0..3 {
            let (Some(port), Some(bus)) = (free_port(), free_port()) else {
                return None;
            };
            if port == bus {
                continue;
            }
            let config = dir.join(format!("nodes-{port}.conf"));
            let mut node = Private::plain(port);
            node.args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-config-file",
                    config.to_str()?,
                    "--cluster-node-timeout",
                    "5000",
                    "--dir",
                    dir.to_str()?,
                ]
                .map(str::to_owned),
            );
            if node.launch().await {
                return Some(node);
            }
        }
        None
    }

    /// Each node's URL (`redis://127.0.0.1:PORT/`): the seed list of a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect()
    }

    /// Sends one command to node `node` (0, 1 or 2) and returns the raw reply, as
    /// [`TestRedis::command`] does. Key commands for another node's slots answer `-MOVED`.
    ///
    /// # Panics
    ///
    /// When the node does not exist or cannot be reached.
    pub async fn command(&self, node: usize, args: &[&str]) -> String {
        exchange(&format!("127.0.0.1:{}", self.nodes[node].port), &[args]).await
    }

    /// The node (0, 1 or 2) that owns `key`'s hash slot.
    ///
    /// # Panics
    ///
    /// When no node claims it.
    pub async fn node_of(&self, key: &str) -> usize {
        for node in 0..self.nodes.len() {
            if !self
                .command(node, &["TYPE", key])
                .await
                .starts_with("-MOVED")
            {
                return node;
            }
        }
        panic!("no node owns the slot of {key}");
    }
}

async fn ping(addr: SocketAddr) -> bool {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).await.ok()?;
        (&buf == b"+PONG\r\n").then_some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(200), probe).await,
        Ok(Some(()))
    )
}

fn free_port() -> Option<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
    listener.local_addr().ok().map(|a| a.port())
}

/// A name no other test (or earlier run against a shared server) uses.
pub fn unique_name(prefix: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // Random per process, so reruns against a shared server do not collide either.
    let salt = RandomState::new().build_hasher().finish() & 0xffff_ffff;
    format!(
        "{prefix}-{}-{}-{salt:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}
