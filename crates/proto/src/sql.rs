//! A byte-level look at SQL text: enough to recognise the few statements sluice must act on
//! (KILL), without parsing SQL. It skips whitespace and comments, and reads keywords and numbers.

use std::ops::Range;

use crate::lexer::{self, Kind, Token};

mod hazards;
mod set;
pub use hazards::{hazard, hazards, hazards_in, shape_hazards, user_variables};
pub use set::{CONNECTION_CHARSETS, set_system_variables};

/// `KILL [HARD | SOFT] [TIDB] [CONNECTION | QUERY] <n>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    pub query_only: bool,
    pub id: u64,
    /// The modifier as written (`HARD`/`SOFT`), to be repeated when the statement is rewritten.
    pub hard: Option<bool>,
}

/// What a KILL statement names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillTarget {
    /// A literal connection id (a sluice id, to be translated); `at` is where its digits are.
    Id { kill: Kill, at: Range<usize> },
    /// `CONNECTION_ID()`: the backend's own id for the connection it runs on.
    Own,
    /// `KILL QUERY ID n`: a query id of the server it runs on, not a connection id.
    QueryId,
    /// `KILL USER name`.
    User,
    /// `?`: a parameter of a prepared statement.
    Placeholder,
    /// Any other expression (MariaDB evaluates one), or an id too large for a connection id.
    Expression,
}

/// A KILL found in a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub target: KillTarget,
    /// The KILL is the text of `PREPARE s FROM '...'` or `EXECUTE IMMEDIATE '...'` (its `at`
    /// is then within that text, not the query).
    pub quoted: bool,
    /// Where its whole statement is (in the query, or in that text).
    pub statement: Range<usize>,
}

/// The KILL statements of a COM_QUERY or COM_STMT_PREPARE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kills {
    /// How many statements the text has (more than one: a multi-statement).
    pub statements: usize,
    pub found: Vec<Found>,
}

/// Finds every KILL in SQL text: each statement of a multi-statement, inside executable
/// comments, and in the literal text that `PREPARE ... FROM` and `EXECUTE IMMEDIATE` run.
/// `multi`: the connection runs multi-statements (CLIENT_MULTI_STATEMENTS, or COM_SET_OPTION);
/// without it the server refuses a second statement before running the first, so only the
/// first is looked at. Cheap when there is nothing to find: a look at the first word, and with
/// `multi` a vectorised search for `;`.
pub fn find_kills(sql: &[u8], multi: bool) -> Option<Kills> {
    find_kills_in(sql, multi, lexer::Mode::DEFAULT)
}

/// [`find_kills`] of text a session in `mode` sent.
pub fn find_kills_in(sql: &[u8], multi: bool, mode: lexer::Mode) -> Option<Kills> {
    if !may_name_kill(sql, multi) {
        return None;
    }
    let mut kills = Kills::default();
    for st in lexer::statements_in(sql, mode).take(if multi { usize::MAX } else { 1 }) {
        kills.statements += 1;
        if let Some(target) = kill_statement(sql, &st) {
            kills.found.push(Found { target, quoted: false, statement: span(&st) });
        } else if let Some(text) = prepared_text(sql, &st, mode) {
            for inner in lexer::statements_in(&text, mode).take(1) {
                if let Some(target) = kill_statement(&text, &inner) {
                    kills.found.push(Found { target, quoted: true, statement: span(&inner) });
                }
            }
        }
    }
    (!kills.found.is_empty()).then_some(kills)
}

/// Whether `sql` may hold a KILL at all, in any mode (a look at the first word, and with `multi`
/// a vectorised search for `;` and then `kill`): most statements end here.
#[inline]
pub fn may_name_kill(sql: &[u8], multi: bool) -> bool {
    may_lead(sql) || (multi && memchr::memchr(b';', sql).is_some() && may_contain_kill(sql))
}

/// The collation a `SET NAMES charset COLLATE collation` gives the connection (lowercased), which
/// the server does not report among the variables the statement changed. None: no such clause.
pub fn set_names_collation(sql: &[u8]) -> Option<String> {
    let st = lexer::statements(sql).next()?;
    if !st.first()?.is_word(sql, "SET") {
        return None;
    }
    let at = st.iter().position(|t| t.is_word(sql, "NAMES"))?;
    let [_, _, collate, name, ..] = st.get(at..)? else { return None };
    if !collate.is_word(sql, "COLLATE") {
        return None;
    }
    let text = match name.kind {
        lexer::Kind::Word | lexer::Kind::Quoted => lexer::name(name.text(sql)),
        _ => return None,
    };
    (!text.eq_ignore_ascii_case(b"DEFAULT")).then(|| String::from_utf8_lossy(&text).to_ascii_lowercase())
}

