//! Session state a statement leaves on its connection that sluice cannot recreate elsewhere:
//! the [`hazard`] bits, found in one pass over the text, and the user variables it names.

use crate::lexer::{self, Kind, Token};

/// Session state a statement may leave on its backend connection that sluice does not track and
/// so cannot recreate elsewhere. Bits of [`hazards`]'s result.
pub mod hazard {
    /// A user variable (`@name`) is read or written.
    pub const USER_VARIABLE: u16 = 1;
    /// `TEMPORARY` (a temporary table lives on its connection).
    pub const TEMPORARY_TABLE: u16 = 2;
    /// `GET_LOCK(...)`, `LOCK TABLE(S)`, `FLUSH ... WITH READ LOCK`, `BACKUP LOCK`, `BACKUP STAGE`.
    pub const LOCK: u16 = 4;
    /// SQL-level `PREPARE` (the statement lives on its connection).
    pub const SQL_PREPARE: u16 = 8;
    /// `HANDLER` (an open table handler lives on its connection).
    pub const HANDLER: u16 = 16;
    /// `XA` (a prepared XA transaction stays with its connection).
    pub const XA: u16 = 32;
    /// Hazards that last until the session's state is reset.
    pub const LASTING: u16 = USER_VARIABLE | TEMPORARY_TABLE | LOCK | SQL_PREPARE | HANDLER | XA;
    /// `SET TRANSACTION` without `SESSION`: it applies to the connection's next transaction.
    pub const SET_TRANSACTION: u16 = 64;
    /// `SQL_CALC_FOUND_ROWS`: the next statement may read `FOUND_ROWS()`.
    pub const FOUND_ROWS: u16 = 128;
    /// `ROW_COUNT()` is read: the statement before it must have run on the same connection.
    pub const ROW_COUNT: u16 = 256;
    /// `KILL` is named (in code, or in SQL run from a literal). No pin: a text without it needs
    /// no KILL look-up ([`find_kills`](crate::sql::find_kills)).
    pub const KILL: u16 = 512;
}

/// Scans SQL text once for the [`hazard`] bits: words and user variables outside string
/// literals, quoted identifiers and comments (executable comments are code), and in the SQL
/// text that `EXECUTE IMMEDIATE` or `PREPARE ... FROM` is given literally. It errs towards
/// reporting (a hazard only stops a session from moving to another backend connection).
pub fn hazards(sql: &[u8]) -> u16 {
    hazards_in(sql, lexer::Mode::DEFAULT)
}

/// [`hazards`] of text a session in `mode` sent. (Never inlined: a function of its own, it takes
/// [`Hazards::token`] into its loop; inlined into its caller, the compiler may leave the token's
/// look a call per token, about 110 instructions more per point select, as unrelated changes
/// elsewhere once made it do.)
#[inline(never)]
pub fn hazards_in(sql: &[u8], mode: lexer::Mode) -> u16 {
    shape_hazards(sql, mode).0
}

/// [`hazards_in`], and whether they follow from the statement's shape alone (its
/// [`Key`](crate::digest::Key)): false when a string literal was read as SQL (after
/// `EXECUTE IMMEDIATE` or `PREPARE s FROM`), whose value the key leaves out.
pub fn shape_hazards(sql: &[u8], mode: lexer::Mode) -> (u16, bool) {
    let mut h = Hazards::default();
    for t in lexer::Lexer::with_mode(sql, mode) {
        h.token(&t, sql, mode);
    }
    (h.found, !h.read_literal)
}

/// The [`hazard`] bits found so far, token by token.
#[derive(Default)]
struct Hazards {
    found: u16,
    /// A string literal was read as SQL.
    read_literal: bool,
    prev: Prev,
    /// Where the token before is (looked at only after the rare words that need it).
    before: std::ops::Range<usize>,
}

impl Hazards {
    /// Looks at the next token of `sql`.
    #[inline]
    fn token(&mut self, t: &Token, sql: &[u8], mode: lexer::Mode) {
        let text = t.text(sql);
        match t.kind {
            Kind::Variable if text.len() > 1 && text[1] != b'@' => self.found |= hazard::USER_VARIABLE,
            Kind::Quoted if self.prev.code_next => {
                self.read_literal = true;
                if let Some(inner) = lexer::unquote_in(text, mode) {
                    self.found |= hazards_in(&inner, mode);
                }
            }
            Kind::Word => self.found |= self.word(text, sql),
            _ => {}
        }
        self.prev.after(t, sql);
        self.before = t.at.clone();
    }

