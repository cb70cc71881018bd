//! `allowance-sim adaptive`: the adaptive rate's figures, each an `allowance-sim run`.
//!
//! An upstream at 20 requests per second (burst 4, `Retry-After: 1`) that the allowance is
//! not told about; eight workers, one allowance whose rate adapts. In virtual time: from
//! 2/s and from 200/s, the upstream dropping to 10/s at 30 s, an IETF upstream whose policy
//! is adopted, and a GitHub-shaped one. With a Redis URL, also in real time: four
//! processes sharing one controller in Redis, against four processes with a controller
//! each. Every row keeps the exact `run` arguments that produced it.
//!
//! ```
//! use allowance_sim::adaptive::{virtual_experiments, Experiment};
//!
//! let runs: Vec<Experiment> = virtual_experiments();
//! assert_eq!(runs[0].name, "from 2/s");
//! assert!(runs[0].command().starts_with("allowance-sim run --virtual"));
//! ```

use std::fmt::Write as _;

use allowance_testkit::report::RunReport;

/// The settings every virtual experiment shares (before its own).
const VIRTUAL: &[&str] = &[
    "--virtual",
    "--mode",
    "shared",
    "--adaptive",
    "--rate",
    "20",
    "--burst",
    "4",
    "--workers",
    "8",
    "--jobs",
    "1200",
    "--retry-after",
    "1",
];

/// The settings both real-time experiments share (before their own): a shorter run. Public
/// for the test that runs them as child processes (`tests/real_time.rs`, module `adaptive`).
pub const REAL: &[&str] = &[
    "--real",
    "--mode",
    "shared",
    "--adaptive",
    "--initial-rate",
    "10",
    "--rate",
    "20",
    "--burst",
    "4",
    "--workers",
    "8",
    "--jobs",
    "200",
    "--retry-after",
    "1",
    "--processes",
    "4",
];

/// How `--redis URL` is shown in a command (a URL may carry a password).
pub const REDIS_PLACEHOLDER: &str = "$REDIS_URL";

/// One run of the set: a name and the arguments of `allowance-sim run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Experiment {
    /// What the row shows.
    pub name: &'static str,
    /// The arguments after `allowance-sim run`.
    pub args: Vec<String>,
    /// Drawn in the chart.
    pub charted: bool,
}

impl Experiment {
    fn new(name: &'static str, common: &[&str], own: &[&str], charted: bool) -> Self {
        Self {
            name,
            args: common.iter().chain(own).map(|a| (*a).to_owned()).collect(),
            charted,
        }
    }

    /// The command line, with a Redis URL shown as [`REDIS_PLACEHOLDER`].
    pub fn command(&self) -> String {
        let mut shown = vec!["allowance-sim".to_owned(), "run".to_owned()];
        let mut redis = false;
        for a in &self.args {
            shown.push(if redis {
                REDIS_PLACEHOLDER.to_owned()
            } else {
                a.clone()
            });
            redis = a == "--redis";
        }
        shown.join(" ")
    }
}

/// The virtual-time experiments, in the order of the table.
pub fn virtual_experiments() -> Vec<Experiment> {
    vec![
        Experiment::new("from 2/s", VIRTUAL, &["--initial-rate", "2"], true),
        Experiment::new("from 200/s", VIRTUAL, &["--initial-rate", "200"], true),
        Experiment::new(
            "from 2/s, upstream 20/s then 10/s at 30 s",
            VIRTUAL,
            &["--initial-rate", "2", "--upstream-rate-change", "30s:10"],
            true,
        ),
        Experiment::new(
            "ietf, adopting the policy, from 2/s",
            VIRTUAL,
            &["--initial-rate", "2", "--dialect", "ietf", "--adopt"],
            false,
        ),
        Experiment::new(
            "github (whole-second resets), from 2/s",
            VIRTUAL,
            &["--initial-rate", "2", "--dialect", "github"],
            false,
        ),
    ]
}

/// The real-time experiments: four processes on one Redis controller at `redis_url`, and
/// four processes with a controller each.
pub fn redis_experiments(redis_url: &str) -> Vec<Experiment> {
    vec![
        Experiment::new(
            "4 processes, one controller in Redis",
            REAL,
            &["--redis", redis_url],
            false,
        ),
        Experiment::new("4 processes, a controller each (memory)", REAL, &[], false),
    ]
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AdaptiveRow {
    /// The experiment's name.
    pub name: String,
    /// The command that produced it (a Redis URL shown as [`REDIS_PLACEHOLDER`]).
    pub command: String,
    /// `virtual` or `real`.
    pub clock: &'static str,
    /// The run's report.
    pub report: RunReport,
}

impl AdaptiveRow {
    /// The row for `experiment`, run: `report` is its run's (`allowance-sim`'s
    /// `cli::run_experiment`).
    pub fn of(experiment: &Experiment, report: RunReport) -> Self {
        Self {
            name: experiment.name.to_owned(),
            command: experiment.command(),
            clock: report.clock,
            report,
        }
    }
}

/// The table in Markdown, the commands under it.
pub fn markdown(rows: &[AdaptiveRow]) -> String {
    let mut s = String::from(
        "| run | clock | attempts | 429s | completed | makespan | achieved | final rate | controllers at the end | settled after the change |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n",
    );
    for row in rows {
        let r = &row.report;
        let share = if r.attempts == 0 {
            0.0
        } else {
            r.rejected as f64 * 100.0 / r.attempts as f64
        };
        let achieved = match (r.achieved_rate, r.achieved_over_ms) {
            (Some(rate), Some(ms)) => format!("{rate:.2}/s (last {:.1} s)", ms as f64 / 1000.0),
            _ => "–".to_owned(),
        };
        let final_rate = r.final_rate.map_or("–".to_owned(), |f| format!("{f:.2}/s"));
        let controllers = r.controller_rates.as_ref().map_or("–".to_owned(), |rates| {
            rates
                .iter()
                .map(|c| format!("{c:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        let settled = r
            .rate_changes
            .iter()
            .flatten()
            .map(|c| {
                c.settled_after_ms.map_or("never".to_owned(), |ms| {
                    format!("{:.1} s", ms as f64 / 1000.0)
                })
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} ({share:.1}%) | {} | {:.1} s | {achieved} | {final_rate} | {controllers} | {} |",
            row.name,
            row.clock,
            r.attempts,
            r.rejected,
            r.completed,
            r.makespan_ms as f64 / 1000.0,
            if settled.is_empty() { "–" } else { &settled },
        );
    }
    s.push_str("\nCommands:\n\n");
    for row in rows {
        let _ = writeln!(s, "- {}: `{}`", row.name, row.command);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_hide_the_redis_url() {
        let runs = redis_experiments("redis://:secret@127.0.0.1:6379/");
        let shown = runs[0].command();
        assert!(shown.ends_with("--redis $REDIS_URL"), "{shown}");
        assert!(!shown.contains("secret"));
    }
}