/// From the first token's start to the last one's end.
fn span(st: &[Token]) -> Range<usize> {
    match (st.first(), st.last()) {
        (Some(a), Some(b)) => a.at.start..b.at.end,
        _ => 0..0,
    }
}

/// Whether the first statement may be a KILL, or run one (PREPARE, EXECUTE IMMEDIATE): its
/// first word, or a comment before it (whose end only the lexer finds).
fn may_lead(sql: &[u8]) -> bool {
    let Some(start) = sql.iter().position(|c| !c.is_ascii_whitespace()) else { return false };
    let rest = &sql[start..];
    match rest[0] | 0x20 {
        // A comment (`/*`, `-- `, `#`: the case bit leaves these bytes as they are).
        b'/' | b'-' | b'#' => return true,
        b'k' | b'p' | b'e' => {}
        _ => return false,
    }
    let n = rest.iter().take(8).position(|c| !c.is_ascii_alphabetic()).unwrap_or(rest.len().min(8));
    let w = &rest[..n];
    w.eq_ignore_ascii_case(b"KILL") || w.eq_ignore_ascii_case(b"PREPARE") || w.eq_ignore_ascii_case(b"EXECUTE")
}

/// Whether `kill` appears in the text in any case.
fn may_contain_kill(sql: &[u8]) -> bool {
    memchr::memchr2_iter(b'k', b'K', sql).any(|i| sql.get(i + 1..i + 4).is_some_and(|w| w.eq_ignore_ascii_case(b"ill")))
}

/// The KILL statement `st` names, if it is one.
fn kill_statement(sql: &[u8], st: &[Token]) -> Option<KillTarget> {
    let (first, mut rest) = st.split_first()?;
    if !first.is_word(sql, "KILL") {
        return None;
    }
    let mut kill = Kill { query_only: false, id: 0, hard: None };
    let is = |r: &[Token], kw: &str| r.first().is_some_and(|t| t.is_word(sql, kw));
    if is(rest, "HARD") || is(rest, "SOFT") {
        kill.hard = Some(is(rest, "HARD"));
        rest = &rest[1..];
    }
    // TiDB's `KILL TIDB [CONNECTION | QUERY] <n>` (the id is translated as for KILL; the word
    // stays for the server).
    if is(rest, "TIDB") {
        rest = &rest[1..];
    }
    if is(rest, "CONNECTION") {
        rest = &rest[1..];
    } else if is(rest, "QUERY") {
        kill.query_only = true;
        rest = &rest[1..];
        if is(rest, "ID") {
            return Some(KillTarget::QueryId);
        }
    }
    Some(match rest {
        [] => return None,
        [u, ..] if u.is_word(sql, "USER") => KillTarget::User,
        [n] if n.kind == Kind::Number && n.text(sql).iter().all(u8::is_ascii_digit) => {
            match std::str::from_utf8(n.text(sql)).ok().and_then(|t| t.parse::<u64>().ok()) {
                Some(id) => KillTarget::Id { kill: Kill { id, ..kill }, at: n.at.clone() },
                None => KillTarget::Expression,
            }
        }
        [f, o, c] if f.is_word(sql, "CONNECTION_ID") && o.is_punct(sql, b'(') && c.is_punct(sql, b')') => KillTarget::Own,
        [p] if p.is_punct(sql, b'?') => KillTarget::Placeholder,
        _ => KillTarget::Expression,
    })
}

/// The literal text of `PREPARE name FROM '...'` or `EXECUTE IMMEDIATE '...'`.
fn prepared_text(sql: &[u8], st: &[Token], mode: lexer::Mode) -> Option<Vec<u8>> {
    let literal = match st {
        [p, _, f, lit] if p.is_word(sql, "PREPARE") && f.is_word(sql, "FROM") => lit,
        [e, i, lit, ..] if e.is_word(sql, "EXECUTE") && i.is_word(sql, "IMMEDIATE") => lit,
        _ => return None,
    };
    lexer::unquote_in(literal.text(sql), mode)
}

