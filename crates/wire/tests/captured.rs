//! Byte-exact tests against packets as real clients and a real broker put them on the wire.
//!
//! How they were captured (2026-11-29, Debian, mosquitto 2.0.11):
//! - Client packets: `tests/capture/capture.py 18830 cap.log` (a minimal peer that answers just
//!   enough for the client to go on), then `mosquitto_pub -h 127.0.0.1 -p 18830 ...` and
//!   `mosquitto_sub ...` with the options named in each case below.
//! - Broker packets: `mosquitto -p 18840`, then `tests/capture/broker_replies.py 18840`, which
//!   replays captured client packets and logs the broker's answers (and the same by hand for
//!   the PUBACK 0x10 and the refused CONNACKs named below).
//! - Spec examples: the CONNECT variable header examples of MQTT 3.1.1 (figure 3.6) and
//!   5.0 (figure 3-6), and the PUBLISH variable header example of 3.1.1 (figure 3.11), completed
//!   into whole packets.
//!
//! Each case decodes to the expected packet and consumes every byte. When `exact` is set our
//! encoder reproduces the capture byte for byte; otherwise the capture only differs in property
//! order (mosquitto keeps insertion order, we write properties by identifier) and the test
//! checks `decode(encode(p)) == p` instead.

use bytes::{Bytes, BytesMut};
use tern_wire::*;

const MAX: u32 = 1 << 20;

fn s(text: &'static str) -> Str {
    Str::from_static(text)
}

fn b(bytes: &'static [u8]) -> Bytes {
    Bytes::from_static(bytes)
}

fn hex(text: &str) -> Vec<u8> {
    let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    (0..clean.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&clean[i..i + 2], 16).unwrap())
        .collect()
}

struct Case {
    name: &'static str,
    protocol: Protocol,
    hex: &'static str,
    expected: Packet,
    exact: bool,
}

fn connect(protocol: Protocol, client_id: &'static str, clean_start: bool) -> Connect {
    Connect {
        protocol,
        clean_start,
        keep_alive_s: 60,
        properties: Properties::default(),
        client_id: s(client_id),
        will: None,
        username: None,
        password: None,
    }
}

fn publish(
    qos: QoS,
    retain: bool,
    topic: &'static str,
    packet_id: u16,
    payload: &'static [u8],
) -> Publish {
    Publish {
        dup: false,
        qos,
        retain,
        topic: s(topic),
        packet_id,
        properties: Properties::default(),
        payload: b(payload),
    }
}

fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    }
}

fn sub_options(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..SubscriptionOptions::default()
    }
}

fn disconnect(reason: ReasonCode) -> Packet {
    Packet::Disconnect(Disconnect {
        reason,
        properties: Properties::default(),
    })
}

