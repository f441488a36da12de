//! Property tests: every packet of every version round-trips through encode and decode, the
//! fan-out template agrees with the decoder, and no byte string makes the decoder panic.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use tern_wire::*;

const MAX: u32 = 1 << 20;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

fn any_str() -> impl Strategy<Value = Str> {
    vec(any::<char>().prop_filter("no U+0000", |c| *c != '\0'), 0..8)
        .prop_map(|chars| Str::copy_from(&chars.into_iter().collect::<String>()).unwrap())
}

fn topic_name() -> impl Strategy<Value = Str> {
    vec(
        prop_oneof![
            4 => select(vec!['a', 'b', '/', '$', ' ', 'é', '日']),
            1 => any::<char>().prop_filter("not in topic names", |c| !matches!(c, '\0' | '+' | '#')),
        ],
        1..10,
    )
    .prop_map(|chars| Str::copy_from(&chars.into_iter().collect::<String>()).unwrap())
}

fn any_bytes() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

/// Where a property block sits, mirroring the spec's table (2.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Connect,
    Will,
    ConnAck,
    Publish,
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

/// Every property with a valid value, then cut down to what `place` allows.
fn properties(place: Place) -> impl Strategy<Value = Properties> {
    let message = (
        proptest::option::of(0u8..=1),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any_str()),
        proptest::option::of(topic_name()),
        proptest::option::of(any_bytes()),
        vec(1u32..=VARINT_MAX, 0..3),
        proptest::option::of(1u16..),
    );
    let session = (
        proptest::option::of(any::<u32>()),
        proptest::option::of(any_str()),
        proptest::option::of(any::<u16>()),
        proptest::option::of(any_str()),
        proptest::option::of(any_bytes()),
        proptest::option::of(0u8..=1),
        proptest::option::of(any::<u32>()),
        proptest::option::of(0u8..=1),
        proptest::option::of(any_str()),
        proptest::option::of(any_str()),
        proptest::option::of(any_str()),
    );
    let limits = (
        proptest::option::of(1u16..),
        proptest::option::of(any::<u16>()),
        proptest::option::of(0u8..=1),
        proptest::option::of(0u8..=1),
        vec((any_str(), any_str()), 0..3),
        proptest::option::of(1u32..),
        proptest::option::of(0u8..=1),
        proptest::option::of(0u8..=1),
        proptest::option::of(0u8..=1),
    );
    (message, session, limits).prop_map(move |(m, s, l)| {
        let mut p = PropertyValues {
            payload_format_indicator: m.0,
            message_expiry_interval_s: m.1,
            content_type: m.2,
            response_topic: m.3,
            correlation_data: m.4,
            subscription_identifiers: m.5,
            topic_alias: m.6,
            session_expiry_interval_s: s.0,
            assigned_client_identifier: s.1,
            server_keep_alive_s: s.2,
            authentication_method: s.3,
            authentication_data: s.4,
            request_problem_information: s.5,
            will_delay_interval_s: s.6,
            request_response_information: s.7,
            response_information: s.8,
            server_reference: s.9,
            reason_string: s.10,
            receive_maximum: l.0,
            topic_alias_maximum: l.1,
            maximum_qos: l.2,
            retain_available: l.3,
            user: l.4,
            maximum_packet_size: l.5,
            wildcard_subscription_available: l.6,
            subscription_identifier_available: l.7,
            shared_subscription_available: l.8,
        };
        restrict(&mut p, place);
        p.into()
    })
}

