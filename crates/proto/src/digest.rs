//! Statement digests: the shape of a statement with its values taken out, so that statements
//! that differ only in their literals are counted together, and a rule can match the shape.
//!
//! Over the lexer's tokens (comments and whitespace already gone): literals (numbers, strings,
//! hex and bit values, charset-introduced strings, signed numbers, `?` placeholders) become `?`;
//! a parenthesized list of literals after `IN` or `VALUES` becomes `(...)`, and further rows of
//! literals after a `VALUES` row are dropped, so `IN (1)` and `IN (1, 2, 3)`, one row and a
//! thousand, share a digest; keywords and unquoted identifiers are compared without case.
//! Quoted identifiers and variables stay as written. The digest is a 64-bit FNV-1a hash of the
//! normalized tokens, so spacing does not change it, and it is computed without allocating.
//! Normalizing the normalized text gives it back unchanged (a fuzzed property).

use crate::lexer::{Kind, Lexer, Mode, Token};

/// One token of a statement's normalized form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// A keyword or unquoted identifier as written (compared and rendered in lower case).
    Word(&'a [u8]),
    /// Punctuation, a quoted identifier or a variable, as written.
    Keep(&'a [u8]),
    /// A literal: `?`.
    Value,
    /// A list of literals: `(...)`.
    List,
}

/// The normalized tokens of SQL text.
pub fn parts(sql: &[u8]) -> Parts<'_> {
    parts_in(sql, Mode::DEFAULT)
}

/// [`parts`] of text a session in `mode` sent.
pub fn parts_in(sql: &[u8], mode: Mode) -> Parts<'_> {
    Parts { lex: Lexer::with_mode(sql, mode), norm: Normalizer::new(sql, mode) }
}

pub struct Parts<'a> {
    lex: Lexer<'a>,
    norm: Normalizer<'a>,
}

/// Turns tokens into parts as the lexer gives them, taking from it the further tokens a part
/// is made of (a signed or introduced literal, a list of literals): [`Parts`] is a lexer and
/// this, and a reader that wants the tokens as well feeds it itself (`crate::scan`). The
/// tokens it takes beyond the one it is given are literals and punctuation only.
pub struct Normalizer<'a> {
    sql: &'a [u8],
    mode: Mode,
    last: Option<Part<'a>>,
    before_last: Option<Part<'a>>,
}

/// After these keywords a `-` or `+` is a sign, not an operator.
const BEFORE_OPERAND: &[&str] = &[
    "select", "where", "and", "or", "not", "xor", "between", "when", "then", "else", "limit", "offset", "set", "values", "value", "return",
    "like", "having", "on", "interval", "div", "mod", "case", "by", "in",
];

/// Rendered with a space before a `(` that follows them (other words are taken for functions).
const SPACED_BEFORE_PAREN: &[&str] = &[
    "in", "values", "value", "from", "join", "exists", "as", "on", "using", "and", "or", "not", "where", "select", "into", "union", "all",
    "any", "some", "when", "then", "else", "set", "by", "having", "over", "with", "is", "like", "table", "xor", "between", "update",
];

fn is_any(word: &[u8], list: &[&str]) -> bool {
    list.iter().any(|k| word.eq_ignore_ascii_case(k.as_bytes()))
}

impl<'a> Normalizer<'a> {
    pub fn new(sql: &'a [u8], mode: Mode) -> Self {
        Normalizer { sql, mode, last: None, before_last: None }
    }

    /// Whether a `-` or `+` here would be a sign.
    fn sign_allowed(&self) -> bool {
        match self.last {
            None => true,
            Some(Part::Keep(k)) => k != b")" && k.len() == 1 && !matches!(k[0], b'`' | b'@'),
            Some(Part::Word(w)) => is_any(w, BEFORE_OPERAND),
            Some(Part::Value | Part::List) => false,
        }
    }

    /// Whether a `(` here opens a list that may be one of literals.
    fn list_allowed(&self) -> bool {
        match (self.last, self.before_last) {
            (Some(Part::Word(w)), _) => is_any(w, &["in", "values", "value"]),
            (Some(Part::Keep(b",")), Some(Part::List)) => true,
            _ => false,
        }
    }

