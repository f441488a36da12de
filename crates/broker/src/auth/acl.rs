//! The ACL file, mosquitto's syntax and semantics as they are (mosquitto 2.0
//! `src/security_default.c`, `aclfile__parse` and `mosquitto_acl_check_default`):
//!
//! ```text
//! # comment
//! topic read $SYS/#            <- before the first `user`: anonymous clients
//! user alice
//! topic readwrite alice/#      <- alice's rules
//! topic deny alice/secret
//! pattern write devices/%c/status   <- every client, %c = client id, %u = username
//! ```
//!
//! A check (one topic, read or write):
//! 1. The client's own list: the rules of its `user` section, or, without a username, the
//!    rules before the first `user` line. A client whose username has no section has none.
//!    `deny` rules come first (mosquitto puts them at the front of the list): the first
//!    matching rule decides, a `deny` denies, a rule granting the access allows, a rule
//!    granting the other access is passed over.
//! 2. Then the `pattern` rules, the same way (denies first), with `%c` and `%u` replaced. A
//!    `%u` pattern is skipped for a client without a username. A client id or username holding
//!    `+` or `#` is denied outright once patterns exist (it could widen a pattern).
//! 3. Nothing matched: denied.
//!
//! A rule matches a topic as an MQTT filter matches it, and a `$`-topic (`$SYS/...`) only by a
//! rule that starts with `$` itself: `topic read #` does not make `$SYS` readable.
//!
//! Subscriptions (mosquitto 2.0 does not check them in its ACL file at all, and only filters
//! what it delivers): a filter is granted when the filter itself, read as a topic, is readable
//! (so `topic read a/#` grants `a/#`, `a/+` and `a/b`; `topic read a/b` does not grant `a/#`);
//! every message is checked again for read access on its concrete topic when it is delivered.

use std::collections::HashMap;

/// Largest ACL file read.
pub(crate) const MAX_ACL_FILE_BYTES: u64 = 64 * 1024 * 1024;

const READ: u8 = 1;
const WRITE: u8 = 2;
const NONE: u8 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Receive messages on a topic (and subscribe to a filter).
    Read,
    /// Publish to a topic.
    Write,
}

impl Access {
    fn bit(self) -> u8 {
        match self {
            Access::Read => READ,
            Access::Write => WRITE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    filter: Box<str>,
    /// `READ | WRITE`, or `NONE` for `deny`.
    access: u8,
}

/// A parsed ACL file.
#[derive(Debug, Default, Clone)]
pub struct Acl {
    anonymous: Vec<Rule>,
    users: HashMap<String, Vec<Rule>>,
    patterns: Vec<Rule>,
}

/// A client as the ACL sees it.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    pub(crate) username: Option<&'a str>,
    pub(crate) client_id: &'a str,
}

impl Acl {
    pub fn load(path: &std::path::Path) -> Result<Acl, AclError> {
        let read = |source| AclError::Read {
            path: path.display().to_string(),
            source,
        };
        let text = super::read_rules_file(path, MAX_ACL_FILE_BYTES).map_err(read)?;
        Acl::parse(&text)
    }