fn restrict(p: &mut PropertyValues, place: Place) {
    use Place::*;
    let message = matches!(place, Publish | Will);
    if !message {
        p.payload_format_indicator = None;
        p.message_expiry_interval_s = None;
        p.content_type = None;
        p.response_topic = None;
        p.correlation_data = None;
    }
    match place {
        Publish => {}
        Subscribe => p.subscription_identifiers.truncate(1),
        _ => p.subscription_identifiers.clear(),
    }
    if place != Publish {
        p.topic_alias = None;
    }
    if !matches!(place, Connect | ConnAck | Disconnect) {
        p.session_expiry_interval_s = None;
    }
    if place != ConnAck {
        p.assigned_client_identifier = None;
        p.server_keep_alive_s = None;
        p.response_information = None;
        p.maximum_qos = None;
        p.retain_available = None;
        p.wildcard_subscription_available = None;
        p.subscription_identifier_available = None;
        p.shared_subscription_available = None;
    }
    if !matches!(place, Connect | ConnAck | Auth) {
        p.authentication_method = None;
        p.authentication_data = None;
    }
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        p.authentication_method = Some(Str::from_static("PLAIN"));
    }
    if place != Connect {
        p.request_problem_information = None;
        p.request_response_information = None;
    }
    if place != Will {
        p.will_delay_interval_s = None;
    }
    if !matches!(place, ConnAck | Disconnect) {
        p.server_reference = None;
    }
    if matches!(place, Connect | Will | Publish | Subscribe | Unsubscribe) {
        p.reason_string = None;
    }
    if !matches!(place, Connect | ConnAck) {
        p.receive_maximum = None;
        p.topic_alias_maximum = None;
        p.maximum_packet_size = None;
    }
}

fn props_for(protocol: Protocol, place: Place) -> BoxedStrategy<Properties> {
    if protocol.is_v5() {
        properties(place).boxed()
    } else {
        Just(Properties::default()).boxed()
    }
}

fn qos() -> impl Strategy<Value = QoS> {
    select(vec![QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce])
}

fn reason(codes: &'static [u8]) -> impl Strategy<Value = ReasonCode> {
    select(codes).prop_map(ReasonCode)
}

const CONNACK_V5: &[u8] = &[
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
];
/// The 5.0 codes that 3.1.1 return codes decode back to.
const CONNACK_V3: &[u8] = &[0x00, 0x84, 0x85, 0x88, 0x86, 0x87];
const PUBACK_V5: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
const PUBREL_V5: &[u8] = &[0x00, 0x92];
const SUBACK_V5: &[u8] = &[
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2,
];
const SUBACK_V3: &[u8] = &[0x00, 0x01, 0x02, 0x80];
const UNSUBACK_V5: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
const DISCONNECT_V5: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];
const AUTH_V5: &[u8] = &[0x00, 0x18, 0x19];

fn will(protocol: Protocol) -> impl Strategy<Value = Will> {
    (
        topic_name(),
        any_bytes(),
        qos(),
        any::<bool>(),
        props_for(protocol, Place::Will),
    )
        .prop_map(|(topic, payload, qos, retain, properties)| Will {
            topic,
            payload,
            qos,
            retain,
            properties,
        })
}

fn connect(protocol: Protocol) -> impl Strategy<Value = Packet> {
    (
        any::<bool>(),
        any::<u16>(),
        props_for(protocol, Place::Connect),
        any_str(),
        proptest::option::of(will(protocol)),
        proptest::option::of(any_str()),
        proptest::option::of(any_bytes()),
    )
        .prop_map(
            move |(
                clean_start,
                keep_alive_s,
                properties,
                client_id,
                will,
                mut username,
                password,
            )| {
                if !protocol.is_v5() && password.is_some() && username.is_none() {
                    username = Some(Str::from_static("user")); // [MQTT-3.1.2-22]
                }
                Packet::Connect(Box::new(Connect {
                    protocol,
                    clean_start,
                    keep_alive_s,
                    properties,
                    client_id,
                    will,
                    username,
                    password,
                }))
            },
        )
}

fn publish(protocol: Protocol) -> impl Strategy<Value = Packet> {
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic_name(),
        1u16..,
        props_for(protocol, Place::Publish),
        any_bytes(),
        any::<bool>(),
    )
        .prop_map(
            move |(qos, dup, retain, topic, id, properties, payload, drop_topic)| {
                let at_most_once = qos == QoS::AtMostOnce;
                // In 5.0 a topic alias may stand in for the topic.
                let topic = if drop_topic && properties.topic_alias.is_some() {
                    Str::default()
                } else {
                    topic
                };
                Packet::Publish(Publish {
                    dup: dup && !at_most_once,
                    qos,
                    retain,
                    topic,
                    packet_id: if at_most_once { 0 } else { id },
                    properties,
                    payload,
                })
            },
        )
}

