//! The session variables a `SET` assigns, for a server that does not report them (TiDB): sluice
//! reads their values back after the statement, as another connection must be given them.

use crate::lexer::{self, Kind, Token};

/// What `SET NAMES` and `SET CHARACTER SET` change: the connection's character sets and
/// collation.
pub const CONNECTION_CHARSETS: [&str; 4] =
    ["character_set_client", "character_set_connection", "character_set_results", "collation_connection"];

/// The session system variables that one `SET` statement assigns, lowercased, each once:
/// `SET [SESSION | LOCAL] a = 1, @@b = 2, @@session.c = 3`, `SET NAMES ...`, `SET CHARACTER SET
/// ...` (what [`CONNECTION_CHARSETS`] names). A `GLOBAL` (or `PERSIST`) assignment changes no
/// session's and is left out, as are user variables (`@x`). Empty for `USE`. None for any
/// other statement, and for a `SET` of anything else (`PASSWORD`, `ROLE`, `TRANSACTION`,
/// `STATEMENT ... FOR`) or of a form sluice does not know.
pub fn set_system_variables(sql: &[u8]) -> Option<Vec<String>> {
    let mut all = lexer::statements(sql);
    let (Some(st), None) = (all.next(), all.next()) else { return None };
    let (first, rest) = st.split_first()?;
    if first.is_word(sql, "USE") {
        return Some(Vec::new());
    }
    if !first.is_word(sql, "SET") || rest.is_empty() {
        return None;
    }
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: &str| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    };
    // The scope the last modifier gave (it holds for the assignments after it).
    let mut session = true;
    for mut a in assignments(sql, rest) {
        let word = |a: &[Token], i: usize, kws: &[&str]| a.get(i).is_some_and(|t| kws.iter().any(|k| t.is_word(sql, k)));
        if word(a, 0, &["GLOBAL", "PERSIST", "PERSIST_ONLY"]) {
            session = false;
            a = &a[1..];
        } else if word(a, 0, &["SESSION", "LOCAL"]) {
            session = true;
            a = &a[1..];
        }
        let (target, value) = a.split_first()?;
        if word(a, 0, &["NAMES", "CHARSET"]) || (word(a, 0, &["CHARACTER"]) && word(a, 1, &["SET"])) {
            CONNECTION_CHARSETS.iter().for_each(|n| add(n));
            continue;
        }
        if !assigns(sql, value) {
            return None;
        }
        match target.kind {
            // (A user variable's value is read back by its own means: `uservar`.)
            Kind::Variable if !target.text(sql).starts_with(b"@@") => {}
            Kind::Word if !word(a, 0, &["PASSWORD", "ROLE", "DEFAULT", "TRANSACTION", "STATEMENT"]) => {
                if session {
                    add(&String::from_utf8_lossy(target.text(sql)).to_ascii_lowercase());
                }
            }
            Kind::Variable => {
                let (global, name) = system_variable(target.text(sql))?;
                if !global {
                    add(&name);
                }
            }
            _ => return None,
        }
    }
    Some(names)
}

/// The assignments of a `SET` (the tokens after it), split at the commas outside parentheses.
fn assignments<'t>(sql: &[u8], tokens: &'t [Token]) -> impl Iterator<Item = &'t [Token]> {
    let mut depth = 0usize;
    tokens.split(move |t| {
        if t.is_punct(sql, b'(') {
            depth += 1;
        } else if t.is_punct(sql, b')') {
            depth = depth.saturating_sub(1);
        }
        depth == 0 && t.is_punct(sql, b',')
    })
}

/// Whether the tokens after a variable's name begin with `=` or `:=`, and a value follows.
fn assigns(sql: &[u8], after: &[Token]) -> bool {
    match after {
        [eq, _, ..] if eq.is_punct(sql, b'=') => true,
        [colon, eq, _, ..] => colon.is_punct(sql, b':') && eq.is_punct(sql, b'='),
        _ => false,
    }
}

/// A `@@[scope.]name` token: whether its scope is global, and its name (lowercased). None for
/// a user variable (`@name`).
fn system_variable(text: &[u8]) -> Option<(bool, String)> {
    let body = text.strip_prefix(b"@@")?;
    let (global, name) = match body.iter().position(|&c| c == b'.') {
        Some(dot) => {
            let scope = &body[..dot];
            let global = ["global", "persist", "persist_only"].iter().any(|s| scope.eq_ignore_ascii_case(s.as_bytes()));
            if !global && !scope.eq_ignore_ascii_case(b"session") && !scope.eq_ignore_ascii_case(b"local") {
                return None;
            }
            (global, &body[dot + 1..])
        }
        None => (false, body),
    };
    let name = lexer::name(name);
    (!name.is_empty()).then(|| (global, String::from_utf8_lossy(&name).to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sql: &str) -> Option<Vec<String>> {
        set_system_variables(sql.as_bytes())
    }

    #[test]
    fn a_set_names_the_session_variables_it_assigns() {
        let v = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(names("SET time_zone = '+03:00'"), v(&["time_zone"]));
        assert_eq!(
            names("set SESSION sql_mode = 'ANSI', @@autocommit := 0, @@session.Wait_Timeout = 60;"),
            v(&["sql_mode", "autocommit", "wait_timeout"])
        );
        assert_eq!(names("SET @@local.max_join_size = DEFAULT"), v(&["max_join_size"]));
        assert_eq!(names("SET @@session.`time_zone` = 0"), None, "(a quoted name: not followed)");
        assert_eq!(names("SET sql_mode = CONCAT(@@sql_mode, ',ANSI'), time_zone = 'UTC'"), v(&["sql_mode", "time_zone"]));
        assert_eq!(names("SET NAMES utf8mb4 COLLATE utf8mb4_bin, time_zone = 'UTC'").map(|l| l.len()), Some(5));
        assert_eq!(names("SET CHARACTER SET latin1"), v(&CONNECTION_CHARSETS));
        assert_eq!(names("SET GLOBAL max_connections = 10, wait_timeout = 5, SESSION sql_mode = ''"), v(&["sql_mode"]));
        assert_eq!(names("SET @@global.max_connections = 10"), v(&[]));
        assert_eq!(names("USE test"), v(&[]));
        assert_eq!(names("SET @x = 1, time_zone = 'UTC', @`y` := 2"), v(&["time_zone"]));
        assert_eq!(names("SET @x = 1"), v(&[]));
    }

    #[test]
    fn anything_else_is_unknown() {
        for sql in [
            "SET PASSWORD = 'x'",
            "SET ROLE r",
            "SET DEFAULT ROLE r FOR u",
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
            "SET SESSION TRANSACTION READ ONLY",
            "SET STATEMENT max_statement_time = 1 FOR SELECT 1",
            "SET time_zone",
            "SET",
            "SET a = 1; SET b = 2",
            "SELECT 1",
            "SET @@foo.bar = 1",
        ] {
            assert_eq!(names(sql), None, "{sql}");
        }
    }
}