    pub(crate) fn parse(text: &str) -> Result<Acl, AclError> {
        let mut acl = Acl::default();
        let mut user: Option<String> = None;
        for (index, line) in text.lines().enumerate() {
            let bad = |reason: String| AclError::Line {
                line: index + 1,
                reason,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (keyword, rest) = line
                .split_once(char::is_whitespace)
                .map(|(k, r)| (k, r.trim()))
                .unwrap_or((line, ""));
            match keyword {
                "user" => {
                    if rest.is_empty() {
                        return Err(bad("missing username".into()));
                    }
                    user = Some(rest.to_string());
                }
                "topic" | "pattern" => {
                    let (access, filter) = match rest.split_once(char::is_whitespace) {
                        Some((access, filter)) => {
                            (parse_access(access).map_err(bad)?, filter.trim())
                        }
                        None => (READ | WRITE, rest),
                    };
                    if filter.is_empty() {
                        return Err(bad("empty topic".into()));
                    }
                    if tern_topic::validate_topic_filter(filter).is_err() {
                        return Err(bad(format!("invalid topic filter `{filter}`")));
                    }
                    let rule = Rule {
                        filter: filter.into(),
                        access,
                    };
                    let list = if keyword == "pattern" {
                        &mut acl.patterns
                    } else {
                        match &user {
                            Some(name) => acl.users.entry(name.clone()).or_default(),
                            None => &mut acl.anonymous,
                        }
                    };
                    push_rule(list, rule);
                }
                other => return Err(bad(format!("unknown keyword `{other}`"))),
            }
        }
        Ok(acl)
    }

    /// Whether `who` may read (receive) or write (publish) `topic`.
    pub(crate) fn allows(&self, who: Who<'_>, topic: &str, access: Access) -> bool {
        let own = match who.username {
            Some(name) => self.users.get(name).map(Vec::as_slice).unwrap_or(&[]),
            None => &self.anonymous,
        };
        if let Some(decided) = decide(own, topic, access, |filter| {
            std::borrow::Cow::Borrowed(filter)
        }) {
            return decided;
        }
        if self.patterns.is_empty() {
            return false;
        }
        let dangerous = |s: &str| s.contains(['+', '#']);
        if dangerous(who.client_id) || who.username.is_some_and(dangerous) {
            return false;
        }
        let patterns = self
            .patterns
            .iter()
            .filter(|rule| who.username.is_some() || !rule.filter.contains("%u"));
        decide(patterns, topic, access, |filter| {
            std::borrow::Cow::Owned(substitute(filter, who))
        })
        .unwrap_or(false)
    }

    /// Whether `who` may subscribe to `filter` (module doc: the filter read as a topic).
    pub(crate) fn allows_subscribe(&self, who: Who<'_>, filter: &str) -> bool {
        self.allows(who, filter, Access::Read)
    }
}

fn parse_access(word: &str) -> Result<u8, String> {
    match word {
        "read" => Ok(READ),
        "write" => Ok(WRITE),
        "readwrite" => Ok(READ | WRITE),
        "deny" => Ok(NONE),
        other => Err(format!(
            "invalid access `{other}` (read, write, readwrite or deny)"
        )),
    }
}

/// Appends a rule; a `deny` goes to the front, as in mosquitto.
fn push_rule(list: &mut Vec<Rule>, rule: Rule) {
    if rule.access == NONE {
        list.insert(0, rule);
    } else {
        list.push(rule);
    }
}

/// The first matching rule that decides: `Some(false)` for a deny, `Some(true)` for a grant
/// of `access`; `None` if none decides.
fn decide<'r>(
    rules: impl IntoIterator<Item = &'r Rule>,
    topic: &str,
    access: Access,
    filter_of: impl Fn(&'r str) -> std::borrow::Cow<'r, str>,
) -> Option<bool> {
    for rule in rules {
        let filter = filter_of(&rule.filter);
        // MQTT-4.7.2-1 (a leading wildcard never matches a `$`-topic) is the matcher's.
        if !tern_topic::filter_matches(&filter, topic) {
            continue;
        }
        if rule.access == NONE {
            return Some(false);
        }
        if rule.access & access.bit() != 0 {
            return Some(true);
        }
    }
    None
}

/// `%c` → client id, `%u` → username, anywhere in the filter (as mosquitto does).
fn substitute(filter: &str, who: Who<'_>) -> String {
    let mut out = String::with_capacity(filter.len() + who.client_id.len());
    let mut rest = filter;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match (after.as_bytes().first(), who.username) {
            (Some(b'c'), _) => {
                out.push_str(who.client_id);
                rest = &after[1..];
            }
            (Some(b'u'), Some(user)) => {
                out.push_str(user);
                rest = &after[1..];
            }
            _ => {
                out.push('%');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# anonymous
topic read public/#
topic read $SYS/broker/uptime

user alice
topic readwrite alice/#
topic deny alice/secret
topic write shared/in
topic read #

user bob
topic bob/#

pattern readwrite devices/%c/#
pattern read users/%u/inbox
pattern deny devices/%c/locked
";

    fn who<'a>(username: Option<&'a str>, client_id: &'a str) -> Who<'a> {
        Who {
            username,
            client_id,
        }
    }

    #[test]
    fn anonymous_rules_are_those_before_the_first_user() {
        let acl = Acl::parse(FILE).unwrap();
        let anon = who(None, "c1");
        assert!(acl.allows(anon, "public/x", Access::Read));
        assert!(!acl.allows(anon, "public/x", Access::Write));
        assert!(!acl.allows(anon, "alice/x", Access::Read));
        assert!(acl.allows(anon, "$SYS/broker/uptime", Access::Read));
        // A user without those rules does not get them.
        assert!(!acl.allows(who(Some("bob"), "c2"), "public/x", Access::Read));
    }

    #[test]
    fn deny_wins_within_a_list_and_readwrite_is_the_default() {
        let acl = Acl::parse(FILE).unwrap();
        let alice = who(Some("alice"), "a1");
        assert!(acl.allows(alice, "alice/x", Access::Write));
        assert!(!acl.allows(alice, "alice/secret", Access::Read));
        assert!(!acl.allows(alice, "alice/secret", Access::Write));
        assert!(acl.allows(alice, "shared/in", Access::Write));
        assert!(acl.allows(alice, "shared/in", Access::Read), "topic read #");
        assert!(acl.allows(who(Some("bob"), "b"), "bob/x", Access::Write));
        assert!(acl.allows(who(Some("bob"), "b"), "bob/x", Access::Read));
    }

    #[test]
    fn sys_topics_need_a_rule_starting_with_dollar() {
        let acl = Acl::parse(FILE).unwrap();
        let alice = who(Some("alice"), "a1");
        assert!(
            !acl.allows(alice, "$SYS/broker/uptime", Access::Read),
            "# alone"
        );
        assert!(!acl.allows_subscribe(alice, "$SYS/#"));
        assert!(acl.allows_subscribe(who(None, "x"), "$SYS/broker/uptime"));
    }

    #[test]
    fn patterns_substitute_client_id_and_username() {
        let acl = Acl::parse(FILE).unwrap();
        let carol = who(Some("carol"), "dev7");
        assert!(acl.allows(carol, "devices/dev7/temp", Access::Write));
        assert!(!acl.allows(carol, "devices/dev8/temp", Access::Write));
        assert!(!acl.allows(carol, "devices/dev7/locked", Access::Read));
        assert!(acl.allows(carol, "users/carol/inbox", Access::Read));
        assert!(!acl.allows(carol, "users/carol/inbox", Access::Write));
        // %u patterns do not apply without a username; %c ones do.
        assert!(!acl.allows(who(None, "dev7"), "users//inbox", Access::Read));
        assert!(acl.allows(who(None, "dev7"), "devices/dev7/x", Access::Read));
        // A wildcard in the client id or username would widen a pattern: denied.
        assert!(!acl.allows(who(Some("carol"), "#"), "devices/x/y", Access::Read));
        assert!(!acl.allows(who(Some("+"), "d"), "users/x/inbox", Access::Read));
    }

    #[test]
    fn subscriptions_are_checked_as_topics() {
        let acl = Acl::parse(FILE).unwrap();
        let anon = who(None, "c");
        assert!(acl.allows_subscribe(anon, "public/#"));
        assert!(acl.allows_subscribe(anon, "public/+/x"));
        assert!(!acl.allows_subscribe(anon, "#"));
        assert!(!acl.allows_subscribe(anon, "+/x"));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = Acl::parse("topic read a\nfrobnicate x\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        assert!(Acl::parse("topic sometimes a/b\n").is_err());
        assert!(Acl::parse("topic read a/#/b\n").is_err());
        assert!(Acl::parse("user\n").is_err());
        let acl = Acl::parse("topic a b/c\n");
        assert!(acl.is_err(), "access `a` is not one");
        // A topic with spaces after an access word is allowed.
        let acl = Acl::parse("topic read a b/c\n").unwrap();
        assert!(acl.allows(who(None, "x"), "a b/c", Access::Read));
    }
}
