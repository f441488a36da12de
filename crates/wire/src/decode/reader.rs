//! A bounds-checked cursor over one packet's frozen bytes.
//!
//! # Invariants
//! - `pos <= end <= data.len()`; every read checks the length first and fails with
//!   [`DecodeError::Truncated`] instead of panicking.
//! - Byte fields are returned as `Bytes::slice` of `data`: zero-copy, a reference count bump.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::packet::Str;
use crate::varint::{self, Varint};

pub(crate) struct Reader<'a> {
    data: &'a Bytes,
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `data[start..]`; `start` must be ≤ `data.len()`.
    pub(crate) fn new(data: &'a Bytes, start: usize) -> Reader<'a> {
        let end = data.len();
        Reader {
            data,
            pos: start.min(end),
            end,
        }
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.end - self.pos
    }

    /// Offset of the next byte within the frame.
    #[inline]
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.end
    }

    #[inline(always)]
    fn take(&mut self, count: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < count {
            return Err(DecodeError::Truncated);
        }
        let data: &'a Bytes = self.data;
        let slice = &data[self.pos..self.pos + count];
        self.pos += count;
        Ok(slice)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    #[inline(always)]
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u32, DecodeError> {
        match varint::parse(&self.data[self.pos..self.end]) {
            Varint::Complete(value, used) => {
                self.pos += used;
                Ok(value)
            }
            Varint::Incomplete => Err(DecodeError::Truncated),
            Varint::Malformed => Err(DecodeError::MalformedVarint),
        }
    }

    /// `count` bytes as a zero-copy slice.
    #[inline(always)]
    pub(crate) fn bytes(&mut self, count: usize) -> Result<Bytes, DecodeError> {
        if self.remaining() < count {
            return Err(DecodeError::Truncated);
        }
        let slice = self.data.slice(self.pos..self.pos + count);
        self.pos += count;
        Ok(slice)
    }

    /// Binary Data: two-byte length then the bytes.
    #[inline(always)]
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let len = usize::from(self.u16()?);
        self.bytes(len)
    }

    /// UTF-8 Encoded String: two-byte length then validated UTF-8.
    #[inline]
    pub(crate) fn string(&mut self) -> Result<Str, DecodeError> {
        Str::from_bytes(self.binary()?)
    }

    /// Splits off the next `count` bytes as a reader of their own (a property block).
    #[inline]
    pub(crate) fn sub(&mut self, count: usize) -> Result<Reader<'a>, DecodeError> {
        if self.remaining() < count {
            return Err(DecodeError::Truncated);
        }
        let sub = Reader {
            data: self.data,
            pos: self.pos,
            end: self.pos + count,
        };
        self.pos += count;
        Ok(sub)
    }

    /// Fails unless every byte was consumed.
    #[inline]
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}