    /// The hazard a word is.
    #[inline]
    fn word(&self, text: &[u8], sql: &[u8]) -> u16 {
        let eq = |k: &[u8]| text.eq_ignore_ascii_case(k);
        let was = |k: &[u8]| sql[self.before.clone()].eq_ignore_ascii_case(k);
        // (By length first: most words are none of these, and are passed over at once.)
        match text.len() {
            2 if eq(b"XA") => hazard::XA,
            4 if text[0] | 0x20 == b'k' && eq(b"KILL") => hazard::KILL,
            // `FLUSH ... WITH READ LOCK`, `BACKUP LOCK`, `BACKUP STAGE`.
            4 if text[0] | 0x20 == b'l' && eq(b"LOCK") && (was(b"READ") || was(b"BACKUP")) => hazard::LOCK,
            5 | 6 if self.prev.lock && (eq(b"TABLE") || eq(b"TABLES")) => hazard::LOCK,
            5 if text[0] | 0x20 == b's' && eq(b"STAGE") && was(b"BACKUP") => hazard::LOCK,
            7 if eq(b"PREPARE") => hazard::SQL_PREPARE,
            7 if eq(b"HANDLER") => hazard::HANDLER,
            8 if eq(b"GET_LOCK") => hazard::LOCK,
            9 if eq(b"TEMPORARY") => hazard::TEMPORARY_TABLE,
            9 if eq(b"ROW_COUNT") => hazard::ROW_COUNT,
            11 if self.prev.set && eq(b"TRANSACTION") => hazard::SET_TRANSACTION,
            19 if eq(b"SQL_CALC_FOUND_ROWS") => hazard::FOUND_ROWS,
            _ => 0,
        }
    }
}

/// What the tokens before the current one were, as [`hazards`] and [`user_variables`] need.
#[derive(Default)]
struct Prev {
    lock: bool,
    set: bool,
    execute: bool,
    /// The statement is a `PREPARE`.
    prepare: bool,
    /// The next string literal is SQL that runs (after `EXECUTE IMMEDIATE`, `PREPARE s FROM`).
    code_next: bool,
}

impl Prev {
    #[inline]
    fn after(&mut self, t: &Token, sql: &[u8]) {
        if t.kind != Kind::Word {
            return self.after_other(t.is_punct(sql, b';'));
        }
        let text = t.text(sql);
        let is = |kw: &[u8]| text.eq_ignore_ascii_case(kw);
        // (By length first: the words looked for are 3, 4, 7 and 9 letters long.)
        let (mut prepare, mut from, mut lock, mut set, mut execute, mut immediate) = (false, false, false, false, false, false);
        match text.len() {
            3 => set = is(b"SET"),
            4 => (from, lock) = (is(b"FROM"), is(b"LOCK")),
            7 => (prepare, execute) = (is(b"PREPARE"), is(b"EXECUTE")),
            9 => immediate = is(b"IMMEDIATE"),
            _ => {}
        }
        self.prepare |= prepare;
        self.code_next = (self.execute && immediate) || (self.prepare && from);
        self.lock = lock;
        self.set = set;
        self.execute = execute;
    }

    /// After a token that is no word (`semicolon`: a `;`, which ends a PREPARE).
    #[inline]
    fn after_other(&mut self, semicolon: bool) {
        self.prepare &= !semicolon;
        self.code_next = false;
        self.lock = false;
        self.set = false;
        self.execute = false;
    }
}

/// The user variables (`@name`) a query names, lowercased (their names are not
/// case-sensitive), each once, in the order they first appear: outside literals and comments,
/// and in the SQL text that `EXECUTE IMMEDIATE` or `PREPARE ... FROM` is given literally.
pub fn user_variables(sql: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    collect_user_variables(sql, &mut names);
    names
}

