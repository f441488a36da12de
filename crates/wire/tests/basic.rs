//! Hand-written round trips of every packet in every version, plus the fan-out template.

use bytes::{Bytes, BytesMut};
use tern_wire::*;

const MAX: u32 = 1 << 20;

fn s(text: &'static str) -> Str {
    Str::from_static(text)
}

fn round_trip(packet: &Packet, protocol: Protocol) -> Packet {
    let mut out = BytesMut::new();
    encode(packet, protocol, &mut out).unwrap();
    assert_eq!(out.len(), encoded_len(packet, protocol).unwrap());
    let mut buf = out.clone();
    let decoded = decode(&mut buf, protocol, MAX).unwrap().unwrap();
    assert!(buf.is_empty());
    // Every strict prefix is "need more bytes".
    for cut in 0..out.len() {
        let mut partial = BytesMut::from(&out[..cut]);
        assert_eq!(
            decode(&mut partial, protocol, MAX).unwrap(),
            None,
            "prefix {cut}"
        );
        assert_eq!(partial.len(), cut);
    }
    decoded
}

fn assert_round_trip(packet: Packet, protocol: Protocol) {
    assert_eq!(round_trip(&packet, protocol), packet, "{protocol:?}");
}

fn v5_props() -> PropertyValues {
    PropertyValues {
        user: vec![(s("k"), s("v")), (s("k"), s("v2"))],
        ..PropertyValues::default()
    }
}

fn all_protocols() -> [Protocol; 3] {
    [Protocol::V3_1, Protocol::V3_1_1, Protocol::V5]
}

