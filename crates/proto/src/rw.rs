//! Read/write classification for the read/write split, on the lexer (no parser, no allocation):
//! where a statement may run. A statement goes to a replica only when sluice is sure that it
//! reads and changes nothing, and that any replica gives the answer the primary would; anything
//! else, and anything it is unsure of, goes to the primary.

use std::iter::Peekable;

use crate::lexer::{Kind, Lexer, Token};

/// Where a statement may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A read with no side effect: a replica may answer it.
    Read,
    /// Reads what the statement before it left on its connection (`FOUND_ROWS()`,
    /// `ROW_COUNT()`, `SHOW WARNINGS`, `GET DIAGNOSTICS`): it runs where that one ran.
    Previous,
    /// Changes the session's state only (`SET` of session variables, `SET NAMES`, `USE`): the
    /// change reaches every connection the session uses.
    Session,
    /// Begins a transaction; `read_only`: `START TRANSACTION READ ONLY`.
    Begin { read_only: bool },
    /// Only the primary may run it, for this reason.
    Primary(Why),
}

/// Why a statement must run on the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// It changes data or schema, or is no statement sluice knows to be a read.
    Write,
    /// It ends or shapes a transaction (`COMMIT`, `SET TRANSACTION`, `SAVEPOINT`, ...).
    Transaction,
    /// `SELECT ... FOR UPDATE`, `FOR SHARE`, `LOCK IN SHARE MODE`.
    LockingRead,
    /// `SELECT ... INTO` variables or a file.
    Into,
    /// Locks or sequences: state on the server that outlives the statement.
    SideEffect,
    /// It reads `LAST_INSERT_ID()`, which only the connection that inserted knows.
    LastInsertId,
    /// It assigns a user variable.
    UserVariable,
    /// `CALL`: a procedure may write.
    Procedure,
    /// It calls a function sluice does not know to be free of side effects (a stored function
    /// may write).
    Function,
    /// It reads what differs from server to server (`@@` variables, `SHOW STATUS`, the process
    /// list, replication status, ...).
    ServerSpecific,
    /// Several statements, not all of them reads.
    Multi,
}

type Tokens<'a> = Peekable<Lexer<'a>>;

/// Classifies a query (one statement, or several separated by `;`: reads only if all are).
pub fn classify(sql: &[u8]) -> Class {
    classify_in(sql, crate::lexer::Mode::DEFAULT)
}

/// [`classify`] of text a session in `mode` sent.
pub fn classify_in(sql: &[u8], mode: crate::lexer::Mode) -> Class {
    let mut tokens = Lexer::with_mode(sql, mode).peekable();
    let mut found: Option<Class> = None;
    while tokens.peek().is_some() {
        let Some(c) = statement(sql, &mut tokens) else { continue };
        found = Some(match found {
            None => c,
            Some(Class::Read) if c == Class::Read => Class::Read,
            Some(_) => Class::Primary(Why::Multi),
        });
    }
    found.unwrap_or(Class::Primary(Why::Write))
}

