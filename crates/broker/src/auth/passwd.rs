//! The password file: one `username:hash` per line, `#` comment lines, as mosquitto_passwd
//! writes it. Three hash forms are accepted as they are:
//! - `$argon2id$...`: a PHC string (argon2 crate), what `tern passwd` writes;
//! - `$6$SALT$HASH`: mosquitto's salted SHA-512, `SHA512(password || salt)`;
//! - `$7$ITERATIONS$SALT$HASH`: mosquitto 2's PBKDF2-HMAC-SHA512, `ITERATIONS` rounds.
//!
//! In both mosquitto forms SALT (12 bytes) and HASH (64 bytes) are standard base64 with
//! padding, as mosquitto's `base64__decode` checks them (`src/password_mosq.c`).
//!
//! # Invariants
//! - A parsed file holds only lines whose hash decoded; a line that does not is an error naming
//!   its line number (mosquitto drops such a user with a log line; refusing the whole file
//!   keeps a typo from silently locking a user out, and a reload then keeps the old file).
//! - Comparisons of derived keys run in constant time for equal lengths.

use std::collections::HashMap;
use std::io::Read;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha512};

/// mosquitto's salt and hash lengths, in bytes.
const MOSQ_SALT_BYTES: usize = 12;
const MOSQ_HASH_BYTES: usize = 64;
/// Salt of the argon2id hashes we write.
const ARGON2_SALT_BYTES: usize = 16;
/// Largest password file read (a file this large is a mistake, not a user list).
pub(crate) const MAX_PASSWORD_FILE_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PasswdError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("cannot hash: {0}")]
    Hash(String),
    #[error("cannot read random bytes: {0}")]
    Random(std::io::Error),
    #[error("a username must not be empty nor contain ':' or a line break")]
    BadUsername,
}

/// One stored hash.
#[derive(Clone, PartialEq, Eq)]
enum Hash {
    /// A PHC string, verified by the argon2 crate.
    Argon2(String),
    Sha512 {
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    Pbkdf2 {
        iterations: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

impl std::fmt::Debug for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print hashes into logs.
        f.write_str(match self {
            Hash::Argon2(_) => "argon2id",
            Hash::Sha512 { .. } => "$6$",
            Hash::Pbkdf2 { .. } => "$7$",
        })
    }
}

/// The users of a password file, with their hashes and the file's lines (so that
/// `tern passwd` rewrites the file keeping comments and order).
#[derive(Debug, Default, Clone)]
pub struct PasswordFile {
    users: HashMap<String, Hash>,
    /// Every line as read (comments included), the users' lines as `Err(username)`.
    lines: Vec<Result<String, String>>,
}

impl PasswordFile {
    pub fn load(path: &std::path::Path) -> Result<PasswordFile, PasswdError> {
        let read = |source| PasswdError::Read {
            path: path.display().to_string(),
            source,
        };
        let text = super::read_rules_file(path, MAX_PASSWORD_FILE_BYTES).map_err(read)?;
        PasswordFile::parse(&text)
    }

    pub(crate) fn parse(text: &str) -> Result<PasswordFile, PasswdError> {
        let mut file = PasswordFile::default();
        for (index, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            // As mosquitto: comments and lines without ':' are skipped.
            let Some((user, hash)) = trimmed.split_once(':').filter(|_| !line.starts_with('#'))
            else {
                file.lines.push(Ok(line.to_string()));
                continue;
            };
            let user = user.trim();
            let parsed = parse_hash(hash.trim()).map_err(|reason| PasswdError::Line {
                line: index + 1,
                reason: format!("user `{user}`: {reason}"),
            })?;
            if file.users.insert(user.to_string(), parsed).is_none() {
                file.lines.push(Err(user.to_string()));
            }
        }
        Ok(file)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub(crate) fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// True if `user` is in the file and `password` is theirs. Slow by design (argon2id,
    /// PBKDF2): call it off the async workers.
    pub(crate) fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.users.get(user) {
            Some(hash) => verify_hash(hash, password),
            None => false,
        }
    }

    /// Sets `user`'s password to a new argon2id hash (added at the end if new).
    pub fn set(&mut self, user: &str, password: &[u8]) -> Result<(), PasswdError> {
        if user.is_empty() || user.contains([':', '\n', '\r']) {
            return Err(PasswdError::BadUsername);
        }
        let hash = Hash::Argon2(hash_argon2id(password)?);
        if self.users.insert(user.to_string(), hash).is_none() {
            self.lines.push(Err(user.to_string()));
        }
        Ok(())
    }

    /// Removes `user`; false if absent.
    pub fn remove(&mut self, user: &str) -> bool {
        if self.users.remove(user).is_none() {
            return false;
        }
        self.lines
            .retain(|line| line.as_ref().err().map(String::as_str) != Some(user));
        true
    }

    /// The file's text: its comments and users in order, each user's hash in its own form.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for line in &self.lines {
            match line {
                Ok(text) => out.push_str(text),
                Err(user) => {
                    let Some(hash) = self.users.get(user) else {
                        continue;
                    };
                    out.push_str(user);
                    out.push(':');
                    out.push_str(&format_hash(hash));
                }
            }
            out.push('\n');
        }
        out
    }
}

