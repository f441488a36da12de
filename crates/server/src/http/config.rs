//! `[http]`: the admin HTTP listener (`/metrics`, `/healthz`, `/readyz`, `/api/v1`, the
//! dashboard). Off unless `bind` is set here or by `--http ADDR`.

use std::net::SocketAddr;

use serde::Deserialize;

/// Shortest bearer token accepted: a guessable token is no protection.
pub const MIN_TOKEN_LEN: usize = 16;

/// The `[http]` table as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an [http] table")]
pub struct HttpSection {
    /// Address of the HTTP listener, e.g. `127.0.0.1:8080`.
    pub bind: Option<String>,
    /// Bearer token: required for actions, and for every request on a non-loopback bind.
    pub token: Option<String>,
}

/// A validated HTTP listener setting.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub bind: SocketAddr,
    pub token: Option<String>,
}

impl HttpSettings {
    /// Resolves `--http ADDR` (wins over `[http] bind`) and checks the rules: a bind must be
    /// an address; a token at least [`MIN_TOKEN_LEN`] long; a non-loopback bind needs a token.
    /// `Ok(None)`: the HTTP listener is off.
    pub fn resolve(
        section: Option<&HttpSection>,
        flag: Option<&str>,
    ) -> Result<Option<HttpSettings>, String> {
        let token = section.and_then(|s| s.token.clone());
        let Some(bind) = flag.or(section.and_then(|s| s.bind.as_deref())) else {
            return Ok(None);
        };
        let bind: SocketAddr = bind
            .parse()
            .map_err(|_| format!("bind: `{bind}` is not an address like 127.0.0.1:8080"))?;
        if let Some(token) = &token {
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "token: must be at least {MIN_TOKEN_LEN} characters long"
                ));
            }
        }
        if !bind.ip().is_loopback() && token.is_none() {
            return Err(format!(
                "bind: {bind} is not a loopback address; set [http] token so that every request must carry it"
            ));
        }
        Ok(Some(HttpSettings { bind, token }))
    }

    /// Every request needs the token (a non-loopback bind), not only actions.
    pub fn token_for_reads(&self) -> bool {
        !self.bind.ip().is_loopback()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(bind: &str, token: Option<&str>) -> HttpSection {
        HttpSection {
            bind: Some(bind.into()),
            token: token.map(Into::into),
        }
    }

    #[test]
    fn non_loopback_bind_without_token_is_refused() {
        let error = HttpSettings::resolve(Some(&section("0.0.0.0:8080", None)), None).unwrap_err();
        assert!(error.contains("not a loopback address"), "{error}");
        let ok = HttpSettings::resolve(
            Some(&section("0.0.0.0:8080", Some("0123456789abcdef"))),
            None,
        )
        .unwrap()
        .unwrap();
        assert!(ok.token_for_reads());
    }

    #[test]
    fn the_flag_wins_and_off_is_off() {
        assert!(HttpSettings::resolve(None, None).unwrap().is_none());
        let s = HttpSettings::resolve(Some(&section("127.0.0.1:1", None)), Some("127.0.0.1:2"))
            .unwrap()
            .unwrap();
        assert_eq!(s.bind.port(), 2);
        assert!(!s.token_for_reads());
        assert!(HttpSettings::resolve(None, Some("nope")).is_err());
        assert!(HttpSettings::resolve(Some(&section("127.0.0.1:1", Some("short"))), None).is_err());
    }
}
