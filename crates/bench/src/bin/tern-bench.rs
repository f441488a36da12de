//! Standalone `tern-bench`: the same tool as `tern bench`.
use clap::Parser;

fn main() -> std::process::ExitCode {
    tern_bench::run(tern_bench::Cli::parse().args)
}
