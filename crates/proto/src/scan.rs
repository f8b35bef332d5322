//! One pass over a statement for what sluice reads of it at every command: the [`hazard`]
//! bits (`sql::hazards_in`) and, when asked, the digest (`digest::digest_in`), from the same
//! tokens, so that a digest costs its normalization and hash and not another lexing.
//!
//! [`hazard`]: crate::sql::hazard

use crate::digest::{Hasher, Normalizer};
use crate::lexer::{Lexer, Mode, Token};
use crate::sql::Hazards;

/// What one pass found in a statement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// `sql::hazards_in`'s bits.
    pub hazards: u16,
    /// `digest::digest_in`'s value; 0 when it was not asked for.
    pub digest: u64,
}

/// Scans `sql` as a session in `mode` sent it; `DIGEST`: take the digest too.
#[inline]
pub fn scan<const DIGEST: bool>(sql: &[u8], mode: Mode) -> Scan {
    scan_tokens::<DIGEST>(sql, mode, Lexer::with_mode(sql, mode))
}

/// [`scan`] of tokens lexed already ([`Tokens`]).
#[inline]
pub fn scan_tokens<const DIGEST: bool>(sql: &[u8], mode: Mode, mut tokens: impl Iterator<Item = Token> + Clone) -> Scan {
    let mut hazards = Hazards::default();
    let mut norm = Normalizer::new(sql, mode);
    let mut hash = Hasher::default();
    while let Some(t) = tokens.next() {
        hazards.token(&t, sql, mode);
        // The normalizer may take further tokens, which the hazards do not see: they are the
        // rest of a literal, or a list of literals, begun by `t` (a literal, a sign, `(` or
        // `,`, or a charset introducer), and none of them is a word the hazards look for or a
        // `;`, so they would leave them as `t` did.
        if DIGEST && let Some(p) = norm.feed(&t, &mut tokens) {
            hash.part(p);
        }
    }
    Scan { hazards: hazards.found, digest: if DIGEST { hash.digest() } else { 0 } }
}

/// The tokens of a statement, lexed once for several readers ([`scan_tokens`],
/// `rw::classify_tokens`). Kept and reused, it allocates only while it grows; a statement of
/// more than [`Tokens::MAX`] tokens is not kept (each reader lexes it).
#[derive(Debug, Default)]
pub struct Tokens {
    list: Vec<Token>,
}

impl Tokens {
    /// The most tokens kept.
    pub const MAX: usize = 4096;

    /// The tokens of `sql` in `mode`; None past [`Tokens::MAX`].
    pub fn lex(&mut self, sql: &[u8], mode: Mode) -> Option<&[Token]> {
        self.list.clear();
        for t in Lexer::with_mode(sql, mode) {
            if self.list.len() == Self::MAX {
                self.list.clear();
                return None;
            }
            self.list.push(t);
        }
        Some(&self.list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pass finds what the separate readers find, in both modes, over texts made of the
    /// pieces statements are made of.
    #[test]
    fn one_pass_finds_what_the_readers_find() {
        let pieces: &[&str] = &[
            "SELECT ",
            "c ",
            "FROM t ",
            "WHERE id = ",
            "-",
            "+ ",
            "1",
            "e",
            "-5 ",
            "'a\\'b' ",
            "\"q\" ",
            "`b` ",
            "@v ",
            "@@s ",
            "_utf8'x' ",
            "x'0f' ",
            "IN ",
            "VALUES ",
            "(",
            ")",
            ", ",
            "?",
            "; ",
            "/* c */ ",
            "-- c\n",
            "SET ",
            "TRANSACTION ",
            "PREPARE s FROM ",
            "EXECUTE IMMEDIATE ",
            "'SET @a = 1' ",
            "LOCK ",
            "TABLES ",
            "READ ",
            "BACKUP ",
            "STAGE ",
            "GET_LOCK(",
            "TEMPORARY ",
            "...",
            "ROW_COUNT() ",
            "SQL_CALC_FOUND_ROWS ",
            "XA ",
            "HANDLER ",
            "/*!50001 ",
            "*/ ",
            "\\",
            "1.5 ",
            "N'n' ",
            "SHOW ",
            "WARNINGS ",
            "FOR UPDATE ",
            "INTO ",
            "START ",
            "READ ONLY ",
            "@@global.x ",
            "GLOBAL ",
            ":= ",
            "NOW() ",
            "LAST_INSERT_ID() ",
            "WITH ",
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut text = String::new();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            for mode in [Mode::DEFAULT, Mode { no_backslash_escapes: true, ansi_quotes: true }] {
                let sql = text.as_bytes();
                let want = Scan { hazards: crate::sql::hazards_in(sql, mode), digest: crate::digest::digest_in(sql, mode) };
                assert_eq!(scan::<true>(sql, mode), want, "{text:?} {mode:?}");
                assert_eq!(scan::<false>(sql, mode).hazards, want.hazards, "{text:?} {mode:?}");
                let mut tokens = Tokens::default();
                let lexed = tokens.lex(sql, mode).unwrap();
                assert_eq!(scan_tokens::<true>(sql, mode, lexed.iter().cloned()), want, "{text:?} {mode:?}");
                assert_eq!(crate::rw::classify_tokens(sql, lexed.iter().cloned()), crate::rw::classify_in(sql, mode), "{text:?}");
            }
        }
    }
}
