//! A byte-level SQL lexer: tokens with their positions, no grammar. Comments and whitespace are
//! skipped; the bodies of executable comments (`/*! ... */`, `/*!50001 ... */`, `/*M! ... */`)
//! are code to the server and so are lexed as code. It never fails: any byte sequence yields
//! tokens, an unterminated literal or comment running to the end.

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A keyword or unquoted identifier (letters, digits, `_`, `$`, non-ASCII; not starting
    /// with a digit).
    Word,
    /// Starts with a digit: an integer, a decimal, `0x..`, `1e5` (and identifiers such as
    /// `1abc`, which the lexer does not tell apart).
    Number,
    /// A quoted string or identifier; the quote character is its first byte.
    Quoted,
    /// `@name`, `@'name'`, `@@name`, `@@session.name`.
    Variable,
    /// Any other byte (`;`, `(`, `?`, `=`, ...).
    Punct,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: Kind,
    /// Where the token is in the text (quotes included).
    pub at: Range<usize>,
}

impl Token {
    pub fn text<'a>(&self, sql: &'a [u8]) -> &'a [u8] {
        &sql[self.at.clone()]
    }

    pub fn is_word(&self, sql: &[u8], kw: &str) -> bool {
        self.kind == Kind::Word && self.text(sql).eq_ignore_ascii_case(kw.as_bytes())
    }

    pub fn is_punct(&self, sql: &[u8], c: u8) -> bool {
        self.kind == Kind::Punct && sql[self.at.start] == c
    }
}

/// How the server reads quoted text under a session's `sql_mode`: whether `\` escapes in
/// strings (not under `NO_BACKSLASH_ESCAPES`) and whether `"` quotes an identifier
/// (`ANSI_QUOTES`, which `ANSI` implies). A `\` decides where a string ends, so the same text
/// can be one statement to one mode and two to the other: every reader of a statement lexes it
/// in its session's mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    pub no_backslash_escapes: bool,
    pub ansi_quotes: bool,
}

impl Mode {
    /// The server's default.
    pub const DEFAULT: Mode = Mode { no_backslash_escapes: false, ansi_quotes: false };

    /// The mode of a `sql_mode` value (a comma-separated list of names, in any case).
    pub fn from_sql_mode(value: &[u8]) -> Mode {
        let mut m = Mode::DEFAULT;
        for name in value.split(|&b| b == b',').map(|n| n.trim_ascii()) {
            m.no_backslash_escapes |= name.eq_ignore_ascii_case(b"NO_BACKSLASH_ESCAPES");
            m.ansi_quotes |= name.eq_ignore_ascii_case(b"ANSI_QUOTES") || name.eq_ignore_ascii_case(b"ANSI");
        }
        m
    }

    /// Whether `\` escapes the next byte in text quoted with `q`.
    #[inline]
    pub fn escapes(self, q: u8) -> bool {
        q != b'`' && !self.no_backslash_escapes && !(q == b'"' && self.ansi_quotes)
    }

    /// Whether text quoted with `q` is a string (else an identifier).
    #[inline]
    pub fn is_string_quote(self, q: u8) -> bool {
        q == b'\'' || (q == b'"' && !self.ansi_quotes)
    }

    /// The mode `sql` must be lexed in: the default whenever the modes cannot differ on it (it
    /// has no `\`, and no `"` under ANSI_QUOTES), so callers may keep to the default's readers.
    #[inline]
    pub fn for_text(self, sql: &[u8]) -> Mode {
        if self == Mode::DEFAULT || (memchr::memchr(b'\\', sql).is_none() && !(self.ansi_quotes && memchr::memchr(b'"', sql).is_some())) {
            Mode::DEFAULT
        } else {
            self
        }
    }
}

/// Iterates over the tokens of SQL text.
#[derive(Debug, Clone)]
pub struct Lexer<'a> {
    sql: &'a [u8],
    pos: usize,
    /// Inside an executable comment: its `*/` is skipped.
    executable: bool,
    mode: Mode,
    /// Comments (and executable comments' ends) skipped so far.
    comments: u32,
}

