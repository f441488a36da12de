//! TLS for the load generator's connections (`--tls-ca`): one rustls client config per run.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::cli::Common;

/// What every TLS connection of a run shares.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl TlsClient {
    /// `None` without `--tls-ca`.
    pub fn from_args(common: &Common) -> anyhow::Result<Option<TlsClient>> {
        let Some(ca) = &common.tls_ca else {
            return Ok(None);
        };
        let name = common.tls_server_name.as_deref().unwrap_or(&common.host);
        let identity = match (&common.tls_cert, &common.tls_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        Ok(Some(TlsClient::new(ca, name, identity)?))
    }

    /// Trusting the CAs in `ca`, checking `server_name`; with `identity` (certificate chain
    /// and key files), presenting that client certificate.
    pub fn new(
        ca: &Path,
        server_name: &str,
        identity: Option<(&Path, &Path)>,
    ) -> anyhow::Result<TlsClient> {
        let file = std::fs::File::open(ca).with_context(|| format!("--tls-ca {}", ca.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut std::io::BufReader::new(file)) {
            let cert = cert.with_context(|| format!("--tls-ca {}", ca.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("--tls-ca {}: bad certificate", ca.display()))?;
        }
        anyhow::ensure!(
            !roots.is_empty(),
            "--tls-ca {}: no certificate",
            ca.display()
        );
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match identity {
            None => config.with_no_client_auth(),
            Some((cert, key)) => {
                let (chain, key) = read_identity(cert, key)?;
                config
                    .with_client_auth_cert(chain, key)
                    .context("--tls-cert/--tls-key")?
            }
        };
        let server_name = ServerName::try_from(server_name.to_owned())
            .with_context(|| format!("--tls-server-name {server_name}"))?;
        Ok(TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    pub async fn handshake(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        self.connector.connect(self.server_name.clone(), tcp).await
    }
}

/// The client certificate chain and its key, from PEM files.
fn read_identity(
    cert: &Path,
    key: &Path,
) -> anyhow::Result<(
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
)> {
    let open = |p: &Path, what: &str| {
        std::fs::File::open(p)
            .map(std::io::BufReader::new)
            .with_context(|| format!("{what} {}", p.display()))
    };
    let chain = rustls_pemfile::certs(&mut open(cert, "--tls-cert")?)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "--tls-cert {}: no certificate",
        cert.display()
    );
    let key = rustls_pemfile::private_key(&mut open(key, "--tls-key")?)
        .with_context(|| format!("--tls-key {}", key.display()))?
        .with_context(|| format!("--tls-key {}: no private key", key.display()))?;
    Ok((chain, key))
}

/// A connection's byte stream: plain TCP or TLS over TCP.
pub enum BenchStream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for BenchStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BenchStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            BenchStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BenchStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            BenchStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            BenchStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BenchStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            BenchStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BenchStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            BenchStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