/// What a query does to a statement prepared with SQL, when sluice can follow it: a
/// `PREPARE name FROM '...'` of a literal text (the query itself prepares it again on another
/// connection), or a `DEALLOCATE | DROP PREPARE name`. The name is lowercased (names are not
/// case-sensitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlPrepare {
    Prepare(Vec<u8>),
    Deallocate(Vec<u8>),
}

/// What a statement does to a transaction that the server's status flags may not show (with
/// autocommit off, a transaction that touched no table yet, or its savepoints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TransactionEnd {
    /// `COMMIT` or `ROLLBACK` (without `AND CHAIN`, and not `ROLLBACK TO`): the transaction is over.
    Ends,
    /// `SAVEPOINT`, `RELEASE SAVEPOINT`, `ROLLBACK TO`: the server keeps a savepoint in the
    /// transaction, begun or not (with autocommit off, one that touched no table yet shows no
    /// in-transaction flag).
    Savepoint,
    /// Anything else.
    #[default]
    No,
}

/// What the first statement of `sql` does to the session's transaction.
pub fn transaction_end(sql: &[u8]) -> TransactionEnd {
    let Some(st) = lexer::statements(sql).next() else { return TransactionEnd::No };
    let Some((first, rest)) = st.split_first() else { return TransactionEnd::No };
    if first.is_word(sql, "SAVEPOINT") || first.is_word(sql, "RELEASE") {
        return TransactionEnd::Savepoint;
    }
    if !(first.is_word(sql, "COMMIT") || first.is_word(sql, "ROLLBACK")) {
        return TransactionEnd::No;
    }
    let word = |i: usize, kw: &str| rest.get(i).is_some_and(|t| t.is_word(sql, kw));
    for i in 0..rest.len() {
        // ROLLBACK [WORK] TO [SAVEPOINT] name; ... AND CHAIN (not AND NO CHAIN).
        if word(i, "TO") {
            return TransactionEnd::Savepoint;
        }
        if word(i, "AND") && word(i + 1, "CHAIN") {
            return TransactionEnd::No;
        }
    }
    TransactionEnd::Ends
}

/// Whether the first statement of `sql` is a `COMMIT` that ends the transaction (not `AND
/// CHAIN`).
pub fn commits(sql: &[u8]) -> bool {
    let first = lexer::statements(sql).next().is_some_and(|st| st.first().is_some_and(|t| t.is_word(sql, "COMMIT")));
    first && transaction_end(sql) == TransactionEnd::Ends
}

