//! A byte-level look at SQL text: enough to recognise the few statements sluice must act on
//! (KILL), without parsing SQL. It skips whitespace and comments, and reads keywords and numbers.

/// Skips whitespace and comments (`-- `, `#`, `/* */`; `/*! */` and `/*M! */` bodies are code
/// and are not skipped).
pub fn skip_space(mut s: &[u8]) -> &[u8] {
    loop {
        match s {
            [c, rest @ ..] if c.is_ascii_whitespace() => s = rest,
            [b'#', ..] => s = skip_line(s),
            [b'-', b'-', c, ..] if c.is_ascii_whitespace() => s = skip_line(s),
            [b'/', b'*', b'!', ..] | [b'/', b'*', b'M', b'!', ..] => return s,
            [b'/', b'*', rest @ ..] => {
                s = match rest.windows(2).position(|w| w == b"*/") {
                    Some(p) => &rest[p + 2..],
                    None => &[],
                }
            }
            _ => return s,
        }
    }
}

fn skip_line(s: &[u8]) -> &[u8] {
    match s.iter().position(|&c| c == b'\n') {
        Some(p) => &s[p + 1..],
        None => &[],
    }
}

/// The next word (letters, digits, `_`) and what follows it.
pub fn word(s: &[u8]) -> (&[u8], &[u8]) {
    let s = skip_space(s);
    let n = s.iter().position(|c| !(c.is_ascii_alphanumeric() || *c == b'_')).unwrap_or(s.len());
    (&s[..n], &s[n..])
}

/// True when the statement's first keyword is `kw` (case-insensitive).
pub fn starts_with_keyword(sql: &[u8], kw: &str) -> bool {
    word(sql).0.eq_ignore_ascii_case(kw.as_bytes())
}

/// `KILL [HARD | SOFT] [CONNECTION | QUERY] [ID] <n>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    pub query_only: bool,
    pub id: u64,
    /// The modifier as written (`HARD`/`SOFT`), to be repeated when the statement is rewritten.
    pub hard: Option<bool>,
}

/// Recognises a KILL of a connection or query by id. `KILL USER ...` and `KILL QUERY ID n` (a
/// query id, not a connection id) return None: they are not about connection ids.
pub fn parse_kill(sql: &[u8]) -> Option<Kill> {
    let (w, mut rest) = word(sql);
    if !w.eq_ignore_ascii_case(b"KILL") {
        return None;
    }
    let mut k = Kill { query_only: false, id: 0, hard: None };
    let (mut w, mut r) = word(rest);
    if w.eq_ignore_ascii_case(b"HARD") || w.eq_ignore_ascii_case(b"SOFT") {
        k.hard = Some(w.eq_ignore_ascii_case(b"HARD"));
        (w, r) = word(r);
    }
    if w.eq_ignore_ascii_case(b"CONNECTION") {
        (w, r) = word(r);
    } else if w.eq_ignore_ascii_case(b"QUERY") {
        k.query_only = true;
        (w, r) = word(r);
        if w.eq_ignore_ascii_case(b"ID") {
            return None;
        }
    }
    rest = r;
    if w.is_empty() || !w.iter().all(u8::is_ascii_digit) {
        return None;
    }
    k.id = std::str::from_utf8(w).ok()?.parse().ok()?;
    // Only a trailing semicolon and whitespace may follow.
    let tail = skip_space(rest);
    let tail = tail.strip_prefix(b";").map(skip_space).unwrap_or(tail);
    tail.is_empty().then_some(k)
}

/// Writes a KILL statement for `id` with the same modifiers.
pub fn write_kill(k: &Kill, id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"KILL ");
    match k.hard {
        Some(true) => out.extend_from_slice(b"HARD "),
        Some(false) => out.extend_from_slice(b"SOFT "),
        None => {}
    }
    out.extend_from_slice(if k.query_only { b"QUERY " } else { b"CONNECTION " });
    out.extend_from_slice(id.to_string().as_bytes());
}

/// Session state a statement may leave on its backend connection that sluice does not track and
/// so cannot recreate elsewhere. Bits of [`hazards`]'s result.
pub mod hazard {
    /// A user variable (`@name`) is read or written.
    pub const USER_VARIABLE: u8 = 1;
    /// `TEMPORARY` (a temporary table lives on its connection).
    pub const TEMPORARY_TABLE: u8 = 2;
    /// `GET_LOCK(...)` or `LOCK TABLE(S)`.
    pub const LOCK: u8 = 4;
    /// SQL-level `PREPARE` (the statement lives on its connection).
    pub const SQL_PREPARE: u8 = 8;
}