fn ack(protocol: Protocol) -> impl Strategy<Value = Packet> {
    let v5 = protocol.is_v5();
    (
        0..4u8,
        1u16..,
        props_for(protocol, Place::Ack),
        reason(PUBACK_V5),
        reason(PUBREL_V5),
    )
        .prop_map(
            move |(kind, packet_id, properties, puback_reason, pubrel_reason)| {
                let reason = match (v5, kind) {
                    (false, _) => ReasonCode::SUCCESS,
                    (true, 0 | 1) => puback_reason,
                    (true, _) => pubrel_reason,
                };
                let ack = Ack {
                    packet_id,
                    reason,
                    properties,
                };
                match kind {
                    0 => Packet::PubAck(ack),
                    1 => Packet::PubRec(ack),
                    2 => Packet::PubRel(ack),
                    _ => Packet::PubComp(ack),
                }
            },
        )
}

fn options(protocol: Protocol) -> impl Strategy<Value = SubscriptionOptions> {
    let v5 = protocol.is_v5();
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        select(vec![
            RetainHandling::SendAtSubscribe,
            RetainHandling::SendIfNew,
            RetainHandling::DoNotSend,
        ]),
    )
        .prop_map(
            move |(qos, no_local, retain_as_published, retain_handling)| {
                if v5 {
                    SubscriptionOptions {
                        qos,
                        no_local,
                        retain_as_published,
                        retain_handling,
                    }
                } else {
                    SubscriptionOptions {
                        qos,
                        ..SubscriptionOptions::default()
                    }
                }
            },
        )
}

fn subscriptions(protocol: Protocol) -> impl Strategy<Value = Packet> {
    let v5 = protocol.is_v5();
    prop_oneof![
        (
            1u16..,
            props_for(protocol, Place::Subscribe),
            vec((any_str(), options(protocol)), 1..4)
        )
            .prop_map(
                |(packet_id, properties, filters)| Packet::Subscribe(Subscribe {
                    packet_id,
                    properties,
                    filters
                })
            ),
        (
            1u16..,
            props_for(protocol, Place::SubAck),
            vec(reason(if v5 { SUBACK_V5 } else { SUBACK_V3 }), 1..4)
        )
            .prop_map(|(packet_id, properties, reasons)| Packet::SubAck(SubAck {
                packet_id,
                properties,
                reasons
            })),
        (
            1u16..,
            props_for(protocol, Place::Unsubscribe),
            vec(any_str(), 1..4)
        )
            .prop_map(|(packet_id, properties, filters)| Packet::Unsubscribe(
                Unsubscribe {
                    packet_id,
                    properties,
                    filters
                }
            )),
        (
            1u16..,
            props_for(protocol, Place::UnsubAck),
            vec(reason(UNSUBACK_V5), 1..4)
        )
            .prop_map(
                move |(packet_id, properties, reasons)| Packet::UnsubAck(UnsubAck {
                    packet_id,
                    properties,
                    reasons: if v5 { reasons } else { Vec::new() },
                })
            ),
    ]
}

fn control(protocol: Protocol) -> BoxedStrategy<Packet> {
    let v5 = protocol.is_v5();
    let connack = (
        any::<bool>(),
        reason(if v5 { CONNACK_V5 } else { CONNACK_V3 }),
        props_for(protocol, Place::ConnAck),
    )
        .prop_map(|(session_present, reason, properties)| {
            Packet::ConnAck(ConnAck {
                session_present: session_present && reason == ReasonCode::SUCCESS,
                reason,
                properties,
            })
        });
    let disconnect = (
        reason(DISCONNECT_V5),
        props_for(protocol, Place::Disconnect),
    )
        .prop_map(move |(reason, properties)| {
            Packet::Disconnect(Disconnect {
                reason: if v5 {
                    reason
                } else {
                    ReasonCode::NORMAL_DISCONNECTION
                },
                properties,
            })
        });
    if v5 {
        let auth = (reason(AUTH_V5), properties(Place::Auth))
            .prop_map(|(reason, properties)| Packet::Auth(Auth { reason, properties }));
        prop_oneof![
            connack,
            disconnect,
            auth,
            Just(Packet::PingReq),
            Just(Packet::PingResp)
        ]
        .boxed()
    } else {
        prop_oneof![
            connack,
            disconnect,
            Just(Packet::PingReq),
            Just(Packet::PingResp)
        ]
        .boxed()
    }
}