/// Classifies the next statement and consumes it with its `;`; None for an empty one.
fn statement(sql: &[u8], t: &mut Tokens<'_>) -> Option<Class> {
    let mut first = t.next()?;
    while first.is_punct(sql, b'(') {
        first = t.next()?;
    }
    if first.is_punct(sql, b';') {
        return None;
    }
    let is = |kws: &[&str]| kws.iter().any(|k| first.is_word(sql, k));
    let class = if is(&["SELECT", "VALUES", "TABLE", "WITH"]) {
        return Some(read(sql, t));
    } else if is(&["SHOW"]) {
        show(sql, t)
    } else if is(&["SET"]) {
        return Some(set(sql, t));
    } else if is(&["DESCRIBE", "DESC", "EXPLAIN", "HELP"]) {
        Class::Read
    } else if is(&["USE"]) {
        Class::Session
    } else if is(&["BEGIN"]) {
        if next_is(sql, t, "NOT") { Class::Primary(Why::Write) } else { Class::Begin { read_only: false } }
    } else if is(&["START"]) {
        return Some(start(sql, t));
    } else if is(&["COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "XA"]) {
        Class::Primary(Why::Transaction)
    } else if is(&["GET"]) {
        if next_is(sql, t, "DIAGNOSTICS") || next_is(sql, t, "CURRENT") { Class::Previous } else { Class::Primary(Why::Write) }
    } else if is(&["CALL"]) {
        Class::Primary(Why::Procedure)
    } else {
        Class::Primary(Why::Write)
    };
    skip_rest(sql, t);
    Some(class)
}

fn next_is(sql: &[u8], t: &mut Tokens<'_>, kw: &str) -> bool {
    t.peek().is_some_and(|n| n.is_word(sql, kw))
}

/// Consumes the rest of the statement and its `;`.
fn skip_rest(sql: &[u8], t: &mut Tokens<'_>) {
    for tok in t.by_ref() {
        if tok.is_punct(sql, b';') {
            return;
        }
    }
}

/// The rest of a `SELECT`, `VALUES`, `TABLE` or `WITH` statement: a read unless something in it
/// says otherwise. The first reason for the primary wins.
fn read(sql: &[u8], t: &mut Tokens<'_>) -> Class {
    let mut class = Class::Read;
    let mut prev: Option<Token> = None;
    while let Some(tok) = t.next() {
        if tok.is_punct(sql, b';') {
            break;
        }
        let next = t.peek();
        let found = match tok.kind {
            Kind::Variable => variable(sql, &tok, next),
            Kind::Word => word_in_read(sql, &tok, prev.as_ref(), next),
            _ => None,
        };
        match (class, found) {
            (Class::Primary(_), _) | (_, None) => {}
            (_, Some(c)) => class = c,
        }
        prev = Some(tok);
    }
    class
}

/// `@@name` differs between servers; `@name :=` assigns a user variable.
#[inline]
fn variable(sql: &[u8], tok: &Token, next: Option<&Token>) -> Option<Class> {
    if tok.text(sql).starts_with(b"@@") {
        Some(Class::Primary(Why::ServerSpecific))
    } else if next.is_some_and(|n| n.is_punct(sql, b':')) {
        Some(Class::Primary(Why::UserVariable))
    } else {
        None
    }
}

#[inline]
fn word_in_read(sql: &[u8], tok: &Token, prev: Option<&Token>, next: Option<&Token>) -> Option<Class> {
    let text = tok.text(sql);
    let prev_is = |kw: &str| prev.is_some_and(|p| p.is_word(sql, kw));
    if next.is_some_and(|n| n.is_punct(sql, b'(')) {
        return function(text, prev.is_some_and(|p| p.is_punct(sql, b'.')));
    }
    let eq = |kw: &[u8]| text.eq_ignore_ascii_case(kw);
    let locking = || prev_is("FOR") || prev_is("IN");
    // (By length first: most words are none of these, and are passed over at once.)
    let why = match text.len() {
        4 if eq(b"INTO") => Why::Into,
        5 if eq(b"SHARE") && locking() => Why::LockingRead,
        6 if eq(b"UPDATE") && locking() => Why::LockingRead,
        5 if eq(b"VALUE") && (prev_is("NEXT") || prev_is("PREVIOUS")) => Why::SideEffect,
        // The statement of a WITH, or data-changing words anywhere else.
        6 if eq(b"INSERT") || eq(b"UPDATE") || eq(b"DELETE") => Why::Write,
        7 if eq(b"REPLACE") => Why::Write,
        _ => return None,
    };
    Some(Class::Primary(why))
}

/// A word followed by `(`: a keyword, a function known to be free of side effects, or not.
fn function(name: &[u8], qualified: bool) -> Option<Class> {
    if qualified {
        return Some(Class::Primary(Why::Function));
    }
    let mut buf = [0u8; 32];
    let Some(upper) = buf.get_mut(..name.len()) else { return Some(Class::Primary(Why::Function)) };
    upper.copy_from_slice(name);
    upper.make_ascii_uppercase();
    let upper: &[u8] = upper;
    match upper {
        b"LAST_INSERT_ID" => Some(Class::Primary(Why::LastInsertId)),
        b"FOUND_ROWS" | b"ROW_COUNT" => Some(Class::Previous),
        b"GET_LOCK" | b"RELEASE_LOCK" | b"RELEASE_ALL_LOCKS" | b"IS_FREE_LOCK" | b"IS_USED_LOCK" | b"NEXTVAL" | b"LASTVAL" | b"SETVAL" => {
            Some(Class::Primary(Why::SideEffect))
        }
        b"CONNECTION_ID" | b"MASTER_GTID_WAIT" | b"MASTER_POS_WAIT" | b"LOAD_FILE" => Some(Class::Primary(Why::ServerSpecific)),
        _ if BEFORE_PARENTHESIS.binary_search(&upper).is_ok() || PURE_FUNCTIONS.binary_search(&upper).is_ok() => None,
        _ => Some(Class::Primary(Why::Function)),
    }
}

/// Keywords a `(` may follow in a read (sorted).
const BEFORE_PARENTHESIS: &[&[u8]] = &[
    b"AGAINST",
    b"ALL",
    b"AND",
    b"ANY",
    b"AS",
    b"BETWEEN",
    b"BY",
    b"CASE",
    b"DISTINCT",
    b"DIV",
    b"ELSE",
    b"EXCEPT",
    b"EXISTS",
    b"FROM",
    b"HAVING",
    b"IN",
    b"INDEX",
    b"INTERSECT",
    b"INTERVAL",
    b"IS",
    b"JOIN",
    b"KEY",
    b"LATERAL",
    b"LIKE",
    b"LIMIT",
    b"NOT",
    b"OFFSET",
    b"ON",
    b"OR",
    b"OVER",
    b"PARTITION",
    b"RECURSIVE",
    b"REGEXP",
    b"RLIKE",
    b"ROW",
    b"SELECT",
    b"SOME",
    b"THEN",
    b"UNION",
    b"USING",
    b"VALUES",
    b"WHEN",
    b"WHERE",
    b"WINDOW",
    b"WITH",
    b"XOR",
];

/// Built-in functions that read nothing but their arguments and change nothing (sorted).
const PURE_FUNCTIONS: &[&[u8]] = &[
    b"ABS",
    b"ACOS",
    b"ADDDATE",
    b"ADDTIME",
    b"AES_DECRYPT",
    b"AES_ENCRYPT",
    b"ASCII",
    b"ASIN",
    b"ATAN",
    b"ATAN2",
    b"AVG",
    b"BIN",
    b"BINARY",
    b"BIT_AND",
    b"BIT_COUNT",
    b"BIT_LENGTH",
    b"BIT_OR",
    b"BIT_XOR",
    b"CAST",
    b"CEIL",
    b"CEILING",
    b"CHAR",
    b"CHARACTER_LENGTH",
    b"CHARSET",
    b"CHAR_LENGTH",
    b"COALESCE",
    b"COERCIBILITY",
    b"COLLATION",
    b"COMPRESS",
    b"CONCAT",
    b"CONCAT_WS",
    b"CONV",
    b"CONVERT",
    b"CONVERT_TZ",
    b"COS",
    b"COT",
    b"COUNT",
    b"CRC32",
    b"CUME_DIST",
    b"CURDATE",
    b"CURRENT_DATE",
    b"CURRENT_ROLE",
    b"CURRENT_TIME",
    b"CURRENT_TIMESTAMP",
    b"CURRENT_USER",
    b"CURTIME",
    b"DATABASE",
    b"DATE",
    b"DATEDIFF",
    b"DATE_ADD",
    b"DATE_FORMAT",
    b"DATE_SUB",
    b"DAY",
    b"DAYNAME",
    b"DAYOFMONTH",
    b"DAYOFWEEK",
    b"DAYOFYEAR",
    b"DEGREES",
    b"DENSE_RANK",
    b"ELT",
    b"EXP",
    b"EXPORT_SET",
    b"EXTRACT",
    b"FIELD",
    b"FIND_IN_SET",
    b"FIRST_VALUE",
    b"FLOOR",
    b"FORMAT",
    b"FROM_BASE64",
    b"FROM_DAYS",
    b"FROM_UNIXTIME",
    b"GREATEST",
    b"GROUP_CONCAT",
    b"HEX",
    b"HOUR",
    b"IF",
    b"IFNULL",
    b"INET6_ATON",
    b"INET6_NTOA",
    b"INET_ATON",
    b"INET_NTOA",
    b"INSTR",
    b"ISNULL",
    b"JSON_ARRAY",
    b"JSON_ARRAYAGG",
    b"JSON_ARRAY_APPEND",
    b"JSON_ARRAY_INSERT",
    b"JSON_COMPACT",
    b"JSON_CONTAINS",
    b"JSON_CONTAINS_PATH",
    b"JSON_DEPTH",
    b"JSON_DETAILED",
    b"JSON_EXISTS",
    b"JSON_EXTRACT",
    b"JSON_INSERT",
    b"JSON_KEYS",
    b"JSON_LENGTH",
    b"JSON_MERGE",
    b"JSON_MERGE_PATCH",
    b"JSON_MERGE_PRESERVE",
    b"JSON_OBJECT",
    b"JSON_OBJECTAGG",
    b"JSON_QUERY",
    b"JSON_QUOTE",
    b"JSON_REMOVE",
    b"JSON_REPLACE",
    b"JSON_SEARCH",
    b"JSON_SET",
    b"JSON_TABLE",
    b"JSON_TYPE",
    b"JSON_UNQUOTE",
    b"JSON_VALID",
    b"JSON_VALUE",
    b"LAG",
    b"LAST_DAY",
    b"LAST_VALUE",
    b"LCASE",
    b"LEAD",
    b"LEAST",
    b"LEFT",
    b"LENGTH",
    b"LN",
    b"LOCALTIME",
    b"LOCALTIMESTAMP",
    b"LOCATE",
    b"LOG",
    b"LOG10",
    b"LOG2",
    b"LOWER",
    b"LPAD",
    b"LTRIM",
    b"MAKEDATE",
    b"MAKETIME",
    b"MAKE_SET",
    b"MATCH",
    b"MAX",
    b"MD5",
    b"MICROSECOND",
    b"MID",
    b"MIN",
    b"MINUTE",
    b"MOD",
    b"MONTH",
    b"MONTHNAME",
    b"NOW",
    b"NTH_VALUE",
    b"NTILE",
    b"NULLIF",
    b"OCT",
    b"OCTET_LENGTH",
    b"ORD",
    b"PERCENT_RANK",
    b"PERIOD_ADD",
    b"PERIOD_DIFF",
    b"PI",
    b"POSITION",
    b"POW",
    b"POWER",
    b"QUARTER",
    b"QUOTE",
    b"RADIANS",
    b"RAND",
    b"RANK",
    b"REGEXP_INSTR",
    b"REGEXP_REPLACE",
    b"REGEXP_SUBSTR",
    b"REPEAT",
    b"REPLACE",
    b"REVERSE",
    b"RIGHT",
    b"ROUND",
    b"ROW_NUMBER",
    b"RPAD",
    b"RTRIM",
    b"SCHEMA",
    b"SECOND",
    b"SEC_TO_TIME",
    b"SESSION_USER",
    b"SHA",
    b"SHA1",
    b"SHA2",
    b"SIGN",
    b"SIN",
    b"SOUNDEX",
    b"SPACE",
    b"SQRT",
    b"STD",
    b"STDDEV",
    b"STDDEV_POP",
    b"STDDEV_SAMP",
    b"STRCMP",
    b"STR_TO_DATE",
    b"SUBDATE",
    b"SUBSTR",
    b"SUBSTRING",
    b"SUBSTRING_INDEX",
    b"SUBTIME",
    b"SUM",
    b"SYSDATE",
    b"SYSTEM_USER",
    b"TAN",
    b"TIME",
    b"TIMEDIFF",
    b"TIMESTAMP",
    b"TIMESTAMPADD",
    b"TIMESTAMPDIFF",
    b"TIME_FORMAT",
    b"TIME_TO_SEC",
    b"TO_BASE64",
    b"TO_DAYS",
    b"TO_SECONDS",
    b"TRIM",
    b"TRUNCATE",
    b"UCASE",
    b"UNCOMPRESS",
    b"UNHEX",
    b"UNIX_TIMESTAMP",
    b"UPPER",
    b"USER",
    b"UTC_DATE",
    b"UTC_TIME",
    b"UTC_TIMESTAMP",
    b"UUID",
    b"UUID_SHORT",
    b"VARIANCE",
    b"VAR_POP",
    b"VAR_SAMP",
    b"WEEK",
    b"WEEKDAY",
    b"WEEKOFYEAR",
    b"YEAR",
    b"YEARWEEK",
];

/// `SHOW ...`: metadata that replicates reads anywhere; warnings belong to the statement before;
/// the rest (status, variables, processes, replication) differs from server to server.
fn show(sql: &[u8], t: &mut Tokens<'_>) -> Class {
    let Some(w1) = t.next() else { return Class::Primary(Why::ServerSpecific) };
    let w2 = t.peek().cloned();
    let is = |tok: &Token, kws: &[&str]| kws.iter().any(|k| tok.is_word(sql, k));
    if is(&w1, &["WARNINGS", "ERRORS", "COUNT"]) {
        Class::Previous
    } else if is(
        &w1,
        &[
            "TABLES",
            "COLUMNS",
            "FIELDS",
            "INDEX",
            "INDEXES",
            "KEYS",
            "DATABASES",
            "SCHEMAS",
            "COLLATION",
            "CHARACTER",
            "CHARSET",
            "TRIGGERS",
        ],
    ) || (is(&w1, &["FULL"]) && w2.as_ref().is_some_and(|w| is(w, &["TABLES", "COLUMNS", "FIELDS"])))
        || (is(&w1, &["TABLE"]) && w2.as_ref().is_some_and(|w| is(w, &["STATUS"])))
        || (is(&w1, &["CREATE"])
            && w2.as_ref().is_some_and(|w| is(w, &["TABLE", "VIEW", "DATABASE", "SCHEMA", "PROCEDURE", "FUNCTION", "TRIGGER", "SEQUENCE"])))
    {
        Class::Read
    } else {
        Class::Primary(Why::ServerSpecific)
    }
}

/// `SET ...`: session state, unless it names the next transaction, a global, a user variable,
/// a password or a role.
fn set(sql: &[u8], t: &mut Tokens<'_>) -> Class {
    let mut class = match t.peek() {
        Some(w) if ["TRANSACTION"].iter().any(|k| w.is_word(sql, k)) => Class::Primary(Why::Transaction),
        Some(w) if ["STATEMENT", "PASSWORD", "ROLE", "DEFAULT"].iter().any(|k| w.is_word(sql, k)) => Class::Primary(Why::Write),
        _ => Class::Session,
    };
    for tok in t.by_ref() {
        if tok.is_punct(sql, b';') {
            break;
        }
        let text = tok.text(sql);
        let global = tok.is_word(sql, "GLOBAL")
            || tok.is_word(sql, "PERSIST")
            || (tok.kind == Kind::Variable && text.len() > 9 && text[..9].eq_ignore_ascii_case(b"@@global."));
        if class == Class::Session && global {
            class = Class::Primary(Why::Write);
        } else if class == Class::Session && tok.kind == Kind::Variable && !text.starts_with(b"@@") {
            class = Class::Primary(Why::UserVariable);
        }
    }
    class
}

/// `START TRANSACTION [READ ONLY | READ WRITE | WITH CONSISTENT SNAPSHOT], ...`; any other
/// `START` (a replica's threads) is for the primary's administrator.
fn start(sql: &[u8], t: &mut Tokens<'_>) -> Class {
    if !next_is(sql, t, "TRANSACTION") {
        skip_rest(sql, t);
        return Class::Primary(Why::Write);
    }
    let mut read_only = false;
    let mut prev_read = false;
    for tok in t.by_ref() {
        if tok.is_punct(sql, b';') {
            break;
        }
        read_only |= prev_read && tok.is_word(sql, "ONLY");
        prev_read = tok.is_word(sql, "READ");
    }
    Class::Begin { read_only }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lists_are_sorted() {
        assert!(BEFORE_PARENTHESIS.windows(2).all(|w| w[0] < w[1]));
        assert!(PURE_FUNCTIONS.windows(2).all(|w| w[0] < w[1]), "{:?}", PURE_FUNCTIONS.windows(2).find(|w| w[0] >= w[1]));
    }

    #[test]
    fn classification_table() {
        use Class::*;
        use Why::*;
        let table: &[(&str, Class)] = &[
            // Reads.
            ("SELECT c FROM sbtest1 WHERE id=10", Read),
            ("select sum(k) from sbtest1 where id between 1 and 100", Read),
            ("SELECT DISTINCT c FROM t WHERE id BETWEEN 1 AND 9 ORDER BY c", Read),
            ("(SELECT 1) UNION (SELECT 2)", Read),
            ("SELECT COUNT(*), MAX(id), CONCAT(a, b) FROM t WHERE x IN (1, 2) AND EXISTS (SELECT 1)", Read),
            ("SELECT * FROM t FORCE INDEX (k) JOIN u USING (id)", Read),
            ("SELECT @v", Read),
            ("SELECT 'FOR UPDATE', `into` FROM t -- INTO @x", Read),
            ("SELECT /* INTO @x */ 1", Read),
            ("WITH c AS (SELECT 1) SELECT * FROM c", Read),
            ("VALUES (1), (2)", Read),
            ("SHOW TABLES", Read),
            ("SHOW FULL COLUMNS FROM t", Read),
            ("SHOW CREATE TABLE t", Read),
            ("DESCRIBE t", Read),
            ("EXPLAIN SELECT 1", Read),
            ("SELECT 1; SELECT 2", Read),
            ("SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 1", Read),
            // Reads that must run elsewhere.
            ("SELECT * FROM t FOR UPDATE", Primary(LockingRead)),
            ("SELECT * FROM t WHERE id = 1 LOCK IN SHARE MODE", Primary(LockingRead)),
            ("SELECT * FROM t FOR SHARE", Primary(LockingRead)),
            ("SELECT c INTO @x FROM t", Primary(Into)),
            ("SELECT * FROM t INTO OUTFILE '/tmp/x'", Primary(Into)),
            ("SELECT GET_LOCK('a', 1)", Primary(SideEffect)),
            ("SELECT NEXTVAL(s)", Primary(SideEffect)),
            ("SELECT NEXT VALUE FOR s", Primary(SideEffect)),
            ("SELECT LAST_INSERT_ID()", Primary(LastInsertId)),
            ("SELECT @v := 1", Primary(UserVariable)),
            ("SELECT my_function(1)", Primary(Function)),
            ("SELECT db.f(1)", Primary(Function)),
            ("SELECT @@read_only", Primary(ServerSpecific)),
            ("SELECT CONNECTION_ID()", Primary(ServerSpecific)),
            ("SHOW STATUS", Primary(ServerSpecific)),
            ("SHOW PROCESSLIST", Primary(ServerSpecific)),
            ("SHOW SLAVE STATUS", Primary(ServerSpecific)),
            ("WITH c AS (SELECT 1) UPDATE t SET a = 1", Primary(Write)),
            ("SELECT FOUND_ROWS()", Previous),
            ("SELECT ROW_COUNT()", Previous),
            ("SHOW WARNINGS", Previous),
            ("SHOW COUNT(*) ERRORS", Previous),
            ("GET DIAGNOSTICS CONDITION 1 @p = MESSAGE_TEXT", Previous),
            // Writes and the rest.
            ("INSERT INTO t VALUES (1)", Primary(Write)),
            ("update t set a = 1", Primary(Write)),
            ("DELETE FROM t", Primary(Write)),
            ("REPLACE INTO t VALUES (1)", Primary(Write)),
            ("CREATE TABLE t (id INT)", Primary(Write)),
            ("CREATE TEMPORARY TABLE t (id INT)", Primary(Write)),
            ("LOCK TABLES t READ", Primary(Write)),
            ("DO GET_LOCK('a', 1)", Primary(Write)),
            ("CALL p()", Primary(Procedure)),
            ("BEGIN NOT ATOMIC SELECT 1; END", Primary(Multi)),
            ("SELECT 1; INSERT INTO t VALUES (1)", Primary(Multi)),
            ("FLUSH TABLES", Primary(Write)),
            ("", Primary(Write)),
            ("garbage ' unterminated", Primary(Write)),
            // Transactions.
            ("BEGIN", Begin { read_only: false }),
            ("START TRANSACTION", Begin { read_only: false }),
            ("START TRANSACTION READ ONLY", Begin { read_only: true }),
            ("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY", Begin { read_only: true }),
            ("START TRANSACTION READ WRITE", Begin { read_only: false }),
            ("START SLAVE", Primary(Write)),
            ("COMMIT", Primary(Transaction)),
            ("ROLLBACK", Primary(Transaction)),
            ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", Primary(Transaction)),
            // Session state.
            ("SET autocommit = 0", Session),
            ("SET NAMES utf8mb4", Session),
            ("SET SESSION sql_mode = ''", Session),
            ("SET @@session.wait_timeout = 10", Session),
            ("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", Session),
            ("USE test", Session),
            ("SET GLOBAL max_connections = 10", Primary(Write)),
            ("SET @@global.max_connections = 10", Primary(Write)),
            ("SET @v = 1", Primary(UserVariable)),
            ("SET a = 1, @v = 2", Primary(UserVariable)),
            ("SET PASSWORD = PASSWORD('x')", Primary(Write)),
            ("SET STATEMENT max_statement_time = 1 FOR SELECT 1", Primary(Write)),
        ];
        for (sql, want) in table {
            assert_eq!(classify(sql.as_bytes()), *want, "{sql}");
        }
    }
}
