//! Length and write helpers for the primitive field types (section 1.5).
//!
//! # Invariants
//! - Every `*_len` function checks the 65,535-byte limit; the matching `put_*` is only called
//!   after its `*_len` succeeded, so `put_*` can cast lengths to `u16` without checking.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::EncodeError;
use crate::packet::Str;

pub(crate) const FIELD_MAX_BYTES: usize = u16::MAX as usize;

/// Encoded size of a string or binary field of `len` bytes (two-byte prefix included).
#[inline]
pub(crate) fn field_len(len: usize) -> Result<usize, EncodeError> {
    if len > FIELD_MAX_BYTES {
        return Err(EncodeError::FieldTooLong(len));
    }
    Ok(2 + len)
}

#[inline]
pub(crate) fn str_len(value: &Str) -> Result<usize, EncodeError> {
    field_len(value.len())
}

#[inline]
pub(crate) fn binary_len(value: &Bytes) -> Result<usize, EncodeError> {
    field_len(value.len())
}

#[inline]
pub(crate) fn put_binary(out: &mut BytesMut, value: &[u8]) {
    out.put_u16(value.len() as u16);
    out.put_slice(value);
}

#[inline]
pub(crate) fn put_str(out: &mut BytesMut, value: &Str) {
    put_binary(out, value.as_bytes());
}
