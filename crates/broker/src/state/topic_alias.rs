//! Topic aliases in both directions (MQTT 5 §3.3.2.3.4).
//!
//! # Invariants
//! - Inbound: only aliases 1..=our Topic Alias Maximum are stored, so the map holds at most
//!   that many entries ([MQTT-3.3.2-9]).
//! - Outbound: we never send an alias above the client's Topic Alias Maximum
//!   ([MQTT-3.3.2-10]); an alias is assigned first-come and never remapped, so a client that
//!   has seen a topic once never needs it again for that alias. Both maps live and die with
//!   one network connection ([MQTT-3.3.2-7]).
//! - A map is allocated on first use (`Option<Box<..>>`, 8 bytes until then): both live in the
//!   futures of every connection, and most clients never use an alias.

use std::collections::HashMap;

use tern_wire::Str;

/// Why an inbound alias was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AliasError {
    /// 0 or above our maximum: DISCONNECT 0x94.
    #[error("topic alias out of range")]
    OutOfRange,
    /// An empty topic with an alias we never saw: DISCONNECT 0x82.
    #[error("unknown topic alias")]
    Unknown,
}

#[derive(Debug)]
pub(crate) struct InboundAliases {
    maximum: u16,
    // Boxed on purpose: 8 bytes in every connection's future instead of 48 for an empty map.
    #[allow(clippy::box_collection)]
    map: Option<Box<HashMap<u16, Str>>>,
}

impl InboundAliases {
    pub(crate) fn new(maximum: u16) -> Self {
        InboundAliases { maximum, map: None }
    }

    /// The topic a PUBLISH is about, given its topic field and optional alias.
    pub(crate) fn resolve(&mut self, topic: &Str, alias: Option<u16>) -> Result<Str, AliasError> {
        let Some(alias) = alias else {
            return Ok(topic.clone());
        };
        if alias == 0 || alias > self.maximum {
            return Err(AliasError::OutOfRange);
        }
        if topic.is_empty() {
            return self
                .map
                .as_ref()
                .and_then(|map| map.get(&alias).cloned())
                .ok_or(AliasError::Unknown);
        }
        self.map
            .get_or_insert_default()
            .insert(alias, topic.clone());
        Ok(topic.clone())
    }
}

#[derive(Debug)]
pub(crate) struct OutboundAliases {
    maximum: u16,
    #[allow(clippy::box_collection)]
    map: Option<Box<HashMap<Str, u16>>>,
}

impl OutboundAliases {
    /// `maximum` = the client's Topic Alias Maximum (0: aliases unused).
    pub(crate) fn new(maximum: u16) -> Self {
        OutboundAliases { maximum, map: None }
    }

    /// `(alias, send_topic)` for a delivery on `topic`.
    pub(crate) fn lookup(&mut self, topic: &Str) -> (Option<u16>, bool) {
        if self.maximum == 0 {
            return (None, true);
        }
        let map = self.map.get_or_insert_default();
        if let Some(&alias) = map.get(topic) {
            return (Some(alias), false);
        }
        let used = map.len();
        if used >= usize::from(self.maximum) {
            return (None, true);
        }
        // used < maximum <= u16::MAX, so used + 1 fits.
        let alias = used as u16 + 1;
        map.insert(topic.clone(), alias);
        (Some(alias), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbound_alias_rules_mqtt_3_3_2_8_and_9() {
        let mut aliases = InboundAliases::new(2);
        let t = Str::from_static("a/b");
        let empty = Str::default();
        assert_eq!(aliases.resolve(&t, Some(0)), Err(AliasError::OutOfRange));
        assert_eq!(aliases.resolve(&t, Some(3)), Err(AliasError::OutOfRange));
        assert_eq!(aliases.resolve(&empty, Some(1)), Err(AliasError::Unknown));
        assert_eq!(aliases.resolve(&t, Some(1)), Ok(t.clone()));
        assert_eq!(aliases.resolve(&empty, Some(1)), Ok(t.clone()));
        let other = Str::from_static("c");
        assert_eq!(aliases.resolve(&other, Some(1)), Ok(other.clone()));
        assert_eq!(aliases.resolve(&empty, Some(1)), Ok(other));
    }

    #[test]
    fn outbound_aliases_first_come_within_client_maximum_mqtt_3_3_2_10() {
        let mut aliases = OutboundAliases::new(1);
        let a = Str::from_static("a");
        let b = Str::from_static("b");
        assert_eq!(aliases.lookup(&a), (Some(1), true));
        assert_eq!(aliases.lookup(&a), (Some(1), false));
        assert_eq!(aliases.lookup(&b), (None, true));
        let mut off = OutboundAliases::new(0);
        assert_eq!(off.lookup(&a), (None, true));
    }
}