#[test]
fn connect_every_version() {
    for protocol in all_protocols() {
        let v5 = protocol.is_v5();
        let connect = Connect {
            protocol,
            clean_start: true,
            keep_alive_s: 60,
            properties: if v5 {
                PropertyValues {
                    session_expiry_interval_s: Some(3600),
                    receive_maximum: Some(10),
                    ..v5_props()
                }
                .into()
            } else {
                Properties::default()
            },
            client_id: s("client-1"),
            will: Some(Will {
                topic: s("last/will"),
                payload: Bytes::from_static(b"bye"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: if v5 {
                    PropertyValues {
                        will_delay_interval_s: Some(5),
                        ..PropertyValues::default()
                    }
                    .into()
                } else {
                    Properties::default()
                },
            }),
            username: Some(s("user")),
            password: Some(Bytes::from_static(b"pw")),
        };
        assert_round_trip(Packet::Connect(Box::new(connect)), protocol);
    }
}

#[test]
fn acks_and_control_every_version() {
    for protocol in all_protocols() {
        let v5 = protocol.is_v5();
        let props = if v5 {
            v5_props().into()
        } else {
            Properties::default()
        };
        let ack = Ack {
            packet_id: 7,
            reason: ReasonCode::SUCCESS,
            properties: props.clone(),
        };
        assert_round_trip(Packet::PubAck(ack.clone()), protocol);
        assert_round_trip(Packet::PubRec(ack.clone()), protocol);
        assert_round_trip(Packet::PubRel(ack.clone()), protocol);
        assert_round_trip(Packet::PubComp(ack), protocol);
        assert_round_trip(Packet::PingReq, protocol);
        assert_round_trip(Packet::PingResp, protocol);
        assert_round_trip(
            Packet::ConnAck(ConnAck {
                session_present: true,
                reason: ReasonCode::SUCCESS,
                properties: props.clone(),
            }),
            protocol,
        );
        assert_round_trip(
            Packet::ConnAck(ConnAck {
                session_present: false,
                reason: ReasonCode::NOT_AUTHORIZED,
                properties: Properties::default(),
            }),
            protocol,
        );
        assert_round_trip(
            Packet::Disconnect(Disconnect {
                reason: ReasonCode::NORMAL_DISCONNECTION,
                properties: Properties::default(),
            }),
            protocol,
        );
        assert_round_trip(
            Packet::Subscribe(Subscribe {
                packet_id: 1,
                properties: props.clone(),
                filters: vec![
                    (s("a/+"), SubscriptionOptions::default()),
                    (
                        s("b/#"),
                        SubscriptionOptions {
                            qos: QoS::ExactlyOnce,
                            ..Default::default()
                        },
                    ),
                ],
            }),
            protocol,
        );
        assert_round_trip(
            Packet::SubAck(SubAck {
                packet_id: 1,
                properties: props.clone(),
                reasons: vec![ReasonCode::GRANTED_QOS_1, ReasonCode(0x80)],
            }),
            protocol,
        );
        assert_round_trip(
            Packet::Unsubscribe(Unsubscribe {
                packet_id: 2,
                properties: props.clone(),
                filters: vec![s("a/+"), s("b")],
            }),
            protocol,
        );
        assert_round_trip(
            Packet::UnsubAck(UnsubAck {
                packet_id: 2,
                properties: props.clone(),
                reasons: if v5 {
                    vec![ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED]
                } else {
                    vec![]
                },
            }),
            protocol,
        );
    }
}

#[test]
fn v5_only_packets_and_fields() {
    let protocol = Protocol::V5;
    for reason in [ReasonCode::SUCCESS, ReasonCode(0x10), ReasonCode(0x80)] {
        for properties in [Properties::default(), v5_props().into()] {
            let ack = Ack {
                packet_id: 9,
                reason,
                properties: properties.clone(),
            };
            assert_round_trip(Packet::PubAck(ack), protocol);
            assert_round_trip(
                Packet::Disconnect(Disconnect {
                    reason: if reason == ReasonCode(0x10) {
                        ReasonCode::DISCONNECT_WITH_WILL_MESSAGE
                    } else {
                        reason
                    },
                    properties,
                }),
                protocol,
            );
        }
    }
    assert_round_trip(
        Packet::Auth(Auth {
            reason: ReasonCode::CONTINUE_AUTHENTICATION,
            properties: PropertyValues {
                authentication_method: Some(s("SCRAM-SHA-1")),
                authentication_data: Some(Bytes::from_static(b"\x00\x01")),
                ..PropertyValues::default()
            }
            .into(),
        }),
        protocol,
    );
    assert_round_trip(
        Packet::Auth(Auth {
            reason: ReasonCode::SUCCESS,
            properties: Properties::default(),
        }),
        protocol,
    );
    let mut out = BytesMut::new();
    assert_eq!(encode(&Packet::PingReq, Protocol::V3_1_1, &mut out), Ok(()));
    assert!(matches!(
        encode(
            &Packet::Auth(Auth {
                reason: ReasonCode::SUCCESS,
                properties: Properties::default()
            }),
            Protocol::V3_1_1,
            &mut out
        ),
        Err(EncodeError::NotInProtocol(PacketType::Auth))
    ));
}

#[test]
fn publish_every_version_is_zero_copy() {
    for protocol in all_protocols() {
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            let publish = Publish {
                dup: qos != QoS::AtMostOnce,
                qos,
                retain: true,
                topic: s("sensors/1/temp"),
                packet_id: if qos == QoS::AtMostOnce { 0 } else { 42 },
                properties: if protocol.is_v5() {
                    PropertyValues {
                        message_expiry_interval_s: Some(10),
                        correlation_data: Some(Bytes::from_static(b"cd")),
                        ..v5_props()
                    }
                    .into()
                } else {
                    Properties::default()
                },
                payload: Bytes::from_static(b"21.5"),
            };
            let mut out = BytesMut::new();
            encode(&Packet::Publish(publish.clone()), protocol, &mut out).unwrap();
            let start = out.as_ptr() as usize;
            let end = start + out.len();
            let decoded = decode(&mut out, protocol, MAX).unwrap().unwrap();
            let Packet::Publish(decoded) = decoded else {
                panic!("not a publish")
            };
            assert_eq!(decoded, publish);
            let mut slices = vec![decoded.topic.as_bytes(), &decoded.payload];
            if let Some(data) = &decoded.properties.correlation_data {
                slices.push(data);
            }
            for (key, value) in &decoded.properties.user {
                slices.push(key.as_bytes());
                slices.push(value.as_bytes());
            }
            for slice in slices {
                let ptr = slice.as_ptr() as usize;
                assert!(
                    ptr >= start && ptr + slice.len() <= end,
                    "not a slice of the input"
                );
            }
        }
    }
}

#[test]
fn several_packets_in_one_buffer() {
    let mut buf = BytesMut::new();
    encode(&Packet::PingReq, Protocol::V5, &mut buf).unwrap();
    encode(&Packet::PingResp, Protocol::V5, &mut buf).unwrap();
    buf.extend_from_slice(&[0x30]); // start of a third
    assert_eq!(
        decode(&mut buf, Protocol::V5, MAX).unwrap(),
        Some(Packet::PingReq)
    );
    assert_eq!(
        decode(&mut buf, Protocol::V5, MAX).unwrap(),
        Some(Packet::PingResp)
    );
    assert_eq!(decode(&mut buf, Protocol::V5, MAX).unwrap(), None);
    assert_eq!(&buf[..], &[0x30]);
}

