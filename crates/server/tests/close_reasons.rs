//! A close the broker starts after it sent its reason (a v5 DISCONNECT, a refusing CONNACK)
//! lets the client read that reason, also when the client keeps writing (issue 24 item 1):
//! the broker shuts its side down, reads and discards what the client still sends for a
//! bounded linger, then closes. Closing with the client's bytes unread made the kernel send
//! RST instead of FIN, and the client's kernel could throw away the reason still in flight
//! (Eclipse Paho's `test_flow_control2` got EPIPE and never read its DISCONNECT 0x93).
//!
//! Every client here writes until it has read the reason ([`common::chatty`]); each test
//! asserts the reason is read and the stream then ends with EOF.

mod common;

use bytes::BytesMut;
use common::Broker;
use common::chatty::Chatty;
use common::raw::*;

fn encoded(packets: &[Packet], protocol: Protocol) -> Vec<u8> {
    let mut out = BytesMut::new();
    for packet in packets {
        tern_wire::encode(packet, protocol, &mut out).expect("encode test packet");
    }
    out.to_vec()
}

fn v5_connect(client_id: &str) -> Packet {
    Packet::Connect(Box::new(connect_packet(Protocol::V5, client_id, true, 0)))
}

/// The default Receive Maximum (1,024).
const RECEIVE_MAXIMUM: u16 = 1024;

/// (v5) MQTT-3.3.4-9 and §3.3.4, Eclipse Paho's `test_flow_control2`: Receive Maximum + 1 QoS 2
/// PUBLISHes, every PUBREC answered with a PUBREL, PINGREQs in between: the client reads
/// DISCONNECT 0x93 (Receive Maximum exceeded), then EOF.
#[tokio::test]
async fn receive_maximum_exceeded_0x93_is_read_by_a_client_that_keeps_writing() {
    let b = Broker::start();
    let mut first = vec![v5_connect("close-rm")];
    for id in 1..=RECEIVE_MAXIMUM + 1 {
        first.push(Packet::Publish(publish("close/rm", b"x", 2, id)));
    }
    let c = Chatty::open(b.addr, Protocol::V5, &encoded(&first, Protocol::V5)).await;
    let ending = c.read_to_end().await;
    ending.assert_reason(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED, "0x93");
}