impl<'a> Lexer<'a> {
    pub fn new(sql: &'a [u8]) -> Self {
        Lexer::with_mode(sql, Mode::DEFAULT)
    }

    /// A lexer of text as a session in `mode` sends it.
    pub fn with_mode(sql: &'a [u8], mode: Mode) -> Self {
        Lexer { sql, pos: 0, executable: false, mode, comments: 0 }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How many comments (and ends of executable ones) were skipped so far.
    #[inline]
    pub fn comments(&self) -> u32 {
        self.comments
    }

    /// Whether the lexer is inside an executable comment (its `*/` to be skipped).
    #[inline]
    pub fn in_executable(&self) -> bool {
        self.executable
    }

    /// Skips the comment (or an executable comment's marker) at `pos`; false when there is
    /// none there.
    #[cold]
    fn skip_comment(&mut self) -> bool {
        let s = self.sql;
        let rest = &s[self.pos..];
        match rest {
            [b'#', ..] | [b'-', b'-', b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c, ..] => {
                self.pos = memchr::memchr(b'\n', rest).map_or(s.len(), |p| self.pos + p + 1)
            }
            [b'-', b'-'] => self.pos = s.len(),
            [b'/', b'*', b'!', ..] | [b'/', b'*', b'M', b'!', ..] => {
                self.pos += if rest[2] == b'M' { 4 } else { 3 };
                // The version the body needs (5 or 6 digits) is not code.
                while s.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    self.pos += 1;
                }
                self.executable = true;
            }
            [b'/', b'*', ..] => {
                self.pos = match memchr::memmem::find(&rest[2..], b"*/") {
                    Some(p) => self.pos + 2 + p + 2,
                    None => s.len(),
                }
            }
            [b'*', b'/', ..] if self.executable => {
                self.executable = false;
                self.pos += 2;
            }
            _ => return false,
        }
        self.comments += 1;
        true
    }

    /// The token of a byte that is neither a digit nor a word's: a quoted text, a variable or
    /// punctuation.
    #[inline]
    fn other(&mut self, c: u8, start: usize) -> Kind {
        let s = self.sql;
        match c {
            b'\'' | b'"' | b'`' => {
                self.pos = skip_quoted_in(s, start + 1, c, self.mode);
                Kind::Quoted
            }
            b'@' => {
                self.pos += 1;
                if s.get(self.pos) == Some(&b'@') {
                    self.pos += 1;
                }
                match s.get(self.pos) {
                    Some(&q @ (b'\'' | b'"' | b'`')) => self.pos = skip_quoted_in(s, self.pos + 1, q, self.mode),
                    _ => self.pos = end_of(s, self.pos, WORD | DOT),
                }
                Kind::Variable
            }
            _ => {
                self.pos += 1;
                Kind::Punct
            }
        }
    }
}

impl Iterator for Lexer<'_> {
    type Item = Token;

    #[inline]
    fn next(&mut self) -> Option<Token> {
        let s = self.sql;
        let mut start = self.pos;
        // Whitespace and comments first, a byte's class at a time.
        let (c, class) = loop {
            let c = *s.get(start)?;
            let class = CLASS[usize::from(c)];
            if class & SPACE != 0 {
                start += 1;
                continue;
            }
            if class & COMMENT != 0 {
                self.pos = start;
                if self.skip_comment() {
                    start = self.pos;
                    continue;
                }
            }
            break (c, class);
        };
        let kind = if class & (DIGIT | WORD) != 0 {
            let (kind, mask) = if class & DIGIT != 0 { (Kind::Number, WORD | DOT) } else { (Kind::Word, WORD) };
            self.pos = end_of(s, start + 1, mask);
            kind
        } else {
            self.pos = start;
            self.other(c, start)
        };
        Some(Token { kind, at: start..self.pos })
    }
}

