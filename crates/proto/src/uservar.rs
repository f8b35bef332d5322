//! User variables carried from one backend connection to another: the query that reads their
//! values back with their types, and the SQL literal that sets each one again exactly (an
//! integer stays an integer, a decimal keeps its scale, a double its bits, a string its bytes,
//! character set and collation).

use crate::packet::Reader;

/// Columns the read-back query returns per variable: the value, `HEX()`, `CHARSET()`,
/// `COLLATION()`.
pub const COLUMNS: usize = 4;

/// Writes `name` as a quoted user variable: `@` and a backquoted identifier.
pub fn write_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"@`");
    out.extend_from_slice(name.replace('`', "``").as_bytes());
    out.push(b'`');
}

/// `SELECT @v, HEX(@v), CHARSET(@v), COLLATION(@v), ...` for every name.
pub fn read_back_query(names: &[String]) -> Vec<u8> {
    let mut q = b"SELECT ".to_vec();
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            q.push(b',');
        }
        write_name(&mut q, n);
        for f in ["HEX", "CHARSET", "COLLATION"] {
            q.push(b',');
            q.extend_from_slice(f.as_bytes());
            q.push(b'(');
            write_name(&mut q, n);
            q.push(b')');
        }
    }
    q
}

/// The type code and flags of a column definition (protocol 4.1).
pub fn column_type(def: &[u8]) -> Option<(u8, u16)> {
    let mut r = Reader::new(def);
    for what in ["catalog", "schema", "table", "org_table", "name", "org_name"] {
        r.lenenc_bytes(what).ok()?;
    }
    r.lenenc("fixed length").ok()?;
    r.u16("charset").ok()?;
    r.u32("length").ok()?;
    let ty = r.u8("type").ok()?;
    let flags = r.u16("flags").ok()?;
    Some((ty, flags))
}

/// The `n` values of a text-protocol row (None: SQL NULL).
pub fn row_values(payload: &[u8], n: usize) -> Option<Vec<Option<&[u8]>>> {
    let mut r = Reader::new(payload);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if r.peek() == Some(0xfb) {
            r.u8("null").ok()?;
            out.push(None);
        } else {
            out.push(Some(r.lenenc_bytes("value").ok()?));
        }
    }
    r.is_empty().then_some(out)
}

/// Column flag: the integer is unsigned.
const UNSIGNED: u16 = 32;