#[test]
fn template_matches_full_encoding() {
    for protocol in all_protocols() {
        let properties = if protocol.is_v5() {
            PropertyValues {
                content_type: Some(s("text/plain")),
                ..v5_props()
            }
            .into()
        } else {
            Properties::default()
        };
        let topic = s("a/b");
        let payload = Bytes::from_static(b"hello");
        let before = publish_templates_built();
        let template = PublishTemplate::new(protocol, &topic, &properties, &payload).unwrap();
        assert!(publish_templates_built() > before);
        let ids = [3u32, 300];
        let deliveries = [
            Delivery::qos0(false),
            Delivery {
                qos: QoS::AtLeastOnce,
                dup: true,
                retain: true,
                packet_id: 17,
                topic_alias: Some(4),
                send_topic: true,
                subscription_identifiers: &ids,
            },
            Delivery {
                qos: QoS::ExactlyOnce,
                dup: false,
                retain: false,
                packet_id: 18,
                topic_alias: Some(4),
                send_topic: false,
                subscription_identifiers: &[],
            },
        ];
        for delivery in deliveries {
            let mut wire = BytesMut::new();
            template.write_head(&delivery, &mut wire);
            wire.extend_from_slice(template.body());
            assert_eq!(wire.len(), template.packet_len(&delivery));
            let Packet::Publish(decoded) = decode(&mut wire, protocol, MAX).unwrap().unwrap()
            else {
                panic!("not a publish")
            };
            let v5 = protocol.is_v5();
            let mut expected_props = properties.clone();
            if v5 {
                expected_props.topic_alias = delivery.topic_alias;
                expected_props.subscription_identifiers =
                    delivery.subscription_identifiers.to_vec();
            }
            let expected = Publish {
                dup: delivery.dup,
                qos: delivery.qos,
                retain: delivery.retain,
                topic: if delivery.send_topic || !v5 {
                    topic.clone()
                } else {
                    Str::default()
                },
                packet_id: delivery.packet_id,
                properties: expected_props,
                payload: payload.clone(),
            };
            assert_eq!(decoded, expected);
        }
        let whole = template.qos0_packet(true);
        let again = template.qos0_packet(true);
        assert_eq!(whole.as_ptr(), again.as_ptr(), "built once");
        let mut buf = BytesMut::from(&whole[..]);
        let Packet::Publish(decoded) = decode(&mut buf, protocol, MAX).unwrap().unwrap() else {
            panic!("not a publish")
        };
        assert!(decoded.retain);
        assert_eq!(decoded.payload, payload);
    }
}

#[test]
fn packet_too_large_is_refused_on_the_fixed_header() {
    // Fixed header announcing 1000 bytes, body absent.
    let mut buf = BytesMut::from(&[0x30, 0xE8, 0x07][..]);
    let error = decode(&mut buf, Protocol::V5, 100).unwrap_err();
    assert_eq!(error.reason_code(), ReasonCode::PACKET_TOO_LARGE);
    assert_eq!(buf.len(), 3);
}

#[test]
fn empty_topic_needs_an_alias_to_encode() {
    let mut publish = Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: Str::default(),
        packet_id: 0,
        properties: Properties::default(),
        payload: Bytes::new(),
    };
    let mut out = BytesMut::new();
    for protocol in all_protocols() {
        assert_eq!(
            encode(&Packet::Publish(publish.clone()), protocol, &mut out),
            Err(EncodeError::EmptyTopicName)
        );
    }
    publish.properties.topic_alias = Some(1);
    assert_round_trip(Packet::Publish(publish.clone()), Protocol::V5);
    assert_eq!(
        encode(&Packet::Publish(publish), Protocol::V3_1_1, &mut out),
        Err(EncodeError::EmptyTopicName)
    );
}

/// The common path allocates nothing for properties: 3.x never carries them, and a 5.0
/// packet whose property block is empty (or left out) decodes to an absent block.
#[test]
fn packets_without_properties_decode_to_an_absent_block() {
    let cases: [(Protocol, &[u8]); 6] = [
        (Protocol::V3_1_1, b"\x30\x05\x00\x01tab"),
        (Protocol::V5, b"\x30\x06\x00\x01t\x00ab"),
        (Protocol::V3_1_1, b"\x40\x02\x00\x07"),
        (Protocol::V5, b"\x40\x02\x00\x07"),
        (Protocol::V5, b"\x40\x04\x00\x07\x10\x00"),
        (Protocol::V5, b"\xe0\x02\x04\x00"),
    ];
    for (protocol, wire) in cases {
        let mut buf = BytesMut::from(wire);
        let packet = decode(&mut buf, protocol, MAX).unwrap().unwrap();
        let absent = match packet {
            Packet::Publish(mut publish) => publish.properties.values_mut().is_none(),
            Packet::PubAck(mut ack) => ack.properties.values_mut().is_none(),
            Packet::Disconnect(mut disconnect) => disconnect.properties.values_mut().is_none(),
            other => panic!("unexpected {other:?}"),
        };
        assert!(absent, "{protocol:?} {wire:?}");
    }
    // A non-empty block is kept, and equals the same values built by hand.
    let mut buf = BytesMut::from(&b"\x30\x0b\x00\x01t\x05\x02\x00\x00\x00\x3cab"[..]);
    let Some(Packet::Publish(publish)) = decode(&mut buf, Protocol::V5, MAX).unwrap() else {
        panic!("not a PUBLISH")
    };
    let expected: Properties = PropertyValues {
        message_expiry_interval_s: Some(60),
        ..PropertyValues::default()
    }
    .into();
    assert_eq!(publish.properties, expected);
}