fn cases() -> Vec<Case> {
    use Protocol::*;
    let mut cases = Vec::new();
    let mut add = |name, protocol, hex, expected, exact| {
        cases.push(Case {
            name,
            protocol,
            hex,
            expected,
            exact,
        })
    };

    // mosquitto_pub -V 311 -i pub311 -t sensors/temp -m 21.5 -q 1 -r
    add(
        "3.1.1 CONNECT, clean session, keep alive 60",
        V3_1_1,
        "101200044d5154540402003c0006707562333131",
        Packet::Connect(Box::new(connect(V3_1_1, "pub311", true))),
        true,
    );
    add(
        "3.1.1 PUBLISH QoS 1 retained",
        V3_1_1,
        "3314000c73656e736f72732f74656d70000132312e35",
        Packet::Publish(publish(QoS::AtLeastOnce, true, "sensors/temp", 1, b"21.5")),
        true,
    );
    add(
        "3.1.1 DISCONNECT",
        V3_1_1,
        "e000",
        disconnect(ReasonCode::NORMAL_DISCONNECTION),
        true,
    );

    // mosquitto_pub -V 311 -i pub311w -t a/b -m hello -q 0 --will-topic will/t
    //   --will-payload gone --will-qos 1 --will-retain -u alice -P secret -k 30
    add(
        "3.1.1 CONNECT with will, user name and password",
        V3_1_1,
        "103000044d51545404ee001e000770756233313177000677696c6c2f740004676f6e65\
         0005616c6963650006736563726574",
        Packet::Connect(Box::new(Connect {
            keep_alive_s: 30,
            will: Some(Will {
                topic: s("will/t"),
                payload: b(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: Properties::default(),
            }),
            username: Some(s("alice")),
            password: Some(b(b"secret")),
            ..connect(V3_1_1, "pub311w", true)
        })),
        true,
    );
    add(
        "3.1.1 PUBLISH QoS 0",
        V3_1_1,
        "300a0003612f6268656c6c6f",
        Packet::Publish(publish(QoS::AtMostOnce, false, "a/b", 0, b"hello")),
        true,
    );
    // mosquitto_pub -V 311 -i pub311q2 -t a/b -m two -q 2
    add(
        "3.1.1 PUBLISH QoS 2",
        V3_1_1,
        "340a0003612f62000174776f",
        Packet::Publish(publish(QoS::ExactlyOnce, false, "a/b", 1, b"two")),
        true,
    );
    add(
        "3.1.1 PUBREL",
        V3_1_1,
        "62020001",
        Packet::PubRel(ack(1)),
        true,
    );

    // mosquitto_pub -V 5 -i pub5 -t sensors/temp -m 21.5 -q 1 -r
    //   -D publish message-expiry-interval 60 -D publish user-property k v
    //   -D publish content-type text/plain
    add(
        "5.0 CONNECT with receive maximum",
        V5,
        "101400044d5154540502003c03210014000470756235",
        Packet::Connect(Box::new(Connect {
            properties: PropertyValues {
                receive_maximum: Some(20),
                ..PropertyValues::default()
            }
            .into(),
            ..connect(V5, "pub5", true)
        })),
        true,
    );
    add(
        "5.0 PUBLISH QoS 1 retained with expiry, user property, content type",
        V5,
        "332e000c73656e736f72732f74656d70000119020000003c2600016b00017603000a74\
         6578742f706c61696e32312e35",
        Packet::Publish(Publish {
            properties: PropertyValues {
                message_expiry_interval_s: Some(60),
                content_type: Some(s("text/plain")),
                user: vec![(s("k"), s("v"))],
                ..PropertyValues::default()
            }
            .into(),
            ..publish(QoS::AtLeastOnce, true, "sensors/temp", 1, b"21.5")
        }),
        false,
    );
    add(
        "5.0 DISCONNECT short form",
        V5,
        "e000",
        disconnect(ReasonCode::NORMAL_DISCONNECTION),
        true,
    );

    // mosquitto_pub -V 5 -i pub5w -t a/b -m hello -q 0 --will-topic will/t --will-payload gone
    //   --will-qos 2 -u alice -P secret -D connect session-expiry-interval 3600
    //   -D connect receive-maximum 20 -D will will-delay-interval 10 -D connect user-property a b
    add(
        "5.0 CONNECT with properties, will properties, user name and password",
        V5,
        "104400044d51545405d6003c0f1100000e10210014260001610001620005707562357705\
         180000000a000677696c6c2f740004676f6e650005616c6963650006736563726574",
        Packet::Connect(Box::new(Connect {
            properties: PropertyValues {
                session_expiry_interval_s: Some(3600),
                receive_maximum: Some(20),
                user: vec![(s("a"), s("b"))],
                ..PropertyValues::default()
            }
            .into(),
            will: Some(Will {
                topic: s("will/t"),
                payload: b(b"gone"),
                qos: QoS::ExactlyOnce,
                retain: false,
                properties: PropertyValues {
                    will_delay_interval_s: Some(10),
                    ..PropertyValues::default()
                }
                .into(),
            }),
            username: Some(s("alice")),
            password: Some(b(b"secret")),
            ..connect(V5, "pub5w", true)
        })),
        true,
    );
    add(
        "5.0 PUBLISH QoS 0 without properties",
        V5,
        "300b0003612f620068656c6c6f",
        Packet::Publish(publish(QoS::AtMostOnce, false, "a/b", 0, b"hello")),
        true,
    );
    add(
        "5.0 PUBLISH QoS 2",
        V5,
        "340b0003612f6200010074776f",
        Packet::Publish(publish(QoS::ExactlyOnce, false, "a/b", 1, b"two")),
        true,
    );
    add(
        "5.0 PUBREL short form",
        V5,
        "62020001",
        Packet::PubRel(ack(1)),
        true,
    );

    // mosquitto_pub -V 31 -i pub31 -t old/client -m x -q 1
    add(
        "3.1 CONNECT (MQIsdp, level 3)",
        V3_1,
        "101300064d51497364700302003c00057075623331",
        Packet::Connect(Box::new(connect(V3_1, "pub31", true))),
        true,
    );
    add(
        "3.1 PUBLISH QoS 1",
        V3_1,
        "320f000a6f6c642f636c69656e74000178",
        Packet::Publish(publish(QoS::AtLeastOnce, false, "old/client", 1, b"x")),
        true,
    );

    // mosquitto_sub -V 311 -i sub311 -t 'a/+' -t 'b/#' -q 2 -W 1
    add(
        "3.1.1 SUBSCRIBE two filters",
        V3_1_1,
        "820e00010003612f2b020003622f2302",
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![
                (s("a/+"), sub_options(QoS::ExactlyOnce)),
                (s("b/#"), sub_options(QoS::ExactlyOnce)),
            ],
        }),
        true,
    );
    // mosquitto_sub -V 5 -i unsub5 -c -t x/y -U 'a/+' -W 1
    add(
        "5.0 CONNECT, no clean start, session expiry max",
        V5,
        "101b00044d5154540500003c0811ffffffff2100140006756e73756235",
        Packet::Connect(Box::new(Connect {
            properties: PropertyValues {
                session_expiry_interval_s: Some(u32::MAX),
                receive_maximum: Some(20),
                ..PropertyValues::default()
            }
            .into(),
            ..connect(V5, "unsub5", false)
        })),
        true,
    );
    add(
        "5.0 SUBSCRIBE one filter",
        V5,
        "82090001000003782f7900",
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(s("x/y"), sub_options(QoS::AtMostOnce))],
        }),
        true,
    );
    add(
        "5.0 UNSUBSCRIBE",
        V5,
        "a2080002000003612f2b",
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 2,
            properties: Properties::default(),
            filters: vec![s("a/+")],
        }),
        true,
    );
    add(
        "5.0 DISCONNECT with will message",
        V5,
        "e00104",
        disconnect(ReasonCode::DISCONNECT_WITH_WILL_MESSAGE),
        true,
    );
    // mosquitto_sub -V 311 -i unsub311 -c -t x/y -U 'a/+' -W 1
    add(
        "3.1.1 CONNECT, no clean session",
        V3_1_1,
        "101400044d5154540400003c0008756e737562333131",
        Packet::Connect(Box::new(connect(V3_1_1, "unsub311", false))),
        true,
    );
    add(
        "3.1.1 UNSUBSCRIBE",
        V3_1_1,
        "a20700020003612f2b",
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 2,
            properties: Properties::default(),
            filters: vec![s("a/+")],
        }),
        true,
    );
    // mosquitto_sub -V 5 -i sub5 -t 'a/+' -t 'c/#' -q 1 -D subscribe subscription-identifier 7
    //   -D subscribe user-property k v -W 1
    add(
        "5.0 SUBSCRIBE with subscription identifier and user property",
        V5,
        "82180001090b072600016b0001760003612f2b010003632f2301",
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: PropertyValues {
                subscription_identifiers: vec![7],
                user: vec![(s("k"), s("v"))],
                ..PropertyValues::default()
            }
            .into(),
            filters: vec![
                (s("a/+"), sub_options(QoS::AtLeastOnce)),
                (s("c/#"), sub_options(QoS::AtLeastOnce)),
            ],
        }),
        true,
    );
    // mosquitto_sub -V 5 -i sub5k -t 'a/+' -q 2 -D connect topic-alias-maximum 10
    //   -D connect maximum-packet-size 1000 -D connect request-problem-information 0
    //   -D connect request-response-information 1 -W 1
    add(
        "5.0 CONNECT with limits and requests",
        V5,
        "102100044d5154540502003c0f22000a27000003e8170019012100140005737562356b",
        Packet::Connect(Box::new(Connect {
            properties: PropertyValues {
                topic_alias_maximum: Some(10),
                maximum_packet_size: Some(1000),
                request_problem_information: Some(0),
                request_response_information: Some(1),
                receive_maximum: Some(20),
                ..PropertyValues::default()
            }
            .into(),
            ..connect(V5, "sub5k", true)
        })),
        false,
    );

    // Broker replies (mosquitto 2.0.11, broker_replies.py).
    add(
        "3.1.1 CONNACK accepted",
        V3_1_1,
        "20020000",
        Packet::ConnAck(ConnAck {
            session_present: false,
            reason: ReasonCode::SUCCESS,
            properties: Properties::default(),
        }),
        true,
    );
    add(
        "3.1.1 SUBACK granted QoS 2 twice",
        V3_1_1,
        "900400010202",
        Packet::SubAck(SubAck {
            packet_id: 1,
            properties: Properties::default(),
            reasons: vec![ReasonCode::GRANTED_QOS_2, ReasonCode::GRANTED_QOS_2],
        }),
        true,
    );
    add(
        "3.1.1 PUBACK",
        V3_1_1,
        "40020001",
        Packet::PubAck(ack(1)),
        true,
    );
    add(
        "3.1.1 PUBREC",
        V3_1_1,
        "50020002",
        Packet::PubRec(ack(2)),
        true,
    );
    add(
        "3.1.1 PUBCOMP",
        V3_1_1,
        "70020002",
        Packet::PubComp(ack(2)),
        true,
    );
    add(
        "3.1.1 UNSUBACK",
        V3_1_1,
        "b0020003",
        Packet::UnsubAck(UnsubAck {
            packet_id: 3,
            properties: Properties::default(),
            reasons: vec![],
        }),
        true,
    );
    add("PINGREQ", V3_1_1, "c000", Packet::PingReq, true);
    add("PINGRESP", V5, "d000", Packet::PingResp, true);
    add(
        "5.0 CONNACK with topic alias maximum and receive maximum",
        V5,
        "200900000622000a210014",
        Packet::ConnAck(ConnAck {
            session_present: false,
            reason: ReasonCode::SUCCESS,
            properties: PropertyValues {
                topic_alias_maximum: Some(10),
                receive_maximum: Some(20),
                ..PropertyValues::default()
            }
            .into(),
        }),
        false,
    );
    add(
        "5.0 SUBACK",
        V5,
        "90050001000101",
        Packet::SubAck(SubAck {
            packet_id: 1,
            properties: Properties::default(),
            reasons: vec![ReasonCode::GRANTED_QOS_1, ReasonCode::GRANTED_QOS_1],
        }),
        true,
    );
    add(
        "5.0 PUBREC short form",
        V5,
        "50020002",
        Packet::PubRec(ack(2)),
        true,
    );
    add(
        "5.0 PUBLISH delivery with subscription identifier",
        V5,
        "320d0003612f620001020b0774776f",
        Packet::Publish(Publish {
            properties: PropertyValues {
                subscription_identifiers: vec![7],
                ..PropertyValues::default()
            }
            .into(),
            ..publish(QoS::AtLeastOnce, false, "a/b", 1, b"two")
        }),
        true,
    );
    add(
        "5.0 PUBCOMP short form",
        V5,
        "70020002",
        Packet::PubComp(ack(2)),
        true,
    );
    add(
        "5.0 UNSUBACK",
        V5,
        "b00400030000",
        Packet::UnsubAck(UnsubAck {
            packet_id: 3,
            properties: Properties::default(),
            reasons: vec![ReasonCode::SUCCESS],
        }),
        true,
    );

    // mosquitto 2.0.11 -p 18842: a 5.0 QoS 1 PUBLISH nobody subscribed to.
    add(
        "5.0 PUBACK no matching subscribers",
        V5,
        "4003000110",
        Packet::PubAck(Ack {
            packet_id: 1,
            reason: ReasonCode::NO_MATCHING_SUBSCRIBERS,
            properties: Properties::default(),
        }),
        true,
    );
    // mosquitto 2.0.11 with `allow_anonymous false`: CONNECT without credentials.
    let not_authorized = || {
        Packet::ConnAck(ConnAck {
            session_present: false,
            reason: ReasonCode::NOT_AUTHORIZED,
            properties: Properties::default(),
        })
    };
    add(
        "3.1.1 CONNACK not authorized (return code 5)",
        V3_1_1,
        "20020005",
        not_authorized(),
        true,
    );
    add(
        "3.1 CONNACK not authorized (return code 5)",
        V3_1,
        "20020005",
        not_authorized(),
        true,
    );
    add(
        "5.0 CONNACK not authorized (0x87)",
        V5,
        "2003008700",
        not_authorized(),
        true,
    );

    // Spec examples.
    // 3.1.1 figure 3.6: protocol name, level 4, flags 0xCE (user name, password, will QoS 1,
    // will flag, clean session), keep alive 10.
    add(
        "spec 3.1.1 CONNECT variable header example",
        V3_1_1,
        "101b00044d51545404ce000a0002696400017400017000017500027077",
        Packet::Connect(Box::new(Connect {
            protocol: V3_1_1,
            clean_start: true,
            keep_alive_s: 10,
            properties: Properties::default(),
            client_id: s("id"),
            will: Some(Will {
                topic: s("t"),
                payload: b(b"p"),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties::default(),
            }),
            username: Some(s("u")),
            password: Some(b(b"pw")),
        })),
        true,
    );
    // 5.0 figure 3-6: level 5, flags 0xC2 (user name, password, clean start), keep alive 10,
    // properties: session expiry interval 10.
    add(
        "spec 5.0 CONNECT variable header example",
        V5,
        "101b00044d51545405c2000a05110000000a0002696400017500027077",
        Packet::Connect(Box::new(Connect {
            protocol: V5,
            clean_start: true,
            keep_alive_s: 10,
            properties: PropertyValues {
                session_expiry_interval_s: Some(10),
                ..PropertyValues::default()
            }
            .into(),
            client_id: s("id"),
            will: None,
            username: Some(s("u")),
            password: Some(b(b"pw")),
        })),
        true,
    );
    // 3.1.1 figure 3.11: topic "a/b", packet identifier 10.
    add(
        "spec 3.1.1 PUBLISH variable header example",
        V3_1_1,
        "32090003612f62000a6869",
        Packet::Publish(publish(QoS::AtLeastOnce, false, "a/b", 10, b"hi")),
        true,
    );
    cases
}

