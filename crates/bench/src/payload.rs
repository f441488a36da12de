//! The bench payload: every message says who sent it, which one it is, and when it was sent.
//!
//! Layout (big-endian, [`HEADER_BYTES`] = 20 bytes, then padding up to the payload size):
//!
//! ```text
//! offset 0   u32  publisher id (0-based, unique in the run)
//! offset 4   u64  sequence number (0-based, per publisher, consecutive)
//! offset 12  u64  send time, ns since the run's clock epoch (see `clock`)
//! offset 20  ..   padding (zero bytes)
//! ```
//!
//! # Invariants
//! - A payload is never shorter than [`HEADER_BYTES`]; the CLI rejects smaller sizes.
//! - Publishers and subscribers live in one process and read one monotonic clock, so the send
//!   time and the receive time are directly comparable (no clock sync involved).

use thiserror::Error;

/// Bytes of the header at the front of every payload.
pub const HEADER_BYTES: usize = 20;

/// The header carried at the front of every bench payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub publisher_id: u32,
    pub seq: u64,
    pub send_time_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PayloadError {
    #[error("payload of {0} bytes is shorter than the {HEADER_BYTES}-byte bench header")]
    TooShort(usize),
}

impl Header {
    /// Writes the header into the first [`HEADER_BYTES`] of `out`.
    pub fn write(&self, out: &mut [u8]) -> Result<(), PayloadError> {
        let Some(head) = out.get_mut(..HEADER_BYTES) else {
            return Err(PayloadError::TooShort(out.len()));
        };
        head[0..4].copy_from_slice(&self.publisher_id.to_be_bytes());
        head[4..12].copy_from_slice(&self.seq.to_be_bytes());
        head[12..20].copy_from_slice(&self.send_time_ns.to_be_bytes());
        Ok(())
    }

    /// Reads the header from the front of a received payload.
    pub fn read(payload: &[u8]) -> Result<Header, PayloadError> {
        let Some(head) = payload.get(..HEADER_BYTES) else {
            return Err(PayloadError::TooShort(payload.len()));
        };
        let mut id = [0u8; 4];
        let mut seq = [0u8; 8];
        let mut time = [0u8; 8];
        id.copy_from_slice(&head[0..4]);
        seq.copy_from_slice(&head[4..12]);
        time.copy_from_slice(&head[12..20]);
        Ok(Header {
            publisher_id: u32::from_be_bytes(id),
            seq: u64::from_be_bytes(seq),
            send_time_ns: u64::from_be_bytes(time),
        })
    }
}

/// A zeroed payload of `size_bytes` (header placeholder + padding).
pub fn blank(size_bytes: usize) -> Result<Vec<u8>, PayloadError> {
    if size_bytes < HEADER_BYTES {
        return Err(PayloadError::TooShort(size_bytes));
    }
    Ok(vec![0u8; size_bytes])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_big_endian_at_fixed_offsets() {
        let mut buf = blank(24).unwrap();
        Header {
            publisher_id: 0x0102_0304,
            seq: 5,
            send_time_ns: 0x0A0B,
        }
        .write(&mut buf)
        .unwrap();
        assert_eq!(&buf[0..4], &[1, 2, 3, 4]);
        assert_eq!(&buf[4..12], &[0, 0, 0, 0, 0, 0, 0, 5]);
        assert_eq!(&buf[12..20], &[0, 0, 0, 0, 0, 0, 0x0A, 0x0B]);
        assert_eq!(&buf[20..], &[0, 0, 0, 0]);
    }

    #[test]
    fn short_payloads_are_rejected() {
        assert_eq!(blank(19), Err(PayloadError::TooShort(19)));
        assert_eq!(Header::read(&[0u8; 19]), Err(PayloadError::TooShort(19)));
        let mut short = [0u8; 3];
        let header = Header {
            publisher_id: 1,
            seq: 1,
            send_time_ns: 1,
        };
        assert_eq!(header.write(&mut short), Err(PayloadError::TooShort(3)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn header_round_trips(id: u32, seq: u64, time: u64, pad in 0usize..64) {
            let mut buf = blank(HEADER_BYTES + pad).unwrap();
            let header = Header { publisher_id: id, seq, send_time_ns: time };
            header.write(&mut buf).unwrap();
            prop_assert_eq!(Header::read(&buf).unwrap(), header);
        }
    }
}
