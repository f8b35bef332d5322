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
}
