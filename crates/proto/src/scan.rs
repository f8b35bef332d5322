//! One pass over a statement for what sluice reads of it at every command: the [`hazard`]
//! bits (`sql::hazards_in`) and, when asked, the digest (`digest::digest_in`) and the split's
//! class (`rw::classify_in`), from the same tokens, so that a digest or a class costs its own
//! look at the tokens and not another lexing.
//!
//! [`hazard`]: crate::sql::hazard

use crate::digest::{Hasher, Normalizer};
use crate::lexer::{Kind, Lexer, Mode, Token};
use crate::rw::{Class, Classifier};
use crate::sql::Hazards;

/// What one pass found in a statement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// `sql::hazards_in`'s bits.
    pub hazards: u16,
    /// `digest::digest_in`'s value; 0 when it was not asked for.
    pub digest: u64,
    /// `rw::classify_in`'s class, when it was asked for and the pass could tell it (see
    /// [`Classifier`]).
    pub class: Option<Class>,
}

/// Scans `sql` as a session in `mode` sent it; `DIGEST`: take the digest too, `CLASS`: the
/// split's class.
#[inline]
pub fn scan<const DIGEST: bool, const CLASS: bool>(sql: &[u8], mode: Mode) -> Scan {
    let mut lex = Lexer::with_mode(sql, mode);
    let mut hazards = Hazards::default();
    let mut norm = Normalizer::new(sql, mode);
    let mut hash = Hasher::default();
    let mut class = Classifier::default();
    while let Some(t) = lex.next() {
        hazards.token(&t, sql, mode);
        if CLASS {
            class.token(&t, sql);
        }
        if !DIGEST {
            continue;
        }
        // The normalizer may take further tokens: the rest of a literal, or a list of
        // literals, begun by `t` (a number, a sign, `(` or `,`, or a charset introducer). None
        // of them is a word the hazards look for, a variable or a `;`, so the hazards need not
        // see them; the classifier, which looks at the token after a word, is given them.
        let before = (CLASS && may_begin_literal(&t, sql)).then(|| lex.clone());
        if let Some(p) = norm.feed(&t, &mut lex) {
            hash.part(p);
        }
        if let Some(mut taken) = before {
            while taken.position() < lex.position()
                && let Some(t) = taken.next()
            {
                class.token(&t, sql);
            }
        }
    }
    Scan { hazards: hazards.found, digest: if DIGEST { hash.digest() } else { 0 }, class: if CLASS { class.finish(sql) } else { None } }
}

/// Whether the normalizer may take further tokens after `t`.
#[inline]
fn may_begin_literal(t: &Token, sql: &[u8]) -> bool {
    let text = t.text(sql);
    match t.kind {
        Kind::Number => true,
        Kind::Punct => matches!(text[0], b'-' | b'+' | b'(' | b','),
        Kind::Word => text[0] == b'_' || text.len() == 1,
        Kind::Quoted | Kind::Variable => false,
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
        let mut gave_up = 0;
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
                let want = Scan { hazards: crate::sql::hazards_in(sql, mode), digest: crate::digest::digest_in(sql, mode), class: None };
                assert_eq!(scan::<true, false>(sql, mode), want, "{text:?} {mode:?}");
                assert_eq!(scan::<false, false>(sql, mode).hazards, want.hazards, "{text:?} {mode:?}");
                let classified = scan::<true, true>(sql, mode);
                assert_eq!(Scan { class: None, ..classified }, want, "{text:?} {mode:?}");
                let class = crate::rw::classify_in(sql, mode);
                match classified.class {
                    Some(c) => assert_eq!(c, class, "{text:?} {mode:?}"),
                    None => gave_up += 1,
                }
            }
        }
        // (It tells most of them itself.)
        assert!(gave_up < 10_000, "{gave_up}");
    }
}
