//! Test PKI made at test time (rcgen): a CA, a server certificate for 127.0.0.1 and
//! localhost, and a client certificate with a CN, with the CA's revocation lists. No private
//! key is committed.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber, date_time_ymd,
};

/// The files of one test PKI, in the directory it was made in.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The CA's revocation list with nothing in it, and one that lists the client
    /// certificate (PEM, `X509 CRL`).
    pub crl_empty: PathBuf,
    pub crl_client: PathBuf,
}

/// The client certificate's serial number in [`make`]'s PKI (the server's is 1).
const CLIENT_SERIAL: u64 = 2;

/// `ca`'s revocation list of the certificates with these serial numbers, as PEM.
fn crl_pem(ca: &CertifiedIssuer<'static, KeyPair>, revoked: &[u64]) -> String {
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
    params.signed_by(ca).unwrap().pem().unwrap()
}

/// Makes a CA (named `name`), a server certificate and a client certificate whose CN is
/// `client_cn`, as PEM files under `dir` (file names start with `name`).
pub fn make(dir: &Path, name: &str, client_cn: &str) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} test CA"));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

    let mut server_params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    server_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server_params.serial_number = Some(SerialNumber::from(1u64));
    let server_key = KeyPair::generate().unwrap();
    let server = server_params.signed_by(&server_key, &ca).unwrap();

    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(DnType::CommonName, client_cn);
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client_params.serial_number = Some(SerialNumber::from(CLIENT_SERIAL));
    let client_key = KeyPair::generate().unwrap();
    let client = client_params.signed_by(&client_key, &ca).unwrap();

    let write = |suffix: &str, text: String| {
        let path = dir.join(format!("{name}-{suffix}.pem"));
        std::fs::write(&path, text).unwrap();
        path
    };
    Pki {
        ca: write("ca", ca.pem()),
        server_cert: write("server", server.pem()),
        server_key: write("server-key", server_key.serialize_pem()),
        client_cert: write("client", client.pem()),
        client_key: write("client-key", client_key.serialize_pem()),
        crl_empty: write("crl-empty", crl_pem(&ca, &[])),
        crl_client: write("crl-client", crl_pem(&ca, &[CLIENT_SERIAL])),
    }
}

/// The files of a cluster node: a certificate for both ends of a cluster link (`serverAuth`
/// and `clientAuth`), its key, and the CA that signed it.
pub struct NodePki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA's revocation list that names this node's certificate.
    pub revoked_in: PathBuf,
    /// The revocation list this node checks its peers against (`[cluster] tls_crl`); `None`
    /// from [`make_cluster`].
    pub crl: Option<PathBuf>,
}

/// Makes a CA (named `name`) and one node certificate per entry of `nodes` (its CN), as PEM
/// files under `dir`. Certificates from two calls chain to two different CAs.
pub fn make_cluster(dir: &Path, name: &str, nodes: &[&str]) -> Vec<NodePki> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} cluster CA"));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let ca_path = dir.join(format!("{name}-cluster-ca.pem"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    nodes
        .iter()
        .zip(1u64..)
        .map(|(cn, serial)| {
            // A SAN that is not the peers' address: the name is not what is checked.
            let mut params = CertificateParams::new(vec![format!("{cn}.cluster")]).unwrap();
            params.distinguished_name.push(DnType::CommonName, *cn);
            params.serial_number = Some(SerialNumber::from(serial));
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            let cert_path = dir.join(format!("{name}-{cn}.pem"));
            let key_path = dir.join(format!("{name}-{cn}-key.pem"));
            std::fs::write(&cert_path, cert.pem()).unwrap();
            std::fs::write(&key_path, key.serialize_pem()).unwrap();
            let revoked_in = dir.join(format!("{name}-{cn}-revoked-crl.pem"));
            std::fs::write(&revoked_in, crl_pem(&ca, &[serial])).unwrap();
            NodePki {
                ca: ca_path.clone(),
                cert: cert_path,
                key: key_path,
                revoked_in,
                crl: None,
            }
        })
        .collect()
}
