//! Feeds arbitrary bytes to the decoder as each protocol version. Properties checked: no
//! panic, every decoded packet consumed bytes, and whatever decodes re-encodes to bytes that
//! decode to the same packet.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tern_wire::{Protocol, decode, encode};

const MAX_PACKET_BYTES: u32 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    for protocol in [Protocol::V3_1, Protocol::V3_1_1, Protocol::V5] {
        let mut buf = BytesMut::from(data);
        loop {
            let before = buf.len();
            match decode(&mut buf, protocol, MAX_PACKET_BYTES) {
                Ok(Some(packet)) => {
                    assert!(buf.len() < before);
                    let mut out = BytesMut::new();
                    encode(&packet, protocol, &mut out).expect("a decoded packet encodes");
                    let again = decode(&mut out, protocol, u32::MAX)
                        .expect("re-encoded packet decodes")
                        .expect("re-encoded packet is complete");
                    assert_eq!(again, packet);
                    assert!(out.is_empty());
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
});
