//! The test kit of the `tower-allowance` workspace (unpublished): what the library's tests,
//! examples and benchmarks drive, and what the `allowance-sim` command line is built on.
//!
//! - [`upstream::Upstream`]: a real HTTP/1.1 server on loopback shaped like the odds API the
//!   seed uses (per-key token bucket, 429 with `Retry-After`, a monthly quota, `/v1/usage`),
//!   logging every attempt it sees; [`upstream::http_client`] to talk to it.
//! - [`tokens::TokenUpstream`]: a loopback upstream limiting requests and tokens per key,
//!   like an LLM API; [`chat::ChatUpstream`]: an OpenAI-shaped one that charges prompt +
//!   `max_tokens` at admission and reports `usage` in its answers (reserve, then settle).
//! - [`fake::FakeUpstream`]: the same idea as an in-process `Service`, for virtual time.
//! - [`dialect`]: the rate-limit headers each provider sends, spoken by the upstreams.
//! - [`scenario`] runs workers (`naive`, `shared`, `split:N`) through the real layers in
//!   virtual time; each job's attempts and end are [`job`] records.
//! - [`report`]: what a run reports (from the *server's* view); [`figures`] and [`scale`]:
//!   one allowance across many processes, measured from the upstream's log (a cooldown's
//!   reach, fairness between processes, 429s the client should not have drawn).
//!
//! Nothing here is command-line specific: real-time and multi-process runs, sweeps, charts
//! and the CLI itself live in `allowance-sim`.
//!
//! Modules are layered, each using only those above it in this list: `dialect`, `upstream`,
//! `fake`, `tokens`, `chat`, `job`, `scenario`, `figures`, `report`, `scale`.
//!
//! ```
//! use allowance_testkit::scenario::{seed_table, SeedRow};
//!
//! let rows: Vec<SeedRow> = seed_table();
//! assert_eq!(rows[0].attempts, 20); // eight workers, each on its own
//! assert_eq!(rows[1].attempts, 8);  // one shared allowance
//! ```

pub mod chat;
pub mod dialect;
pub mod fake;
pub mod figures;
pub mod job;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod tokens;
pub mod upstream;