/// The [`SqlPrepare`] a query is, if it is one statement of that form (None otherwise: a
/// PREPARE from a variable, among other statements, ...).
pub fn sql_prepare(sql: &[u8]) -> Option<SqlPrepare> {
    let mut st = lexer::statements(sql);
    let first = st.next()?;
    if st.next().is_some() {
        return None;
    }
    let name = |t: &Token| -> Option<Vec<u8>> {
        let ident = t.kind == lexer::Kind::Word || (t.kind == lexer::Kind::Quoted && t.text(sql).first() == Some(&b'`'));
        ident.then(|| lexer::name(t.text(sql)).to_ascii_lowercase())
    };
    match first.as_slice() {
        [p, n, f, lit] if p.is_word(sql, "PREPARE") && f.is_word(sql, "FROM") && lit.kind == lexer::Kind::Quoted => {
            matches!(lit.text(sql).first(), Some(b'\'' | b'"')).then(|| name(n).map(SqlPrepare::Prepare)).flatten()
        }
        [d, p, n] if (d.is_word(sql, "DEALLOCATE") || d.is_word(sql, "DROP")) && p.is_word(sql, "PREPARE") => {
            name(n).map(SqlPrepare::Deallocate)
        }
        _ => None,
    }
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

/// Whether a statement may carry a password or a key, and so must not be recorded as written
/// (traffic capture keeps its normalized text, literals taken out, instead): `GRANT`, account
/// statements that name a password (`CREATE USER`, `ALTER USER`, `SET PASSWORD`), anything
/// with `IDENTIFIED`, a `PASSWORD(...)`-like call, replication set-up (`CHANGE MASTER` with
/// its `MASTER_PASSWORD`), `CREATE/ALTER SERVER` (its `OPTIONS (PASSWORD ...)`), each statement
/// of a multi-statement, and a quoted string that holds such a statement (`PREPARE s FROM
/// '...'`, `EXECUTE IMMEDIATE '...'`, `SET @q = '...'`). Conservative: a column named
/// `password` that is called like a function is taken for one. Cheap for the statements that
/// name none of `identified`, `password` and `grant` (in any case): they are not lexed.
pub fn carries_secret(sql: &[u8]) -> bool {
    carries_secret_in(sql, lexer::Mode::DEFAULT)
}

/// [`carries_secret`] of text a session in `mode` sent.
pub fn carries_secret_in(sql: &[u8], mode: lexer::Mode) -> bool {
    // A statement that carries a secret names one of these words: most statements are done
    // here, without lexing. (CREATE/ALTER USER and CHANGE MASTER without any of them carry
    // none.)
    names_a_secret_word(sql) && secret_in(sql, true, mode)
}

/// [`carries_secret`] past its quick look; `strings`: look into quoted strings too.
fn secret_in(sql: &[u8], strings: bool, mode: lexer::Mode) -> bool {
    use crate::digest::{Part, parts_in};
    let word = |p: &Option<Part>, w: &str| matches!(p, Some(Part::Word(x)) if x.eq_ignore_ascii_case(w.as_bytes()));
    let leading = [("create", "user"), ("alter", "user"), ("set", "password"), ("change", "master"), ("change", "replication")];
    let servers = [("create", "server"), ("alter", "server")];
    // The first two words of each statement (`CREATE OR REPLACE X` counts as `CREATE X`).
    let (mut first, mut second, mut words) = (None, None, 0);
    let mut last = None;
    for p in parts_in(sql, mode) {
        let cur = Some(p);
        if matches!(p, Part::Keep(b";")) {
            (first, second, words) = (None, None, 0);
        } else if words < 2 && matches!(p, Part::Word(_)) && !(words == 1 && (word(&cur, "or") || word(&cur, "replace"))) {
            if words == 0 {
                first = cur;
            } else {
                second = cur;
            }
            words += 1;
            let pair = |(a, b): &(&str, &str)| word(&first, a) && word(&second, b);
            if word(&first, "grant") || leading.iter().any(pair) || servers.iter().any(pair) {
                return true;
            }
        }
        if word(&cur, "identified") || (matches!(p, Part::Keep(b"(")) && (word(&last, "password") || word(&last, "old_password"))) {
            return true;
        }
        last = cur;
    }
    // A string that is itself a statement (it begins with one's verb) and carries a secret.
    strings
        && quoted_strings(sql, mode)
            .any(|inner| names_a_secret_word(&inner) && begins_statement(&inner, mode) && secret_in(&inner, false, mode))
}

/// Whether `sql` begins with the verb of a statement.
fn begins_statement(sql: &[u8], mode: lexer::Mode) -> bool {
    const VERBS: &[&str] = &["select", "create", "alter", "set", "grant", "change", "insert", "update", "replace", "do", "call", "with"];
    matches!(crate::digest::parts_in(sql, mode).next(), Some(crate::digest::Part::Word(w)) if VERBS.iter().any(|v| w.eq_ignore_ascii_case(v.as_bytes())))
}

/// The contents of the quoted strings of `sql`, unquoted.
fn quoted_strings(sql: &[u8], mode: lexer::Mode) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut lex = lexer::Lexer::with_mode(sql, mode);
    std::iter::from_fn(move || {
        loop {
            let t = lex.next()?;
            if t.kind == Kind::Quoted
                && let Some(inner) = lexer::unquote_in(t.text(sql), mode)
            {
                return Some(inner);
            }
        }
    })
}

/// The name of the statement `EXECUTE name [USING ...]` runs (not `EXECUTE IMMEDIATE`),
/// lowercased as sluice keys SQL-prepared statements.
pub fn executed_name(sql: &[u8], mode: lexer::Mode) -> Option<String> {
    use crate::digest::{Part, parts_in};
    let mut it = parts_in(sql, mode);
    let (Some(Part::Word(first)), Some(second)) = (it.next(), it.next()) else { return None };
    if !first.eq_ignore_ascii_case(b"execute") {
        return None;
    }
    let name = match second {
        Part::Word(w) if !w.eq_ignore_ascii_case(b"immediate") => w.to_vec(),
        Part::Keep(q) if q.len() >= 2 && q[0] == b'`' => lexer::name(q),
        _ => return None,
    };
    Some(String::from_utf8_lossy(&name).to_ascii_lowercase())
}

