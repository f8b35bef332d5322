//! The statements the tests of redaction put through it: every word of [`super::WORDS`] beside
//! a secret, in every position the lexer knows, and the statements that carry a password or a
//! key in the forms MariaDB has. Public, so that the proxy's tests send the same corpus to a
//! real server through a capture.

use super::WORDS;

/// Statements that each carry `secret` (a word that is in no statement otherwise) in a string
/// literal: account, replication and key statements (on account `sec_u`; none changes the
/// password of the user that sends them), and each of [`WORDS`] called with it in every
/// position, in lower and upper case.
pub fn corpus(secret: &str) -> Vec<String> {
    let mut all: Vec<String> = [
        "CREATE USER IF NOT EXISTS sec_u IDENTIFIED BY '{s}'",
        "ALTER USER sec_u IDENTIFIED BY '{s}'",
        "ALTER USER sec_u IDENTIFIED VIA ed25519 USING PASSWORD('{s}')",
        "ALTER USER sec_u IDENTIFIED VIA mysql_native_password USING PASSWORD('{s}')",
        "SET PASSWORD FOR sec_u = PASSWORD('{s}')",
        "SET PASSWORD FOR sec_u = OLD_PASSWORD('{s}')",
        "GRANT SELECT ON test.* TO sec_u IDENTIFIED BY '{s}'",
        "SET STATEMENT max_statement_time=100 FOR CHANGE MASTER 'c' TO MASTER_HOST='h', MASTER_USER='r', MASTER_PASSWORD='{s}'",
        "CHANGE MASTER 'c' TO MASTER_SSL_KEY = '/keys/{s}.pem'",
        "CREATE SERVER IF NOT EXISTS sec_srv FOREIGN DATA WRAPPER mysql OPTIONS (HOST '127.0.0.1', USER 'x', PASSWORD '{s}')",
        "SELECT AES_ENCRYPT('data', '{s}')",
        "SELECT AES_DECRYPT(AES_ENCRYPT('data', 'k'), '{s}')",
        "SELECT DES_ENCRYPT('data', '{s}'), DES_DECRYPT('x', '{s}')",
        "SELECT ENCODE('data', '{s}'), DECODE('x', '{s}')",
        "SELECT ENCRYPT('{s}', 'ab')",
        "SELECT KDF('{s}', 'salt', 'info', 'hkdf', 256)",
        "SELECT SHA2('{s}', 256) IS NOT NULL, 'IDENTIFIED'",
        "INSTALL SONAME '{s}'",
        "INSTALL PLUGIN p SONAME '{s}'",
        "CREATE TABLE sec_t (a INT) ENGINE=FEDERATED CONNECTION='mysql://u:{s}@127.0.0.1:1/d/t'",
        "EXECUTE IMMEDIATE '(SELECT PASSWORD(''{s}''))'",
        "PREPARE sec_p FROM '(SELECT PASSWORD(''{s}''))'",
        // Read one way with backslash escapes, the other way without (NO_BACKSLASH_ESCAPES).
        "SELECT 'x\\', PASSWORD('{s}')",
        "SELECT PASSWORD('x\\'), '{s}' -- '",
        "SELECT \"x\\\" {s} \", PASSWORD(1)",
    ]
    .iter()
    .map(|f| f.replace("{s}", secret))
    .collect();
    for word in WORDS {
        let call = format!("{word}('{secret}')");
        for form in positions(&call, secret) {
            all.push(form.to_ascii_uppercase().replace(&secret.to_ascii_uppercase(), secret));
            all.push(form);
        }
    }
    all
}

/// Statements that put `call` (a word and a literal secret) in each position: nested, quoted,
/// commented, in executable comments, after `SET STATEMENT`, in the literals that `EXECUTE
/// IMMEDIATE` and `PREPARE` run (doubled quotes, backslash escapes, joined literals), and in
/// the text a double-quoted literal holds.
fn positions(call: &str, secret: &str) -> Vec<String> {
    let doubled = call.replace('\'', "''");
    let escaped = call.replace('\'', "\\'");
    // (The word split in two, as joined literals spell it.)
    let (a, b) = call.split_at(call.len() / 3);
    let (da, db) = (a.replace('\'', "''"), b.replace('\'', "''"));
    vec![
        format!("SELECT {call}"),
        format!("SELECT ((({call})))"),
        format!("SELECT 1 FROM t WHERE x = ({call}) AND y IN (SELECT {call})"),
        format!("/* lead */ SELECT /* mid */ {call} -- tail"),
        format!("SELECT 1 /*! , {call} */"),
        format!("SELECT 1 /*!50700 , {call} */"),
        format!("SELECT 1 /*M!100000 , {call} */"),
        format!("/*!{call}*/"),
        format!("SET STATEMENT max_statement_time=100 FOR SELECT {call}"),
        format!("SET STATEMENT a=1, b=2 FOR SET STATEMENT c=3 FOR SELECT {call}"),
        format!("EXECUTE IMMEDIATE 'SELECT {doubled}'"),
        format!("EXECUTE IMMEDIATE '({doubled})'"),
        format!("EXECUTE IMMEDIATE 'SELECT {escaped}'"),
        format!("EXECUTE IMMEDIATE \"SELECT {call}\""),
        format!("EXECUTE IMMEDIATE 'SELECT {da}' '{db}'"),
        format!("EXECUTE IMMEDIATE 'SELECT {da}' /* c */ '{db}'"),
        format!("PREPARE s FROM 'SELECT {doubled}'"),
        format!("PREPARE s FROM '(SELECT {doubled})'"),
        format!("PREPARE s FROM 'EXECUTE IMMEDIATE ''SELECT {}'''", doubled.replace('\'', "''")),
        format!("SELECT 1; SELECT {call}; SELECT 2"),
        format!("SELECT `{}` FROM t WHERE c = '{secret}'", call.split('(').next().unwrap_or_default()),
        format!("SET @q = 'SELECT {doubled}'"),
        format!("SELECT 'a\\'b', {call}"),
        format!("SELECT \"a\\\"b\", {call}"),
    ]
}