fn parse_hash(text: &str) -> Result<Hash, String> {
    if text.starts_with("$argon2") {
        let phc = PasswordHash::new(text).map_err(|e| format!("bad argon2 hash: {e}"))?;
        if phc.algorithm.as_str() != "argon2id" {
            return Err(format!("{} is not accepted, only argon2id", phc.algorithm));
        }
        return Ok(Hash::Argon2(text.to_string()));
    }
    let parts: Vec<&str> = text.split('$').collect();
    let decode = |field: &str, bytes: usize, what: &str| {
        STANDARD
            .decode(field)
            .ok()
            .filter(|v| v.len() == bytes)
            .ok_or_else(|| format!("bad {what}: expected {bytes} bytes of base64"))
    };
    match parts.as_slice() {
        ["", "6", salt, hash] => Ok(Hash::Sha512 {
            salt: decode(salt, MOSQ_SALT_BYTES, "salt")?,
            hash: decode(hash, MOSQ_HASH_BYTES, "hash")?,
        }),
        ["", "7", iterations, salt, hash] => {
            let iterations: u32 = iterations
                .parse()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or("bad iteration count")?;
            Ok(Hash::Pbkdf2 {
                iterations,
                salt: decode(salt, MOSQ_SALT_BYTES, "salt")?,
                hash: decode(hash, MOSQ_HASH_BYTES, "hash")?,
            })
        }
        _ => Err("not an argon2id, $6$ or $7$ hash".into()),
    }
}

fn format_hash(hash: &Hash) -> String {
    match hash {
        Hash::Argon2(phc) => phc.clone(),
        Hash::Sha512 { salt, hash } => {
            format!("$6${}${}", STANDARD.encode(salt), STANDARD.encode(hash))
        }
        Hash::Pbkdf2 {
            iterations,
            salt,
            hash,
        } => format!(
            "$7${iterations}${}${}",
            STANDARD.encode(salt),
            STANDARD.encode(hash)
        ),
    }
}

fn verify_hash(hash: &Hash, password: &[u8]) -> bool {
    match hash {
        Hash::Argon2(phc) => PasswordHash::new(phc)
            .map(|parsed| {
                argon2::Argon2::default()
                    .verify_password(password, &parsed)
                    .is_ok()
            })
            .unwrap_or(false),
        Hash::Sha512 { salt, hash } => {
            let mut digest = Sha512::new();
            digest.update(password);
            digest.update(salt);
            constant_time_eq(&digest.finalize(), hash)
        }
        Hash::Pbkdf2 {
            iterations,
            salt,
            hash,
        } => {
            let mut derived = [0u8; MOSQ_HASH_BYTES];
            pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, *iterations, &mut derived);
            constant_time_eq(&derived, hash)
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Fills `out` from the kernel's random source.
pub(crate) fn random_bytes(out: &mut [u8]) -> Result<(), PasswdError> {
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .map_err(PasswdError::Random)
}

/// A new argon2id PHC string for `password` (the argon2 crate's default parameters).
pub fn hash_argon2id(password: &[u8]) -> Result<String, PasswdError> {
    let mut salt = [0u8; ARGON2_SALT_BYTES];
    random_bytes(&mut salt)?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| PasswdError::Hash(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password, &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswdError::Hash(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made by mosquitto_passwd 2.0.11: `-b` (default, $7$) and `-H sha512 -b` ($6$).
    const MOSQ_7: &str = "alice:$7$101$RWFyuDNO2qrYK//5$W1jPJGoEYhqtS+bl3ykvl9y5h23yUm3MV9xJ9bkRhGJ0yOgyiLE/krIySj4Ne/RklkFnovGnTGA0VZzEwRaSDQ==";
    const MOSQ_6: &str = "bob:$6$fDxoezs84U/W6XZB$Lv28lGT46V0h2emdnqxWBH97qeliDFfH9kLpXx7dJ6Y7sti+Ttuad9UODJqcOkaGEQXHMRqRC/Up8JbKP7Gokg==";

    #[test]
    fn mosquitto_hashes_verify_as_they_are() {
        let file = PasswordFile::parse(&format!("# users\n{MOSQ_7}\n{MOSQ_6}\n")).unwrap();
        assert_eq!(file.len(), 2);
        assert!(file.verify("alice", b"secret"));
        assert!(!file.verify("alice", b"Secret"));
        assert!(file.verify("bob", b"hunter2"));
        assert!(!file.verify("bob", b"hunter3"));
        assert!(!file.verify("carol", b"secret"));
    }

    #[test]
    fn argon2id_round_trip_keeps_comments_and_other_hashes() {
        let mut file = PasswordFile::parse(&format!("# users\n{MOSQ_6}\n")).unwrap();
        file.set("carol", b"pw").unwrap();
        let text = file.to_text();
        assert!(text.starts_with("# users\nbob:$6$"), "{text}");
        assert!(text.contains("carol:$argon2id$"), "{text}");
        let again = PasswordFile::parse(&text).unwrap();
        assert!(again.verify("carol", b"pw"));
        assert!(!again.verify("carol", b"pW"));
        assert!(again.verify("bob", b"hunter2"));
        let mut again = again;
        assert!(again.remove("bob"));
        assert!(!again.remove("bob"));
        assert_eq!(
            PasswordFile::parse(&again.to_text()).unwrap().len(),
            1,
            "{}",
            again.to_text()
        );
        assert!(matches!(
            file.set("a:b", b"x"),
            Err(PasswdError::BadUsername)
        ));
    }

    #[test]
    fn bad_lines_name_their_line() {
        let e = PasswordFile::parse("# x\nu:$6$short$short\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        assert!(PasswordFile::parse("u:plaintext\n").is_err());
        assert!(PasswordFile::parse("u:$7$0$RWFyuDNO2qrYK//5$W1jP\n").is_err());
        let e = PasswordFile::parse(
            "u:$argon2i$v=19$m=16,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("argon2id"), "{e}");
    }
}
