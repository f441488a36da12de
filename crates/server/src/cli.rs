//! Command line (server contract: `tern serve [--bind ADDR] [--config FILE] [--data-dir DIR]
//! [--log LEVEL]`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Tern: an MQTT 3.1.1 and 5.0 broker.
#[derive(Debug, Parser)]
#[command(name = "tern", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the MQTT broker until SIGINT or SIGTERM.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (overrides [listener] bind of the config file).
    /// Default 127.0.0.1:1883; port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,

    /// TOML config file with [listener], [limits] and [sys] tables. Unknown keys and bad
    /// values are errors (exit code 2).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory for durable state (accepted now; used by store-backed sessions).
    #[arg(long, value_name = "DIR", default_value = "./tern-data")]
    pub data_dir: PathBuf,

    /// Log filter (e.g. info, debug, tern_broker=trace); overrides RUST_LOG. Logs go to stderr.
    #[arg(long, value_name = "LEVEL")]
    pub log: Option<String>,
}
