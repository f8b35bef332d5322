//! Password scrambles: computing client replies and verifying them on the server side.
//!
//! Verification is constant-time in the secret-dependent comparison (via `subtle`).

use sha1::{Digest, Sha1};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub const NATIVE: &[u8] = b"mysql_native_password";
pub const CACHING_SHA2: &[u8] = b"caching_sha2_password";
pub const CLEAR: &[u8] = b"mysql_clear_password";
pub const ED25519: &[u8] = b"client_ed25519";
/// TiDB's login with a session token (the auth data) instead of a password.
pub const TIDB_SESSION_TOKEN: &[u8] = b"tidb_session_token";
/// TiDB's caching_sha2_password with SM3 for SHA-256 (a TiDB server always asks for the clear
/// password after the scramble).
pub const TIDB_SM3: &[u8] = b"tidb_sm3_password";

/// Length of the scramble sluice sends in its greeting.
pub const SCRAMBLE_LEN: usize = 20;

/// Turns random bytes into a scramble clients accept (printable ASCII, no NUL, no '$').
pub fn make_scramble(random: [u8; SCRAMBLE_LEN]) -> [u8; SCRAMBLE_LEN] {
    random.map(|b| {
        let c = 0x21 + (b % 94);
        if c == b'$' { b'#' } else { c }
    })
}

fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut h = Sha1::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    digest32::<Sha256>(parts)
}

