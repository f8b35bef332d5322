//! Users mode: sluice checks client passwords against `[[users]]` (with an RSA key for
//! caching_sha2 full authentication without TLS) and keeps what it needs to log in to backends
//! as the same user. Secrets are never logged (`Debug` is redacted).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeySize, OAEP_SHA1_MGF1SHA1, OaepPrivateDecryptingKey, PrivateDecryptingKey};
use parking_lot::Mutex;
use sluice_proto::auth;

use crate::backend::conn::Credential;
use crate::config::UserConfig;

pub struct User {
    pub name: String,
    /// The clear password, when configured so.
    password: Option<Vec<u8>>,
    /// SHA1(SHA1(password)).
    native_stage2: [u8; 20],
    /// SHA1(password) recovered from a client's reply when only the hash is configured.
    recovered_stage1: Mutex<Option<[u8; 20]>>,
    pub max_connections: usize,
    pub require_tls: bool,
    pub connections: Arc<AtomicUsize>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User").field("name", &self.name).field("secrets", &"<redacted>").finish()
    }
}

/// The outcome of checking a client's first auth reply.
pub enum Check {
    /// Accepted.
    Ok,
    /// Rejected.
    Denied,
    /// The client used another plugin: ask it to switch to mysql_native_password.
    SwitchToNative,
    /// caching_sha2_password for a user stored as a native hash: the clear password is needed
    /// (full authentication over TLS, or RSA-encrypted).
    FullAuth,
}

