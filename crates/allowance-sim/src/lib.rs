//! The `allowance-sim` command line and what it adds to the workspace's test kit
//! ([`allowance_testkit`]: the throttling upstreams, the fake service, the virtual-time
//! scenario runner and its reports).
//!
//! - [`live`] runs the scenarios' workers over real HTTP in real time, against the built-in
//!   upstream or any URL; [`multi`] spreads them over several processes (`--processes`),
//!   sharing one allowance in Redis.
//! - [`cancel`]: callers that give up while they wait (`--cancel-fraction`), and the slots
//!   they cost.
//! - [`chart`]: charts drawn as SVG (plotters): panels of lines, steps, dots, bars, spans
//!   and event ticks on one x axis, with a legend; every picture below is one.
//! - [`timeline`]: a run as an ASCII timeline or an SVG; [`rate_chart`]: an adaptive run's
//!   rate over time.
//! - [`sweep`]: naive, split and shared over a grid of workers and rates.
//! - [`adaptive`]: the adaptive rate's figures (`allowance-sim adaptive`).
//! - [`cli`]: the `allowance-sim` command line (`seed`, `run`, `serve`, `http`, `sweep`,
//!   `adaptive`).
//!
//! Modules are layered, each using only those above it in this list (and the test kit):
//! `chart`, `cancel`, `live`, `multi`, `timeline`, `sweep`, `rate_chart`, `adaptive`, `cli`.
//!
//! ```
//! use allowance_sim::timeline;
//! use allowance_testkit::{report::RunReport, scenario::{run_virtual, Mode, Scenario}};
//!
//! let s = Scenario::seed(Mode::Shared);
//! let report = RunReport::from_virtual(&s, &run_virtual(&s)?);
//! assert!(timeline::svg(&[("shared", &report)])?.starts_with("<svg"));
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```

pub mod adaptive;
pub mod cancel;
pub mod chart;
pub mod classes;
pub mod cli;
pub mod live;
pub mod multi;
pub mod rate_chart;
pub mod sweep;
pub mod timeline;
pub mod tokens;
