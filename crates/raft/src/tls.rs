//! Mutual TLS on the cluster port (`[cluster] tls_cert`, `tls_key`, `tls_ca`): every
//! connection between nodes, Raft RPCs and forwarded client connections alike, is TLS 1.2 or
//! 1.3 in which both ends present a certificate signed by the cluster CA.
//!
//! # What is verified, and why not the name
//! Each side checks the other's chain against the cluster CA (and its validity dates and
//! extended key usage: `serverAuth` for the accepting side, `clientAuth` for the connecting
//! side). The name in the certificate is not checked: peers are configured as `ID=IP:PORT`,
//! so a name check would tie each node's certificate to its address (IP SANs re-issued on
//! every move), and the accepting side has no name to check a connecting peer against at all
//! (it learns who connects from the handshake). Any certificate the cluster CA signed is a
//! cluster member, on both sides, which is the rule nats-server routes and EMQX clusters
//! apply with a private CA. It follows that the CA must be the cluster's own: a CA that also
//! signs other certificates (an organisation's, a public one) lets their holders in.
//!
//! # Revocation
//! With certificate revocation lists (`[cluster] tls_crl`), a node whose certificate a CRL
//! of the cluster CA lists is refused on both sides: its connections are not accepted, and
//! a connection to it is dropped in the handshake. Only the end certificate is checked
//! against the CRLs (as mosquitto's `crlfile`), and its issuer must have a CRL in the set:
//! a certificate whose status the CRLs cannot tell is refused.
//!
//! # Reload
//! [`ClusterTls::reload`] (SIGHUP in `tern serve`) replaces the certificate, key, CA and
//! CRLs of this `ClusterTls` and of all its clones: later handshakes use the new ones, and
//! every live link is checked again with the new verifiers (the handshake's rule, now), the
//! links they refuse cut ([`link`]). So installing a CRL that revokes a stolen node key and
//! reloading every other node cuts that node off at once, with no restart; a renewed
//! certificate of this node is presented from the next connection on. Files that do not
//! build a config leave the old one in force.
//!
//! The PEM files are read by the caller (the server's `tls` module reads them for the MQTT
//! listeners too); this module turns the parsed certificates into the two rustls configs.

use std::sync::{Arc, RwLock};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as RustlsError, RootCertStore,
    ServerConfig, SignatureScheme,
};
use tokio::net::TcpStream;

use crate::error::ConsensusError;

mod link;
pub use link::{Link, TlsLink};
use link::{LinkWatch, Links, Side};

/// The cluster port's TLS: this node's certificate, for accepting and for connecting, and
/// the cluster CA that peers' certificates must chain to (module documentation). Clones
/// share one state: a reload through any of them reaches all.
#[derive(Clone)]
pub struct ClusterTls {
    shared: Arc<Shared>,
}

struct Shared {
    current: RwLock<Configs>,
    links: Links,
}

/// One set of files made into rustls configs and the verifiers they use.
struct Configs {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    client_verifier: Arc<dyn ClientCertVerifier>,
    server_verifier: Arc<CaOnlyVerifier>,
    /// How many reloads came before these (0: the files read at start).
    generation: u64,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls").finish_non_exhaustive()
    }
}