impl User {
    /// `per_user`: the limit of a user with none of its own (`proxy.max_connections_per_user`).
    fn from_config(c: &UserConfig, per_user: usize) -> User {
        let (password, native_stage2) = match (&c.password, &c.password_hash) {
            (Some(p), _) => (Some(p.as_bytes().to_vec()), auth::native_stage2(p.as_bytes())),
            (None, Some(h)) => (None, auth::parse_native_hash(h.get_ref()).unwrap_or([0; 20])),
            (None, None) => (Some(Vec::new()), auth::native_stage2(b"")),
        };
        User {
            name: c.name.clone(),
            password,
            native_stage2,
            recovered_stage1: Mutex::new(None),
            max_connections: if c.max_connections > 0 { c.max_connections } else { per_user },
            require_tls: c.require_tls,
            connections: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn same_settings(&self, o: &User) -> bool {
        self.password == o.password
            && self.native_stage2 == o.native_stage2
            && self.max_connections == o.max_connections
            && self.require_tls == o.require_tls
    }

    fn has_empty_password(&self) -> bool {
        self.password.as_deref() == Some(b"")
    }

    /// Checks the reply a client computed with `plugin` over `scramble`.
    pub fn check(&self, plugin: &[u8], scramble: &[u8], reply: &[u8]) -> Check {
        if plugin == auth::NATIVE {
            if reply.is_empty() {
                // Clients send nothing when the greeting named another plugin; ask again with
                // this one (a second empty reply is then a refusal).
                return if self.has_empty_password() { Check::Ok } else { Check::SwitchToNative };
            }
            if self.has_empty_password() {
                return Check::Denied;
            }
            return match auth::verify_native(scramble, reply, &self.native_stage2) {
                Some(stage1) => {
                    if self.password.is_none() {
                        *self.recovered_stage1.lock() = Some(stage1);
                    }
                    Check::Ok
                }
                None => Check::Denied,
            };
        }
        if plugin == auth::CACHING_SHA2 {
            if let Some(pw) = &self.password {
                if reply.is_empty() || reply == [0] {
                    // Some clients send nothing when the greeting named another plugin.
                    return if pw.is_empty() { Check::Ok } else { Check::SwitchToNative };
                }
                if pw.is_empty() {
                    return Check::Denied;
                }
                return if auth::verify_sha2(scramble, reply, &auth::sha2_stage2(pw)) { Check::Ok } else { Check::Denied };
            }
            if !reply.is_empty() && reply != [0] {
                return Check::FullAuth;
            }
        }
        Check::SwitchToNative
    }

    /// Checks a clear-text password (caching_sha2 full authentication).
    pub fn check_clear(&self, password: &[u8]) -> bool {
        match &self.password {
            Some(pw) => auth::verify_clear(pw, password),
            None => {
                let ok: bool = subtle::ConstantTimeEq::ct_eq(&auth::native_stage2(password)[..], &self.native_stage2[..]).into();
                if ok {
                    *self.recovered_stage1.lock() = Some(auth::native_stage1(password));
                }
                ok
            }
        }
    }

    /// What sluice logs in to backends with.
    pub fn credential(&self) -> Option<Credential> {
        match &self.password {
            Some(pw) => Some(Credential::Password(pw.clone())),
            None => (*self.recovered_stage1.lock()).map(Credential::NativeStage1),
        }
    }

    /// Counts a connection of the user that is open already (a session handed over by another
    /// process), even past the limit.
    pub fn count(&self) -> UserSlot {
        self.connections.fetch_add(1, Ordering::Relaxed);
        UserSlot(self.connections.clone())
    }

    /// Counts a connection against the user's limit; None when the limit is reached.
    pub fn acquire(&self) -> Option<UserSlot> {
        let n = self.connections.fetch_add(1, Ordering::Relaxed);
        let slot = UserSlot(self.connections.clone());
        (self.max_connections == 0 || n < self.max_connections).then_some(slot)
    }
}

/// A client connection counted against its user's limit: the count is given back when the
/// slot is dropped, however the login or session that holds it ends (an error, a timeout
/// that drops the login's future, a COM_CHANGE_USER to another user).
#[derive(Debug)]
pub struct UserSlot(Arc<AtomicUsize>);

impl Drop for UserSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The users sluice checks passwords of (users mode), swapped whole by a reload: a login looks
/// one up once, and a session keeps what it logged in with.
#[derive(Default)]
pub struct Users {
    map: arc_swap::ArcSwap<HashMap<String, Arc<User>>>,
}

impl Users {
    pub fn from_config(users: &[UserConfig], per_user: usize) -> Users {
        let map = users.iter().map(|u| (u.name.clone(), Arc::new(User::from_config(u, per_user)))).collect();
        Users { map: arc_swap::ArcSwap::from_pointee(map) }
    }

    pub fn get(&self, name: &str) -> Option<Arc<User>> {
        self.map.load().get(name).cloned()
    }

    pub fn is_empty(&self) -> bool {
        self.map.load().is_empty()
    }

    /// Puts a new list in force. A user whose settings did not change stays as it was; one that
    /// changed keeps counting the connections it has against its limit; the sessions of a user
    /// removed keep going. Returns the names added, changed and removed.
    pub fn replace(&self, users: &[UserConfig], per_user: usize) -> [Vec<String>; 3] {
        let old = self.map.load_full();
        let (mut added, mut changed) = (Vec::new(), Vec::new());
        let mut map = HashMap::with_capacity(users.len());
        for c in users {
            let mut u = User::from_config(c, per_user);
            let kept = match old.get(&c.name) {
                Some(o) if o.same_settings(&u) => o.clone(),
                Some(o) => {
                    u.connections = o.connections.clone();
                    changed.push(c.name.clone());
                    Arc::new(u)
                }
                None => {
                    added.push(c.name.clone());
                    Arc::new(u)
                }
            };
            map.insert(c.name.clone(), kept);
        }
        let removed = old.keys().filter(|k| !map.contains_key(*k)).cloned().collect();
        self.map.store(Arc::new(map));
        [added, changed, removed]
    }
}

/// A user that does not exist: checked like a real one so that timing does not tell.
pub fn phantom_check(scramble: &[u8], reply: &[u8]) {
    let _ = auth::verify_native(scramble, reply, &[0x5a; 20]);
}

/// The RSA key pair for caching_sha2_password full authentication without TLS.
pub struct RsaKey {
    key: OaepPrivateDecryptingKey,
    /// The public key as PEM, as clients expect it.
    pub(crate) pem: Vec<u8>,
}

/// The RSA key for caching_sha2_password's full authentication could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RsaError(&'static str);

impl RsaKey {
    /// Err: the crypto library failed (sluice's fault, or its host's).
    pub fn generate() -> Result<RsaKey, RsaError> {
        let private = PrivateDecryptingKey::generate(KeySize::Rsa2048).map_err(|_| RsaError("RSA key generation failed"))?;
        let der = private.public_key().as_der().map_err(|_| RsaError("RSA public key encoding failed"))?;
        let pem = pem("PUBLIC KEY", der.as_ref());
        let key = OaepPrivateDecryptingKey::new(private).map_err(|_| RsaError("RSA key rejected"))?;
        Ok(RsaKey { key, pem })
    }

    pub(crate) fn decrypt(&self, ciphertext: &[u8]) -> Option<Vec<u8>> {
        let mut out = vec![0u8; self.key.min_output_size()];
        let n = self.key.decrypt(&OAEP_SHA1_MGF1SHA1, ciphertext, &mut out, None).ok()?.len();
        out.truncate(n);
        Some(out)
    }
}

fn pem(label: &str, der: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(pw: Option<&str>, hash: Option<&str>) -> User {
        let text = match (pw, hash) {
            (Some(p), _) => format!("[[users]]\nname='u'\npassword='{p}'\n"),
            (None, Some(h)) => format!("[[users]]\nname='u'\npassword_hash='{h}'\n"),
            _ => "[[users]]\nname='u'\n".into(),
        };
        let cfg = crate::config::Config::parse(&text).unwrap();
        User::from_config(&cfg.users[0], 0)
    }

    #[test]
    fn native_and_sha2_and_hash_only() {
        let s = b"01234567890123456789";
        let u = user(Some("pw"), None);
        let good = auth::native_reply_from_stage1(s, &auth::native_stage1(b"pw"));
        assert!(matches!(u.check(auth::NATIVE, s, &good), Check::Ok));
        assert!(matches!(u.check(auth::NATIVE, s, &[1; 20]), Check::Denied));
        assert!(matches!(u.check(auth::NATIVE, s, b""), Check::SwitchToNative));
        assert!(matches!(u.check(auth::CACHING_SHA2, s, &auth::sha2_reply(s, b"pw")), Check::Ok));
        assert!(matches!(u.check(auth::CACHING_SHA2, s, &auth::sha2_reply(s, b"px")), Check::Denied));
        assert!(matches!(u.check(auth::ED25519, s, b"x"), Check::SwitchToNative));

        let h = user(None, Some("*14E65567ABDB5135D0CFD9A70B3032C179A49EE7"));
        assert!(h.credential().is_none());
        let good = auth::native_reply_from_stage1(s, &auth::native_stage1(b"secret"));
        assert!(matches!(h.check(auth::NATIVE, s, &good), Check::Ok));
        assert!(matches!(h.credential(), Some(Credential::NativeStage1(s1)) if s1 == auth::native_stage1(b"secret")));
        assert!(matches!(h.check(auth::CACHING_SHA2, s, &[0; 32]), Check::FullAuth));
        assert!(matches!(h.check(auth::CACHING_SHA2, s, b""), Check::SwitchToNative));
        assert!(h.check_clear(b"secret") && !h.check_clear(b"Secret"));

        let e = user(None, None);
        assert!(matches!(e.check(auth::NATIVE, s, b""), Check::Ok));
        assert!(matches!(e.check(auth::NATIVE, s, &good), Check::Denied));
        assert!(format!("{e:?}").contains("redacted"));
    }
}
