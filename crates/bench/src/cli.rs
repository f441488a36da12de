//! The command line: `tern bench <pubsub|fanout|conns|latency> [options]`.
//!
//! [`Args`] is a `clap::Args` so that the `tern` binary can embed it as a subcommand; the
//! standalone `tern-bench` binary wraps the same type.

use std::net::Ipv4Addr;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

/// Payload, window and count limits the CLI enforces.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
/// A window must leave at least one packet id free so the id space (1..=65535) never wraps onto
/// a message still in flight.
pub const MAX_WINDOW: u32 = 65_000;

/// Load generator and checker for MQTT brokers (any broker, by host and port).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// The standalone `tern-bench` binary's parser.
#[derive(Debug, Parser)]
#[command(
    name = "tern-bench",
    version,
    about = "MQTT load generator (same as `tern bench`)"
)]
pub struct Cli {
    #[command(flatten)]
    pub args: Args,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Publish/subscribe throughput: N publishers, M subscribers, every subscriber gets every
    /// message. Closed loop: each publisher keeps at most --window QoS>0 messages unacknowledged.
    Pubsub(PubSubArgs),
    /// Fan-out: one publisher, many subscribers on its topic.
    Fanout(FanoutArgs),
    /// Connection count and memory: opens N idle connections (spread over 127.0.0.x source
    /// addresses) and reads the broker's resident memory when --broker-pid is given.
    Conns(ConnsArgs),
    /// Latency at a fixed offered rate (open loop: messages are stamped with the time they were
    /// due, so back-pressure shows up as latency instead of hiding it).
    Latency(LatencyArgs),
}

/// Options every subcommand takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Broker host (IPv4 address or name).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker MQTT port.
    #[arg(long, short = 'p', default_value_t = 1883)]
    pub port: u16,
    /// Subscribers connect to these ports of --host instead of --port, subscriber i to the
    /// (i mod count)-th: a cluster's nodes, with the publishers on --port (pubsub and fanout).
    #[arg(long, value_delimiter = ',', value_name = "PORT,...")]
    pub sub_ports: Vec<u16>,
    /// MQTT protocol version: 3 (3.1.1) or 5.
    #[arg(long = "mqtt", value_enum, default_value = "3")]
    pub protocol: ProtocolArg,
    /// The broker's pid: adds its CPU time and resident memory (from /proc) to the report.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Print the report as one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// No live progress line on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Tokio worker threads of the load generator (multi-thread runtime only).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Tokio runtime flavour of the load generator.
    #[arg(long, value_enum, default_value = "current")]
    pub runtime: RuntimeFlavor,
    /// Connections opened concurrently during setup.
    #[arg(long, default_value_t = 64)]
    pub connect_concurrency: usize,
    /// Give up on the whole run after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// Connect with clean start 0 (v5: a session expiry of 1 h): the broker keeps the sessions
    /// and takes its persistent-session paths (cursors, recorded QoS 2 exchanges).
    #[arg(long)]
    pub persistent: bool,
    /// After the last publish is acknowledged, wait at most this long for deliveries still on
    /// their way (QoS 0 losses only show up as this wait).
    #[arg(long, default_value_t = 3000)]
    pub drain_ms: u64,
    /// Prefix of client ids and topics (a random suffix per run keeps runs apart).
    #[arg(long, default_value = "tern-bench")]
    pub prefix: String,
    /// Connect with TLS (mqtts), trusting the CA certificates in this PEM file. The server
    /// name checked is --tls-server-name, or --host.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the server certificate must carry (default: --host; an IP address works).
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// With --tls-ca: present this client certificate chain (PEM), for listeners that ask
    /// for one (`tls_client_ca`). Every connection of the run presents the same one.
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PubSubArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, default_value_t = 1)]
    pub publishers: u32,
    #[arg(long, default_value_t = 1)]
    pub subscribers: u32,
    /// Messages per publisher.
    #[arg(long, short = 'n', default_value_t = 100_000)]
    pub messages: u64,
    /// Payload size (at least 20: the bench header).
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    #[arg(long, value_enum, default_value = "0")]
    pub qos: Qos,
    /// Unacknowledged QoS>0 messages per publisher (ignored at QoS 0).
    #[arg(long, default_value_t = 256)]
    pub window: u32,
    #[arg(long, value_enum, default_value = "shared")]
    pub topics: TopicMode,
}

