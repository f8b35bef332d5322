//! Secrets in statements: whether a statement may carry a password or a key, and its text with
//! every literal taken out. Every place that stores or shows a statement asks this module
//! (captures, `/sessions`, the SQL admin, digests' texts, logs, errors).
//!
//! The decision does not depend on where a word stands: a statement may carry a secret when
//! one of [`WORDS`] appears anywhere in it, in any case: in code, in a comment (executable or
//! not), in a string literal, in a name. String literals are also read as the server spells
//! them: their escapes undone and adjacent literals joined (`'PASS' 'WORD'` is one string to
//! the server), and what they spell is looked at again as a statement (`EXECUTE IMMEDIATE`,
//! `PREPARE ... FROM`, `SET @q = '...'`), to any depth. It errs on the side of redacting: a
//! column named `password` counts. What no reading of one statement can see is text built at
//! run time: `CONCAT()`, hex literals, `CHAR()`, a variable filled piece by piece, a stored
//! routine's parameter.
//!
//! When a statement may carry a secret, [`redact_into`] writes it with every literal (string,
//! number, hex) replaced by `?` and comments dropped, in every way the server may read it
//! (whatever the session's `sql_mode`), double-quoted text counted as a string even under
//! `ANSI_QUOTES`.

use crate::lexer::{self, Kind, Lexer, Mode};

mod corpus;
pub use corpus::corpus;

/// The words that make a statement one that may carry a secret (found in any case, anywhere,
/// also inside longer words: `password` finds `OLD_PASSWORD`, `ED25519_PASSWORD`,
/// `MASTER_PASSWORD`, `SOURCE_PASSWORD`, `SET PASSWORD`, `CREATE SERVER ... OPTIONS (PASSWORD
/// ...)`, `START SLAVE ... PASSWORD=`; `crypt` finds `AES_ENCRYPT`, `AES_DECRYPT`,
/// `DES_ENCRYPT`, `DES_DECRYPT`, `ENCRYPT`):
pub const WORDS: &[&str] = &[
    // Account statements and their hashes (`IDENTIFIED BY`, `IDENTIFIED WITH ... AS`,
    // `IDENTIFIED VIA ... USING`, a `SHA2(...)` beside one).
    "identified",
    "password",
    "grant",
    // Keys: AES_*, DES_*, ENCRYPT, and ENCODE/DECODE's password argument; KDF's.
    "crypt",
    "encode",
    "decode",
    "kdf",
    // Replication's key file (`MASTER_SSL_KEY`), Galera's state transfer account
    // (`wsrep_sst_auth`), a FEDERATED table's connection string (`mysql://user:pw@...`), a
    // plugin's library (`INSTALL SONAME`).
    "ssl_key",
    "sst_auth",
    "mysql://",
    "soname",
];

/// Nesting of literals read as statements, followed this deep (each level is shorter).
const DEPTH: usize = 8;

/// Whether `sql` may carry a password or a key ([`WORDS`], anywhere in it or in what its
/// string literals spell). Cheap when none is there: one pass over the bytes, and a lexing only
/// for text that has a backslash or two quotes that may be adjacent literals.
pub fn may_carry(sql: &[u8]) -> bool {
    may_carry_at(sql, 0)
}

fn may_carry_at(sql: &[u8], depth: usize) -> bool {
    let (word, quoted) = look(sql);
    if word {
        return true;
    }
    if !quoted || depth >= DEPTH || !may_spell_more(sql) {
        return false;
    }
    // (With a backslash the text reads several ways: each may spell other strings.)
    readings(sql).iter().any(|&m| spelled_strings(sql, m).any(|s| may_carry_at(&s, depth + 1)))
}

