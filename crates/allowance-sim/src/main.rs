//! The `allowance-sim` command line: see `allowance-sim --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = allowance_sim::cli::Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match allowance_sim::cli::execute(cli, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allowance-sim: {e}");
            ExitCode::FAILURE
        }
    }
}
