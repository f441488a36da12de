//! The TOML config file: `[listener]`, `[limits]`, `[sys]`. Every key is optional; an unknown
//! key or a value of the wrong type or range is an error that names the key and its table.

use std::path::Path;

use serde::de::DeserializeOwned;
use tern_broker::BrokerConfig;
use toml::{Table, Value};

/// What the file sets.
#[derive(Debug, Clone, Default)]
pub struct FileConfig {
    pub bind: Option<String>,
    pub broker: BrokerConfig,
}

#[derive(Debug)]
pub enum ConfigFileError {
    Read(std::io::Error),
    Parse(String),
    UnknownTable(String),
    NotATable(String),
    UnknownField {
        key: String,
        table: &'static str,
    },
    BadValue {
        key: String,
        table: &'static str,
        reason: String,
    },
}

impl std::fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigFileError::Read(e) => write!(f, "cannot read: {e}"),
            ConfigFileError::Parse(e) => write!(f, "invalid TOML: {e}"),
            ConfigFileError::UnknownTable(t) => write!(f, "unknown table `{t}`"),
            ConfigFileError::NotATable(t) => write!(f, "`{t}` must be a table"),
            ConfigFileError::UnknownField { key, table } => {
                write!(f, "unknown field `{key}` in [{table}]")
            }
            ConfigFileError::BadValue { key, table, reason } => {
                write!(f, "invalid value for `{key}` in [{table}]: {reason}")
            }
        }
    }
}

impl std::error::Error for ConfigFileError {}

pub fn load(path: &Path) -> Result<FileConfig, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(ConfigFileError::Read)?;
    parse(&text)
}

fn get<T: DeserializeOwned>(
    value: &Value,
    key: &str,
    table: &'static str,
) -> Result<T, ConfigFileError> {
    value
        .clone()
        .try_into()
        .map_err(|e: toml::de::Error| ConfigFileError::BadValue {
            key: key.to_string(),
            table,
            reason: e.message().trim().to_string(),
        })
}

pub fn parse(text: &str) -> Result<FileConfig, ConfigFileError> {
    let root: Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigFileError::Parse(e.to_string()))?;
    let mut config = FileConfig::default();
    for (name, section) in &root {
        let Value::Table(section) = section else {
            return Err(ConfigFileError::NotATable(name.clone()));
        };
        match name.as_str() {
            "listener" => {
                for (key, value) in section {
                    match key.as_str() {
                        "bind" => {
                            let bind: String = get(value, key, "listener")?;
                            if bind.parse::<std::net::SocketAddr>().is_err() {
                                return Err(ConfigFileError::BadValue {
                                    key: key.clone(),
                                    table: "listener",
                                    reason: format!(
                                        "`{bind}` is not an address like 127.0.0.1:1883"
                                    ),
                                });
                            }
                            config.bind = Some(bind);
                        }
                        _ => return Err(unknown(key, "listener")),
                    }
                }
            }
            "limits" => parse_limits(section, &mut config.broker)?,
            "sys" => {
                for (key, value) in section {
                    match key.as_str() {
                        "interval_s" => config.broker.sys_interval_s = get(value, key, "sys")?,
                        _ => return Err(unknown(key, "sys")),
                    }
                }
            }
            other => return Err(ConfigFileError::UnknownTable(other.to_string())),
        }
    }
    if let Err(error) = config.broker.validate() {
        let table = if error.field == "sys_interval_s" {
            "sys"
        } else {
            "limits"
        };
        return Err(ConfigFileError::BadValue {
            key: error.field.to_string(),
            table,
            reason: error.reason.to_string(),
        });
    }
    Ok(config)
}

fn unknown(key: &str, table: &'static str) -> ConfigFileError {
    ConfigFileError::UnknownField {
        key: key.to_string(),
        table,
    }
}

fn parse_limits(section: &Table, b: &mut BrokerConfig) -> Result<(), ConfigFileError> {
    const T: &str = "limits";
    for (key, v) in section {
        let k = key.as_str();
        match k {
            "max_packet_size_bytes" => b.max_packet_size_bytes = get(v, k, T)?,
            "receive_maximum" => b.receive_maximum = get(v, k, T)?,
            "topic_alias_maximum" => b.topic_alias_maximum = get(v, k, T)?,
            "max_keep_alive_s" => b.max_keep_alive_s = get(v, k, T)?,
            "connect_timeout_ms" => b.connect_timeout_ms = get(v, k, T)?,
            "max_inflight_messages" => b.max_inflight_messages = get(v, k, T)?,
            "max_queued_messages" => b.max_queued_messages = get(v, k, T)?,
            "max_session_expiry_interval_s" => b.max_session_expiry_interval_s = get(v, k, T)?,
            "max_subscriptions_per_session" => b.max_subscriptions_per_session = get(v, k, T)?,
            "max_retained_messages" => b.max_retained_messages = get(v, k, T)?,
            "max_client_id_len" => b.max_client_id_len = get(v, k, T)?,
            "outbound_queue_max_bytes" => b.outbound_queue_max_bytes = get(v, k, T)?,
            "outbound_queue_max_messages" => b.outbound_queue_max_messages = get(v, k, T)?,
            "slow_subscriber_timeout_ms" => b.slow_subscriber_timeout_ms = get(v, k, T)?,
            _ => return Err(unknown(k, T)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.broker, BrokerConfig::default());
        assert_eq!(c.bind, None);
    }

    #[test]
    fn sets_every_table() {
        let c = parse(
            "[listener]\nbind = \"127.0.0.1:0\"\n[limits]\nreceive_maximum = 10\n[sys]\ninterval_s = 0\n",
        )
        .unwrap();
        assert_eq!(c.bind.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(c.broker.receive_maximum, 10);
        assert_eq!(c.broker.sys_interval_s, 0);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = parse("[limits]\nmax_packet_sizee = 5\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown field `max_packet_sizee` in [limits]"
        );
    }

    #[test]
    fn bad_value_is_named() {
        let e = parse("[limits]\nreceive_maximum = \"lots\"\n").unwrap_err();
        assert!(
            e.to_string().contains("`receive_maximum` in [limits]"),
            "{e}"
        );
        let e = parse("[limits]\nreceive_maximum = 70000\n").unwrap_err();
        assert!(
            e.to_string().contains("`receive_maximum` in [limits]"),
            "{e}"
        );
        let e = parse("[limits]\nreceive_maximum = 0\n").unwrap_err();
        assert!(
            e.to_string().contains("`receive_maximum` in [limits]"),
            "{e}"
        );
        let e = parse("[listener]\nbind = \"nope\"\n").unwrap_err();
        assert!(e.to_string().contains("`bind` in [listener]"), "{e}");
    }
}
