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
//! a certificate whose status the CRLs cannot tell is refused. The files are read at start.
//!
//! The PEM files are read by the caller (the server's `tls` module reads them for the MQTT
//! listeners too); this module turns the parsed certificates into the two rustls configs.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as RustlsError, RootCertStore,
    ServerConfig, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::error::ConsensusError;

/// The cluster port's TLS: this node's certificate, for accepting and for connecting, and
/// the cluster CA that peers' certificates must chain to (module documentation).
#[derive(Clone)]
pub struct ClusterTls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
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
            .with_client_cert_verifier(client_verifier)
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
            .with_custom_certificate_verifier(server_verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad("tls_cert/tls_key", &e))?;
        Ok(ClusterTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }

    /// The server side of the handshake on a connection a peer opened.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<Link> {
        let tls = self.acceptor.accept(stream).await?;
        Ok(Link::Tls(Box::new(tokio_rustls::TlsStream::Server(tls))))
    }

    /// The client side of the handshake on a connection to the peer at `addr`.
    pub async fn connect(
        &self,
        addr: std::net::SocketAddr,
        stream: TcpStream,
    ) -> std::io::Result<Link> {
        // Not checked (module documentation); the address is what a name would have been.
        let name = ServerName::IpAddress(addr.ip().into());
        let tls = self.connector.connect(name, stream).await?;
        Ok(Link::Tls(Box::new(tokio_rustls::TlsStream::Client(tls))))
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

/// A connection between two nodes: plain TCP (no `[cluster] tls_*`), or TLS over it.
pub enum Link {
    Tcp(TcpStream),
    /// Boxed: a TLS stream holds its buffers inline (kilobytes), a TCP stream a handle.
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Link::Tcp(_) => "Link::Tcp",
            Link::Tls(_) => "Link::Tls",
        })
    }
}

impl AsyncRead for Link {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Link::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer,
        ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
        SerialNumber, date_time_ymd,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Ca(CertifiedIssuer<'static, KeyPair>);

    impl Ca {
        fn new() -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            Ca(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
        }

        /// A node's `ClusterTls`: a certificate of this CA (named `name`, with `usages`),
        /// trusting `trust`.
        fn node(&self, name: &str, usages: Vec<ExtendedKeyUsagePurpose>, trust: &Ca) -> ClusterTls {
            self.node_serial(name, 1, usages, trust, Vec::new())
        }

        /// [`Ca::node`] with the certificate's serial number, and `crls` checked.
        fn node_serial(
            &self,
            name: &str,
            serial: u64,
            usages: Vec<ExtendedKeyUsagePurpose>,
            trust: &Ca,
            crls: Vec<CertificateRevocationListDer<'static>>,
        ) -> ClusterTls {
            let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
            params.extended_key_usages = usages;
            params.serial_number = Some(SerialNumber::from(serial));
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.0).unwrap();
            let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
            let ca = vec![trust.0.der().clone()];
            ClusterTls::new(vec![cert.der().clone()], key, ca, crls).unwrap()
        }

        /// This CA's revocation list of the certificates with these serial numbers.
        fn crl(&self, revoked: &[u64]) -> CertificateRevocationListDer<'static> {
            let params = CertificateRevocationListParams {
                this_update: date_time_ymd(2020, 1, 1),
                next_update: date_time_ymd(2100, 1, 1),
                crl_number: SerialNumber::from(1u64),
                issuing_distribution_point: None,
                revoked_certs: revoked
                    .iter()
                    .map(|&n| RevokedCertParams {
                        serial_number: SerialNumber::from(n),
                        revocation_time: date_time_ymd(2021, 1, 1),
                        reason_code: None,
                        invalidity_date: None,
                    })
                    .collect(),
                key_identifier_method: KeyIdMethod::Sha256,
            };
            params.signed_by(&self.0).unwrap().der().clone()
        }
    }

    fn both() -> Vec<ExtendedKeyUsagePurpose> {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    }

    /// A byte from `client` to `server` and back over a fresh connection: whether it went.
    async fn exchange(server: &ClusterTls, client: &ClusterTls) -> bool {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = server.clone();
        let serving = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut link = server.accept(s).await.ok()?;
            let b = link.read_u8().await.ok()?;
            link.write_u8(b).await.ok()?;
            link.flush().await.ok()
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let went = async {
            let mut link = client.connect(addr, tcp).await.ok()?;
            link.write_u8(7).await.ok()?;
            link.flush().await.ok()?;
            (link.read_u8().await.ok()? == 7).then_some(())
        }
        .await
        .is_some();
        let served = serving.await.unwrap().is_some();
        went && served
    }

    #[tokio::test]
    async fn members_talk_whatever_their_names_and_strangers_do_not() {
        let ca = Ca::new();
        let other = Ca::new();
        // Names that are not the address dialled (127.0.0.1): not checked.
        let a = ca.node("a.cluster", both(), &ca);
        let b = ca.node("b.elsewhere", both(), &ca);
        assert!(exchange(&a, &b).await, "two members");
        // Another CA's certificate, trusting ours: refused as client and as server.
        let stranger = other.node("a.cluster", both(), &ca);
        assert!(!exchange(&a, &stranger).await, "a stranger connecting");
        assert!(!exchange(&stranger, &a).await, "a stranger accepting");
        // A member whose certificate lacks the usage its side needs.
        let client_only = ca.node("c", vec![ExtendedKeyUsagePurpose::ClientAuth], &ca);
        assert!(
            exchange(&a, &client_only).await,
            "connecting needs clientAuth only"
        );
        assert!(
            !exchange(&client_only, &a).await,
            "accepting needs serverAuth"
        );
    }

    /// A member whose certificate the cluster CA revoked is refused as client and as server,
    /// by nodes that have the CRL; the same certificates without it talk (the test's control).
    #[tokio::test]
    async fn a_revoked_members_certificate_is_refused_both_ways() {
        let ca = Ca::new();
        let crl = ca.crl(&[3]);
        let with_crl =
            |name: &str, serial: u64| ca.node_serial(name, serial, both(), &ca, vec![crl.clone()]);
        let (a, b, revoked) = (with_crl("a", 1), with_crl("b", 2), with_crl("c", 3));
        assert!(exchange(&a, &b).await, "two members in good standing");
        assert!(!exchange(&a, &revoked).await, "a revoked node connecting");
        assert!(!exchange(&revoked, &a).await, "a revoked node accepting");

        let without = |name: &str, serial: u64| ca.node_serial(name, serial, both(), &ca, vec![]);
        let (a, revoked) = (without("a", 1), without("c", 3));
        assert!(
            exchange(&a, &revoked).await,
            "without the CRL, serial 3 connects"
        );
        assert!(
            exchange(&revoked, &a).await,
            "without the CRL, serial 3 accepts"
        );

        // A CRL from another CA leaves our certificates' status unknown: refused.
        let other = Ca::new();
        let foreign = |name: &str, serial: u64| {
            ca.node_serial(name, serial, both(), &ca, vec![other.crl(&[])])
        };
        assert!(
            !exchange(&foreign("a", 1), &foreign("b", 2)).await,
            "status unknown"
        );
    }
}
