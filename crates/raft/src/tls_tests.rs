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
        let (chain, key) = self.issue(name, serial, usages);
        ClusterTls::new(chain, key, vec![trust.0.der().clone()], crls).unwrap()
    }

    /// A certificate of this CA and its key.
    fn issue(
        &self,
        name: &str,
        serial: u64,
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.extended_key_usages = usages;
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        (vec![cert.der().clone()], key)
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
    let foreign =
        |name: &str, serial: u64| ca.node_serial(name, serial, both(), &ca, vec![other.crl(&[])]);
    assert!(
        !exchange(&foreign("a", 1), &foreign("b", 2)).await,
        "status unknown"
    );
}

/// A connection from `client` to `server`, both ends, handshakes done.
async fn link_pair(server: &ClusterTls, client: &ClusterTls) -> (Link, Link) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = server.clone();
    let accepting = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        server.accept(s).await.unwrap()
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connected = client.connect(addr, tcp).await.unwrap();
    (accepting.await.unwrap(), connected)
}

/// Whether a byte goes from `from` to `to` over a live link.
async fn goes(from: &mut Link, to: &mut Link) -> bool {
    let sent = async {
        from.write_u8(9).await?;
        from.flush().await
    };
    if sent.await.is_err() {
        return false;
    }
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), to.read_u8()).await;
    matches!(read, Ok(Ok(9)))
}

/// A reload whose CRL revokes a member cuts that member's live links, accepted and
/// connected, waking a read waiting on one; the other member's links stay; later
/// handshakes follow the new files; a reload with bad files changes nothing.
#[tokio::test]
async fn a_reload_cuts_the_live_links_of_the_certificates_it_revokes() {
    let ca = Ca::new();
    let trust = || vec![ca.0.der().clone()];
    let (chain_a, key_a) = ca.issue("a", 1, both());
    let a = ClusterTls::new(
        chain_a.clone(),
        key_a.clone_key(),
        trust(),
        vec![ca.crl(&[])],
    )
    .unwrap();
    let b = ca.node_serial("b", 2, both(), &ca, vec![]);
    let c = ca.node_serial("c", 3, both(), &ca, vec![]);

    let (mut a_from_c, mut c_to_a) = link_pair(&a, &c).await;
    let (mut c_from_a, mut a_to_c) = link_pair(&c, &a).await;
    let (mut a_from_b, mut b_to_a) = link_pair(&a, &b).await;
    let (mut b_from_a, mut a_to_b) = link_pair(&b, &a).await;
    assert!(goes(&mut c_to_a, &mut a_from_c).await, "before the reload");
    // A read that waits on c's accepted link through the reload: a task of its own.
    let waiting = tokio::spawn(async move { a_from_c.read_u8().await });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(!waiting.is_finished());

    // Bad files (a CA that is not a certificate): refused, nothing changes.
    let garbage = vec![CertificateDer::from(vec![1u8, 2, 3])];
    assert!(
        a.reload(chain_a.clone(), key_a.clone_key(), garbage, vec![])
            .is_err()
    );
    assert!(
        goes(&mut a_to_c, &mut c_from_a).await,
        "after a refused reload"
    );

    let cut = a
        .reload(chain_a, key_a, trust(), vec![ca.crl(&[3])])
        .unwrap();
    assert_eq!(cut, 2, "c's accepted and connected links");
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the waiting read is woken")
        .unwrap();
    let error = read.expect_err("a cut link reads nothing");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionAborted);
    assert!(
        !goes(&mut a_to_c, &mut c_from_a).await,
        "a's connected link to c is cut"
    );
    assert!(
        goes(&mut b_to_a, &mut a_from_b).await,
        "b's link into a stays"
    );
    assert!(
        goes(&mut a_to_b, &mut b_from_a).await,
        "a's link to b stays"
    );
    assert!(!exchange(&a, &c).await, "c connecting after the reload");
    assert!(
        !exchange(&c, &a).await,
        "a connecting to c after the reload"
    );
    assert!(
        exchange(&a, &b).await && exchange(&b, &a).await,
        "b after the reload"
    );
}

/// A handshake under way through a reload ran with the old files: its link, registered after
/// the reload's walk, is checked against the new ones before it is handed out.
#[tokio::test]
async fn a_handshake_that_straddles_a_reload_is_checked_against_the_new_files() {
    let ca = Ca::new();
    let (chain_a, key_a) = ca.issue("a", 1, both());
    let trust = vec![ca.0.der().clone()];
    let a = ClusterTls::new(
        chain_a.clone(),
        key_a.clone_key(),
        trust.clone(),
        vec![ca.crl(&[])],
    )
    .unwrap();
    let c = ca.node_serial("c", 3, both(), &ca, vec![]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let server = a.clone();
    let accepting = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        server.accept(s).await
    });
    // The accept has taken the old acceptor and waits for the client's hello.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        a.reload(chain_a, key_a, trust, vec![ca.crl(&[3])]).unwrap(),
        0
    );
    let _client = c.connect(addr, tcp).await;
    let accepted = accepting.await.unwrap();
    let error = accepted.expect_err("c's link was handed out after its revocation");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{error}"
    );
}