/// Whether `sql` contains one of the words that a statement carrying a secret names, in any
/// case. Eight bytes at a time: a byte that may begin one (i, p or g in either case) is looked
/// at closely; most words of most statements have none.
fn names_a_secret_word(sql: &[u8]) -> bool {
    // (`CREATE SERVER` carries a secret only in its `PASSWORD` option: `password` finds it.)
    const WORDS: [&[u8]; 3] = [b"identified", b"password", b"grant"];
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    // (`| 0x20` maps an ASCII capital to its small letter, and no other byte to i, p or g.)
    let begins_one = |i: usize| {
        let c = sql[i] | 0x20;
        (c == b'i' || c == b'p' || c == b'g')
            && WORDS.iter().any(|w| w[0] == c && sql.get(i..i + w.len()).is_some_and(|x| x.eq_ignore_ascii_case(w)))
    };
    // The high bit of each byte of `y` that is zero (and maybe of some above one that is).
    let zeros = |y: u64| y.wrapping_sub(ONES) & !y & (ONES << 7);
    let mut at = 0;
    for eight in sql.chunks_exact(8) {
        let x = u64::from_le_bytes(eight.try_into().expect("eight bytes")) | (ONES * 0x20);
        let mut m = zeros(x ^ (ONES * u64::from(b'i'))) | zeros(x ^ (ONES * u64::from(b'p'))) | zeros(x ^ (ONES * u64::from(b'g')));
        while m != 0 {
            if begins_one(at + (m.trailing_zeros() / 8) as usize) {
                return true;
            }
            m &= m - 1;
        }
        at += 8;
    }
    (at..sql.len()).any(begins_one)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_collations() {
        let c = |s: &str| set_names_collation(s.as_bytes());
        assert_eq!(c("SET NAMES utf8mb4 COLLATE utf8mb4_bin").as_deref(), Some("utf8mb4_bin"));
        assert_eq!(c("set names 'utf8mb4' collate 'UTF8MB4_UNICODE_CI', time_zone = '+00:00'").as_deref(), Some("utf8mb4_unicode_ci"));
        assert_eq!(c("SET time_zone = '+00:00', NAMES latin1 COLLATE `latin1_bin`").as_deref(), Some("latin1_bin"));
        assert_eq!(c("SET NAMES utf8mb4"), None);
        assert_eq!(c("SET NAMES utf8mb4 COLLATE DEFAULT"), None);
        assert_eq!(c("SELECT 'SET NAMES a COLLATE b'"), None);
    }

    #[test]
    fn transaction_ends() {
        use TransactionEnd::*;
        for (sql, want) in [
            ("COMMIT", Ends),
            ("commit work", Ends),
            ("/* x */ ROLLBACK", Ends),
            ("ROLLBACK AND NO CHAIN RELEASE", Ends),
            ("COMMIT AND CHAIN", No),
            ("ROLLBACK TO SAVEPOINT a", Savepoint),
            ("ROLLBACK WORK TO a", Savepoint),
            ("SAVEPOINT a", Savepoint),
            ("release savepoint a", Savepoint),
            ("SELECT 'COMMIT'", No),
            ("", No),
        ] {
            assert_eq!(transaction_end(sql.as_bytes()), want, "{sql}");
        }
        for (sql, want) in
            [("COMMIT", true), ("/* x */ commit WORK", true), ("ROLLBACK", false), ("COMMIT AND CHAIN", false), ("SELECT 1", false)]
        {
            assert_eq!(commits(sql.as_bytes()), want, "{sql}");
        }
    }

    #[test]
    fn statements_that_may_carry_a_secret() {
        for sql in [
            "CREATE USER u IDENTIFIED BY 'pw'",
            "create user if not exists u@'%' identified via ed25519 using PASSWORD('pw')",
            "ALTER USER u IDENTIFIED BY 'pw'",
            "SET PASSWORD FOR u = PASSWORD('pw')",
            "set password = 'pw'",
            "GRANT ALL ON *.* TO u IDENTIFIED BY 'pw'",
            "grant select on t to u",
            "SELECT PASSWORD('pw')",
            "SELECT old_password ('pw')",
            "/* c */ CHANGE MASTER TO MASTER_PASSWORD = 'pw'",
            "CHANGE REPLICATION SOURCE TO SOURCE_PASSWORD = 'pw'",
            "INSERT INTO t SELECT 1 FROM u WHERE x IDENTIFIED",
            "select PassWord ('pw')",
            "SELECT 1; ALTER USER u IdEnTiFiEd BY 'pw'",
            &format!("GrAnT ALL ON *.* TO u /* {} */", "x".repeat(300)),
            "CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'u', PASSWORD 'pw')",
            "create or replace server s foreign data wrapper mysql options (password 'pw')",
            "ALTER SERVER s OPTIONS (PASSWORD 'pw')",
            "SELECT 1; CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (PASSWORD 'pw')",
            "PREPARE s FROM 'ALTER USER u IDENTIFIED BY ''pw'''",
            "EXECUTE IMMEDIATE 'CREATE USER u IDENTIFIED BY \\'pw\\''",
            "SET @q = 'SET PASSWORD FOR u = PASSWORD(''pw'')'",
            "CREATE OR REPLACE USER u IDENTIFIED BY 'pw'",
        ] {
            assert!(carries_secret(sql.as_bytes()), "{sql}");
        }
        for sql in [
            "SELECT password FROM users WHERE id = 1",
            "UPDATE users SET password = 'hash' WHERE id = 1",
            "SELECT 'IDENTIFIED BY', 'PASSWORD(1)'",
            "SELECT `password` (1)",
            "SET @user = 'create user'",
            "SELECT c FROM t WHERE id = 5 GROUP BY c",
            "SELECT @@server_id, 'the server'",
            "SELECT 'server password'",
            "CREATE USER u@'%'",
            &format!("SELECT '{}' FROM t WHERE id = 5", "x".repeat(300)),
            "",
        ] {
            assert!(!carries_secret(sql.as_bytes()), "{sql}");
        }
    }

    #[test]
    fn secret_words_are_found_at_any_offset_in_any_case() {
        for word in ["identified", "PASSWORD", "Grant", "gRaNt"] {
            for pad in 0..20 {
                for tail in ["", " ", "x1234567"] {
                    let sql = format!("{}{word}{tail}", "a".repeat(pad));
                    assert!(names_a_secret_word(sql.as_bytes()), "{sql:?}");
                    // One letter short, it is no word.
                    let short = format!("{}{}{tail}", "a".repeat(pad), &word[..word.len() - 1]);
                    assert!(!names_a_secret_word(short.as_bytes()), "{short:?}");
                }
            }
        }
        // Bytes whose `| 0x20` is not i, p or g, and bytes around them, find nothing.
        let noise: Vec<u8> = (0..=255u8).filter(|b| !matches!(b | 0x20, b'i' | b'p' | b'g')).collect();
        assert!(!names_a_secret_word(&noise));
        assert!(!names_a_secret_word(b"ipgIPGipg_pass_grand_identifie"));
    }

    fn kills(sql: &str) -> Vec<KillTarget> {
        find_kills(sql.as_bytes(), true).map(|k| k.found.into_iter().map(|f| f.target).collect()).unwrap_or_default()
    }

    fn id(query_only: bool, id: u64, hard: Option<bool>, at: Range<usize>) -> KillTarget {
        KillTarget::Id { kill: Kill { query_only, id, hard }, at }
    }

    #[test]
    fn kill_forms() {
        use KillTarget::*;
        assert_eq!(kills("KILL 5"), vec![id(false, 5, None, 5..6)]);
        assert_eq!(kills("  kill query 12 ;"), vec![id(true, 12, None, 13..15)]);
        assert_eq!(kills("/* x */ KILL HARD CONNECTION 7"), vec![id(false, 7, Some(true), 29..30)]);
        assert_eq!(kills("KILL SOFT QUERY 7"), vec![id(true, 7, Some(false), 16..17)]);
        assert_eq!(kills("KILL QUERY ID 7"), vec![QueryId]);
        assert_eq!(kills("KILL TIDB 5"), vec![id(false, 5, None, 10..11)]);
        assert_eq!(kills("kill tidb query 5"), vec![id(true, 5, None, 16..17)]);
        assert_eq!(kills("KILL USER bob"), vec![User]);
        assert_eq!(kills("KILL HARD USER 'bob'@'%'"), vec![User]);
        assert_eq!(kills("KILL CONNECTION_ID()"), vec![Own]);
        assert_eq!(kills("KILL ?"), vec![Placeholder]);
        assert_eq!(kills("KILL @id"), vec![Expression]);
        assert_eq!(kills("KILL 2+3"), vec![Expression]);
        assert_eq!(kills("KILL '5'"), vec![Expression]);
        assert_eq!(kills("KILL 99999999999"), vec![id(false, 99999999999, None, 5..16)]);
        assert_eq!(kills("KILL 99999999999999999999999"), vec![Expression]);
        assert_eq!(kills("KILL"), vec![]);
        assert_eq!(kills("SELECT 1"), vec![]);
        assert_eq!(kills("SELECT 'KILL 5', `kill`, skill FROM killed -- KILL 6"), vec![]);
    }

    #[test]
    fn kills_anywhere_in_a_query() {
        use KillTarget::*;
        let k = find_kills(b"KILL 2; SELECT 1", true).unwrap();
        assert_eq!((k.statements, k.found.len()), (2, 1));
        let k = find_kills(b"SELECT 1; kill query 3 ; KILL CONNECTION 4", true).unwrap();
        assert_eq!(k.found.iter().map(|f| f.statement.clone()).collect::<Vec<_>>(), vec![10..22, 25..42]);
        assert_eq!(kills("SELECT 1; kill query 3 ; KILL CONNECTION 4"), vec![id(true, 3, None, 21..22), id(false, 4, None, 41..42)]);
        assert_eq!(kills("/*!50000 KILL 5 */"), vec![id(false, 5, None, 14..15)]);
        assert_eq!(kills("/*M!100000 KILL */ 5"), vec![id(false, 5, None, 19..20)]);
        let k = find_kills(b"PREPARE s FROM 'KILL 5'", true).unwrap();
        assert_eq!(k.found, vec![Found { target: id(false, 5, None, 5..6), quoted: true, statement: 0..6 }]);
        assert_eq!(kills("EXECUTE IMMEDIATE \"KILL QUERY ?\" USING @x"), vec![Placeholder]);
        assert_eq!(kills("PREPARE s FROM 'KILL QUERY ID 7'"), vec![QueryId]);
        // Without multi-statements only the first statement can run.
        assert_eq!(find_kills(b"SELECT 1; KILL 5", false), None);
        assert!(find_kills(b"/* c */ KILL 5; SELECT 1", false).is_some());
        assert!(find_kills(b"  kill 5", false).is_some());
        assert!(find_kills(b"-- c\nKILL 5", false).is_some());
        assert!(find_kills(b"# c\nKILL 5", false).is_some());
        for n in 0..20 {
            let q = format!("SELECT {}; KILL 5", "x".repeat(n));
            assert!(find_kills(q.as_bytes(), true).is_some(), "{q}");
        }
        // A stored program's body runs later, on the server: its statements are not the query's.
        assert_eq!(kills("CREATE PROCEDURE p() BEGIN KILL 5; END"), vec![]);
    }

    #[test]
    fn kill_rewrite() {
        let mut out = Vec::new();
        write_kill(&Kill { query_only: true, id: 1, hard: Some(false) }, 99, &mut out);
        assert_eq!(out, b"KILL SOFT QUERY 99");
    }

    #[test]
    fn sql_prepares_that_can_be_followed() {
        assert_eq!(sql_prepare(b"PREPARE S1 FROM 'SELECT ? + 1'"), Some(SqlPrepare::Prepare(b"s1".to_vec())));
        assert_eq!(sql_prepare(b"/* x */ prepare `My s` from \"SELECT 1\";"), Some(SqlPrepare::Prepare(b"my s".to_vec())));
        assert_eq!(sql_prepare(b"DEALLOCATE PREPARE s1"), Some(SqlPrepare::Deallocate(b"s1".to_vec())));
        assert_eq!(sql_prepare(b"DROP PREPARE s1"), Some(SqlPrepare::Deallocate(b"s1".to_vec())));
        assert_eq!(sql_prepare(b"PREPARE s FROM @q"), None, "a text sluice does not know");
        assert_eq!(sql_prepare(b"PREPARE s FROM 'SELECT 1'; SELECT 2"), None, "among other statements");
        assert_eq!(sql_prepare(b"SELECT 'PREPARE s FROM x'"), None);
    }
}
