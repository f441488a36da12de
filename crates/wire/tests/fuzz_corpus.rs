//! Replays every file of the committed fuzz corpus (`fuzz/corpus/decode`) through the decoder
//! as each protocol version, with the fuzz target's checks: no panic, progress on every
//! decoded packet, and decode(encode(p)) == p for whatever decodes.

use std::path::PathBuf;

use bytes::BytesMut;
use tern_wire::{Protocol, decode, encode};

const MAX_PACKET_BYTES: u32 = 1 << 16;

fn check(data: &[u8]) -> usize {
    let mut decoded = 0;
    for protocol in [Protocol::V3_1, Protocol::V3_1_1, Protocol::V5] {
        let mut buf = BytesMut::from(data);
        loop {
            let before = buf.len();
            match decode(&mut buf, protocol, MAX_PACKET_BYTES) {
                Ok(Some(packet)) => {
                    decoded += 1;
                    assert!(buf.len() < before);
                    let mut out = BytesMut::new();
                    encode(&packet, protocol, &mut out).expect("a decoded packet encodes");
                    let again = decode(&mut out, protocol, u32::MAX)
                        .expect("re-encoded packet decodes")
                        .expect("re-encoded packet is complete");
                    assert_eq!(again, packet);
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
    decoded
}

#[test]
fn corpus_replays_cleanly() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    let mut files = 0;
    let mut decoded = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        decoded += check(&data);
        files += 1;
    }
    assert!(files >= 30, "corpus has only {files} files");
    assert!(decoded > 0, "nothing in the corpus decodes");
}
