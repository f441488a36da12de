//! MQTT topic filter matching (`+` one level, `#` the rest), kept local so the store
//! depends on no other crate of ours. Topics beginning with `$` never match a filter
//! that begins with a wildcard (MQTT-4.7.2-1).

/// True if `topic` matches `filter`. Filters are taken as given (not validated here).
pub fn topic_matches(filter: &[u8], topic: &[u8]) -> bool {
    if topic.first() == Some(&b'$') && matches!(filter.first(), Some(b'+') | Some(b'#')) {
        return false;
    }
    let mut f = filter.split(|&b| b == b'/');
    let mut t = topic.split(|&b| b == b'/');
    loop {
        match (f.next(), t.next()) {
            (Some(b"#"), _) => return true,
            (Some(b"+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

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
