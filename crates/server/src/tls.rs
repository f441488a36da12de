//! TLS for listeners (rustls): certificates and keys from PEM files, optional client
//! certificates checked against revocation lists, and the reload that swaps a listener's
//! config while it serves.
//!
//! # Invariants
//! - A reload either replaces a listener's whole config (certificate, key, client CA and CRLs
//!   read and checked together) or leaves it as it was: a bad file never takes TLS down.
//! - Handshakes take the config current when they start. A connection already up keeps its
//!   session keys, but its client certificate is checked again by the verifier current after
//!   a reload ([`CertificateCheck`]): one the new files refuse is disconnected
//!   (`Broker::after_tls_reload`), as the next handshake with it would be refused.
//! - With CRLs, a client certificate is checked as mosquitto's `crlfile` does: the end
//!   certificate only, and one whose issuer has no CRL in the file is refused (status unknown).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use tern_broker::CertificateCheck;

/// A TLS setup that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no PEM private key found (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: PathBuf },
    #[error("{path}: bad client CA certificate: {reason}")]
    BadCa { path: PathBuf, reason: String },
    #[error("{path}: no PEM certificate revocation list (X509 CRL) found")]
    NoCrl { path: PathBuf },
    #[error("{path}: the revocation lists do not make a certificate check: {reason}")]
    BadCrl { path: PathBuf, reason: String },
    #[error("certificate {cert} and key {key} do not make a TLS config: {reason}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// The files of one TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    /// PEM revocation lists for the client certificates (with `client_ca` only).
    pub crl: Option<PathBuf>,
    pub require_client_cert: bool,
}

/// One listener's TLS config, replaceable while it serves.
pub struct TlsState {
    files: TlsFiles,
    current: RwLock<Built>,
}

/// A listener's config as read from its files at one time.
struct Built {
    config: Arc<ServerConfig>,
    /// How many reloads came before it (0: read at start).
    generation: u64,
    /// The client-certificate verifier inside `config` (with a client CA only), kept to check
    /// the certificates of connected clients again after a reload.
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl TlsState {
    pub fn load(files: TlsFiles) -> Result<TlsState, TlsError> {
        let built = build(&files)?;
        Ok(TlsState {
            files,
            current: RwLock::new(built),
        })
    }

    /// The config for a handshake starting now, and its generation
    /// ([`CertificateCheck::generation`]).
    pub fn current(&self) -> (Arc<ServerConfig>, u64) {
        let built = self.current.read();
        (built.config.clone(), built.generation)
    }

    /// Re-reads the files and swaps the config in (the next generation); on error the old one
    /// stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let mut built = build(&self.files)?;
        let mut current = self.current.write();
        built.generation = current.generation + 1;
        *current = built;
        Ok(())
    }
}

/// The same verification as a handshake starting now (client CA, CRLs, validity at this
/// moment), so a reload that revokes a certificate reaches the connections made with it.
impl CertificateCheck for TlsState {
    fn still_valid(&self, chain: &[Bytes]) -> bool {
        let Some(verifier) = self.current.read().verifier.clone() else {
            // No client CA: this listener verifies no client certificate, so none is kept.
            return true;
        };
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return false;
        };
        let intermediates: Vec<CertificateDer<'_>> = intermediates
            .iter()
            .map(|c| CertificateDer::from(c.as_ref()))
            .collect();
        verifier
            .verify_client_cert(
                &CertificateDer::from(end_entity.as_ref()),
                &intermediates,
                UnixTime::now(),
            )
            .is_ok()
    }

    fn generation(&self) -> u64 {
        self.current.read().generation
    }
}

