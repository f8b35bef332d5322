use super::*;

/// Every secret of these tests holds this: one search finds them all.
const MARK: &str = "s3cr3t";

/// `sql` may carry a secret, and its redaction holds no byte of one.
fn redacts(sql: &str) {
    assert!(may_carry(sql.as_bytes()), "not found: {sql}");
    let out = String::from_utf8(redacted(sql.as_bytes())).unwrap();
    assert!(!out.contains(MARK) && !out.contains("3cr3"), "{sql}\n -> {out}");
}

#[test]
fn the_forms_that_escaped_a_list_of_forms() {
    for sql in [
        "EXECUTE IMMEDIATE '(SELECT PASSWORD(''s3cr3t''))'",
        "PREPARE s FROM '(SELECT PASSWORD(''s3cr3t''))'",
        "SET STATEMENT max_statement_time=100 FOR CHANGE MASTER 'c' TO MASTER_HOST='h', MASTER_USER='r', MASTER_PASSWORD='s3cr3t'",
        "SELECT AES_ENCRYPT('data', 's3cr3t')",
    ] {
        redacts(sql);
    }
}

#[test]
fn every_listed_form() {
    for sql in [
        "CREATE USER u IDENTIFIED BY 's3cr3t'",
        "create user if not exists u@'%' identified via ed25519 using PASSWORD('s3cr3t')",
        "CREATE USER u IDENTIFIED VIA ed25519 USING ED25519_PASSWORD('s3cr3t')",
        "ALTER USER u IDENTIFIED WITH caching_sha2_password BY 's3cr3t'",
        "CREATE USER u IDENTIFIED BY PASSWORD SHA2('s3cr3t', 256)",
        "SET PASSWORD FOR u = PASSWORD('s3cr3t')",
        "set password = 's3cr3t'",
        "SET PASSWORD = OLD_PASSWORD('s3cr3t')",
        "GRANT ALL ON *.* TO u IDENTIFIED BY 's3cr3t'",
        "SELECT old_password ('s3cr3t')",
        "/* c */ CHANGE MASTER TO MASTER_PASSWORD = 's3cr3t'",
        "CHANGE MASTER TO MASTER_SSL_KEY = '/keys/s3cr3t.pem'",
        "CHANGE REPLICATION SOURCE TO SOURCE_PASSWORD = 's3cr3t'",
        "START SLAVE USER='r' PASSWORD='s3cr3t'",
        "CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'u', PASSWORD 's3cr3t')",
        "SELECT AES_DECRYPT(x, 's3cr3t') FROM t",
        "SELECT DES_ENCRYPT('x', 's3cr3t'), DES_DECRYPT(y, 's3cr3t')",
        "SELECT ENCODE('x', 's3cr3t'), DECODE(y, 's3cr3t')",
        "SELECT ENCRYPT('s3cr3t', 'ab')",
        "SELECT KDF('s3cr3t', 'salt', 'info', 'hkdf', 256)",
        "INSTALL SONAME 's3cr3t'",
        "INSTALL PLUGIN p SONAME 's3cr3t'",
        "SET GLOBAL wsrep_sst_auth = 'u:s3cr3t'",
        "CREATE TABLE t (a INT) ENGINE=FEDERATED CONNECTION='mysql://u:s3cr3t@h:3306/d/t'",
        "SELECT 1; ALTER USER u IdEnTiFiEd BY 's3cr3t'",
        "SET @q = 'SET PASSWORD FOR u = PASSWORD(''s3cr3t'')'",
        "UPDATE users SET password = 's3cr3t' WHERE id = 1",
    ] {
        redacts(sql);
    }
}

/// Each word of the list, with a secret beside it, in every place the lexer knows, in both
/// cases ([`corpus`]).
#[test]
fn every_word_in_every_position() {
    let all = corpus(MARK);
    assert!(all.len() > WORDS.len() * 40, "{}", all.len());
    for sql in &all {
        redacts(sql);
    }
}