/// Byte classes (bits of [`CLASS`]).
const SPACE: u8 = 1;
/// Letters, digits, `_`, `$` and non-ASCII bytes: what words are made of.
const WORD: u8 = 2;
const DIGIT: u8 = 4;
const DOT: u8 = 8;
/// `#`, `-`, `/`, `*`: what a comment begins (or an executable one ends) with.
const COMMENT: u8 = 16;

/// The class of every byte: one load per byte instead of a chain of comparisons.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        if c.is_ascii_whitespace() {
            t[i] |= SPACE;
        }
        if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80 {
            t[i] |= WORD;
        }
        if c.is_ascii_digit() {
            t[i] |= DIGIT;
        }
        if c == b'.' {
            t[i] |= DOT;
        }
        if matches!(c, b'#' | b'-' | b'/' | b'*') {
            t[i] |= COMMENT;
        }
        i += 1;
    }
    t
};

/// The index of the first byte from `from` on whose class has none of the bits of `mask`.
#[inline]
fn end_of(s: &[u8], from: usize, mask: u8) -> usize {
    match s.get(from..) {
        Some(rest) => rest.iter().position(|&c| CLASS[usize::from(c)] & mask == 0).map_or(s.len(), |p| from + p),
        None => s.len(),
    }
}

/// The index after a quoted string or identifier whose body starts at `from` and whose quote
/// is `q`; a doubled quote or (outside backquotes) a backslash escape does not end it.
pub fn skip_quoted(s: &[u8], from: usize, q: u8) -> usize {
    skip_quoted_in(s, from, q, Mode::DEFAULT)
}

/// [`skip_quoted`] in `mode` (where a backslash may escape nothing).
pub fn skip_quoted_in(s: &[u8], mut from: usize, q: u8, mode: Mode) -> usize {
    let escapes = mode.escapes(q);
    while from < s.len() {
        match s[from] {
            b'\\' if escapes => from += 2,
            c if c == q && s.get(from + 1) == Some(&q) => from += 2,
            c if c == q => return from + 1,
            _ => from += 1,
        }
    }
    s.len()
}

/// The value of a quoted string token (quotes removed, escapes resolved); None when the token
/// is not a string in single or double quotes.
pub fn unquote(raw: &[u8]) -> Option<Vec<u8>> {
    unquote_in(raw, Mode::DEFAULT)
}

/// [`unquote`] in `mode`: under ANSI_QUOTES `"..."` is no string, under NO_BACKSLASH_ESCAPES a
/// backslash is itself.
pub fn unquote_in(raw: &[u8], mode: Mode) -> Option<Vec<u8>> {
    let (&q, body) = raw.split_first()?;
    if !mode.is_string_quote(q) {
        return None;
    }
    let escapes = mode.escapes(q);
    let body = body.strip_suffix(&[q]).unwrap_or(body);
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'\\' if escapes && i + 1 < body.len() => {
                out.push(match body[i + 1] {
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'r' => b'\r',
                    b'0' => 0,
                    b'Z' => 0x1a,
                    c => c,
                });
                i += 2;
            }
            c if c == q && body.get(i + 1) == Some(&q) => {
                out.push(q);
                i += 2;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// The name a word, a backquoted identifier or a quoted string (as a user variable's name may
/// be written) stands for: quotes taken off, doubled quotes and escapes undone.
pub fn name(raw: &[u8]) -> Vec<u8> {
    match raw.first() {
        Some(b'`') => {
            let body = &raw[1..];
            let body = body.strip_suffix(b"`").unwrap_or(body);
            let mut out = Vec::with_capacity(body.len());
            let mut i = 0;
            while i < body.len() {
                out.push(body[i]);
                i += if body[i] == b'`' && body.get(i + 1) == Some(&b'`') { 2 } else { 1 };
            }
            out
        }
        Some(b'\'' | b'"') => unquote(raw).unwrap_or_default(),
        _ => raw.to_vec(),
    }
}

/// Splits a COM_QUERY into its statements (the ranges between top-level `;`), as the server
/// does with CLIENT_MULTI_STATEMENTS. A compound statement (a stored program's definition,
/// `BEGIN NOT ATOMIC`, IF/CASE/LOOP/WHILE/REPEAT/FOR, a labelled block) contains `;` of its
/// own whose extent only a grammar knows: it is taken to run to the end of the text, so the
/// statements of a body are never taken for statements of the query.
pub fn statements(sql: &[u8]) -> Statements<'_> {
    statements_in(sql, Mode::DEFAULT)
}

/// [`statements`] of text in `mode`.
pub fn statements_in(sql: &[u8], mode: Mode) -> Statements<'_> {
    Statements { sql, lexer: Lexer::with_mode(sql, mode) }
}

