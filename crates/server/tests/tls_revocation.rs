//! A client certificate revoked while its holder is connected: the CRL is replaced and the
//! broker gets SIGHUP. The holder's connection is cut at the reload (v5: DISCONNECT 0x87, Not
//! authorized; v3.1.1: closed), as its next handshake would be refused; a reload that revokes
//! nothing cuts nobody, and a client without a certificate stays. Raw MQTT over rustls, so
//! what the broker sends is read byte for byte. Certificates made at test time.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Broker;
use common::certs::{self, Pki};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// Bound on one read: a packet owed now, or the end of a connection the broker closes.
const READ_WITHIN: Duration = Duration::from_secs(10);

trait Io: Read + Write {}
impl<T: Read + Write> Io for T {}

/// An MQTT client's byte stream: TLS with the PKI's client certificate, or plain TCP.
struct Client(Box<dyn Io>);

fn tls_client(addr: SocketAddr, pki: &Pki) -> Client {
    let (conn, tcp) = tls_connection(addr, pki);
    Client(Box::new(StreamOwned::new(conn, tcp)))
}

/// [`tls_client`] with its TLS handshake done before anything MQTT is sent.
fn handshaken(addr: SocketAddr, pki: &Pki) -> Client {
    let (mut conn, mut tcp) = tls_connection(addr, pki);
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).expect("TLS handshake");
    }
    Client(Box::new(StreamOwned::new(conn, tcp)))
}

fn tls_connection(addr: SocketAddr, pki: &Pki) -> (ClientConnection, TcpStream) {
    let mut roots = RootCertStore::empty();
    let mut ca = BufReader::new(std::fs::File::open(&pki.ca).unwrap());
    for cert in rustls_pemfile::certs(&mut ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain = rustls_pemfile::certs(&mut BufReader::new(
        std::fs::File::open(&pki.client_cert).unwrap(),
    ))
    .collect::<Result<Vec<_>, _>>()
    .unwrap();
    let key = rustls_pemfile::private_key(&mut BufReader::new(
        std::fs::File::open(&pki.client_key).unwrap(),
    ))
    .unwrap()
    .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(Arc::new(config), name).unwrap();
    (conn, tcp(addr))
}

fn tcp(addr: SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(READ_WITHIN)).unwrap();
    tcp
}

impl Client {
    /// CONNECT (clean start, keep alive 60 s) as `level` 4 (v3.1.1) or 5; CONNACK must accept.
    fn connect(&mut self, level: u8, client_id: &str) {
        assert_eq!(self.connack(level, client_id), Some(0), "CONNECT refused");
    }

    /// CONNECT, then the CONNACK's return or reason code; `None` if the connection ended
    /// first (a TLS handshake the broker refused ends it).
    fn connack(&mut self, level: u8, client_id: &str) -> Option<u8> {
        let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', level, 0x02, 0, 60];
        if level == 5 {
            body.push(0); // no properties
        }
        body.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
        body.extend_from_slice(client_id.as_bytes());
        if !self.send(0x10, &body) {
            return None;
        }
        let (kind, connack) = self.packet()?;
        assert_eq!(kind, 0x20, "not a CONNACK");
        connack.get(1).copied()
    }

    /// `false` if the connection is gone.
    fn send(&mut self, first: u8, body: &[u8]) -> bool {
        assert!(body.len() < 128, "one-byte remaining length only");
        let mut packet = vec![first, body.len() as u8];
        packet.extend_from_slice(body);
        self.0.write_all(&packet).is_ok() && self.0.flush().is_ok()
    }

