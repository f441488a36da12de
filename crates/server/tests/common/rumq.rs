//! rumqttc 0.24 clients (v4 = MQTT 3.1.1 and v5) for the normal paths. The event loop runs in a
//! task that forwards every event to a channel and stops at the first error (no reconnects:
//! a test that wants to reconnect builds a new client).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::WAIT;

/// What the event-loop task reports.
#[derive(Debug)]
pub enum Ev<P> {
    In(P),
    /// The event loop ended with this error (connection closed, refused, ...).
    Err(String),
}

async fn next<P: std::fmt::Debug>(
    rx: &mut mpsc::UnboundedReceiver<Ev<P>>,
    timeout: Duration,
) -> Option<Ev<P>> {
    tokio::time::timeout(timeout, rx.recv())
        .await
        .ok()
        .flatten()
}

pub mod v4 {
    use super::*;
    #[allow(unused_imports)]
    pub use rumqttc::{
        AsyncClient, ConnAck, ConnectReturnCode, Event, LastWill, MqttOptions, Packet, Publish, QoS,
    };

    pub struct Client {
        pub client: AsyncClient,
        rx: mpsc::UnboundedReceiver<Ev<Packet>>,
        task: JoinHandle<()>,
        pub connack: ConnAck,
    }

    pub fn options(addr: SocketAddr, client_id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    /// Connects and waits for CONNACK. `Err` carries the event loop's error (e.g. refused).
    pub async fn try_connect(o: MqttOptions) -> Result<Client, String> {
        let (client, mut eventloop) = AsyncClient::new(o, 64);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(p)) => {
                        if tx.send(Ev::In(p)).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Outgoing(_)) => {}
                    Err(e) => {
                        let _ = tx.send(Ev::Err(e.to_string()));
                        return;
                    }
                }
            }
        });
        match next(&mut rx, WAIT).await {
            Some(Ev::In(Packet::ConnAck(connack))) => Ok(Client {
                client,
                rx,
                task,
                connack,
            }),
            Some(Ev::Err(e)) => Err(e),
            other => Err(format!("no CONNACK: {other:?}")),
        }
    }

    pub async fn connect(o: MqttOptions) -> Client {
        try_connect(o).await.expect("rumqttc v4 connect")
    }

    impl Client {
        /// Next incoming packet other than PINGRESP.
        pub async fn next_packet(&mut self) -> Packet {
            loop {
                match next(&mut self.rx, WAIT).await {
                    Some(Ev::In(Packet::PingResp)) => continue,
                    Some(Ev::In(p)) => return p,
                    other => panic!("expected a packet within {WAIT:?}, got {other:?}"),
                }
            }
        }

        /// Next PUBLISH, skipping acknowledgements of our own requests.
        pub async fn expect_publish(&mut self) -> Publish {
            loop {
                match self.next_packet().await {
                    Packet::Publish(p) => return p,
                    Packet::PubAck(_)
                    | Packet::PubRec(_)
                    | Packet::PubComp(_)
                    | Packet::SubAck(_)
                    | Packet::UnsubAck(_) => continue,
                    other => panic!("expected PUBLISH, got {other:?}"),
                }
            }
        }

        /// Waits for the SUBACK of a subscribe just sent; returns its return codes.
        pub async fn expect_suback(&mut self) -> Vec<rumqttc::SubscribeReasonCode> {
            loop {
                match self.next_packet().await {
                    Packet::SubAck(s) => return s.return_codes,
                    Packet::PubAck(_) | Packet::PubComp(_) => continue,
                    other => panic!("expected SUBACK, got {other:?}"),
                }
            }
        }

        pub async fn subscribe(&mut self, filter: &str, q: QoS) {
            self.client
                .subscribe(filter, q)
                .await
                .expect("subscribe request");
            let codes = self.expect_suback().await;
            assert_eq!(codes.len(), 1);
            assert!(
                !matches!(codes[0], rumqttc::SubscribeReasonCode::Failure),
                "subscription to {filter} failed"
            );
        }

        /// Waits for the PUBACK (QoS 1) or PUBCOMP (QoS 2) of a publish just sent.
        pub async fn expect_publish_done(&mut self) {
            loop {
                match self.next_packet().await {
                    Packet::PubAck(_) | Packet::PubComp(_) => return,
                    Packet::PubRec(_) => continue,
                    other => panic!("expected PUBACK/PUBCOMP, got {other:?}"),
                }
            }
        }

        /// Asserts that the event loop ends (the broker closed the connection).
        pub async fn expect_closed(&mut self) {
            loop {
                match next(&mut self.rx, WAIT).await {
                    Some(Ev::Err(_)) | None => return,
                    Some(Ev::In(_)) => continue,
                }
            }
        }

        /// Sends DISCONNECT and waits until the event loop has written it.
        pub async fn disconnect(mut self) {
            let _ = self.client.disconnect().await;
            self.expect_closed().await;
        }
    }

    impl Drop for Client {
        fn drop(&mut self) {
            self.task.abort();
        }
    }
}