/// Whether a literal of `sql` may spell text its bytes do not show: an escape, or two string
/// quotes with nothing but spaces or a comment between them (adjacent literals, or a doubled
/// quote inside one).
fn may_spell_more(sql: &[u8]) -> bool {
    if memchr::memchr(b'\\', sql).is_some() {
        return true;
    }
    memchr::memchr2_iter(b'\'', b'"', sql).any(|i| {
        let next = sql[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
        matches!(next, Some(b'\'' | b'"' | b'/' | b'-' | b'#'))
    })
}

/// The strings the literals of `sql` spell: each run of adjacent string literals (comments and
/// spaces between them, a charset introducer before one), unquoted and joined.
fn spelled_strings(sql: &[u8], mode: Mode) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut lex = Lexer::with_mode(sql, mode).peekable();
    std::iter::from_fn(move || {
        loop {
            let t = lex.next()?;
            let string = |t: &lexer::Token| t.kind == Kind::Quoted && matches!(sql[t.at.start], b'\'' | b'"');
            if !string(&t) {
                continue;
            }
            let unquote = |t: &lexer::Token| lexer::unquote_in(t.text(sql), Mode { ansi_quotes: false, ..mode }).unwrap_or_default();
            let mut s = unquote(&t);
            while let Some(n) = lex.next_if(string) {
                s.extend_from_slice(&unquote(&n));
            }
            return Some(s);
        }
    })
}

/// Writes `sql` with every literal replaced by `?` and comments dropped, safe whatever the
/// session's `sql_mode`: where a backslash makes the text read differently with
/// `NO_BACKSLASH_ESCAPES` or `ANSI_QUOTES`, a byte is kept only if it is code in every reading
/// (a byte that is part of a literal in any of them is left out, and so is one that is a
/// comment or a space in any).
pub fn redact_into(sql: &[u8], out: &mut Vec<u8>) {
    // What each byte is: code to keep (0), a gap (1: space, comment), a literal (2).
    let mut class = vec![0u8; sql.len()];
    for &mode in readings(sql) {
        let mut end = 0;
        for t in Lexer::with_mode(sql, mode) {
            class[end..t.at.start].iter_mut().for_each(|c| *c = (*c).max(1));
            let literal = match t.kind {
                Kind::Number => true,
                // (A name that runs to the end of the text may be one left open, holding the
                // rest: it is taken out too.)
                Kind::Quoted | Kind::Variable if t.at.end == sql.len() => true,
                Kind::Quoted => sql[t.at.start] != b'`',
                Kind::Word | Kind::Variable | Kind::Punct => false,
            };
            if literal {
                class[t.at.clone()].iter_mut().for_each(|c| *c = 2);
            }
            end = t.at.end;
        }
        class[end..].iter_mut().for_each(|c| *c = (*c).max(1));
    }
    // Code as it is, each literal as `?`, each gap as one space (none at either end).
    let mut i = 0;
    while i < sql.len() {
        let run = class[i..].iter().position(|&c| c != class[i]).map_or(sql.len(), |p| i + p);
        match class[i] {
            0 => out.extend_from_slice(&sql[i..run]),
            2 => out.push(b'?'),
            _ if i > 0 && run < sql.len() => out.push(b' '),
            _ => {}
        }
        i = run;
    }
}

/// The ways the server may lex `sql`, whatever the session's `sql_mode`: one unless it has a
/// backslash (which escapes, or not, under `NO_BACKSLASH_ESCAPES`, and not in `"` under
/// `ANSI_QUOTES`).
fn readings(sql: &[u8]) -> &'static [Mode] {
    const READINGS: [Mode; 3] =
        [Mode::DEFAULT, Mode { no_backslash_escapes: true, ansi_quotes: false }, Mode { no_backslash_escapes: false, ansi_quotes: true }];
    if memchr::memchr(b'\\', sql).is_some() { &READINGS } else { &READINGS[..1] }
}

/// [`redact_into`] a new vector.
pub fn redacted(sql: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(sql.len());
    redact_into(sql, &mut out);
    out
}