fn digest32<D: Digest>(parts: &[&[u8]]) -> [u8; 32]
where
    [u8; 32]: From<sha2::digest::Output<D>>,
{
    let mut h = D::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn xor<const N: usize>(a: &[u8; N], b: &[u8; N]) -> [u8; N] {
    let mut out = [0u8; N];
    for i in 0..N {
        out[i] = a[i] ^ b[i];
    }
    out
}

/// SHA1(password): what a client must know to answer any native-password scramble.
pub fn native_stage1(password: &[u8]) -> [u8; 20] {
    sha1(&[password])
}

/// SHA1(SHA1(password)): what the server stores (`*HEX` in mysql.user).
pub fn native_stage2(password: &[u8]) -> [u8; 20] {
    sha1(&[&native_stage1(password)])
}

/// The client reply for mysql_native_password, from SHA1(password).
/// An empty password gives an empty reply.
pub fn native_reply_from_stage1(scramble: &[u8], stage1: &[u8; 20]) -> [u8; 20] {
    let stage2 = sha1(&[stage1]);
    xor(stage1, &sha1(&[scramble, &stage2]))
}

/// Verifies a mysql_native_password reply against the stored SHA1(SHA1(password)).
/// On success returns SHA1(password), recovered from the reply, which lets sluice log in to
/// backends as the same user without ever storing the password.
pub fn verify_native(scramble: &[u8], reply: &[u8], stage2: &[u8; 20]) -> Option<[u8; 20]> {
    let reply: &[u8; 20] = reply.try_into().ok()?;
    let stage1 = xor(reply, &sha1(&[scramble, stage2]));
    let ok: bool = sha1(&[&stage1]).ct_eq(stage2).into();
    ok.then_some(stage1)
}

/// Parses a native-password hash as stored by MySQL: `*` followed by 40 hex digits.
pub fn parse_native_hash(s: &str) -> Option<[u8; 20]> {
    let hex = s.strip_prefix('*')?;
    if hex.len() != 40 {
        return None;
    }
    let mut out = [0u8; 20];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// SHA256(SHA256(password)): the caching_sha2_password fast-path verifier.
pub fn sha2_stage2(password: &[u8]) -> [u8; 32] {
    sha256(&[&sha256(&[password])])
}

/// The client's caching_sha2_password fast-auth reply.
pub fn sha2_reply(scramble: &[u8], password: &[u8]) -> [u8; 32] {
    if password.is_empty() {
        return [0; 32];
    }
    let stage1 = sha256(&[password]);
    let stage2 = sha256(&[&stage1]);
    xor(&stage1, &sha256(&[&stage2, scramble]))
}

/// The client's tidb_sm3_password scramble: caching_sha2's with SM3 for SHA-256
/// (XOR(SM3(pw), SM3(SM3(SM3(pw)), nonce))); empty for an empty password.
pub fn sm3_reply(scramble: &[u8], password: &[u8]) -> Vec<u8> {
    if password.is_empty() {
        return Vec::new();
    }
    let sm3 = |parts: &[&[u8]]| digest32::<sm3::Sm3>(parts);
    let stage1 = sm3(&[password]);
    let stage2 = sm3(&[&stage1]);
    xor(&stage1, &sm3(&[&stage2, scramble])).to_vec()
}

/// Verifies a caching_sha2_password fast-auth reply against SHA256(SHA256(password)).
pub fn verify_sha2(scramble: &[u8], reply: &[u8], stage2: &[u8; 32]) -> bool {
    let Ok(reply) = <&[u8; 32]>::try_from(reply) else { return false };
    let stage1 = xor(reply, &sha256(&[stage2, scramble]));
    sha256(&[&stage1]).ct_eq(stage2).into()
}

/// Constant-time comparison of a clear-text password (full caching_sha2 auth, clear plugin).
pub fn verify_clear(expected: &[u8], got: &[u8]) -> bool {
    // Compare digests so that the length of the secret does not show in the timing either.
    sha256(&[expected]).ct_eq(&sha256(&[got])).into()
}

/// XORs a password (NUL-terminated) with the scramble, as caching_sha2 does before RSA encryption.
pub fn xor_with_scramble(password_nul: &[u8], scramble: &[u8]) -> Vec<u8> {
    if scramble.is_empty() {
        return password_nul.to_vec();
    }
    password_nul.iter().enumerate().map(|(i, b)| b ^ scramble[i % scramble.len()]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAMBLE: &[u8; 20] = b"abcdefghijklmnopqrst";

    #[test]
    fn native_verify_recovers_stage1() {
        let stage2 = native_stage2(b"secret");
        let reply = native_reply_from_stage1(SCRAMBLE, &native_stage1(b"secret"));
        assert_eq!(verify_native(SCRAMBLE, &reply, &stage2), Some(native_stage1(b"secret")));
        let wrong = native_reply_from_stage1(SCRAMBLE, &native_stage1(b"secreT"));
        assert_eq!(verify_native(SCRAMBLE, &wrong, &stage2), None);
        assert_eq!(verify_native(SCRAMBLE, b"", &stage2), None);
        assert_eq!(verify_native(SCRAMBLE, &[0; 19], &stage2), None);
    }

    #[test]
    fn native_hash_matches_mysql_password_function() {
        // PASSWORD('secret') in MySQL/MariaDB.
        let h = parse_native_hash("*14E65567ABDB5135D0CFD9A70B3032C179A49EE7").unwrap();
        assert_eq!(h, native_stage2(b"secret"));
        assert!(parse_native_hash("14E65567ABDB5135D0CFD9A70B3032C179A49EE7").is_none());
        assert!(parse_native_hash("*ZZ").is_none());
    }

    #[test]
    fn sm3_scramble_is_caching_sha2s_with_sm3() {
        let sm3 = |parts: &[&[u8]]| digest32::<sm3::Sm3>(parts);
        // GB/T 32905-2016's example: SM3("abc").
        let abc: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&"66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0"[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(sm3(&[b"abc"]).to_vec(), abc);
        let stage2 = sm3(&[&sm3(&[b"pw"])]);
        let reply: [u8; 32] = sm3_reply(SCRAMBLE, b"pw").try_into().unwrap();
        assert_eq!(sm3(&[&xor(&reply, &sm3(&[&stage2, SCRAMBLE]))]), stage2);
        assert!(sm3_reply(SCRAMBLE, b"").is_empty());
    }

    #[test]
    fn sha2_fast_path() {
        let stage2 = sha2_stage2(b"pw");
        assert!(verify_sha2(SCRAMBLE, &sha2_reply(SCRAMBLE, b"pw"), &stage2));
        assert!(!verify_sha2(SCRAMBLE, &sha2_reply(SCRAMBLE, b"pW"), &stage2));
        assert!(!verify_sha2(SCRAMBLE, &[1, 2, 3], &stage2));
    }

    #[test]
    fn clear_comparison() {
        assert!(verify_clear(b"secret", b"secret"));
        assert!(!verify_clear(b"secret", b"secreT"));
        assert!(!verify_clear(b"secret", b"secret2"));
        assert!(!verify_clear(b"secret", b""));
        assert!(verify_clear(b"", b""));
    }

    #[test]
    fn scramble_has_no_nul_or_dollar() {
        let s = make_scramble([0, 36 - 33, 255, 94, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert!(s.iter().all(|&b| b != 0 && b != b'$' && b.is_ascii_graphic()));
    }
}