pub mod v5 {
    use super::*;
    #[allow(unused_imports)]
    pub use rumqttc::v5::mqttbytes::QoS;
    #[allow(unused_imports)]
    pub use rumqttc::v5::mqttbytes::v5::{
        ConnAck, ConnAckProperties, ConnectProperties, ConnectReturnCode, Disconnect,
        DisconnectReasonCode, Filter, LastWill, LastWillProperties, Packet, Publish,
        PublishProperties, RetainForwardRule, SubscribeProperties, SubscribeReasonCode,
    };
    #[allow(unused_imports)]
    pub use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    pub struct Client {
        pub client: AsyncClient,
        rx: mpsc::UnboundedReceiver<Ev<Packet>>,
        task: JoinHandle<()>,
        pub connack: ConnAck,
    }

    pub fn options(addr: SocketAddr, client_id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    pub async fn try_connect(o: MqttOptions) -> Result<Client, String> {
        let (client, mut eventloop) = AsyncClient::new(o, 64);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(p)) => {
                        if tx.send(Ev::In(p)).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Outgoing(_)) => {}
                    Err(e) => {
                        // rumqttc reports the server's DISCONNECT as an error; surface it as the
                        // packet it was so tests can check its reason code.
                        if let rumqttc::v5::ConnectionError::MqttState(
                            rumqttc::v5::StateError::ServerDisconnect { reason_code, .. },
                        ) = &e
                        {
                            let d = Disconnect {
                                reason_code: *reason_code,
                                properties: None,
                            };
                            let _ = tx.send(Ev::In(Packet::Disconnect(d)));
                        }
                        let _ = tx.send(Ev::Err(format!("{e:?}")));
                        return;
                    }
                }
            }
        });
        match next(&mut rx, WAIT).await {
            Some(Ev::In(Packet::ConnAck(connack))) => Ok(Client {
                client,
                rx,
                task,
                connack,
            }),
            Some(Ev::Err(e)) => Err(e),
            other => Err(format!("no CONNACK: {other:?}")),
        }
    }

    pub async fn connect(o: MqttOptions) -> Client {
        try_connect(o).await.expect("rumqttc v5 connect")
    }

    impl Client {
        pub async fn next_packet(&mut self) -> Packet {
            loop {
                match next(&mut self.rx, WAIT).await {
                    Some(Ev::In(Packet::PingResp(_))) => continue,
                    Some(Ev::In(p)) => return p,
                    other => panic!("expected a packet within {WAIT:?}, got {other:?}"),
                }
            }
        }

        pub async fn expect_publish(&mut self) -> Publish {
            loop {
                match self.next_packet().await {
                    Packet::Publish(p) => return p,
                    Packet::PubAck(_)
                    | Packet::PubRec(_)
                    | Packet::PubComp(_)
                    | Packet::SubAck(_)
                    | Packet::UnsubAck(_) => continue,
                    other => panic!("expected PUBLISH, got {other:?}"),
                }
            }
        }

        pub async fn expect_suback(&mut self) -> Vec<SubscribeReasonCode> {
            loop {
                match self.next_packet().await {
                    Packet::SubAck(s) => return s.return_codes,
                    Packet::PubAck(_) | Packet::PubComp(_) => continue,
                    other => panic!("expected SUBACK, got {other:?}"),
                }
            }
        }

        pub async fn subscribe(&mut self, filter: &str, q: QoS) {
            self.client
                .subscribe(filter, q)
                .await
                .expect("subscribe request");
            let codes = self.expect_suback().await;
            assert_eq!(codes.len(), 1);
            assert!(
                matches!(codes[0], SubscribeReasonCode::Success(_)),
                "subscription to {filter} failed: {codes:?}"
            );
        }

        pub async fn expect_publish_done(&mut self) {
            loop {
                match self.next_packet().await {
                    Packet::PubAck(_) | Packet::PubComp(_) => return,
                    Packet::PubRec(_) => continue,
                    other => panic!("expected PUBACK/PUBCOMP, got {other:?}"),
                }
            }
        }

        /// Asserts the connection ends; returns the broker's DISCONNECT reason if one came.
        pub async fn expect_closed(&mut self) -> Option<DisconnectReasonCode> {
            let mut reason = None;
            loop {
                match next(&mut self.rx, WAIT).await {
                    Some(Ev::Err(_)) | None => return reason,
                    Some(Ev::In(Packet::Disconnect(d))) => reason = Some(d.reason_code),
                    Some(Ev::In(_)) => continue,
                }
            }
        }

        pub async fn disconnect(mut self) {
            let _ = self.client.disconnect().await;
            self.expect_closed().await;
        }
    }

    impl Drop for Client {
        fn drop(&mut self) {
            self.task.abort();
        }
    }
}