fn packet(protocol: Protocol) -> impl Strategy<Value = Packet> {
    prop_oneof![
        1 => connect(protocol),
        2 => publish(protocol),
        1 => ack(protocol),
        1 => subscriptions(protocol),
        1 => control(protocol),
    ]
}

fn any_protocol() -> impl Strategy<Value = Protocol> {
    select(vec![Protocol::V3_1, Protocol::V3_1_1, Protocol::V5])
}

fn protocol_and_packet() -> impl Strategy<Value = (Protocol, Packet)> {
    any_protocol().prop_flat_map(|protocol| (Just(protocol), packet(protocol)))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_packet_round_trips((protocol, packet) in protocol_and_packet()) {
        let mut out = BytesMut::new();
        encode(&packet, protocol, &mut out).unwrap();
        prop_assert_eq!(out.len(), encoded_len(&packet, protocol).unwrap());
        let decoded = decode(&mut out, protocol, MAX).unwrap();
        prop_assert_eq!(decoded, Some(packet));
        prop_assert!(out.is_empty());
    }

    #[test]
    fn template_deliveries_decode_as_the_message(
        protocol in any_protocol(),
        topic in topic_name(),
        properties in properties(Place::Publish),
        payload in any_bytes(),
        qos in qos(),
        dup in any::<bool>(),
        retain in any::<bool>(),
        packet_id in 1u16..,
        alias in proptest::option::of(1u16..),
        send_topic in any::<bool>(),
        identifiers in vec(1u32..=VARINT_MAX, 0..3),
    ) {
        let v5 = protocol.is_v5();
        let template = PublishTemplate::new(protocol, &topic, &properties, &payload).unwrap();
        let delivery = Delivery {
            qos,
            dup,
            retain,
            packet_id: if qos == QoS::AtMostOnce { 0 } else { packet_id },
            topic_alias: alias,
            send_topic: send_topic || alias.is_none(),
            subscription_identifiers: &identifiers,
        };
        let mut wire = BytesMut::new();
        template.write_head(&delivery, &mut wire);
        wire.extend_from_slice(template.body());
        prop_assert_eq!(wire.len(), template.packet_len(&delivery));
        let Some(Packet::Publish(decoded)) = decode(&mut wire, protocol, MAX).unwrap() else {
            panic!("not a publish");
        };
        let mut expected = if v5 { properties.clone() } else { Properties::default() };
        if v5 {
            expected.topic_alias = alias;
            expected.subscription_identifiers = identifiers.clone();
        }
        prop_assert_eq!(decoded.properties, expected);
        prop_assert_eq!(decoded.payload, payload);
        prop_assert_eq!(decoded.qos, qos);
        prop_assert_eq!(decoded.dup, dup && qos != QoS::AtMostOnce);
        prop_assert_eq!(decoded.retain, retain);
        prop_assert_eq!(decoded.topic.is_empty(), v5 && !delivery.send_topic);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..64), protocol in any_protocol()) {
        let mut buf = BytesMut::from(&bytes[..]);
        // Decode until error or "need more"; every Ok(Some) must consume bytes.
        loop {
            let before = buf.len();
            match decode(&mut buf, protocol, 256) {
                Ok(Some(_)) => prop_assert!(buf.len() < before),
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn mutated_packets_never_panic(
        (protocol, packet) in protocol_and_packet(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut out = BytesMut::new();
        encode(&packet, protocol, &mut out).unwrap();
        let mut bytes = out.to_vec();
        for (index, value) in flips {
            let at = index.index(bytes.len());
            bytes[at] = value;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        let mut buf = BytesMut::from(&bytes[..]);
        if let Ok(Some(decoded)) = decode(&mut buf, protocol, MAX) {
            // Whatever decodes must encode again, to bytes that decode to the same packet.
            let mut again = BytesMut::new();
            prop_assert!(encode(&decoded, protocol, &mut again).is_ok());
            prop_assert_eq!(decode(&mut again, protocol, MAX).unwrap(), Some(decoded));
        }
    }
}
