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
    /// How many statements of the query come before its own.
    pub index: usize,
}

/// The KILL statements of a COM_QUERY or COM_STMT_PREPARE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kills {
    /// How many statements the text has (more than one: a multi-statement).
    pub statements: usize,
    /// How many statements from the first answer with one result each: a `CALL` or an
    /// `EXECUTE` may answer with several, so where the statements after it begin cannot be
    /// told from the response.
    pub single_results: usize,
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
    let mut several = false;
    for st in lexer::statements_in(sql, mode).take(if multi { usize::MAX } else { 1 }) {
        let index = kills.statements;
        kills.statements += 1;
        several |= st.first().is_some_and(|t| t.is_word(sql, "CALL") || t.is_word(sql, "EXECUTE"));
        kills.single_results += usize::from(!several);
        if let Some(target) = kill_statement(sql, &st) {
            kills.found.push(Found { target, quoted: false, statement: span(&st), index });
        } else if let Some(text) = prepared_text(sql, &st, mode) {
            for inner in lexer::statements_in(&text, mode).take(1) {
                if let Some(target) = kill_statement(&text, &inner) {
                    kills.found.push(Found { target, quoted: true, statement: span(&inner), index });
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
        assert_eq!(k.found.iter().map(|f| f.index).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!((k.statements, k.single_results), (3, 3));
        let k = find_kills(b"SELECT 1; CALL p(); KILL 5", true).unwrap();
        assert_eq!((k.statements, k.single_results), (3, 1));
        assert_eq!(kills("SELECT 1; kill query 3 ; KILL CONNECTION 4"), vec![id(true, 3, None, 21..22), id(false, 4, None, 41..42)]);
        assert_eq!(kills("/*!50000 KILL 5 */"), vec![id(false, 5, None, 14..15)]);
        assert_eq!(kills("/*M!100000 KILL */ 5"), vec![id(false, 5, None, 19..20)]);
        let k = find_kills(b"PREPARE s FROM 'KILL 5'", true).unwrap();
        assert_eq!(k.found, vec![Found { target: id(false, 5, None, 5..6), quoted: true, statement: 0..6, index: 0 }]);
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
