//! One pass over a statement for what sluice reads of it at every command: the [`hazard`]
//! bits (`sql::hazards_in`) and, when asked, the digest (`digest::digest_in`) or the statement's
//! [`Key`] (which a table turns into its digest and the split's class), from the same tokens,
//! so that a digest or a key costs its own look at the tokens and not another lexing.
//!
//! [`hazard`]: crate::sql::hazard

use crate::digest::{Hasher, Key, Normalizer};
use crate::lexer::{Kind, Lexer, Mode};
use crate::sql::Hazards;

/// What one pass found in a statement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// `sql::hazards_in`'s bits.
    pub hazards: u16,
    /// `digest::digest_in`'s value; 0 when it was not asked for.
    pub digest: u64,
    /// The statement's [`Key`]; 0 when it was not asked for.
    pub key: u64,
    /// Whether the text holds a comment (or an executable comment's end).
    pub commented: bool,
}

/// Scans `sql` as a session in `mode` sent it; `DIGEST`: take the digest too.
#[inline]
pub fn scan<const DIGEST: bool>(sql: &[u8], mode: Mode) -> Scan {
    pass::<DIGEST, false>(sql, mode, [0; 2])
}

/// Scans `sql` for its hazards and its [`Key`] (with `seed`): what a table of keys turns into
/// a digest or a class without the normalizer's or the classifier's work.
#[inline]
pub fn scan_keyed(sql: &[u8], mode: Mode, seed: [u64; 2]) -> Scan {
    pass::<false, true>(sql, mode, seed)
}

