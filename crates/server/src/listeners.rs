//! `[[listener]]` tables: any number of listeners, each plain TCP or WebSocket, with or
//! without TLS. `[listener] bind` (one table) and `--bind` keep working: `--bind` replaces the
//! first listener's address.
//!
//! Start-up: [`ListenerConfig::check`] (no I/O) when the file is read, [`prepare`] (reads the
//! TLS files: a bad file is a config error, exit code 2), then [`bind`] in the runtime.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use serde::Deserialize;
use tern_broker::{
    AcceptedSocket, ByteStream, CertificateCheck, ClientCertificate, Listener, ListenerContext,
    StreamTransport, TransportKind, Upgrade, UpgradeFuture, Upgraded,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::tls::{TlsError, TlsFiles, TlsState};

/// One `[[listener]]` table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, expecting = "a [[listener]] table")]
pub struct ListenerConfig {
    pub bind: String,
    #[serde(default)]
    pub transport: TransportName,
    /// PEM certificate chain; with `tls_key`, TLS is on.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: client certificates are asked for and checked against them.
    pub tls_client_ca: Option<PathBuf>,
    /// PEM revocation lists: a client certificate they list is refused (reloaded on SIGHUP).
    pub tls_crl: Option<PathBuf>,
    #[serde(default)]
    pub require_client_cert: bool,
    #[serde(default)]
    pub use_identity_as_username: bool,
    /// Overrides `[auth] allow_anonymous` for this listener (consumed by the `[auth]` layer).
    pub allow_anonymous: Option<bool>,
    /// Open connections at most on this listener; more are closed at accept (counted).
    pub max_connections: Option<usize>,
}

/// `transport = "tcp" | "ws"`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TransportName {
    #[default]
    Tcp,
    Ws,
}

impl ListenerConfig {
    pub fn plain(bind: impl Into<String>) -> ListenerConfig {
        ListenerConfig {
            bind: bind.into(),
            transport: TransportName::Tcp,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_crl: None,
            require_client_cert: false,
            use_identity_as_username: false,
            allow_anonymous: None,
            max_connections: None,
        }
    }

    pub fn tls(&self) -> bool {
        self.tls_cert.is_some()
    }

    /// Checks the table alone (no file is read): `(key, reason)` of the first problem.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.bind.parse::<SocketAddr>().is_err() {
            return Err((
                "bind",
                format!("`{}` is not an address like 127.0.0.1:1883", self.bind),
            ));
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => return Err(("tls_key", "tls_cert needs tls_key".into())),
            (None, Some(_)) => return Err(("tls_cert", "tls_key needs tls_cert".into())),
            _ => {}
        }
        let needs_tls = [
            ("tls_client_ca", self.tls_client_ca.is_some()),
            ("tls_crl", self.tls_crl.is_some()),
            ("require_client_cert", self.require_client_cert),
            ("use_identity_as_username", self.use_identity_as_username),
        ];
        for (key, set) in needs_tls {
            if set && !self.tls() {
                return Err((key, "needs TLS (tls_cert and tls_key)".into()));
            }
        }
        if (self.require_client_cert || self.use_identity_as_username || self.tls_crl.is_some())
            && self.tls_client_ca.is_none()
        {
            let key = if self.require_client_cert {
                "require_client_cert"
            } else if self.use_identity_as_username {
                "use_identity_as_username"
            } else {
                "tls_crl"
            };
            return Err((key, "needs tls_client_ca (client certificates)".into()));
        }
        if self.max_connections == Some(0) {
            return Err(("max_connections", "must be at least 1".into()));
        }
        Ok(())
    }
}

/// A listener whose TLS files were read, ready to bind.
pub struct Prepared {
    pub config: ListenerConfig,
    /// Named by its bound address once bound (`bind`).
    pub context: ListenerContext,
    pub tls: Option<Arc<TlsState>>,
}

/// Reads every listener's TLS files.
pub fn prepare(configs: &[ListenerConfig]) -> Result<Vec<Prepared>, (String, TlsError)> {
    let mut prepared = Vec::with_capacity(configs.len());
    for (index, config) in configs.iter().enumerate() {
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => {
                let files = TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: config.tls_client_ca.clone(),
                    crl: config.tls_crl.clone(),
                    require_client_cert: config.require_client_cert,
                };
                let state = TlsState::load(files).map_err(|e| (config.bind.clone(), e))?;
                Some(Arc::new(state))
            }
            _ => None,
        };
        let transport = match config.transport {
            TransportName::Tcp => TransportKind::Tcp,
            TransportName::Ws => TransportKind::WebSocket,
        };
        let mut context = ListenerContext::new(index, config.bind.clone(), transport);
        context.tls = tls.is_some();
        context.allow_anonymous = config.allow_anonymous;
        context.use_identity_as_username = config.use_identity_as_username;
        context.max_connections = config.max_connections;
        prepared.push(Prepared {
            config: config.clone(),
            context,
            tls,
        });
    }
    Ok(prepared)
}

/// Re-reads the certificates of every TLS listener (issue 13: on SIGHUP).
#[derive(Clone, Default)]
pub struct CertReloader {
    listeners: Vec<(String, Arc<TlsState>)>,
}

impl CertReloader {
    pub fn new(prepared: &[Prepared]) -> CertReloader {
        CertReloader {
            listeners: prepared
                .iter()
                .filter_map(|p| Some((p.config.bind.clone(), p.tls.clone()?)))
                .collect(),
        }
    }