    /// Takes the literal that starts with `t` (and the tokens that belong to it) from `lex`;
    /// false when `t` does not start one. `sign`: a leading `-` or `+` is a sign.
    fn literal<L: Iterator<Item = Token> + Clone>(sql: &[u8], mode: Mode, lex: &mut L, t: &Token, sign: bool) -> bool {
        match t.kind {
            Kind::Number => {
                // `1e-5`: the lexer stops the number before the exponent's sign.
                let text = t.text(sql);
                if text.last().is_some_and(|c| matches!(c, b'e' | b'E'))
                    && matches!(sql.get(t.at.end), Some(b'-' | b'+'))
                    && sql.get(t.at.end + 1).is_some_and(u8::is_ascii_digit)
                {
                    lex.next();
                    lex.next();
                }
                true
            }
            Kind::Quoted => mode.is_string_quote(t.text(sql)[0]),
            Kind::Word => {
                // A charset introducer or a hex, bit or national string: `_utf8mb4'a'`, `x'0f'`.
                let w = t.text(sql);
                let introducer = w[0] == b'_' || (w.len() == 1 && matches!(w[0] | 0x20, b'x' | b'b' | b'n'));
                if introducer && sql.get(t.at.end) == Some(&b'\'') {
                    lex.next();
                    return true;
                }
                false
            }
            Kind::Punct => match t.text(sql)[0] {
                b'?' => true,
                b'-' | b'+' if sign => {
                    let mut ahead = lex.clone();
                    // Signs and the literal they are given to are one value.
                    loop {
                        match ahead.next() {
                            Some(n) if n.kind == Kind::Punct && matches!(n.text(sql), b"-" | b"+") => {}
                            Some(n) if Self::literal(sql, mode, &mut ahead, &n, false) => {
                                *lex = ahead;
                                return true;
                            }
                            _ => return false,
                        }
                    }
                }
                _ => false,
            },
            Kind::Variable => false,
        }
    }

    /// After a `(`: takes a list of literals up to its `)` (or the `...` of one normalized
    /// already) and returns true, or takes nothing and returns false.
    fn list<L: Iterator<Item = Token> + Clone>(sql: &[u8], mode: Mode, lex: &mut L) -> bool {
        let mut ahead = lex.clone();
        // `(...)`: a list normalized already.
        let mut dots = ahead.clone();
        if (0..3).all(|_| dots.next().is_some_and(|t| t.is_punct(sql, b'.'))) && dots.next().is_some_and(|t| t.is_punct(sql, b')')) {
            *lex = dots;
            return true;
        }
        loop {
            let Some(t) = ahead.next() else { return false };
            if !Self::literal(sql, mode, &mut ahead, &t, true) {
                return false;
            }
            match ahead.next() {
                Some(t) if t.is_punct(sql, b',') => {}
                Some(t) if t.is_punct(sql, b')') => break,
                _ => return false,
            }
        }
        *lex = ahead;
        true
    }

    fn emit(&mut self, p: Part<'a>) -> Option<Part<'a>> {
        self.before_last = self.last;
        self.last = Some(p);
        Some(p)
    }
}

impl<'a> Normalizer<'a> {
    /// The part that token `t`, just taken from `lex`, begins (None: it adds nothing to the
    /// shape, as a further row of a `VALUES` list).
    #[inline(always)]
    pub fn feed<L: Iterator<Item = Token> + Clone>(&mut self, t: &Token, lex: &mut L) -> Option<Part<'a>> {
        let (sql, mode) = (self.sql, self.mode);
        let text = t.text(sql);
        // (What can only be no literal is passed over without a call.)
        let literal = match t.kind {
            Kind::Number => Self::literal(sql, mode, lex, t, false),
            Kind::Quoted => mode.is_string_quote(text[0]),
            // Only `_charset` and one-letter words introduce a literal.
            Kind::Word => {
                (text[0] == b'_' || text.len() == 1) && sql.get(t.at.end) == Some(&b'\'') && Self::literal(sql, mode, lex, t, false)
            }
            Kind::Variable => false,
            Kind::Punct => match text[0] {
                b'?' => true,
                // (Whether a `-` or `+` is a sign is asked only of those.)
                b'-' | b'+' => self.sign_allowed() && Self::literal(sql, mode, lex, t, true),
                _ => false,
            },
        };
        if literal {
            return self.emit(Part::Value);
        }
        match t.kind {
            Kind::Word => self.emit(Part::Word(text)),
            Kind::Punct if text == b"(" && self.list_allowed() && Self::list(sql, mode, lex) => self.emit(Part::List),
            Kind::Punct if text == b"," && self.last == Some(Part::List) => {
                // Another row of literals after a VALUES row adds nothing to the shape.
                let mut ahead = lex.clone();
                if ahead.next().is_some_and(|t| t.is_punct(sql, b'(')) && Self::list(sql, mode, &mut ahead) {
                    *lex = ahead;
                    return None;
                }
                self.emit(Part::Keep(text))
            }
            _ => self.emit(Part::Keep(text)),
        }
    }
}