fn collect_user_variables(sql: &[u8], names: &mut Vec<String>) {
    let mut prev = Prev::default();
    for t in lexer::Lexer::new(sql) {
        let text = t.text(sql);
        match t.kind {
            Kind::Variable if text.get(1) != Some(&b'@') => {
                let name = String::from_utf8_lossy(&lexer::name(&text[1..])).to_lowercase();
                if !name.is_empty() && !names.contains(&name) {
                    names.push(name);
                }
            }
            Kind::Quoted if prev.code_next => {
                if let Some(inner) = lexer::unquote(text) {
                    collect_user_variables(&inner, names);
                }
            }
            _ => {}
        }
        prev.after(&t, sql);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hazards_outside_literals_and_comments() {
        use hazard::*;
        assert_eq!(hazards(b"SELECT c FROM sbtest1 WHERE id=5"), 0);
        assert_eq!(hazards(b"SELECT @@session.sql_mode, @@autocommit"), 0);
        assert_eq!(hazards(b"SET @x = 1"), USER_VARIABLE);
        assert_eq!(hazards(b"select 1 into @`a b`"), USER_VARIABLE);
        assert_eq!(hazards(b"SELECT 'me@example.com', \"@x\", `@y` -- @z\n /* @w */ # @v"), 0);
        assert_eq!(hazards(b"SELECT 'it''s @x', 'a\\'@x'"), 0);
        assert_eq!(hazards(b"create temporary table t (a int)"), TEMPORARY_TABLE);
        assert_eq!(hazards(b"SELECT GET_LOCK('a', 1)"), LOCK);
        assert_eq!(hazards(b"LOCK  TABLES t WRITE"), LOCK);
        assert_eq!(hazards(b"SELECT * FROM t LOCK IN SHARE MODE"), 0);
        assert_eq!(hazards(b"FLUSH TABLES WITH READ LOCK"), LOCK);
        assert_eq!(hazards(b"flush tables t1, t2 with read lock"), LOCK);
        assert_eq!(hazards(b"BACKUP LOCK t"), LOCK);
        assert_eq!(hazards(b"BACKUP STAGE START"), LOCK);
        assert_eq!(hazards(b"SELECT `read`, lock FROM t"), 0);
        assert_eq!(hazards(b"PREPARE s FROM 'select 1'"), SQL_PREPARE);
        assert_eq!(hazards(b"SELECT temporary_x, prepared FROM t"), 0);
        assert_eq!(hazards(b"/*!50000 SET @x=1 */"), USER_VARIABLE);
        assert_eq!(hazards(b"'unterminated @x"), 0);
        assert_eq!(hazards(b"HANDLER t OPEN"), HANDLER);
        assert_eq!(hazards(b"XA START 'x'"), XA);
        assert_eq!(hazards(b"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), SET_TRANSACTION);
        assert_eq!(hazards(b"SET SESSION TRANSACTION READ ONLY"), 0);
        assert_eq!(hazards(b"SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 1"), FOUND_ROWS);
        assert_eq!(hazards(b"SELECT ROW_COUNT()"), ROW_COUNT);
        // SQL given as a literal to run is looked into.
        assert_eq!(hazards(b"EXECUTE IMMEDIATE 'CREATE TEMPORARY TABLE t (a INT)'"), TEMPORARY_TABLE);
        assert_eq!(hazards(b"execute immediate \"SET @x = ?\" USING 1"), USER_VARIABLE);
        assert_eq!(hazards(b"PREPARE s FROM 'SELECT GET_LOCK(?, 1)'"), SQL_PREPARE | LOCK);
        assert_eq!(hazards(b"SELECT 'CREATE TEMPORARY TABLE' FROM t"), 0);
    }

    #[test]
    fn user_variable_names() {
        let v = |sql: &str| user_variables(sql.as_bytes());
        assert_eq!(v("SET @a = 1, @B := @a + @@session.x"), ["a", "b"]);
        assert_eq!(v("SELECT 1 INTO @`x``y`, @'q r', @\"z\""), ["x`y", "q r", "z"]);
        assert_eq!(v("SELECT 'a@b.c', `@d` -- @e\n"), Vec::<String>::new());
        assert_eq!(v("EXECUTE IMMEDIATE 'SET @in = ?' USING @out"), ["in", "out"]);
        assert_eq!(v("PREPARE s FROM 'SELECT @p'"), ["p"]);
        assert_eq!(v("SELECT @v.w:=1"), ["v.w"]);
    }
}