    /// Swaps in each TLS listener's re-read certificate, key and client CA. A listener whose
    /// files are bad keeps its config; its error is logged and returned. Connections already
    /// up keep going; handshakes from now on use the new files.
    pub fn reload(&self) -> Vec<(String, TlsError)> {
        let mut failed = Vec::new();
        for (name, state) in &self.listeners {
            match state.reload() {
                Ok(()) => tracing::info!(listener = %name, "TLS certificates reloaded"),
                Err(error) => {
                    tracing::error!(listener = %name, %error, "TLS reload failed; old certificates kept");
                    failed.push((name.clone(), error));
                }
            }
        }
        failed
    }
}

/// Binds every listener (in the runtime).
pub async fn bind(
    prepared: Vec<Prepared>,
    max_packet_size_bytes: u32,
) -> anyhow::Result<Vec<Listener>> {
    let mut listeners = Vec::with_capacity(prepared.len());
    for listener in prepared {
        let socket = TcpListener::bind(&listener.config.bind)
            .await
            .with_context(|| format!("cannot listen on {}", listener.config.bind))?;
        let mut context = listener.context;
        // The bound address (port 0 resolved) names it in logs and metrics.
        if let Ok(local) = socket.local_addr() {
            context.name = local.to_string();
        }
        let websocket = listener.config.transport == TransportName::Ws;
        let upgrade: Option<Arc<dyn Upgrade>> = if websocket || listener.tls.is_some() {
            Some(Arc::new(StreamUpgrade {
                tls: listener.tls,
                websocket,
                max_packet_size_bytes,
            }))
        } else {
            None
        };
        listeners.push(Listener {
            socket,
            context: Arc::new(context),
            upgrade,
        });
    }
    Ok(listeners)
}

/// TLS handshake and/or WebSocket upgrade of an accepted socket.
struct StreamUpgrade {
    tls: Option<Arc<TlsState>>,
    websocket: bool,
    max_packet_size_bytes: u32,
}

impl Upgrade for StreamUpgrade {
    fn upgrade(&self, socket: AcceptedSocket) -> UpgradeFuture {
        let tls = self.tls.clone();
        let websocket = self.websocket;
        let max_packet = self.max_packet_size_bytes;
        match socket {
            AcceptedSocket::Tcp(socket) => {
                let _ = socket.set_nodelay(true);
                Box::pin(upgrade(socket, tls, websocket, max_packet))
            }
            // A client forwarded over a TLS cluster link: this listener's own TLS and
            // WebSocket run inside it, as they would on the socket.
            AcceptedSocket::Stream(stream) => Box::pin(upgrade(stream, tls, websocket, max_packet)),
        }
    }
}

async fn upgrade<S: ByteStream>(
    socket: S,
    tls: Option<Arc<TlsState>>,
    websocket: bool,
    max_packet: u32,
) -> std::io::Result<Upgraded> {
    let Some(state) = tls else {
        let ws = crate::ws::accept(socket, max_packet).await?;
        return Ok(Upgraded {
            stream: StreamTransport::new(ws),
            peer_cn: None,
            client_cert: None,
        });
    };
    let (config, verified_in) = state.current();
    let tls = TlsAcceptor::from(config).accept(socket).await?;
    let chain = tls.get_ref().1.peer_certificates().unwrap_or_default();
    let peer_cn = chain.first().and_then(crate::tls::common_name);
    // Kept for the connection's life, checked again when the listener's files are reloaded.
    let client_cert = (!chain.is_empty()).then(|| ClientCertificate {
        chain: chain.iter().map(|c| Bytes::copy_from_slice(c)).collect(),
        check: state as Arc<dyn CertificateCheck>,
        verified_in,
    });
    let stream = if websocket {
        StreamTransport::new(crate::ws::accept(tls, max_packet).await?)
    } else {
        StreamTransport::new(tls)
    };
    Ok(Upgraded {
        stream,
        peer_cn,
        client_cert,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ListenerConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn tables_parse_and_check() {
        let l = parse("bind = \"127.0.0.1:0\"\ntransport = \"ws\"\n").unwrap();
        assert_eq!(l.transport, TransportName::Ws);
        assert!(l.check().is_ok());
        let e = parse("bind = \"127.0.0.1:0\"\ntransport = \"quic\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown variant `quic`"), "{e}");
        let e = parse("bind = \"127.0.0.1:0\"\ntls = true\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `tls`"), "{e}");
        let l = parse("bind = \"127.0.0.1:0\"\ntls_cert = \"c.pem\"\n").unwrap();
        assert_eq!(l.check().unwrap_err().0, "tls_key");
        let l = parse("bind = \"127.0.0.1:0\"\nrequire_client_cert = true\n").unwrap();
        assert_eq!(l.check().unwrap_err().0, "require_client_cert");
        let l = parse(
            "bind = \"127.0.0.1:0\"\ntls_cert = \"c\"\ntls_key = \"k\"\nuse_identity_as_username = true\n",
        )
        .unwrap();
        assert_eq!(l.check().unwrap_err().0, "use_identity_as_username");
        let l = parse("bind = \"nope\"\n").unwrap();
        assert_eq!(l.check().unwrap_err().0, "bind");
    }
}