#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, default_value_t = 1000)]
    pub subscribers: u32,
    /// Messages the one publisher sends (each is delivered to every subscriber).
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub messages: u64,
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    #[arg(long, value_enum, default_value = "0")]
    pub qos: Qos,
    #[arg(long, default_value_t = 256)]
    pub window: u32,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ConnsArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, short = 'n', default_value_t = 10_000)]
    pub connections: u32,
    /// Connections per source address; the first is --first-source, then the next address.
    #[arg(long, default_value_t = 5_000)]
    pub per_source: u32,
    /// First source address for the connections (127.0.0.x on loopback). Not 127.0.0.1 by
    /// default: every other loopback client on the machine draws its ephemeral ports there, and
    /// its TIME_WAIT sockets would eat into ours.
    #[arg(long, default_value = "127.0.0.2")]
    pub first_source: Ipv4Addr,
    /// Keep the connections open this long before reading memory and closing.
    #[arg(long, default_value_t = 3)]
    pub hold_s: u64,
    /// Keep alive announced in CONNECT (long enough that no ping is due during the hold).
    #[arg(long, default_value_t = 600)]
    pub keep_alive_s: u16,
    /// The run's tag in the client ids (default: random per run). With `--persistent`, a
    /// second run with the same tag reconnects to the sessions the first one left: a
    /// reconnect storm of persistent sessions.
    #[arg(long)]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub common: Common,
    /// Offered rate, messages per second over all publishers.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    #[arg(long, default_value_t = 10)]
    pub duration_s: u64,
    #[arg(long, default_value_t = 1)]
    pub publishers: u32,
    #[arg(long, default_value_t = 1)]
    pub subscribers: u32,
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    #[arg(long, value_enum, default_value = "0")]
    pub qos: Qos,
    /// Unacknowledged QoS>0 messages per publisher; a full window delays sends, and the delay
    /// counts as latency.
    #[arg(long, default_value_t = 4096)]
    pub window: u32,
    #[arg(long, value_enum, default_value = "per-publisher")]
    pub topics: TopicMode,
}

/// Quality of service, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
pub enum Qos {
    #[value(name = "0")]
    AtMostOnce,
    #[value(name = "1")]
    AtLeastOnce,
    #[value(name = "2")]
    ExactlyOnce,
}

impl Qos {
    pub fn level(self) -> u8 {
        self as u8
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum ProtocolArg {
    /// MQTT 3.1.1
    #[value(name = "3")]
    V311,
    /// MQTT 5.0
    #[value(name = "5")]
    V5,
}

/// `current`: one thread runs every client (cheapest wake-ups); `multi`: --threads workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum RuntimeFlavor {
    Current,
    Multi,
}

/// One topic for everybody, or one per publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicMode {
    Shared,
    PerPublisher,
}

impl std::fmt::Display for TopicMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TopicMode::Shared => "shared",
            TopicMode::PerPublisher => "per-publisher",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_pubsub_line() {
        let cli = Cli::try_parse_from([
            "tern-bench",
            "pubsub",
            "--port",
            "1884",
            "--mqtt",
            "5",
            "--qos",
            "2",
            "--window",
            "1",
            "--publishers",
            "4",
            "--topics",
            "per-publisher",
            "--json",
        ])
        .unwrap();
        let Command::Pubsub(args) = cli.args.command else {
            panic!("not pubsub")
        };
        assert_eq!(args.common.port, 1884);
        assert_eq!(args.common.protocol, ProtocolArg::V5);
        assert_eq!(args.qos, Qos::ExactlyOnce);
        assert_eq!(args.window, 1);
        assert_eq!(args.publishers, 4);
        assert_eq!(args.topics, TopicMode::PerPublisher);
        assert!(args.common.json);
    }

    #[test]
    fn parses_subscriber_ports() {
        let cli =
            Cli::try_parse_from(["tern-bench", "fanout", "--sub-ports", "1884,1885"]).unwrap();
        let Command::Fanout(args) = cli.args.command else {
            panic!("not fanout")
        };
        assert_eq!(args.common.sub_ports, vec![1884, 1885]);
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
