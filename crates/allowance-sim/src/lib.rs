//! A throttling upstream and a scenario runner for `tower-allowance`.
//!
//! - [`upstream::Upstream`]: a real HTTP/1.1 server on loopback shaped like the odds API the
//!   seed uses (per-key token bucket, 429 with `Retry-After`, a monthly quota, `/v1/usage`),
//!   logging every attempt it sees.
//! - [`fake::FakeUpstream`]: the same idea as an in-process `Service`, for virtual time.
//! - [`scenario`] runs workers (`naive`, `shared`, `split:N`) through the real layers in
//!   virtual time; [`live`] runs the same workers over real HTTP in real time.
//! - [`report`] and [`timeline`]: what a run reports (from the *server's* view), as a table,
//!   JSON, an ASCII timeline or an SVG; [`rate_chart`]: an adaptive run's rate over time.
//! - [`dialect`]: the rate-limit headers each provider sends, spoken by both upstreams.
//! - [`adaptive`]: the adaptive rate's figures (`allowance-sim adaptive`).
//! - [`cli`]: the `allowance-sim` command line (`seed`, `run`, `serve`, `http`, `sweep`,
//!   `adaptive`).
//! - [`scale`] and [`cancel`]: one allowance across many processes, measured (a cooldown's
//!   reach, fairness between processes, cancelled waiters and the slots they cost).
//!
//! ```
//! use allowance_sim::scenario::{seed_table, SeedRow};
//!
//! let rows: Vec<SeedRow> = seed_table();
//! assert_eq!(rows[0].attempts, 20); // eight workers, each on its own
//! assert_eq!(rows[1].attempts, 8);  // one shared allowance
//! ```

pub mod adaptive;
pub mod cancel;
pub mod cli;
pub mod dialect;
pub mod fake;
pub mod live;
pub mod multi;
pub mod rate_chart;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod sweep;
pub mod timeline;
pub mod tokens;
pub mod upstream;
