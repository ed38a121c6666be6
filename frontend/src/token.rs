//! Auth tokens: what Authenticate hands out and every request of an auth-enabled tenant
//! carries (docs/design/auth.md, A3).
//!
//! etcd's default "simple" token is a random string its members remember; Strata's frontends
//! are stateless and come and go, so a token must verify on every frontend and survive a
//! restart. Tokens are therefore signed, as etcd's `--auth-token=jwt` tokens are: a JWT (HS256)
//! whose claims name the tenant, the user, the auth revision it was minted at and its expiry,
//! signed with the deployment's key (`--auth-token-key-file`, the same on every frontend).
//! Expiry is in journal time (the tenant's replica's clock, which the journal leader stamps:
//! DESIGN invariant 4), so every frontend agrees on it whatever its own clock says.
//!
//! A token names a user, not a set of permissions: each request is checked against the auth
//! state as it is when the request is served (etcd's default "simple" tokens behave so), so a
//! grant or a revoke takes effect at once and never makes a client authenticate again. What
//! ends a token early is what ends etcd's: its user's password changing or the user going. The
//! claims carry a fingerprint of the password hash the token was minted against
//! ([`credential_of`]); a token whose fingerprint no longer matches is invalid.
//! Clients treat tokens as opaque; a JWT stays readable with ordinary tools.

use std::path::Path;
use std::time::Duration;

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde::{Deserialize, Serialize};

/// etcd's default token lifetime (`--auth-token-ttl`, 300 s).
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(300);
/// The shortest key accepted: HMAC-SHA256 wants at least its output's 32 bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The JOSE header of every token (HS256).
const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// What a token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub tenant: String,
    pub username: String,
    pub revision: u64,
    /// Expiry: journal time, milliseconds since the Unix epoch.
    pub exp_ms: i64,
    /// [`credential_of`] the user's password hash when the token was minted.
    pub credential: String,
}

/// A fingerprint of a stored password hash (the first 8 bytes of its SHA-256, in hex): equal
/// while the password is unchanged, and telling nothing about it (the hash is salted bcrypt).
pub fn credential_of(hash: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, hash);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading the auth token key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the auth token key {path} holds {len} bytes; at least {MIN_KEY_BYTES} are needed")]
    TooShort { path: String, len: usize },
    #[error("no auth token key file given")]
    NoKey,
}

/// Signs tokens with the deployment's newest key and verifies them with any of its keys.
pub struct Tokens {
    signing: hmac::Key,
    /// Keys that verify besides the signing one (a rotation adds a key before it signs).
    others: Vec<hmac::Key>,
    ttl: Duration,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("ttl", &self.ttl).finish()
    }
}

impl Tokens {
    /// Tokens signed with `secret` (at least [`MIN_KEY_BYTES`]), valid for `ttl`.
    pub fn new(secret: &[u8], ttl: Duration) -> Self {
        Self::with_keys(secret, &[], ttl)
    }

    /// Tokens signed with `signing` and verified with it or any of `others`.
    pub fn with_keys(signing: &[u8], others: &[&[u8]], ttl: Duration) -> Self {
        let key = |s: &[u8]| hmac::Key::new(hmac::HMAC_SHA256, s);
        Self {
            signing: key(signing),
            others: others.iter().map(|s| key(s)).collect(),
            ttl,
        }
    }

    /// Tokens with the keys in files `paths` (their bytes as they are), the first signing.
    pub fn from_files(paths: &[impl AsRef<Path>], ttl: Duration) -> Result<Self, KeyError> {
        let mut secrets = Vec::with_capacity(paths.len());
        for path in paths {
            let path = path.as_ref();
            let shown = path.display().to_string();
            let secret = std::fs::read(path).map_err(|source| KeyError::Read {
                path: shown.clone(),
                source,
            })?;
            if secret.len() < MIN_KEY_BYTES {
                return Err(KeyError::TooShort {
                    path: shown,
                    len: secret.len(),
                });
            }
            secrets.push(secret);
        }
        let refs: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
        let (signing, others) = refs.split_first().ok_or(KeyError::NoKey)?;
        Ok(Self::with_keys(signing, others, ttl))
    }

    /// A token for `username` of `tenant` whose password hash has fingerprint `credential`,
    /// minted at auth revision `revision` when the journal's time is `now_ms`.
    pub fn sign(
        &self,
        tenant: &str,
        username: &str,
        credential: &str,
        revision: u64,
        now_ms: i64,
    ) -> String {
        let ttl_ms = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
        let claims = Claims {
            tenant: tenant.to_string(),
            username: username.to_string(),
            revision,
            exp_ms: now_ms.saturating_add(ttl_ms),
            credential: credential.to_string(),
        };
        // Serializing plain strings and integers cannot fail.
        let body = serde_json::to_vec(&claims).unwrap_or_default();
        let signed = format!("{}.{}", B64.encode(HEADER), B64.encode(body));
        let tag = hmac::sign(&self.signing, signed.as_bytes());
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    }