pub struct Statements<'a> {
    sql: &'a [u8],
    lexer: Lexer<'a>,
}

/// One statement of a query: its tokens (without the terminating `;`).
pub type Statement = Vec<Token>;

impl Iterator for Statements<'_> {
    type Item = Statement;

    fn next(&mut self) -> Option<Statement> {
        let mut tokens = Vec::new();
        while let Some(t) = self.lexer.next() {
            if !t.is_punct(self.sql, b';') {
                tokens.push(t);
            } else if is_compound(self.sql, &tokens) {
                tokens.push(t);
                tokens.extend(self.lexer.by_ref());
            } else if !tokens.is_empty() {
                return Some(tokens);
            }
        }
        (!tokens.is_empty()).then_some(tokens)
    }
}

/// Whether a statement's tokens up to its first `;` begin a compound statement.
fn is_compound(sql: &[u8], t: &[Token]) -> bool {
    let word = |i: usize, kws: &[&str]| t.get(i).is_some_and(|t| kws.iter().any(|k| t.is_word(sql, k)));
    let punct = |i: usize, c: u8| t.get(i).is_some_and(|t| t.is_punct(sql, c));
    if word(0, &["IF", "CASE", "LOOP", "WHILE", "REPEAT", "FOR"]) || (word(0, &["BEGIN"]) && word(1, &["NOT"])) || punct(1, b':') {
        return true;
    }
    if !word(0, &["CREATE", "ALTER"]) {
        return false;
    }
    // CREATE [OR REPLACE] [DEFINER = user] [AGGREGATE] {PROCEDURE | FUNCTION | ...}
    let mut i = 1;
    if word(i, &["OR"]) && word(i + 1, &["REPLACE"]) {
        i += 2;
    }
    if word(i, &["DEFINER"]) {
        i += 1 + usize::from(punct(i + 1, b'='));
        if word(i, &["CURRENT_USER"]) {
            i += 1;
            if punct(i, b'(') && punct(i + 1, b')') {
                i += 2;
            }
        } else {
            i += 1;
            if t.get(i).is_some_and(|t| t.kind == Kind::Variable) {
                i += 1;
            }
        }
    }
    if word(i, &["AGGREGATE"]) {
        i += 1;
    }
    word(i, &["PROCEDURE", "FUNCTION", "TRIGGER", "EVENT", "PACKAGE"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(sql: &[u8]) -> Vec<(Kind, &[u8])> {
        Lexer::new(sql).map(|t| (t.kind, t.text(sql))).collect()
    }

    #[test]
    fn tokens() {
        use Kind::*;
        let sql = b"SELECT a1,'x''y\\'', `b``c`, @v, @@session.x, 12.5e3 -- c\n# d\n/* e */ FROM t;";
        assert_eq!(
            texts(sql),
            vec![
                (Word, &b"SELECT"[..]),
                (Word, b"a1"),
                (Punct, b","),
                (Quoted, b"'x''y\\''"),
                (Punct, b","),
                (Quoted, b"`b``c`"),
                (Punct, b","),
                (Variable, b"@v"),
                (Punct, b","),
                (Variable, b"@@session.x"),
                (Punct, b","),
                (Number, b"12.5e3"),
                (Word, b"FROM"),
                (Word, b"t"),
                (Punct, b";"),
            ]
        );
        // Executable comments are code; plain ones are not.
        assert_eq!(texts(b"/*!50000 KILL 5 */ /* KILL 6 */ /*M!100100 x*/"), vec![(Word, &b"KILL"[..]), (Number, b"5"), (Word, b"x")]);
        assert_eq!(texts(b"'unterminated"), vec![(Quoted, &b"'unterminated"[..])]);
        assert_eq!(texts(b"--"), vec![]);
        assert_eq!(texts(b"a--b"), vec![(Word, &b"a"[..]), (Punct, b"-"), (Punct, b"-"), (Word, b"b")]);
    }

    #[test]
    fn modes_decide_where_strings_end() {
        let nbe = Mode::from_sql_mode(b"STRICT_TRANS_TABLES,no_backslash_escapes");
        let ansi = Mode::from_sql_mode(b"REAL_AS_FLOAT,PIPES_AS_CONCAT,ANSI_QUOTES,IGNORE_SPACE,ANSI");
        assert_eq!((nbe.no_backslash_escapes, nbe.ansi_quotes, ansi.ansi_quotes, ansi.no_backslash_escapes), (true, false, true, false));
        assert_eq!(Mode::from_sql_mode(b"ANSI"), Mode { no_backslash_escapes: false, ansi_quotes: true });
        let sql = b"SELECT 'a\\'; KILL 5 -- '";
        let split_in = |m| statements_in(sql, m).count();
        assert_eq!((split_in(Mode::DEFAULT), split_in(nbe)), (1, 2));
        let dq = b"SELECT \"a\\\"; KILL 5 -- \"";
        assert_eq!((statements_in(dq, Mode::DEFAULT).count(), statements_in(dq, ansi).count()), (1, 2));
        assert_eq!(unquote_in(b"'a\\n'", nbe).as_deref(), Some(&b"a\\n"[..]));
        assert_eq!(unquote_in(b"\"col\"", ansi), None);
        assert_eq!(nbe.for_text(b"SELECT 1"), Mode::DEFAULT);
        assert_eq!(nbe.for_text(b"SELECT '\\'"), nbe);
        assert_eq!(ansi.for_text(b"SELECT \"x\""), ansi);
    }

    #[test]
    fn unquoting() {
        assert_eq!(unquote(b"'a''b\\'c\\n'").as_deref(), Some(&b"a'b'c\n"[..]));
        assert_eq!(unquote(b"\"KILL 5\"").as_deref(), Some(&b"KILL 5"[..]));
        assert_eq!(unquote(b"`x`"), None);
    }

    fn split(sql: &[u8]) -> Vec<Vec<u8>> {
        statements(sql).map(|st| sql[st[0].at.start..st[st.len() - 1].at.end].to_vec()).collect()
    }

    #[test]
    fn splitting() {
        assert_eq!(split(b"KILL 2; SELECT 1"), vec![b"KILL 2".to_vec(), b"SELECT 1".to_vec()]);
        assert_eq!(split(b";; SELECT ';' ; /* ; */ SELECT 2;"), vec![b"SELECT ';'".to_vec(), b"SELECT 2".to_vec()]);
        let body = b"CREATE DEFINER=`a`@`%` PROCEDURE p() BEGIN KILL 5; SELECT 1; END; KILL 6";
        assert_eq!(split(body).len(), 1);
        assert_eq!(split(b"BEGIN NOT ATOMIC SELECT 1; END").len(), 1);
        assert_eq!(split(b"lbl: LOOP LEAVE lbl; END LOOP").len(), 1);
        assert_eq!(split(b"SELECT IF(1,2,3); KILL 5").len(), 2);
        assert_eq!(split(b"BEGIN; KILL 5").len(), 2);
        assert_eq!(split(b"CREATE TABLE t (a int); KILL 5").len(), 2);
        assert_eq!(split(b"CREATE TABLE event (a int); KILL 5").len(), 2);
        assert_eq!(
            split(b"create or replace definer=current_user() trigger t before insert on x for each row begin set @a=1; end").len(),
            1
        );
        assert_eq!(split(b"IF (1 > 0) THEN SELECT 1; END IF").len(), 1);
    }
}
