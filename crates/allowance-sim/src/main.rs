//! The `allowance-sim` command line: see `allowance-sim --help` (exit codes included).

use std::{
    io::{IsTerminal, Write as _},
    process::ExitCode,
};

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = allowance_sim::cli::Cli::parse();
    // `RUST_LOG` as usual; by default warnings, so that a Redis outage or a fallback the
    // stores report reaches the terminal. On stderr: stdout carries the report.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = allowance_sim::cli::execute(cli, &mut out);
    if let Err(e) = &result {
        // The whole chain: "redis refused" alone does not say WRONGPASS from NOPERM.
        // A closed stderr is no reason to panic (exit 101 instead of the documented code).
        let _ = writeln!(
            std::io::stderr(),
            "allowance-sim: {}",
            allowance_sim::cli::error_chain(&**e)
        );
    }
    ExitCode::from(allowance_sim::cli::exit_status(&result))
}