    /// The claims of `token` if this deployment signed it for `tenant` and it has not expired
    /// at journal time `now_ms`.
    pub fn verify(&self, token: &str, tenant: &str, now_ms: i64) -> Option<Claims> {
        let (signed, tag) = token.rsplit_once('.')?;
        let tag = B64.decode(tag).ok()?;
        std::iter::once(&self.signing)
            .chain(&self.others)
            .find(|k| hmac::verify(k, signed.as_bytes(), &tag).is_ok())?;
        let (header, body) = signed.split_once('.')?;
        if B64.decode(header).ok()? != HEADER.as_bytes() {
            return None;
        }
        let claims: Claims = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        (claims.tenant == tenant && claims.exp_ms > now_ms).then_some(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_token_verifies_for_its_tenant_until_it_expires() {
        let tokens = Tokens::new(KEY, DEFAULT_TOKEN_TTL);
        let t = tokens.sign("tenant-a", "alice", "c", 7, NOW);
        let claims = tokens.verify(&t, "tenant-a", NOW).expect("valid");
        assert_eq!((claims.username.as_str(), claims.revision), ("alice", 7));
        assert_eq!(claims.exp_ms, NOW + 300_000);
        // Another frontend with the same key accepts it, until it expires.
        let again = Tokens::new(KEY, DEFAULT_TOKEN_TTL);
        assert!(again.verify(&t, "tenant-a", NOW + 299_999).is_some());
        assert!(
            again.verify(&t, "tenant-a", NOW + 300_000).is_none(),
            "expired"
        );
        assert!(
            tokens.verify(&t, "tenant-b", NOW).is_none(),
            "another tenant"
        );
        let other = Tokens::new(b"another key, another deployment!", DEFAULT_TOKEN_TTL);
        assert!(other.verify(&t, "tenant-a", NOW).is_none(), "another key");
    }

    #[test]
    fn a_changed_token_is_refused() {
        let tokens = Tokens::new(KEY, DEFAULT_TOKEN_TTL);
        let t = tokens.sign("t", "alice", "c", 7, NOW);
        let (header, rest) = t.split_once('.').unwrap();
        let (_, tag) = rest.split_once('.').unwrap();
        let root = Claims {
            tenant: "t".into(),
            username: "root".into(),
            revision: 7,
            exp_ms: NOW + 300_000,
            credential: "c".into(),
        };
        let forged = format!(
            "{header}.{}.{tag}",
            B64.encode(serde_json::to_vec(&root).unwrap())
        );
        assert!(tokens.verify(&forged, "t", NOW).is_none());
        for bad in ["", "a.b", "a.b.c", &t[..t.len() - 2]] {
            assert!(tokens.verify(bad, "t", NOW).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_short_or_missing_key_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("strata-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        std::fs::write(&short, b"too short").unwrap();
        let good = dir.join("good");
        std::fs::write(&good, KEY).unwrap();
        assert!(matches!(
            Tokens::from_files(&[&good, &short], DEFAULT_TOKEN_TTL),
            Err(KeyError::TooShort { len: 9, .. })
        ));
        assert!(matches!(
            Tokens::from_files(&[dir.join("missing")], DEFAULT_TOKEN_TTL),
            Err(KeyError::Read { .. })
        ));
        assert!(Tokens::from_files(&[&good], DEFAULT_TOKEN_TTL).is_ok());
        let none: [&Path; 0] = [];
        assert!(matches!(
            Tokens::from_files(&none, DEFAULT_TOKEN_TTL),
            Err(KeyError::NoKey)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A key rotates without logging anyone out: the new key is added beside the old (old
    /// tokens still verify, new ones are signed with the new key once it is first), then the
    /// old is dropped (its tokens stop verifying).
    #[test]
    fn keys_rotate() {
        let (old, new) = (KEY, &b"a new key for the same deployment"[..]);
        let before = Tokens::new(old, DEFAULT_TOKEN_TTL).sign("t", "alice", "c", 1, NOW);
        let during = Tokens::with_keys(new, &[old], DEFAULT_TOKEN_TTL);
        assert!(
            during.verify(&before, "t", NOW).is_some(),
            "old tokens still verify"
        );
        let fresh = during.sign("t", "alice", "c", 1, NOW);
        let after = Tokens::new(new, DEFAULT_TOKEN_TTL);
        assert!(
            after.verify(&fresh, "t", NOW).is_some(),
            "signed with the new key"
        );
        assert!(
            after.verify(&before, "t", NOW).is_none(),
            "the old key is gone"
        );
    }

    #[test]
    fn a_credential_fingerprint_follows_the_hash() {
        let a = credential_of(b"$2a$10$first hash");
        assert_eq!(a.len(), 16);
        assert_eq!(a, credential_of(b"$2a$10$first hash"));
        assert_ne!(a, credential_of(b"$2a$10$other hash"));
    }
}