    /// The next packet (first byte, body), or `None` once the broker closed the connection.
    fn packet(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut first = [0u8; 1];
        match self.0.read(&mut first) {
            Ok(1) => {}
            Ok(_) => return None,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => panic!("nothing read: {e}"),
            Err(_) => return None, // reset, or the TLS session ended without close_notify
        }
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let mut byte = [0u8; 1];
            self.0.read_exact(&mut byte).ok()?;
            len |= usize::from(byte[0] & 0x7f) << shift;
            shift += 7;
            if byte[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.0.read_exact(&mut body).ok()?;
        Some((first[0], body))
    }

    /// PINGREQ answered by PINGRESP: the connection is up.
    fn ping(&mut self) {
        assert!(self.send(0xC0, &[]), "the connection is gone");
        assert_eq!(self.packet().map(|p| p.0), Some(0xD0), "no PINGRESP");
    }

    /// After a v5 DISCONNECT (if `v5`) with `reason`, the broker closes the connection.
    fn expect_cut(&mut self, v5: bool, reason: u8) {
        if v5 {
            let (kind, body) = self.packet().expect("a DISCONNECT before the close");
            assert_eq!(kind, 0xE0, "not a DISCONNECT: {kind:#x} {body:?}");
            assert_eq!(body.first(), Some(&reason), "reason code");
        }
        let deadline = Instant::now() + READ_WITHIN;
        while let Some((kind, _)) = self.packet() {
            assert!(Instant::now() < deadline, "still open");
            assert_ne!(kind, 0xD0, "still answered");
        }
    }
}

/// SIGHUP, then waits until the broker logs that its TLS files were read again.
fn reload(broker: &Broker, times: usize) {
    broker.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while broker
        .log_tail(400)
        .matches("TLS certificates reloaded")
        .count()
        < times
    {
        assert!(Instant::now() < deadline, "no reload logged");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(pki: &Pki, crl: &Path) -> (Broker, SocketAddr) {
    let config = format!(
        "[[listener]]\nbind = \"127.0.0.1:0\"\n\n[[listener]]\nbind = \"127.0.0.1:0\"\n\
         tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_client_ca = \"{}\"\ntls_crl = \"{}\"\n\
         require_client_cert = true\n",
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca.display(),
        crl.display()
    );
    let mut broker = Broker::start_with_args(&config, &[]);
    let addrs = broker.listener_addrs(2);
    (broker, addrs[1])
}

#[test]
fn a_reloaded_crl_disconnects_the_clients_of_the_certificate_it_revokes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "r", "client-r");
    let crl = dir.path().join("live-crl.pem");
    std::fs::copy(&pki.crl_empty, &crl).unwrap();
    let (broker, tls_addr) = start(&pki, &crl);

    let mut v5 = tls_client(tls_addr, &pki);
    v5.connect(5, "cert-v5");
    let mut v3 = tls_client(tls_addr, &pki);
    v3.connect(4, "cert-v3");
    let mut plain = Client(Box::new(tcp(broker.addr)));
    plain.connect(5, "no-cert");

    // A reload that revokes nothing cuts nobody.
    reload(&broker, 1);
    v5.ping();
    v3.ping();
    plain.ping();

    // The certificate revoked: its holders are cut at the reload.
    std::fs::copy(&pki.crl_client, &crl).unwrap();
    reload(&broker, 2);
    v5.expect_cut(true, 0x87);
    v3.expect_cut(false, 0x87);
    plain.ping();
    // And it cannot come back.
    let again = tls_client(tls_addr, &pki).connack(5, "again");
    assert_eq!(again, None, "a revoked certificate connected again");
    plain.ping();
}

/// A client whose TLS handshake came before a reload and whose CONNECT comes after it: the
/// reload's walk of the connected clients cannot see it yet, so the CONNECT is checked against
/// the files in force: accepted after a reload that revokes nothing, refused with 0x87 (v3.1.1:
/// return code 5, not authorized) once the certificate is revoked.
#[test]
fn a_connect_after_a_reload_is_checked_though_its_handshake_came_before() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "h", "client-h");
    let crl = dir.path().join("live-crl.pem");
    std::fs::copy(&pki.crl_empty, &crl).unwrap();
    let (broker, tls_addr) = start(&pki, &crl);

    let mut early = handshaken(tls_addr, &pki);
    reload(&broker, 1);
    early.connect(5, "early");
    early.ping();

    let mut v5 = handshaken(tls_addr, &pki);
    let mut v3 = handshaken(tls_addr, &pki);
    std::fs::copy(&pki.crl_client, &crl).unwrap();
    reload(&broker, 2);
    assert_eq!(
        v5.connack(5, "late-v5"),
        Some(0x87),
        "v5 CONNECT after the revocation"
    );
    assert_eq!(
        v3.connack(4, "late-v3"),
        Some(5),
        "v3.1.1 CONNECT after the revocation"
    );
}