fn build(files: &TlsFiles) -> Result<Built, TlsError> {
    let certs = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config_error = |reason: String| TlsError::Config {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason,
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(e.to_string()))?;
    let mut kept = None;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(path)? {
                roots.add(cert).map_err(|e| TlsError::BadCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match &files.crl {
                None => verifier,
                Some(crl) => verifier
                    .with_crls(read_crls(crl)?)
                    .only_check_end_entity_revocation(),
            };
            let verifier = if files.require_client_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier.build().map_err(|e| match &files.crl {
                Some(crl) => TlsError::BadCrl {
                    path: crl.clone(),
                    reason: e.to_string(),
                },
                None => TlsError::BadCa {
                    path: path.clone(),
                    reason: e.to_string(),
                },
            })?;
            kept = Some(verifier.clone());
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| config_error(e.to_string()))?;
    Ok(Built {
        config: Arc::new(config),
        generation: 0,
        verifier: kept,
    })
}

fn open(path: &Path) -> Result<BufReader<File>, TlsError> {
    File::open(path)
        .map(BufReader::new)
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = rustls_pemfile::certs(&mut open(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The revocation lists in a PEM file (`-----BEGIN X509 CRL-----`); at least one.
fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let crls = rustls_pemfile::crls(&mut open(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if crls.is_empty() {
        return Err(TlsError::NoCrl {
            path: path.to_path_buf(),
        });
    }
    Ok(crls)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    rustls_pemfile::private_key(&mut open(path)?)
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey {
            path: path.to_path_buf(),
        })
}

/// `[cluster] tls_cert`, `tls_key`, `tls_ca`: this node's certificate chain and key (used
/// both to accept and to connect) and the cluster CA (`tern_raft::tls`); `tls_crl`, the
/// cluster CA's revocation lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub crl: Option<PathBuf>,
}

/// What the cluster port's TLS files hold, parsed: chain, key, CA, CRLs.
type ClusterTlsParts = (
    Vec<CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
    Vec<CertificateDer<'static>>,
    Vec<rustls::pki_types::CertificateRevocationListDer<'static>>,
);

fn read_cluster_files(files: &ClusterTlsFiles) -> Result<ClusterTlsParts, TlsError> {
    let chain = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let ca = read_certs(&files.ca)?;
    let crls = match &files.crl {
        Some(path) => read_crls(path)?,
        None => Vec::new(),
    };
    Ok((chain, key, ca, crls))
}

fn cluster_config_error(files: &ClusterTlsFiles, e: &tern_raft::ConsensusError) -> TlsError {
    TlsError::Config {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason: e.to_string(),
    }
}

/// Reads the cluster port's TLS files, with the listeners' PEM reading.
pub fn cluster_tls(files: &ClusterTlsFiles) -> Result<tern_raft::ClusterTls, TlsError> {
    let (chain, key, ca, crls) = read_cluster_files(files)?;
    tern_raft::ClusterTls::new(chain, key, ca, crls).map_err(|e| cluster_config_error(files, &e))
}

/// SIGHUP: reads the cluster port's TLS files again into `tls` (and every clone of it), which
/// cuts the live links to and from peers whose certificates they now refuse; returns how many
/// were cut. Files that fail to read or build leave the old ones in force.
pub fn reload_cluster_tls(
    files: &ClusterTlsFiles,
    tls: &tern_raft::ClusterTls,
) -> Result<usize, TlsError> {
    let (chain, key, ca, crls) = read_cluster_files(files)?;
    tls.reload(chain, key, ca, crls)
        .map_err(|e| cluster_config_error(files, &e))
}

/// The Common Name of a (verified) client certificate, for `use_identity_as_username`.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<Arc<str>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn bad_files_are_named_and_a_failed_reload_keeps_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let cert_path = write(dir.path(), "c.pem", &cert.pem());
        let key_path = write(dir.path(), "k.pem", &key.serialize_pem());
        let files = TlsFiles {
            cert: cert_path.clone(),
            key: key_path.clone(),
            client_ca: None,
            crl: None,
            require_client_cert: false,
        };
        let state = TlsState::load(files.clone()).unwrap();
        let (before, _) = state.current();
        std::fs::write(&key_path, "not a key").unwrap();
        let error = state.reload().unwrap_err();
        assert!(matches!(error, TlsError::NoKey { .. }), "{error}");
        assert!(
            Arc::ptr_eq(&before, &state.current().0),
            "kept the old config"
        );

        let missing = TlsFiles {
            key: dir.path().join("missing.pem"),
            ..files.clone()
        };
        let error = TlsState::load(missing).err().unwrap();
        assert!(error.to_string().contains("missing.pem"), "{error}");
        let garbage = TlsFiles {
            cert: write(dir.path(), "g.pem", "-----BEGIN CERTIFICATE-----\nnope\n"),
            ..files
        };
        assert!(TlsState::load(garbage).is_err());
    }

    #[test]
    fn common_name_of_a_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sensor-7");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()).as_deref(), Some("sensor-7"));
    }
}