#[test]
fn statements_that_name_no_secret_word_are_left_alone() {
    for sql in [
        "SELECT c FROM sbtest1 WHERE id = 5",
        "SELECT 'IDENT' 'x', 'IFIED'",
        "SELECT `pass`, word FROM t",
        "SET @user = 'create user'",
        "SELECT c FROM t WHERE id = 5 GROUP BY c ORDER BY k",
        "SELECT @@server_id, 'the server'",
        "CREATE USER u@'%'",
        "INSERT INTO t VALUES ('https://example.com/a'), ('')",
        "UPDATE t SET k = k + 1 WHERE id = 1",
        "SELECT 'a\\nb' FROM t",
        "",
    ] {
        assert!(!may_carry(sql.as_bytes()), "{sql}");
    }
    let long = format!("SELECT '{}' FROM t WHERE id = 5", "x".repeat(300));
    assert!(!may_carry(long.as_bytes()));
}

#[test]
fn words_are_found_at_any_offset_in_any_case() {
    for word in WORDS {
        for case in [word.to_string(), word.to_ascii_uppercase()] {
            for pad in 0..20 {
                for tail in ["", " ", "x1234567"] {
                    let sql = format!("{}{case}{tail}", "a".repeat(pad));
                    assert!(names_a_word(sql.as_bytes()), "{sql:?}");
                    // One letter short at either end, it is no word.
                    for short in [&case[..case.len() - 1], &case[1..]] {
                        let sql = format!("{}{short}{tail}", "a".repeat(pad));
                        assert!(!names_a_word(sql.as_bytes()) || WORDS.iter().any(|w| short.eq_ignore_ascii_case(w)), "{sql:?}");
                    }
                }
            }
        }
    }
    let noise: Vec<u8> = (0..=255u8).collect();
    assert!(!names_a_word(&noise));
}

#[test]
fn redaction_keeps_the_code_and_takes_out_every_literal() {
    let r = |s: &str| String::from_utf8(redacted(s.as_bytes())).unwrap();
    assert_eq!(r("ALTER USER sec_u IDENTIFIED BY 'pw'"), "ALTER USER sec_u IDENTIFIED BY ?");
    assert_eq!(r("/* who */ SET PASSWORD FOR `u`@'%' = PASSWORD(\"pw\") -- x"), "SET PASSWORD FOR `u`@'%' = PASSWORD(?)");
    assert_eq!(r("SELECT AES_ENCRYPT(@d, 0x6b6579, 12)"), "SELECT AES_ENCRYPT(@d, ?, ?)");
    assert_eq!(r("EXECUTE IMMEDIATE 'ALTER USER u IDENTIFIED BY ''pw''' USING 1"), "EXECUTE IMMEDIATE ? USING ?");
    assert_eq!(r("/*!50700 SELECT PASSWORD('pw') */"), "SELECT PASSWORD(?)");
}

/// Text that reads one way with backslash escapes and another without: what is a literal in
/// either reading is taken out.
#[test]
fn redaction_holds_in_every_reading() {
    for sql in [
        // With escapes, one string and then `s3cr3t` outside any; without, the other way round.
        "SELECT 'x\\', PASSWORD('s3cr3t')",
        "SELECT PASSWORD('x\\'), 's3cr3t' -- '",
        "SELECT \"x\\\" s3cr3t \", PASSWORD(1)",
        "SELECT PASSWORD(\"a\\\"), 's3cr3t', \"b\")",
        // A name left open holds the rest of the text.
        "SELECT PASSWORD(1), `x s3cr3t",
        "SELECT PASSWORD(1), @'x s3cr3t",
    ] {
        redacts(sql);
    }
}

#[test]
fn deep_nesting_is_read_to_its_end() {
    // (Quotes doubled at every level: the words stand in the text itself.)
    let mut s = "SELECT 1".to_string();
    for _ in 0..12 {
        s = format!("EXECUTE IMMEDIATE '{}'", s.replace('\'', "''"));
    }
    assert!(!may_carry(s.as_bytes()));
    assert!(may_carry(s.replace("SELECT 1", "SELECT PASSWORD(1)").as_bytes()));
}