#[inline(always)]
fn pass<const DIGEST: bool, const KEY: bool>(sql: &[u8], mode: Mode, seed: [u64; 2]) -> Scan {
    let mut lex = Lexer::with_mode(sql, mode);
    let mut hazards = Hazards::default();
    let mut norm = Normalizer::new(sql, mode);
    let mut hash = Hasher::default();
    let mut key = Key::new(seed, mode);
    // (The key's run: from `run` to the end of the last token; comments skipped before it.)
    let (mut run, mut last_end, mut comments) = (0, 0, 0);
    while let Some(t) = lex.next() {
        hazards.token(&t, sql, mode);
        if KEY {
            if lex.comments() != comments {
                key.run(sql, run, last_end);
                key.gap(lex.in_executable());
                (run, comments) = (t.at.start, lex.comments());
            }
            let literal = match t.kind {
                Kind::Number => true,
                Kind::Quoted => mode.is_string_quote(sql[t.at.start]),
                _ => false,
            };
            if literal {
                key.run(sql, run, t.at.start);
                key.literal(sql, &t);
                run = t.at.end;
            }
            last_end = t.at.end;
        }
        // The normalizer may take further tokens: the rest of a literal, or a list of
        // literals, begun by `t`. None of them is a word the hazards look for, a variable or a
        // `;`, so the hazards need not see them.
        if DIGEST && let Some(p) = norm.feed(&t, &mut lex) {
            hash.part(p);
        }
    }
    if KEY {
        key.run(sql, run, last_end.max(run));
    }
    Scan {
        hazards: hazards.found,
        digest: if DIGEST { hash.digest() } else { 0 },
        key: if KEY { key.finish() } else { 0 },
        commented: lex.comments() != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces the texts of these tests are made of.
    const PIECES: &[&str] = &[
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

    /// The next of a xorshift sequence.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// The pass finds what the separate readers find, in both modes, over texts made of the
    /// pieces statements are made of.
    #[test]
    fn one_pass_finds_what_the_readers_find() {
        let pieces = PIECES;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(next(&mut x) % 24) {
                text.push_str(pieces[(next(&mut x) % pieces.len() as u64) as usize]);
            }
            for mode in [Mode::DEFAULT, Mode { no_backslash_escapes: true, ansi_quotes: true }] {
                let sql = text.as_bytes();
                let want = Scan {
                    hazards: crate::sql::hazards_in(sql, mode),
                    digest: crate::digest::digest_in(sql, mode),
                    key: 0,
                    commented: {
                        let mut lex = Lexer::with_mode(sql, mode);
                        lex.by_ref().for_each(drop);
                        lex.comments() != 0
                    },
                };
                assert_eq!(scan::<true>(sql, mode), want, "{text:?} {mode:?}");
                assert_eq!(scan::<false>(sql, mode).hazards, want.hazards, "{text:?} {mode:?}");
            }
        }
    }

    /// Texts of one key have one digest and one class, over texts made of pieces with holes
    /// filled with random values, comments and spacing; and texts that differ in values and
    /// comments alone share a key (else a table of keys would spare nothing).
    #[test]
    fn one_key_means_one_digest_and_one_class() {
        // The pieces, and holes for a number, a string or a comment.
        let holes = ["{n}", "{s}", "{c}", "{n}", "{s}", "{c}", "{n}", "{s}", "{c}", "_utf8", "x", "N", "1e"];
        let pieces: Vec<&str> = PIECES.iter().copied().chain(holes).collect();
        let numbers = ["1", "23", "4.5", "1e", "12", ".5", "0x1f", "7e5", "1E"];
        let strings = ["'a'", "'b\\'c'", "''", "\"dq\"", "'x''y'", "\"\""];
        let comments = ["/* x */", "/* yy */ ", "-- z\n", "#q\n", " ", "", "/*!50001 ", "/*+ hint */"];
        let seed = [0x9e37_79b9_7f4a_7c15, 0xbf58_476d_1ce4_e5b9];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut seen: std::collections::HashMap<(u64, bool), (u64, crate::rw::Class, String)> = Default::default();
        let mut shared = 0;
        for _ in 0..20_000 {
            let template: Vec<&str> = (0..next(&mut x) % 16).map(|_| pieces[(next(&mut x) % pieces.len() as u64) as usize]).collect();
            // Two fillings of one template.
            for _ in 0..2 {
                let mut text = String::new();
                for p in &template {
                    let fill: &[&str] = match *p {
                        "{n}" => &numbers,
                        "{s}" => &strings,
                        "{c}" => &comments,
                        _ => {
                            text.push_str(p);
                            continue;
                        }
                    };
                    text.push_str(fill[(next(&mut x) % fill.len() as u64) as usize]);
                }
                for mode in [Mode::DEFAULT, Mode { no_backslash_escapes: true, ansi_quotes: true }] {
                    let sql = text.as_bytes();
                    let s = scan_keyed(sql, mode, seed);
                    assert_eq!(s.hazards, crate::sql::hazards_in(sql, mode), "{text:?}");
                    let (digest, class) = (crate::digest::digest_in(sql, mode), crate::rw::classify_in(sql, mode));
                    match seen.get(&(s.key, mode.ansi_quotes)) {
                        Some((d, c, other)) => {
                            assert_eq!(*d, digest, "{text:?} and {other:?} share a key in {mode:?}");
                            assert_eq!(*c, class, "{text:?} and {other:?} share a key in {mode:?}");
                            shared += usize::from(other != &text);
                        }
                        None => drop(seen.insert((s.key, mode.ansi_quotes), (digest, class, text.clone()))),
                    }
                }
            }
        }
        assert!(shared > 5_000, "{shared}");
        let key = |t: &str| scan_keyed(t.as_bytes(), Mode::DEFAULT, seed).key;
        assert_eq!(key("SELECT c FROM t WHERE id=1"), key("SELECT c FROM t WHERE id=23456"));
        assert_eq!(key("/* a */SELECT 'x' -- trace 1\n"), key("/* bb */SELECT 'yy' -- trace 22\n"));
        assert_ne!(key("SELECT c FROM t WHERE id=1"), key("SELECT d FROM t WHERE id=1"));
        assert_ne!(key("SELECT 1e-5"), key("SELECT 12-5"));
        assert_ne!(key("SELECT _utf8'a'"), key("SELECT _utf8 'a'"));
        // (Another seed, other keys.)
        assert_ne!(key("SELECT 1"), scan_keyed(b"SELECT 1", Mode::DEFAULT, [1, 2]).key);
    }
}