impl ClusterTls {
    /// From this node's certificate chain and key, the cluster CA's certificates and its
    /// revocation lists (none: nothing is checked for revocation).
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca: Vec<CertificateDer<'static>>,
        crls: Vec<CertificateRevocationListDer<'static>>,
    ) -> Result<ClusterTls, ConsensusError> {
        Ok(ClusterTls {
            shared: Arc::new(Shared {
                current: RwLock::new(Configs::new(chain, key, ca, crls)?),
                links: Links::default(),
            }),
        })
    }

    /// Replaces the files (as [`ClusterTls::new`] takes them) for this `ClusterTls` and its
    /// clones, then cuts every live link whose peer the new verifiers refuse; returns how
    /// many were cut. An error leaves the old files in force and every link as it was.
    pub fn reload(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca: Vec<CertificateDer<'static>>,
        crls: Vec<CertificateRevocationListDer<'static>>,
    ) -> Result<usize, ConsensusError> {
        let mut configs = Configs::new(chain, key, ca, crls)?;
        let (client_verifier, server_verifier) = (
            configs.client_verifier.clone(),
            configs.server_verifier.clone(),
        );
        // Swapped before the check: a handshake that took the old configs and registers its
        // link after the check's walk sees the new generation and checks itself (`admit`).
        {
            let mut current = self
                .shared
                .current
                .write()
                .unwrap_or_else(|e| e.into_inner());
            configs.generation = current.generation + 1;
            *current = configs;
        }
        let now = UnixTime::now();
        let mut cut = 0;
        for watch in self.shared.links.live() {
            if let Err(error) = recheck(&watch, client_verifier.as_ref(), &server_verifier, now) {
                tracing::warn!(peer = %watch.peer, %error, "cluster TLS: a connection cut after the reload: its peer's certificate is refused now");
                watch.cut();
                cut += 1;
            }
        }
        Ok(cut)
    }

    fn configs(&self) -> std::sync::RwLockReadGuard<'_, Configs> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The server side of the handshake on a connection a peer opened.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<Link> {
        let (acceptor, generation) = {
            let configs = self.configs();
            (configs.acceptor.clone(), configs.generation)
        };
        let tls = acceptor.accept(stream).await?;
        let stream = tokio_rustls::TlsStream::Server(tls);
        let link = TlsLink::new(stream, Side::Accepted, &self.shared.links)?;
        self.admit(link, generation)
    }

    /// The client side of the handshake on a connection to the peer at `addr`.
    pub async fn connect(
        &self,
        addr: std::net::SocketAddr,
        stream: TcpStream,
    ) -> std::io::Result<Link> {
        // Not checked (module documentation); the address is what a name would have been.
        let name = ServerName::IpAddress(addr.ip().into());
        let (connector, generation) = {
            let configs = self.configs();
            (configs.connector.clone(), configs.generation)
        };
        let tls = connector.connect(name, stream).await?;
        let stream = tokio_rustls::TlsStream::Client(tls);
        let link = TlsLink::new(stream, Side::Connected, &self.shared.links)?;
        self.admit(link, generation)
    }

    /// A link whose handshake ran under the configs of `generation`, registered: if a reload
    /// came since, its walk may have missed the link, so the link is checked here against
    /// the configs in force (and refused as a handshake would be now).
    fn admit(&self, link: TlsLink, generation: u64) -> std::io::Result<Link> {
        let verifiers = {
            let configs = self.configs();
            (configs.generation != generation).then(|| {
                (
                    configs.client_verifier.clone(),
                    configs.server_verifier.clone(),
                )
            })
        };
        if let Some((client_verifier, server_verifier)) = verifiers {
            let now = UnixTime::now();
            recheck(
                link.watch(),
                client_verifier.as_ref(),
                &server_verifier,
                now,
            )
            .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("cluster TLS: refused by the files reloaded during the handshake: {e}"),
                )
            })?;
        }
        Ok(Link::Tls(Box::new(link)))
    }
}

/// A live link's peer chain checked as its handshake checked it, with today's verifiers.
fn recheck(
    watch: &LinkWatch,
    client_verifier: &dyn ClientCertVerifier,
    server_verifier: &CaOnlyVerifier,
    now: UnixTime,
) -> Result<(), RustlsError> {
    let Some((end_entity, intermediates)) = watch.chain.split_first() else {
        return Err(RustlsError::NoCertificatesPresented);
    };
    match watch.side {
        Side::Accepted => client_verifier
            .verify_client_cert(end_entity, intermediates, now)
            .map(|_| ()),
        Side::Connected => {
            let name = ServerName::IpAddress(watch.peer.ip().into());
            server_verifier
                .verify_server_cert(end_entity, intermediates, &name, &[], now)
                .map(|_| ())
        }
    }
}

impl Configs {
    fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca: Vec<CertificateDer<'static>>,
        crls: Vec<CertificateRevocationListDer<'static>>,
    ) -> Result<Configs, ConsensusError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            ConsensusError::Invalid(format!("cluster TLS: {what}: {e}"))
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots.add(cert).map_err(|e| bad("tls_ca", &e))?;
        }
        let roots = Arc::new(roots);
        let revoking = !crls.is_empty();
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .with_crls(crls.clone());
        let client_verifier = if revoking {
            client_verifier.only_check_end_entity_revocation()
        } else {
            client_verifier
        };
        let client_verifier = client_verifier.build().map_err(|e| bad("tls_ca", &e))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_client_cert_verifier(client_verifier.clone())
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| bad("tls_cert/tls_key", &e))?;
        let server_verifier =
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone()).with_crls(crls);
        let server_verifier = if revoking {
            server_verifier.only_check_end_entity_revocation()
        } else {
            server_verifier
        };
        let server_verifier = Arc::new(CaOnlyVerifier {
            webpki: server_verifier.build().map_err(|e| bad("tls_crl", &e))?,
        });
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .dangerous()
            .with_custom_certificate_verifier(server_verifier.clone())
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad("tls_cert/tls_key", &e))?;
        Ok(Configs {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            client_verifier,
            server_verifier,
            generation: 0,
        })
    }
}

/// Checks a peer's server certificate against the cluster CA only: its chain, dates,
/// `serverAuth` usage and revocation, not its name (module documentation).
///
/// rustls' own verifier does all of that and checks the name last, after the chain and the
/// revocation lists have passed: its name error alone is taken as success, every other
/// error stands.
#[derive(Debug)]
struct CaOnlyVerifier {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for CaOnlyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, RustlsError> {
        let checked = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match checked {
            Err(RustlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