#[test]
fn captured_packets_decode_and_reencode() {
    for case in cases() {
        let bytes = hex(case.hex);
        let mut buf = BytesMut::from(&bytes[..]);
        let decoded = decode(&mut buf, case.protocol, MAX)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name))
            .unwrap_or_else(|| panic!("{}: incomplete", case.name));
        assert!(buf.is_empty(), "{}: bytes left", case.name);
        assert_eq!(decoded, case.expected, "{}", case.name);
        let mut out = BytesMut::new();
        encode(&case.expected, case.protocol, &mut out).unwrap();
        if case.exact {
            assert_eq!(&out[..], &bytes[..], "{}: re-encoding differs", case.name);
        } else {
            assert_eq!(out.len(), bytes.len(), "{}", case.name);
            let again = decode(&mut out, case.protocol, MAX).unwrap().unwrap();
            assert_eq!(again, case.expected, "{}", case.name);
        }
    }
}

#[test]
fn captured_stream_decodes_packet_by_packet() {
    // The whole 5.0 publish session as one read buffer, split at every offset.
    let stream = hex("101400044d5154540502003c03210014000470756235\
         332e000c73656e736f72732f74656d70000119020000003c2600016b00017603000a746578742f706c61696e32312e35\
         e000");
    for split in 0..=stream.len() {
        let mut buf = BytesMut::from(&stream[..split]);
        let mut packets = Vec::new();
        let mut fed = split;
        loop {
            match decode(&mut buf, Protocol::V5, MAX).unwrap() {
                Some(packet) => packets.push(packet),
                None if fed < stream.len() => {
                    buf.extend_from_slice(&stream[fed..]);
                    fed = stream.len();
                }
                None => break,
            }
        }
        assert_eq!(packets.len(), 3, "split at {split}");
        assert!(matches!(packets[2], Packet::Disconnect(_)));
    }
}