/// Whether `sql` contains one of [`WORDS`] in any case, and whether it has a quote or a
/// backslash (a literal that may spell more). One load of a table per byte, eight bytes at a
/// time: the bytes of a piece that holds an anchor (a word's rarest letter in statements) are
/// looked at closely, for the words it stands in.
#[inline]
fn look(sql: &[u8]) -> (bool, bool) {
    let mut seen = 0;
    let mut at = 0;
    let mut chunks = sql.chunks_exact(8);
    for eight in &mut chunks {
        let any = eight.iter().fold(0, |m, &b| m | ANCHOR[usize::from(b)]);
        seen |= any;
        if any & !QUOTE != 0 && words_in(sql, at..at + 8) {
            return (true, true);
        }
        at += 8;
    }
    let any = chunks.remainder().iter().fold(0, |m, &b| m | ANCHOR[usize::from(b)]);
    seen |= any;
    if any & !QUOTE != 0 && words_in(sql, at..sql.len()) {
        return (true, true);
    }
    (false, seen & QUOTE != 0)
}

/// Whether `sql` contains one of [`WORDS`] in any case.
#[cfg(test)]
fn names_a_word(sql: &[u8]) -> bool {
    look(sql).0
}

/// Whether one of [`WORDS`] stands around an anchor in `range` of `sql`.
#[inline(never)]
fn words_in(sql: &[u8], range: std::ops::Range<usize>) -> bool {
    for i in range {
        let mut words = ANCHOR[usize::from(sql[i])] & !QUOTE;
        while words != 0 {
            let k = words.trailing_zeros() as usize;
            words &= words - 1;
            let (w, off) = (WORDS[k].as_bytes(), usize::from(OFFSET[k]));
            // (The anchor's neighbour first: most anchors stand in no word.)
            let peer = if off + 1 < w.len() { i + 1 } else { i.wrapping_sub(1) };
            let want = if off + 1 < w.len() { w[off + 1] } else { w[off - 1] };
            if sql.get(peer).is_some_and(|&c| c | 0x20 == want | 0x20)
                && i >= off
                && sql.get(i - off..i - off + w.len()).is_some_and(|x| x.eq_ignore_ascii_case(w))
            {
                return true;
            }
        }
    }
    false
}

/// Where a word's anchor is: the first of its letters in this list, which are rare in the
/// statements applications send most (`SELECT c FROM t WHERE id = 5` has a `d` only), so the
/// quick look stops at few bytes.
const fn anchor_of(w: &[u8]) -> usize {
    const RARE: &[u8] = b":kupnd";
    let mut r = 0;
    while r < RARE.len() {
        let mut i = 0;
        while i < w.len() {
            if w[i] == RARE[r] {
                return i;
            }
            i += 1;
        }
        r += 1;
    }
    panic!("a word without an anchor")
}

/// [`ANCHOR`]'s bit for a quote or a backslash.
const QUOTE: u16 = 1 << 15;

/// The place of each word's anchor ([`anchor_of`]).
static OFFSET: [u8; WORDS.len()] = {
    let mut t = [0u8; WORDS.len()];
    let mut k = 0;
    while k < WORDS.len() {
        t[k] = anchor_of(WORDS[k].as_bytes()) as u8;
        k += 1;
    }
    t
};

/// For each byte, the words (bits by index in [`WORDS`]) whose anchor it is, in either case,
/// and [`QUOTE`] for `'`, `"` and `\`.
static ANCHOR: [u16; 256] = {
    assert!(WORDS.len() < 15);
    let mut t = [0u16; 256];
    let mut k = 0;
    while k < WORDS.len() {
        let w = WORDS[k].as_bytes();
        let c = w[anchor_of(w)];
        t[c as usize] |= 1 << k;
        t[c.to_ascii_uppercase() as usize] |= 1 << k;
        k += 1;
    }
    t[b'\'' as usize] |= QUOTE;
    t[b'"' as usize] |= QUOTE;
    t[b'\\' as usize] |= QUOTE;
    t
};

#[cfg(test)]
mod tests;
