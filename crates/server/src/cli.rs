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
    #[command(after_help = CONFIG_HELP)]
    Serve(ServeArgs),
    /// Load generator against any MQTT broker: pubsub, fanout, conns, latency.
    Bench(tern_bench::Args),
    /// Add, change (-b: password on the command line) or delete (-D) a user of a password
    /// file; -c creates it. Hashes are argon2id; mosquitto_passwd's lines are kept as they are.
    Passwd(crate::passwd::PasswdArgs),
}

/// The config file keys, shown by `tern serve --help`.
const CONFIG_HELP: &str = "\
Config file keys (TOML, all optional; defaults shown):
  [listener]                              one plain TCP listener (or use [[listener]] tables)
    bind = \"127.0.0.1:1883\"
  [[listener]]                            as many as needed; `tern listening on ADDR` is printed
                                          for each, in this order (--bind replaces the first's bind)
    bind = \"127.0.0.1:8883\"               required
    transport = \"tcp\"                     tcp | ws (MQTT over WebSocket: path /mqtt, subprotocol mqtt)
    tls_cert = \"server.pem\"               PEM certificate chain; with tls_key, TLS is on (mqtts/wss)
    tls_key = \"server.key\"                PEM private key (PKCS#8, PKCS#1 or SEC1)
    tls_client_ca = \"ca.pem\"              ask for client certificates, verified against these CAs
    tls_crl = \"crl.pem\"                   with tls_client_ca: PEM CRLs; a client certificate they
                                          list is refused (reloaded on SIGHUP, as mosquitto's crlfile;
                                          connected clients it revokes are disconnected)
    require_client_cert = false           refuse a TLS handshake without a client certificate
    use_identity_as_username = false      the client certificate's CN is the username (password
                                          dropped); no certificate: CONNACK 4 / 0x86, as mosquitto
    allow_anonymous                       per listener; overrides [auth] allow_anonymous
    max_connections                       open sockets on this listener (unset: no limit); more are
                                          closed at accept ($SYS/broker/clients/refused/
                                          listener_max_connections). Failed TLS handshakes and
                                          WebSocket upgrades: $SYS/broker/clients/handshakes/failed
  [limits]
    max_packet_size_bytes = 1048576       largest packet accepted (v5 CONNACK Maximum Packet Size)
    receive_maximum = 1024                unacknowledged QoS>0 PUBLISHes a client may send
    topic_alias_maximum = 64              client-to-server topic aliases (0 disables)
    max_keep_alive_s = 3600               longest keep alive (v5: Server Keep Alive)
    connect_timeout_ms = 10000            close sockets that send no CONNECT in time (a TLS
                                          handshake or WebSocket upgrade gets as long again)
    max_inflight_messages = 1024          outbound QoS>0 in flight per session
    max_queued_messages = 100000          per session beyond the window; oldest dropped
    max_queued_bytes = 67108864           per session, bytes of those (topic + payload + 64 B each);
                                          oldest dropped; counted in $SYS/broker/messages/dropped/queue_limit
    max_queued_bytes_total = 1073741824   all sessions' queues together; at it QoS 0 is dropped
                                          (messages/dropped/memory_limit) and new QoS>0 PUBLISHes
                                          refused (v5 PUBACK/PUBREC 0x97; 3.1.1: connection closed
                                          without an ack) (messages/refused/memory_limit)
    max_connections = 100000              live connections; beyond: CONNACK 0x97 / 3, then close
                                          (a takeover of a connected client id is always allowed)
    max_session_expiry_interval_s = 4294967295
    max_subscriptions_per_session = 10000
    max_sessions = 1000000                live + offline sessions; a new one beyond: CONNACK 0x89 / 3
    max_retained_messages = 1000000
    max_client_id_len = 256
    outbound_queue_max_bytes = 8388608    per connection; QoS 0 dropped beyond it
    outbound_queue_max_messages = 100000
    slow_subscriber_timeout_ms = 30000    full queue this long: disconnect (v5 0x97)
    max_topic_levels = 128                levels of a topic name or filter; beyond: PUBLISH closes
                                          the connection (v5 0x90), SUBSCRIBE gets 0x8F / 0x80
    max_topic_length_bytes = 4096         bytes of a topic name or filter, same refusals
    max_connect_rate_per_ip = 0           CONNECTs per second per source address (token bucket;
                                          0: no limit); beyond: CONNACK 0x9F / 3
    connect_rate_burst = 10               CONNECTs an address may make at once before the rate applies
    reject_control_chars = true           U+0001-U+001F, U+007F-U+009F in topics, filters, client
                                          ids, usernames are malformed: closed (v5 0x81)
  [auth]                                  (users and ACL; mosquitto's file formats, README \"Authentication\")
    allow_anonymous = (see text)          let clients without a username in. Default: true when
                                          every listener binds a loopback address; otherwise false
                                          if password_file is set, and without it tern refuses to
                                          start until one of the two is set
    password_file = \"passwd\"              users (`tern passwd`; mosquitto_passwd $6$/$7$ lines work
                                          as they are). Wrong password: CONNACK 0x86 / 4; no
                                          username where one is needed: 0x87 / 5
    acl_file = \"acl\"                      mosquitto ACL file (user, topic, pattern %c %u, deny).
                                          Denied SUBSCRIBE: SUBACK 0x87 / 0x80; denied PUBLISH:
                                          v5 PUBACK/PUBREC 0x87, 3.1.1 dropped; denied topics are
                                          not delivered. SIGHUP re-reads both files.
  [sys]
    interval_s = 10                       $SYS/broker/... publish interval (0 disables)
  [state]                                 state streams: sessions, subscriptions, retained messages
    sync = \"always\"                       always | interval | never; SUBACK/UNSUBACK of a persistent
                                          session and the PUBACK/PUBREC of a retained PUBLISH wait
                                          for it (its own setting, never a [[stream]]'s)
    sync_interval_ms = 100                with sync = \"interval\"
  [store]
    max_disk_bytes = 0                    disk budget of the message streams (0: none). At it, new
                                          messages that would be written are refused (QoS>0: v5
                                          PUBACK/PUBREC 0x97; 3.1.1: connection closed without an
                                          ack) or dropped (QoS 0), nothing stored is deleted for
                                          them; they are accepted again once retention frees space.
                                          Measured from the blocks' allocated lengths (an active
                                          block written to counts its whole block_size_bytes)
                                          every 25 ms; minimum 65536, and no less than
                                          any stored stream's block_size_bytes (refused
                                          at start).
                                          The state streams (sessions, retained) are not counted:
                                          retention cannot free them; their compaction bounds them
                                          (about 4 MiB plus twice their live records). Keep each
                                          stream's block_size_bytes well below the budget
  [http]                                  admin HTTP listener (off unless bind or --http is set)
    bind = \"127.0.0.1:8080\"                GET /metrics (Prometheus), /healthz, /readyz, /api/v1/..., / (dashboard)
    token = \"...\"                          bearer token (16+ characters): required for actions (DELETE, POST)
                                          and, on a non-loopback bind (which refuses to start without one),
                                          for every request but /, /healthz and /readyz
  [[stream]]                              message streams; a message goes to the first that captures it
    name = \"messages\"                     required
    filters = [\"#\"]                       topic filters captured (unset: every topic, $-topics too)
    max_age_s, max_msgs, max_bytes, max_msgs_per_topic   retention limits (unset: unlimited)
    sync = \"always\"                       always | interval | never (fdatasync per group commit)
    sync_interval_ms = 100                with sync = \"interval\"
    durability = \"default\"                default (QoS 1/2) | always (QoS 0 too) | never (memory only)
    keep = \"interest\"                     interest: a block goes once no one needs it (no persistent
                                          session's cursor below it, nothing unrouted, no open QoS 2
                                          exchange); retention: keep everything the limits allow,
                                          as a replay log. Limits never remove open QoS 2 state;
                                          they may remove a QoS 1 message in flight to a persistent
                                          session (resent from memory while tern runs, not after a
                                          restart; counted in tern_inflight_exposed_retention_total)
    block_size_bytes = 4194304
  The default stream `messages` (every topic, sync always, durability default) is the only stream
  when none is configured, and is appended after the configured ones when none of them captures
  every topic (has no `filters`): a topic is kept in memory only if its stream says
  durability = \"never\". A filtered stream may not be called `messages` then.

