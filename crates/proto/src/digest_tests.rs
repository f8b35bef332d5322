use super::{digest, normalize};

fn norm(sql: &str) -> String {
    let mut out = Vec::new();
    normalize(sql.as_bytes(), &mut out, 1 << 20);
    String::from_utf8(out).expect("utf-8 in, utf-8 out")
}

#[test]
fn literals_become_placeholders() {
    let cases = [
        ("SELECT * FROM t WHERE id = 42", "select * from t where id = ?"),
        ("select c from t where a='x' and b = \"y\"", "select c from t where a = ? and b = ?"),
        ("SELECT 1.5e-3, -7, +2, 0x1F, x'0f', b'01', N'abc', _utf8mb4'é'", "select ?, ?, ?, ?, ?, ?, ?, ?"),
        ("SELECT a - 1, a-1, (a) - 1 FROM t", "select a - ?, a - ?, (a) - ? from t"),
        ("SELECT * FROM t WHERE x = -1 AND y BETWEEN -2 AND -3", "select * from t where x = ? and y between ? and ?"),
        ("SELECT c FROM sbtest1 WHERE id=?", "select c from sbtest1 where id = ?"),
        ("SELECT @a, @@session.sql_mode, `Col`.`X` FROM `T`", "select @a, @@session.sql_mode, `Col`.`X` from `T`"),
        ("SELECT count(*), COUNT( * ) FROM t", "select count(*), count(*) from t"),
        ("select 'it''s', 'a\\'b' from dual", "select ?, ? from dual"),
    ];
    for (sql, want) in cases {
        assert_eq!(norm(sql), want, "{sql}");
    }
}

#[test]
fn lists_and_rows_fold() {
    let cases = [
        ("SELECT * FROM t WHERE id IN (1, 2, 3)", "select * from t where id in (...)"),
        ("SELECT * FROM t WHERE id in (7)", "select * from t where id in (...)"),
        ("SELECT * FROM t WHERE id IN (-1,'a',?,x'00')", "select * from t where id in (...)"),
        ("SELECT * FROM t WHERE id IN (SELECT id FROM u)", "select * from t where id in (select id from u)"),
        ("SELECT * FROM t WHERE id IN (a, 1)", "select * from t where id in (a, ?)"),
        ("INSERT INTO t VALUES (1,'a'),(2,'b'),(3,'c')", "insert into t values (...)"),
        ("INSERT INTO t (a,b) VALUE (1,2)", "insert into t(a, b) value (...)"),
        ("INSERT INTO t VALUES (1, NOW()), (2, 3)", "insert into t values (?, now()), (?, ?)"),
        ("SELECT f(1, 2)", "select f(?, ?)"),
    ];
    for (sql, want) in cases {
        assert_eq!(norm(sql), want, "{sql}");
    }
}

#[test]
fn comments_spacing_and_case_do_not_change_the_digest() {
    let same = [
        "SELECT c FROM t WHERE id = 1",
        "select   c\nfrom t where ID=2",
        "/* app: page 7 */ SELECT c FROM t -- trailing\n WHERE id = 3",
        "SELECT c # why\nFROM t WHERE id = ?",
        "SELECT /* sluice: route=primary */ c FROM t WHERE id = 'x'",
    ];
    let d = digest(same[0].as_bytes());
    for sql in same {
        assert_eq!(digest(sql.as_bytes()), d, "{sql}");
    }
    for other in [
        "SELECT c FROM t WHERE id = id",
        "SELECT c FROM u WHERE id = 1",
        "SELECT `C` FROM t WHERE id = 1",
        "SELECT c FROM t WHERE id IN (1)",
    ] {
        assert_ne!(digest(other.as_bytes()), d, "{other}");
    }
    assert_eq!(digest(b"SELECT * FROM t WHERE id IN (1)"), digest(b"select * from t where id in (1,2,3,4,5)"));
    assert_ne!(digest(b""), 0);
}

#[test]
fn executable_comments_are_code() {
    assert_eq!(norm("/*!40101 SET NAMES utf8 */"), "set names utf8");
    assert_eq!(norm("SELECT /*!50000 SQL_NO_CACHE */ 1"), "select sql_no_cache ?");
}

#[test]
fn normalized_text_normalizes_to_itself() {
    for sql in [
        "INSERT INTO t VALUES (1,'a'),(2,'b')",
        "SELECT * FROM t WHERE id IN (1,2) AND x = -5 OR y - 3 > 1e+5",
        "SELECT `a b`, @`v`, 'unterminated",
        "select a.b, t.* from t",
    ] {
        let once = norm(sql);
        assert_eq!(norm(&once), once, "{sql}");
        assert_eq!(digest(once.as_bytes()), digest(sql.as_bytes()), "{sql}");
    }
}

#[test]
fn a_long_text_is_cut_at_a_token() {
    let sql = format!("SELECT {} FROM t", (0..100).map(|i| format!("col{i}")).collect::<Vec<_>>().join(", "));
    let mut out = Vec::new();
    normalize(sql.as_bytes(), &mut out, 40);
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.len() <= 44 && text.ends_with("..."), "{text}");
    assert!(text.starts_with("select col0, col1,"), "{text}");
}
