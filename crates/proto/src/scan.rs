//! One pass over a statement for what sluice reads of it at every command: its [`Key`], which
//! a table of shapes seen turns into the [`hazard`] bits (`sql::shape_hazards`), the digest
//! (`digest::digest_in`) and the split's class (`rw::classify_in`), so that a statement of a
//! shape seen before costs the lexer and the key, and none of their looks at its tokens.
//!
//! [`hazard`]: crate::sql::hazard

use crate::digest::Key;
use crate::lexer::{Kind, Lexer, Mode};

/// What one pass found in a statement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// The statement's [`Key`].
    pub key: u64,
    /// Whether the text holds a comment (or an executable comment's end).
    pub commented: bool,
}

/// Scans `sql` (as a session in `mode` sent it) for its [`Key`], with `seed`.
#[inline]
pub fn scan_keyed(sql: &[u8], mode: Mode, seed: [u64; 2]) -> Scan {
    let mut lex = Lexer::with_mode(sql, mode);
    let mut key = Key::new(seed, mode);
    // (The key's run: from `run` to the end of the last token; comments skipped before it.)
    let (mut run, mut last_end, mut comments) = (0, 0, 0);
    while let Some(t) = lex.next() {
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
    key.run(sql, run, last_end.max(run));
    Scan { key: key.finish(), commented: lex.comments() != 0 }
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
        "KILL ",
        "QUERY ",
        "CONNECTION_ID() ",
    ];

    /// The next of a xorshift sequence.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Texts of one key have one digest, one class and (unless a literal was read as SQL) the
    /// same hazards, over texts made of pieces with holes filled with random values, comments
    /// and spacing; and texts that differ in values and comments alone share a key (else a
    /// table of keys would spare nothing).
    #[test]
    fn one_key_means_one_digest_one_class_and_the_same_hazards() {
        // The pieces, and holes for a number, a string or a comment.
        let holes = ["{n}", "{s}", "{c}", "{n}", "{s}", "{c}", "{n}", "{s}", "{c}", "_utf8", "x", "N", "1e"];
        let pieces: Vec<&str> = PIECES.iter().copied().chain(holes).collect();
        let numbers = ["1", "23", "4.5", "1e", "12", ".5", "0x1f", "7e5", "1E"];
        let strings = ["'a'", "'SET @b = 2'", "'LOCK TABLES t READ'", "'KILL 7'", "'b\\'c'", "''", "\"dq\"", "'x''y'", "\"\""];
        let comments = ["/* x */", "/* yy */ ", "-- z\n", "#q\n", " ", "", "/*!50001 ", "/*+ hint */"];
        let seed = [0x9e37_79b9_7f4a_7c15, 0xbf58_476d_1ce4_e5b9];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        type Shape = (u64, crate::rw::Class, (u16, bool), String);
        let mut seen: std::collections::HashMap<(u64, bool), Shape> = Default::default();
        let (mut shared, mut by_literal, mut kills) = (0, 0, 0);
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
                    let mut lex = Lexer::with_mode(sql, mode);
                    lex.by_ref().for_each(drop);
                    assert_eq!(s.commented, lex.comments() != 0, "{text:?}");
                    let (digest, class) = (crate::digest::digest_in(sql, mode), crate::rw::classify_in(sql, mode));
                    let hazards = crate::sql::shape_hazards(sql, mode);
                    assert_eq!(hazards.0, crate::sql::hazards_in(sql, mode));
                    // (A text without the KILL bit needs no KILL look-up.)
                    if crate::sql::find_kills_in(sql, true, mode).is_some() {
                        assert!(hazards.0 & crate::sql::hazard::KILL != 0, "{text:?} {mode:?}");
                        kills += 1;
                    }
                    match seen.get(&(s.key, mode.ansi_quotes)) {
                        Some((d, c, h, other)) => {
                            assert_eq!(*d, digest, "{text:?} and {other:?} share a key in {mode:?}");
                            assert_eq!(*c, class, "{text:?} and {other:?} share a key in {mode:?}");
                            // (Both follow from the shape, or neither does.)
                            assert_eq!(h.1, hazards.1, "{text:?} and {other:?} share a key in {mode:?}");
                            if hazards.1 {
                                assert_eq!(h.0, hazards.0, "{text:?} and {other:?} share a key in {mode:?}");
                            }
                            shared += usize::from(other != &text);
                            by_literal += usize::from(!hazards.1);
                        }
                        None => drop(seen.insert((s.key, mode.ansi_quotes), (digest, class, hazards, text.clone()))),
                    }
                }
            }
        }
        assert!(shared > 5_000 && by_literal > 50 && kills > 500, "{shared} {by_literal} {kills}");
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
