//! Variable Byte Integers (section 1.5.5): remaining length, property lengths, property
//! identifiers and subscription identifiers.
//!
//! # Invariants
//! - At most four bytes are read; a continuation bit on the fourth byte is malformed.
//! - Non-minimal encodings (e.g. `0x80 0x00` for 0) are accepted when decoding: the spec only
//!   obliges the sender to use the minimum, and mosquitto and rumqtt accept them too. The
//!   encoder always writes the minimal form.

use bytes::BufMut;

/// Largest value a four-byte Variable Byte Integer can carry.
pub const VARINT_MAX: u32 = 268_435_455;

/// Outcome of parsing a Variable Byte Integer from the front of a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Varint {
    /// `(value, bytes used)`.
    Complete(u32, usize),
    /// The slice ends before the last byte of the integer.
    Incomplete,
    /// Five or more bytes.
    Malformed,
}

#[inline]
pub(crate) fn parse(bytes: &[u8]) -> Varint {
    let mut value: u32 = 0;
    for index in 0..4 {
        let Some(&byte) = bytes.get(index) else {
            return Varint::Incomplete;
        };
        value |= u32::from(byte & 0x7F) << (7 * index);
        if byte & 0x80 == 0 {
            return Varint::Complete(value, index + 1);
        }
    }
    Varint::Malformed
}

/// A complete Variable Byte Integer at the front of `bytes`: `(value, bytes used)`; `None`
/// if it is cut short or malformed. For callers outside the decoder that read raw packet
/// bytes (the broker peeks at a CONNECT that failed to decode).
pub fn parse_complete(bytes: &[u8]) -> Option<(u32, usize)> {
    match parse(bytes) {
        Varint::Complete(value, used) => Some((value, used)),
        Varint::Incomplete | Varint::Malformed => None,
    }
}

/// Number of bytes the minimal encoding of `value` takes (`value` must be ≤ [`VARINT_MAX`]).
#[inline]
pub(crate) fn len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Writes the minimal encoding of `value` (`value` must be ≤ [`VARINT_MAX`]).
#[inline]
pub(crate) fn write(mut value: u32, out: &mut impl BufMut) {
    loop {
        let byte = (value & 0x7F) as u8;
        value >>= 7;
        if value == 0 {
            out.put_u8(byte);
            return;
        }
        out.put_u8(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_round_trip() {
        for value in [
            0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, VARINT_MAX,
        ] {
            let mut out = Vec::new();
            write(value, &mut out);
            assert_eq!(out.len(), len(value));
            assert_eq!(parse(&out), Varint::Complete(value, out.len()));
        }
    }

    #[test]
    fn parse_complete_only_answers_complete_integers() {
        assert_eq!(parse_complete(&[0x80, 0x01, 0xAA]), Some((128, 2)));
        assert_eq!(parse_complete(&[0x80]), None);
        assert_eq!(parse_complete(&[0xFF, 0xFF, 0xFF, 0xFF, 0x7F]), None);
    }

    #[test]
    fn five_bytes_are_malformed() {
        assert_eq!(parse(&[0xFF, 0xFF, 0xFF, 0xFF, 0x7F]), Varint::Malformed);
        assert_eq!(parse(&[0x80, 0x80, 0x80, 0x80]), Varint::Malformed);
    }

    #[test]
    fn incomplete_and_non_minimal() {
        assert_eq!(parse(&[0x80, 0x80]), Varint::Incomplete);
        assert_eq!(parse(&[]), Varint::Incomplete);
        assert_eq!(parse(&[0x80, 0x00]), Varint::Complete(0, 2));
    }
}