/// The SQL literal that gives a user variable the value read back: `value` as the text
/// protocol gave it, of column type `ty` with `flags`, and for a string its `HEX()`, `CHARSET()`
/// and `COLLATION()`. None when a part is not what the server sends for a user variable (the
/// caller keeps the session on its connection rather than guess).
pub fn literal(
    ty: u8,
    flags: u16,
    value: Option<&[u8]>,
    hex: Option<&[u8]>,
    charset: Option<&[u8]>,
    collation: Option<&[u8]>,
) -> Option<String> {
    let Some(value) = value else { return Some("NULL".into()) };
    // A string's own bytes are not text; a number's are.
    let text = std::str::from_utf8(value).unwrap_or_default();
    let all = |s: &str, ok: fn(u8) -> bool| !s.is_empty() && s.bytes().all(ok);
    match ty {
        // TINY, SHORT, LONG, LONGLONG, INT24.
        1 | 2 | 3 | 8 | 9 => {
            let digits = text.strip_prefix('-').unwrap_or(text);
            if !all(digits, |c| c.is_ascii_digit()) {
                return None;
            }
            Some(if flags & UNSIGNED != 0 {
                format!("CAST({text} AS UNSIGNED)")
            } else if text.starts_with('-') {
                format!("CAST({text} AS SIGNED)")
            } else {
                text.to_string()
            })
        }
        // DECIMAL, NEWDECIMAL: the literal keeps the scale.
        0 | 246 => all(text, |c| c.is_ascii_digit() || c == b'-' || c == b'.').then(|| text.to_string()),
        // FLOAT, DOUBLE: the server prints the shortest text that reads back to the same bits;
        // an exponent makes the literal a double.
        4 | 5 => {
            if !all(text, |c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E')) {
                return None;
            }
            Some(if text.contains(['e', 'E']) { text.to_string() } else { format!("{text}e0") })
        }
        // A string: its bytes, character set and collation.
        _ => {
            let name = |b: Option<&[u8]>| -> Option<String> {
                let s = std::str::from_utf8(b?).ok()?;
                all(s, |c| c.is_ascii_alphanumeric() || c == b'_').then(|| s.to_string())
            };
            let hex = std::str::from_utf8(hex?).ok()?;
            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) || hex.len() % 2 != 0 {
                return None;
            }
            let (charset, collation) = (name(charset)?, name(collation)?);
            // (`binary` is a keyword: a binary string has no other collation anyway.)
            Some(if collation == "binary" { format!("_binary X'{hex}'") } else { format!("_{charset} X'{hex}' COLLATE {collation}") })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_quotes_names() {
        let q = read_back_query(&["a".into(), "b`c".into()]);
        assert_eq!(
            String::from_utf8(q).unwrap(),
            "SELECT @`a`,HEX(@`a`),CHARSET(@`a`),COLLATION(@`a`),@`b``c`,HEX(@`b``c`),CHARSET(@`b``c`),COLLATION(@`b``c`)"
        );
    }

    #[test]
    fn literals_keep_the_type() {
        let l = |ty, flags, v: &str| literal(ty, flags, Some(v.as_bytes()), None, None, None);
        assert_eq!(l(8, 0, "42").as_deref(), Some("42"));
        assert_eq!(l(8, 0, "-9223372036854775808").as_deref(), Some("CAST(-9223372036854775808 AS SIGNED)"));
        assert_eq!(l(8, UNSIGNED, "18446744073709551615").as_deref(), Some("CAST(18446744073709551615 AS UNSIGNED)"));
        assert_eq!(l(8, 0, "4 2"), None);
        assert_eq!(l(246, 0, "-1.50").as_deref(), Some("-1.50"));
        assert_eq!(l(5, 0, "0.30000000000000004").as_deref(), Some("0.30000000000000004e0"));
        assert_eq!(l(5, 0, "-5e-324").as_deref(), Some("-5e-324"));
        assert_eq!(l(5, 0, "1; DROP"), None);
        assert_eq!(literal(253, 0, None, None, None, None).as_deref(), Some("NULL"));
        let s = literal(253, 0, Some(b"\xc3\xa9"), Some(b"C3A9"), Some(b"utf8mb4"), Some(b"utf8mb4_bin"));
        assert_eq!(s.as_deref(), Some("_utf8mb4 X'C3A9' COLLATE utf8mb4_bin"));
        assert_eq!(literal(253, 0, Some(b""), Some(b""), Some(b"binary"), Some(b"binary")).as_deref(), Some("_binary X''"));
        assert_eq!(literal(253, 0, Some(b"\0\xff"), Some(b"00FF"), Some(b"binary"), Some(b"binary")).as_deref(), Some("_binary X'00FF'"));
        assert_eq!(literal(8, 0, Some(b"\xff"), None, None, None), None);
        assert_eq!(literal(253, 0, Some(b"x"), Some(b"78"), Some(b"utf8mb4'"), Some(b"x")), None);
        assert_eq!(literal(253, 0, Some(b"x"), Some(b"7"), Some(b"latin1"), Some(b"latin1_bin")), None);
    }

    #[test]
    fn rows_and_column_definitions() {
        let mut row = vec![2, b'4', b'2', 0xfb];
        assert_eq!(row_values(&row, 2), Some(vec![Some(&b"42"[..]), None]));
        assert_eq!(row_values(&row, 3), None);
        row.push(0);
        assert_eq!(row_values(&row, 2), None, "bytes left over");
        let mut def = Vec::new();
        for s in ["def", "", "", "", "@x", ""] {
            def.push(s.len() as u8);
            def.extend_from_slice(s.as_bytes());
        }
        def.extend_from_slice(&[0x0c, 63, 0, 20, 0, 0, 0, 8, 32, 0, 0, 0, 0]);
        assert_eq!(column_type(&def), Some((8, 32)));
        assert_eq!(column_type(&def[..def.len() - 8]), None);
    }
}
