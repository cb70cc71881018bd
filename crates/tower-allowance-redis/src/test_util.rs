//! Test support: a private `redis-server` child process that tests can kill and restart.
//!
//! [`TestRedis::start`] spawns `redis-server` (or `$REDIS_SERVER_BIN`) on a free loopback
//! port with persistence off, and kills it on drop. When that is impossible it falls back to
//! `$ALLOWANCE_REDIS_URL`; when neither works it returns `None` so the test can say it
//! skipped, except under `CI=true`, where it panics: CI never skips silently.
//!
//! ```no_run
//! use tower_allowance_redis::test_util::TestRedis;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let Some(redis) = TestRedis::start().await else { return };
//! println!("testing against {}", redis.url());
//! # }
//! ```

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    net::{Ipv4Addr, SocketAddr, TcpListener},
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
}

#[derive(Debug)]
struct Private {
    port: u16,
    child: Option<Child>,
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

impl TestRedis {
    /// A private server if one can be spawned, else `$ALLOWANCE_REDIS_URL`.
    ///
    /// # Panics
    ///
    /// Under `CI=true` when neither is available.
    pub async fn start() -> Option<Self> {
        if let Some(redis) = Self::spawn().await {
            return Some(redis);
        }
        if let Ok(url) = std::env::var("ALLOWANCE_REDIS_URL") {
            return Some(Self { url, server: None });
        }
        Self::unavailable("no redis-server could be spawned and ALLOWANCE_REDIS_URL is not set")
    }

    /// A private server only (for tests that kill and restart it).
    ///
    /// # Panics
    ///
    /// Under `CI=true` when it cannot be spawned.
    pub async fn start_private() -> Option<Self> {
        match Self::spawn().await {
            Some(redis) => Some(redis),
            None => Self::unavailable("no private redis-server could be spawned"),
        }
    }

    fn unavailable(why: &str) -> Option<Self> {
        assert!(!ci(), "CI=true and {why}: redis tests must run in CI");
        eprintln!("SKIPPED: {why}");
        None
    }

    async fn spawn() -> Option<Self> {
        for _ in 0..3 {
            let port = free_port()?;
            let mut server = Private { port, child: None };
            if server.launch().await {
                return Some(Self {
                    url: format!("redis://127.0.0.1:{port}/"),
                    server: Some(server),
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
        let addr = self
            .url
            .trim_start_matches("redis://")
            .split(['/', '?'])
            .next()
            .map(|a| a.rsplit('@').next().unwrap_or(a).to_owned())
            .expect("a host:port in the URL");
        let mut cmd = String::new();
        for args in commands {
            cmd.push_str(&format!("*{}\r\n", args.len()));
            for a in *args {
                cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
            }
        }
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(&addr).await?;
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
}

impl Private {
    /// Spawns the server and polls (bounded) until it answers PING.
    async fn launch(&mut self) -> bool {
        let child = Command::new(bin())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else { return false };
        self.child = Some(child);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        for _ in 0..500 {
            if ping(addr).await {
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