/// Scans SQL text once for the [`hazard`] bits: words and `@` outside string literals, quoted
/// identifiers and comments. It errs towards reporting (a hazard only stops a session from
/// moving to another backend connection).
pub fn hazards(sql: &[u8]) -> u8 {
    let mut found = 0;
    let mut prev_lock = false;
    let mut i = 0;
    while i < sql.len() {
        let c = sql[i];
        match c {
            b'\'' | b'"' | b'`' => i = skip_quoted(sql, i + 1, c),
            b'#' => i = sql.len() - skip_line(&sql[i..]).len(),
            b'-' if sql.get(i + 1) == Some(&b'-') && sql.get(i + 2).is_some_and(u8::is_ascii_whitespace) => {
                i = sql.len() - skip_line(&sql[i..]).len()
            }
            b'/' if sql.get(i + 1) == Some(&b'*') && !matches!(sql.get(i + 2), Some(b'!' | b'M')) => {
                i = match sql[i + 2..].windows(2).position(|w| w == b"*/") {
                    Some(p) => i + 2 + p + 2,
                    None => sql.len(),
                }
            }
            b'@' => {
                match sql.get(i + 1) {
                    Some(b'@') => i += 2,
                    Some(n) if n.is_ascii_alphanumeric() || matches!(n, b'_' | b'$' | b'.' | b'\'' | b'"' | b'`') => {
                        found |= hazard::USER_VARIABLE;
                        i += 1;
                    }
                    _ => i += 1,
                }
                // The name of a system variable or user variable is not a keyword.
                while i < sql.len() && is_word_byte(sql[i]) {
                    i += 1;
                }
            }
            c if is_word_byte(c) => {
                let start = i;
                while i < sql.len() && is_word_byte(sql[i]) {
                    i += 1;
                }
                let w = &sql[start..i];
                let eq = |k: &[u8]| w.eq_ignore_ascii_case(k);
                if eq(b"TEMPORARY") {
                    found |= hazard::TEMPORARY_TABLE;
                } else if eq(b"GET_LOCK") || (prev_lock && (eq(b"TABLE") || eq(b"TABLES"))) {
                    found |= hazard::LOCK;
                } else if eq(b"PREPARE") {
                    found |= hazard::SQL_PREPARE;
                }
                prev_lock = eq(b"LOCK");
                continue;
            }
            _ => i += 1,
        }
        if !c.is_ascii_whitespace() {
            prev_lock = false;
        }
    }
    found
}

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// The index after a quoted string or identifier that started before `from` with `q`; a
/// doubled quote or a backslash escape does not end it.
fn skip_quoted(s: &[u8], mut from: usize, q: u8) -> usize {
    while from < s.len() {
        match s[from] {
            b'\\' if q != b'`' => from += 2,
            c if c == q && s.get(from + 1) == Some(&q) => from += 2,
            c if c == q => return from + 1,
            _ => from += 1,
        }
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_forms() {
        assert_eq!(parse_kill(b"KILL 5"), Some(Kill { query_only: false, id: 5, hard: None }));
        assert_eq!(parse_kill(b"  kill query 12 ;"), Some(Kill { query_only: true, id: 12, hard: None }));
        assert_eq!(parse_kill(b"/* x */ KILL HARD CONNECTION 7"), Some(Kill { query_only: false, id: 7, hard: Some(true) }));
        assert_eq!(parse_kill(b"KILL QUERY ID 7"), None);
        assert_eq!(parse_kill(b"KILL USER bob"), None);
        assert_eq!(parse_kill(b"KILL 5; SELECT 1"), None);
        assert_eq!(parse_kill(b"SELECT 1"), None);
        assert_eq!(parse_kill(b"KILL"), None);
        let mut out = Vec::new();
        write_kill(&Kill { query_only: true, id: 1, hard: Some(false) }, 99, &mut out);
        assert_eq!(out, b"KILL SOFT QUERY 99");
    }

    #[test]
    fn comments_and_keywords() {
        assert!(starts_with_keyword(b"-- c\n# d\n /* e */ select 1", "SELECT"));
        assert!(!starts_with_keyword(b"/*!40101 SET x=1 */", "SET"));
        assert_eq!(skip_space(b"/* unterminated"), b"");
    }

    #[test]
    fn hazards_outside_literals_and_comments() {
        use hazard::*;
        assert_eq!(hazards(b"SELECT c FROM sbtest1 WHERE id=5"), 0);
        assert_eq!(hazards(b"SELECT @@session.sql_mode, @@autocommit"), 0);
        assert_eq!(hazards(b"SET @x = 1"), USER_VARIABLE);
        assert_eq!(hazards(b"select 1 into @`a b`"), USER_VARIABLE);
        assert_eq!(hazards(b"SELECT 'me@example.com', \"@x\", `@y` -- @z\n /* @w */ # @v"), 0);
        assert_eq!(hazards(b"SELECT 'it''s @x', 'a\\'@x'"), 0);
        assert_eq!(hazards(b"create temporary table t (a int)"), TEMPORARY_TABLE);
        assert_eq!(hazards(b"SELECT GET_LOCK('a', 1)"), LOCK);
        assert_eq!(hazards(b"LOCK  TABLES t WRITE"), LOCK);
        assert_eq!(hazards(b"SELECT * FROM t LOCK IN SHARE MODE"), 0);
        assert_eq!(hazards(b"PREPARE s FROM 'select 1'"), SQL_PREPARE);
        assert_eq!(hazards(b"SELECT temporary_x, prepared FROM t"), 0);
        assert_eq!(hazards(b"/*!50000 SET @x=1 */"), USER_VARIABLE);
        assert_eq!(hazards(b"'unterminated @x"), 0);
    }
}
