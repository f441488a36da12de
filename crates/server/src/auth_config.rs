//! `[auth]`: `allow_anonymous`, `password_file`, `acl_file`, and the rule for the default of
//! `allow_anonymous` (true only when every listener binds a loopback address).
//!
//! File paths are taken as written (relative ones from the working directory, as mosquitto
//! does). The files are read at start-up (an unreadable or malformed file stops the start,
//! exit code 2) and again on SIGHUP (a bad file then keeps the rules in force, logged).

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use tern_broker::{Acl, AuthRules, PasswordFile};

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an [auth] table")]
pub struct AuthConfig {
    /// Let clients without a username in. Default: true only if every listener binds a
    /// loopback address ([`allow_anonymous_default`]).
    pub allow_anonymous: Option<bool>,
    /// Users and hashes (`tern passwd`, or mosquitto_passwd's `$6$` / `$7$` lines).
    pub password_file: Option<PathBuf>,
    /// mosquitto ACL file.
    pub acl_file: Option<PathBuf>,
}

/// `allow_anonymous` when the file does not set it: true if every bind address is a loopback
/// one; otherwise false when a password file is configured, and an error saying what to set
/// when nothing is (an open broker on a reachable address is never a default).
pub fn allow_anonymous_default(auth: &AuthConfig, binds: &[String]) -> Result<bool, String> {
    if let Some(allow) = auth.allow_anonymous {
        return Ok(allow);
    }
    let exposed: Vec<&String> = binds.iter().filter(|b| !is_loopback(b)).collect();
    if exposed.is_empty() {
        return Ok(true);
    }
    if auth.password_file.is_some() {
        return Ok(false);
    }
    let list: Vec<&str> = exposed.iter().map(|s| s.as_str()).collect();
    Err(format!(
        "listening on {} (not a loopback address) without authentication: set \
         [auth] password_file = \"FILE\" (make users with `tern passwd -c FILE USER`), \
         or [auth] allow_anonymous = true to let anyone connect",
        list.join(", ")
    ))
}

/// True if `bind` resolves to loopback addresses only (an unresolvable name counts as not).
fn is_loopback(bind: &str) -> bool {
    match bind.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Reads the files `auth` names into the rules the broker enforces.
pub fn load_rules(auth: &AuthConfig, allow_anonymous: bool) -> Result<AuthRules, String> {
    let passwords = match &auth.password_file {
        Some(path) => {
            Some(Arc::new(PasswordFile::load(path).map_err(|e| {
                format!("password_file {}: {e}", path.display())
            })?))
        }
        None => None,
    };
    let acl = match &auth.acl_file {
        Some(path) => Some(Arc::new(
            Acl::load(path).map_err(|e| format!("acl_file {}: {e}", path.display()))?,
        )),
        None => None,
    };
    Ok(AuthRules {
        allow_anonymous,
        passwords,
        acl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binds(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn anonymous_by_default_only_on_loopback() {
        let none = AuthConfig::default();
        assert_eq!(
            allow_anonymous_default(&none, &binds(&["127.0.0.1:1883"])),
            Ok(true)
        );
        assert_eq!(
            allow_anonymous_default(&none, &binds(&["127.0.0.1:1883", "[::1]:1884"])),
            Ok(true)
        );
        let e =
            allow_anonymous_default(&none, &binds(&["127.0.0.1:1", "0.0.0.0:1883"])).unwrap_err();
        assert!(e.contains("0.0.0.0:1883"), "{e}");
        assert!(
            e.contains("password_file") && e.contains("allow_anonymous"),
            "{e}"
        );
        let with_file = AuthConfig {
            password_file: Some("p".into()),
            ..AuthConfig::default()
        };
        assert_eq!(
            allow_anonymous_default(&with_file, &binds(&["0.0.0.0:1"])),
            Ok(false)
        );
        assert_eq!(
            allow_anonymous_default(&with_file, &binds(&["127.0.0.1:1"])),
            Ok(true)
        );
        let open = AuthConfig {
            allow_anonymous: Some(true),
            ..AuthConfig::default()
        };
        assert_eq!(
            allow_anonymous_default(&open, &binds(&["0.0.0.0:1"])),
            Ok(true)
        );
        let closed = AuthConfig {
            allow_anonymous: Some(false),
            ..AuthConfig::default()
        };
        assert_eq!(
            allow_anonymous_default(&closed, &binds(&["127.0.0.1:1"])),
            Ok(false)
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let t: toml::Value = toml::from_str("allow_anonymous = true\npasswd = \"x\"\n").unwrap();
        assert!(t.try_into::<AuthConfig>().is_err());
    }
}
