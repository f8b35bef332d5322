//! Writing a text-protocol result set, for answers sluice makes itself (the SQL admin
//! listener): column definitions and rows whose values are all strings (or NULL).

use crate::packet::{put_lenenc, put_lenenc_bytes};

/// `MYSQL_TYPE_VAR_STRING`.
const VAR_STRING: u8 = 0xfd;
/// utf8mb4_general_ci.
const UTF8MB4: u16 = 45;

/// The payload of the definition of a string column `name` of table `table`.
pub fn column_def(out: &mut Vec<u8>, table: &str, name: &str) {
    put_lenenc_bytes(out, b"def");
    put_lenenc_bytes(out, b"sluice");
    put_lenenc_bytes(out, table.as_bytes());
    put_lenenc_bytes(out, table.as_bytes());
    put_lenenc_bytes(out, name.as_bytes());
    put_lenenc_bytes(out, name.as_bytes());
    put_lenenc(out, 0x0c);
    out.extend_from_slice(&UTF8MB4.to_le_bytes());
    out.extend_from_slice(&(1024u32 * 4).to_le_bytes());
    out.push(VAR_STRING);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&[0, 0]);
}

/// The payload of a row: each value as a length-encoded string, or NULL.
pub fn text_row(out: &mut Vec<u8>, values: &[Option<&str>]) {
    for v in values {
        match v {
            Some(s) => put_lenenc_bytes(out, s.as_bytes()),
            None => out.push(0xfb),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::Reader;

    #[test]
    fn columns_and_rows_read_back() {
        let mut def = Vec::new();
        column_def(&mut def, "backends", "name");
        assert_eq!(crate::replication::column_name(&def), Some(&b"name"[..]));
        let mut row = Vec::new();
        text_row(&mut row, &[Some("a"), None, Some("")]);
        let mut r = Reader::new(&row);
        assert_eq!(r.lenenc_bytes("a").unwrap(), b"a");
        assert_eq!(r.lenenc_or_null("null").unwrap(), None);
        assert_eq!(r.lenenc_bytes("empty").unwrap(), b"");
        assert!(r.is_empty());
    }
}