impl<'a> Iterator for Parts<'a> {
    type Item = Part<'a>;

    fn next(&mut self) -> Option<Part<'a>> {
        loop {
            let t = self.lex.next()?;
            if let Some(p) = self.norm.feed(&t, &mut self.lex) {
                return Some(p);
            }
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The digest of SQL text: a hash of its normalized tokens (never 0).
pub fn digest(sql: &[u8]) -> u64 {
    digest_in(sql, Mode::DEFAULT)
}

/// [`digest`] of text a session in `mode` sent.
pub fn digest_in(sql: &[u8], mode: Mode) -> u64 {
    let mut h = Hasher::default();
    parts_in(sql, mode).for_each(|p| h.part(p));
    h.digest()
}

/// A digest as its parts come: 64-bit FNV-1a over the normalized text, each part followed by
/// a space.
#[derive(Debug, Clone, Copy)]
pub struct Hasher(u64);

impl Default for Hasher {
    fn default() -> Self {
        Hasher(FNV_OFFSET)
    }
}

impl Hasher {
    #[inline]
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
    }

    #[inline]
    pub fn part(&mut self, p: Part) {
        match p {
            Part::Word(w) => {
                for &b in w {
                    self.0 = (self.0 ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(FNV_PRIME);
                }
            }
            Part::Keep(k) => self.bytes(k),
            Part::Value => self.bytes(b"?"),
            Part::List => self.bytes(b"(...)"),
        }
        self.bytes(b" ");
    }

    /// The digest (never 0).
    pub fn digest(self) -> u64 {
        self.0.max(1)
    }
}

/// A key of a statement that is finer than its digest, and far cheaper: texts of one key have one
/// digest, texts of one digest may have several keys. It hashes the text as written, a machine
/// word at a time, with its literals (numbers and strings) and its comments cut out, so a
/// table of the keys seen (`sluice::route::digest`) gives the digest of a statement again
/// without normalizing it, and statements that differ in their values alone share a key.
///
/// Why one key means one digest: the key hashes every byte outside literals and comments, and
/// for each literal its kind and what the normalizer reads of it (a number starts with a digit,
/// which no word or variable before it could end at; a string with its quote), and for each gap
/// that held a comment whether an executable comment is open after it (the lexer's one state
/// between tokens). Two texts of one key therefore lex into the same tokens but for the values
/// of literals, and normalize alike.
///
/// A statement comes from a client, who may try to make it collide with another's key (and take
/// that one's digest, and its rules): the hash is a folded multiply keyed with the process's
/// own random seed, which a client never sees (keys are never shown).
#[derive(Debug, Clone, Copy)]
pub struct Key {
    h: u64,
    k: u64,
}

/// What a mark in a [`Key`] stands for.
const LITERAL: u64 = 1 << 62;
const GAP: u64 = 1 << 61;

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let x = u128::from(a) * u128::from(b);
    (x as u64) ^ ((x >> 64) as u64)
}

impl Key {
    /// A key of text read in `mode`, with `seed` (two random words of the process).
    #[inline]
    pub fn new(seed: [u64; 2], mode: Mode) -> Key {
        let bits = u64::from(mode.no_backslash_escapes) | u64::from(mode.ansi_quotes) << 1;
        Key { h: seed[0] ^ bits, k: seed[1] | 1 }
    }