SIGINT/SIGTERM: stop accepting, send v5 clients DISCONNECT 0x8B, close, exit 0.
SIGHUP: re-read password_file and acl_file, and every TLS listener's certificate, key and
client CA; connections stay up, new CONNECTs and handshakes use the new files (a bad file keeps
the old rules or certificates, logged).";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (overrides [listener] bind, or the first [[listener]]'s bind, of the
    /// config file). Default 127.0.0.1:1883; port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,

    /// TOML config file with [listener] or [[listener]], [limits], [sys], [state], [store] and
    /// [[stream]] tables.
    /// Unknown keys and bad values are errors (exit code 2).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory for durable state: message streams, sessions, retained messages.
    #[arg(long, value_name = "DIR", default_value = "./tern-data")]
    pub data_dir: PathBuf,

    /// Sync policy of every message stream (the configured ones and the default stream
    /// `messages`), overriding the config file: always (fdatasync before acknowledging),
    /// interval, never. The state streams keep `[state] sync`.
    #[arg(long, value_name = "POLICY")]
    pub sync: Option<String>,

    /// Interval of `--sync interval`.
    #[arg(long, value_name = "MS", default_value_t = crate::config_file::DEFAULT_SYNC_INTERVAL_MS)]
    pub sync_interval_ms: u64,

    /// Log filter (e.g. info, debug, tern_broker=trace); overrides RUST_LOG. Logs go to stderr.
    #[arg(long, value_name = "LEVEL")]
    pub log: Option<String>,

    /// Log line format: text (for people) or json (one object per line, for log shippers).
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Address of the admin HTTP listener (/metrics, /healthz, /readyz, /api/v1, the
    /// dashboard at /); overrides [http] bind. Off unless set here or there.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,

    /// Validate FILE (TOML config) and exit: 0 if it is valid, 2 (with the reason) if not.
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
}
