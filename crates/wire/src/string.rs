//! [`Str`], the MQTT UTF-8 string: below the properties (which hold strings) and the packets.
//!
//! # Invariants
//! - A [`Str`] always holds well-formed UTF-8 without U+0000 ([MQTT-1.5.4-1], [MQTT-1.5.4-2]).

use bytes::Bytes;

use crate::error::DecodeError;

/// A validated MQTT UTF-8 string: a zero-copy `Bytes` holding well-formed UTF-8 with no U+0000.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Str(Bytes);

impl Str {
    /// Validates `bytes` as an MQTT UTF-8 string.
    pub fn from_bytes(bytes: Bytes) -> Result<Str, DecodeError> {
        std::str::from_utf8(&bytes).map_err(|_| DecodeError::InvalidUtf8)?;
        // Byte search (memchr) instead of a char scan: U+0000 is the single byte 0 in UTF-8.
        if bytes.contains(&0) {
            return Err(DecodeError::NullCharacter);
        }
        Ok(Str(bytes))
    }

    /// Wraps bytes the caller has already validated (UTF-8, no U+0000): [`Str::as_str`]
    /// relies on it.
    pub(crate) fn from_validated(bytes: Bytes) -> Str {
        Str(bytes)
    }

    /// Builds a `Str` from static text; panics only on a programming error (U+0000 in a literal).
    pub fn from_static(text: &'static str) -> Str {
        assert!(!text.contains('\0'), "MQTT strings cannot hold U+0000");
        Str(Bytes::from_static(text.as_bytes()))
    }

    /// Copies `text` into a new `Str`. Fails on U+0000.
    pub fn copy_from(text: &str) -> Result<Str, DecodeError> {
        if text.contains('\0') {
            return Err(DecodeError::NullCharacter);
        }
        Ok(Str(Bytes::copy_from_slice(text.as_bytes())))
    }

    /// Without a second UTF-8 check: topics are read as `&str` several times per routed
    /// message (trie walk, ACL, aliases), and re-validating them was ~4% of the broker's CPU
    /// in the QoS 0 cell (BENCHMARKS.md, session 6; `cargo bench -p tern-wire -- str_as_str`).
    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor leaves well-formed UTF-8 in `self.0`: `from_bytes` checks
        // it, `from_static` and `copy_from` copy a `&str`, `from_validated` is crate-private and
        // its one caller (`decode::publish::topic_name`) checks it (or finds it all ASCII),
        // `Default` is empty; the bytes are immutable (`Bytes`) and never exposed mutably.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }

    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Str {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Str {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::ops::Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}
