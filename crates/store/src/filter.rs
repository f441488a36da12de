//! Sets of MQTT topic filters for reads by filter. The matching rule itself is tern-topic's
//! (`+` one level, `#` the rest, `$` topics never matching a leading wildcard, MQTT-4.7.2-1):
//! one implementation of the rule for the broker, its ACL and the store.

/// True if `topic` matches `filter`. Filters are taken as given (not validated here).
pub use tern_topic::filter_matches_bytes as topic_matches;

/// A set of filters; empty means "everything".
#[derive(Debug, Clone, Default)]
pub struct FilterSet {
    filters: Vec<Vec<u8>>,
}

impl FilterSet {
    pub fn new<I, F>(filters: I) -> Self
    where
        I: IntoIterator<Item = F>,
        F: AsRef<[u8]>,
    {
        FilterSet {
            filters: filters.into_iter().map(|f| f.as_ref().to_vec()).collect(),
        }
    }

    /// Matches every topic.
    pub fn all() -> Self {
        FilterSet::default()
    }

    pub fn matches(&self, topic: &[u8]) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| topic_matches(f, topic))
    }

    pub fn is_all(&self) -> bool {
        self.filters.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::topic_matches as m;

    #[test]
    fn wildcards() {
        assert!(m(b"a/b", b"a/b"));
        assert!(!m(b"a/b", b"a/c"));
        assert!(m(b"a/+", b"a/c"));
        assert!(!m(b"a/+", b"a/c/d"));
        assert!(m(b"a/#", b"a"));
        assert!(m(b"a/#", b"a/c/d"));
        assert!(m(b"#", b"x/y"));
        assert!(m(b"+/+", b"/x"));
        assert!(m(b"+", b""));
        assert!(!m(b"a", b"a/b"));
        // MQTT-4.7.2-1: $-topics do not match leading wildcards.
        assert!(!m(b"#", b"$SYS/x"));
        assert!(!m(b"+/x", b"$SYS/x"));
        assert!(m(b"$SYS/#", b"$SYS/x"));
    }
}
