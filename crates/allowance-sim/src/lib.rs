//! A throttling upstream and a scenario runner for `tower-allowance`.
//!
//! [`fake::FakeUpstream`] is an in-process `Service` with its own token bucket, shaped like
//! the seed article's fake server; [`scenario`] runs workers against it through the real
//! layers in virtual time and reports what the *server* saw.
//!
//! ```
//! use allowance_sim::scenario::{seed_table, SeedRow};
//!
//! let rows: Vec<SeedRow> = seed_table();
//! assert_eq!(rows[0].attempts, 20); // eight workers, each on its own
//! assert_eq!(rows[1].attempts, 8);  // one shared allowance
//! ```

pub mod cli;
pub mod fake;
pub mod live;
pub mod report;
pub mod scenario;
pub mod timeline;
pub mod upstream;