    #[inline(always)]
    fn word(&mut self, w: u64) {
        self.h = fold(self.h ^ w, self.k);
    }

    /// Hashes `sql[from..to]`, the text between two marks.
    #[inline]
    pub fn run(&mut self, sql: &[u8], from: usize, to: usize) {
        let run = &sql[from..to];
        let mut words = run.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]));
        }
        let tail = words.remainder().len();
        if tail > 0 {
            // The last `tail` bytes: the 8 that end at `to`, shifted (the text before the run
            // is the text's too), or, in a text shorter than 8, bytes taken one by one.
            let w = match sql.get(to.wrapping_sub(8)..to) {
                Some(w) if to >= 8 => u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) >> (64 - 8 * tail),
                _ => words.remainder().iter().rev().fold(0, |w, &b| w << 8 | u64::from(b)),
            };
            self.word(w);
        }
        // (The run's length ends it: a tail's zero bytes are not the text's.)
        self.word(run.len() as u64);
    }

    /// A literal token `t`, the run before it hashed already: its kind and what the normalizer
    /// reads of it beyond that (a string's quote; whether a number ends with an `e`, which may
    /// take a signed exponent after it), never its value.
    #[inline]
    pub fn literal(&mut self, sql: &[u8], t: &Token) {
        let text = t.text(sql);
        let mark = match t.kind {
            Kind::Number => 1 << 8 | u64::from(text[text.len() - 1] | 0x20 == b'e'),
            _ => 2 << 8 | u64::from(text[0]),
        };
        self.word(LITERAL | mark);
    }

    /// A gap between tokens that held a comment (its text is not hashed); `executable`: an
    /// executable comment is open after it.
    #[inline]
    pub fn gap(&mut self, executable: bool) {
        self.word(GAP | u64::from(executable));
    }

    /// The key (never 0).
    #[inline]
    pub fn finish(self) -> u64 {
        self.h.max(1)
    }
}

/// The normalized text of SQL text, appended to `out`, at most `limit` bytes of it (whole
/// tokens; a cut text ends with `...`).
pub fn normalize(sql: &[u8], out: &mut Vec<u8>, limit: usize) {
    normalize_in(sql, Mode::DEFAULT, out, limit)
}

/// [`normalize`] of text a session in `mode` sent.
pub fn normalize_in(sql: &[u8], mode: Mode, out: &mut Vec<u8>, limit: usize) {
    let start = out.len();
    let mut last: Option<Part> = None;
    for p in parts_in(sql, mode) {
        let bytes: &[u8] = match p {
            Part::Word(w) | Part::Keep(w) => w,
            Part::Value => b"?",
            Part::List => b"(...)",
        };
        if let Some(l) = last
            && spaced(l, p)
        {
            out.push(b' ');
        }
        if out.len() - start + bytes.len() > limit {
            out.extend_from_slice(b"...");
            return;
        }
        match p {
            Part::Word(w) => out.extend(w.iter().map(u8::to_ascii_lowercase)),
            _ => out.extend_from_slice(bytes),
        }
        last = Some(p);
    }
}

/// Whether the text puts a space between two parts.
fn spaced(before: Part, after: Part) -> bool {
    // (`.` joins names only: after a variable or a number it would join the token.)
    let name = |p: Part| matches!(p, Part::Word(_)) || matches!(p, Part::Keep(k) if k[0] == b'`' || k == b"*");
    match (before, after) {
        (_, Part::Keep(b".")) => !name(before),
        (Part::Keep(b"."), _) => !name(after),
        (_, Part::Keep(b"," | b")" | b";")) | (Part::Keep(b"("), _) => false,
        (Part::Word(w), Part::Keep(b"(")) => is_any(w, SPACED_BEFORE_PAREN),
        _ => true,
    }
}

/// A digest as it is shown: 16 hexadecimal digits.
pub fn hex(digest: u64) -> String {
    format!("{digest:016x}")
}

#[cfg(test)]
#[path = "digest_tests.rs"]
mod tests;
