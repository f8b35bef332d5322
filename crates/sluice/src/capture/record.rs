//! The records of a capture and how they are written (pure: no I/O).
//!
//! A capture file is [`MAGIC`] followed by chunks (`chunk.rs`); a chunk's bytes are records,
//! each `u32` length (little-endian, of what follows) + kind + fields. Integers are LEB128
//! varints, strings and byte strings a varint length and the bytes. A decoder skips the kinds
//! it does not know, so newer writers stay readable.
//!
//! - `Begin`: the session's state when it was first seen by this capture (user, schema,
//!   character set, changed variables, prepared statements, ...), so that a replay can rebuild it
//!   before its first command, whether the session opened before the capture started or during it.
//! - `Command`: a command as the client sent it (its payload: command byte and body), numbered
//!   from 1 per session, so that a gap (a dropped chunk) is seen.
//! - `Result`: the summary of its response, with the same number. A session writes a command
//!   and its result together, once the response is through; the command's time is when it was
//!   forwarded to the server.
//! - `Exchange`: a command and its result in one record, as a session writes them (shorter
//!   than the two: one length, session and number; the row sums only when there are rows, and
//!   for a single row only the ordered one, from which the other follows). It decodes as a
//!   `Command` and a `Result`.
//! - `End`: the session ended.

/// The first bytes of every capture file (chunks with checksums).
pub const MAGIC: &[u8; 8] = b"SLCAPT02";
/// The first bytes of a capture file of the first version (chunks without checksums).
pub const MAGIC_V1: &[u8; 8] = b"SLCAPT01";

const BEGIN: u8 = 1;
const COMMAND: u8 = 2;
const RESULT: u8 = 3;
const END: u8 = 4;
const EXCHANGE: u8 = 5;

/// Command flags.
pub mod flag {
    /// The payload is the statement's normalized text (its literals replaced): the statement
    /// may carry a password, and replay skips it.
    pub const REDACTED: u8 = 1;
    /// The payload is a prefix of a command longer than sluice reads whole (`len` is whole).
    pub const TRUNCATED: u8 = 2;
    /// COM_CHANGE_USER: the payload is the command byte and the user name only (no
    /// authentication data).
    pub const CHANGE_USER: u8 = 4;
}

/// A session's state when the capture first saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Begin {
    pub user: String,
    pub schema: Option<String>,
    pub client: String,
    pub collation: u8,
    /// Capabilities between the client and sluice.
    pub capabilities: u32,
    pub in_transaction: bool,
    /// Session variables the session changed, with their values.
    pub variables: Vec<(String, String)>,
    /// Statements prepared with COM_STMT_PREPARE: the client's id, the text, and the parameter
    /// types last sent for it (2 bytes per parameter; empty if none were), which an execute
    /// that does not send them again relies on.
    pub prepared: Vec<(u32, Vec<u8>, Vec<u8>)>,
    /// Statements prepared with SQL PREPARE: name and text.
    pub sql_prepared: Vec<(String, String)>,
    /// User variables and their values (as SQL literals).
    pub user_variables: Vec<(String, String)>,
    /// The backend the session was on.
    pub backend: String,
}

/// What a response was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// The error code, 0 when the command succeeded.
    pub error: u16,
    /// Affected rows, summed over the results.
    pub affected: u64,
    /// Rows returned, summed over the results.
    pub rows: u64,
    /// A checksum of the rows in the order they came.
    pub ordered: u64,
    /// A checksum of the rows in any order (for reads without ORDER BY).
    pub unordered: u64,
    /// From the command's forwarding to the server to the end of its response, as a replay
    /// measures it (0 when sluice answered the command itself).
    pub latency_us: u64,
    /// The id a COM_STMT_PREPARE gave the client (0 for other commands).
    pub stmt_id: u32,
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Begin { session: u64, at_us: u64, begin: Box<Begin> },
    Command { session: u64, at_us: u64, number: u64, flags: u8, len: u64, payload: Vec<u8> },
    Result { session: u64, number: u64, summary: Summary },
    End { session: u64, at_us: u64 },
}

impl Record {
    pub fn session(&self) -> u64 {
        match self {
            Record::Begin { session, .. }
            | Record::Command { session, .. }
            | Record::Result { session, .. }
            | Record::End { session, .. } => *session,
        }
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Writes a record: reserves its length, lets `body` write kind and fields, fills the length in.
fn framed(out: &mut Vec<u8>, kind: u8, session: u64, body: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    put_varint(out, session);
    body(out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

pub fn put_begin(out: &mut Vec<u8>, session: u64, at_us: u64, b: &Begin) {
    framed(out, BEGIN, session, |out| {
        put_varint(out, at_us);
        put_bytes(out, b.user.as_bytes());
        match &b.schema {
            Some(s) => {
                out.push(1);
                put_bytes(out, s.as_bytes());
            }
            None => out.push(0),
        }
        put_bytes(out, b.client.as_bytes());
        out.push(b.collation);
        put_varint(out, b.capabilities.into());
        out.push(b.in_transaction.into());
        for pairs in [&b.variables, &b.sql_prepared, &b.user_variables] {
            put_varint(out, pairs.len() as u64);
            for (k, v) in pairs.iter() {
                put_bytes(out, k.as_bytes());
                put_bytes(out, v.as_bytes());
            }
        }
        put_varint(out, b.prepared.len() as u64);
        for (id, sql, types) in &b.prepared {
            put_varint(out, (*id).into());
            put_bytes(out, sql);
            put_bytes(out, types);
        }
        put_bytes(out, b.backend.as_bytes());
    });
}

/// A command: `payload` as recorded (see [`flag`]), `len` the command's whole length. (Sessions
/// write [`put_exchange`]; `Command` and `Result` records stay readable, from older captures.)
#[cfg(test)]
pub fn put_command(out: &mut Vec<u8>, session: u64, at_us: u64, number: u64, flags: u8, len: u64, payload: &[u8]) {
    framed(out, COMMAND, session, |out| {
        put_varint(out, at_us);
        put_varint(out, number);
        out.push(flags);
        put_varint(out, len);
        put_bytes(out, payload);
    });
}

#[cfg(test)]
pub fn put_result(out: &mut Vec<u8>, session: u64, number: u64, s: &Summary) {
    framed(out, RESULT, session, |out| {
        put_varint(out, number);
        put_varint(out, s.error.into());
        put_varint(out, s.affected);
        put_varint(out, s.rows);
        out.extend_from_slice(&s.ordered.to_le_bytes());
        out.extend_from_slice(&s.unordered.to_le_bytes());
        put_varint(out, s.latency_us);
        put_varint(out, s.stmt_id.into());
    });
}

/// A command and its result, as one record (see `Exchange` above).
#[allow(clippy::too_many_arguments)] // a command's fields, then its result
pub fn put_exchange(out: &mut Vec<u8>, session: u64, at_us: u64, number: u64, flags: u8, len: u64, payload: &[u8], s: &Summary) {
    let mut head = Fields::default();
    head.byte(EXCHANGE);
    for v in [session, at_us, number] {
        head.varint(v);
    }
    head.byte(flags);
    head.varint(len);
    head.varint(payload.len() as u64);
    let mut tail = Fields::default();
    for v in [s.error.into(), s.affected, s.rows, s.latency_us, s.stmt_id.into()] {
        tail.varint(v);
    }
    if (s.ordered, s.unordered) == (0, 0) {
        tail.byte(0);
    } else if s.unordered == super::sums::unordered_of_one(s.ordered) {
        tail.byte(1);
        tail.u64_le(s.ordered);
    } else {
        tail.byte(2);
        tail.u64_le(s.ordered);
        tail.u64_le(s.unordered);
    }
    let body = head.n + payload.len() + tail.n;
    out.reserve(4 + body);
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.extend_from_slice(head.bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(tail.bytes());
}

/// A record's fixed fields, gathered on the stack and copied at once.
struct Fields {
    b: [u8; 80],
    n: usize,
}

impl Default for Fields {
    fn default() -> Fields {
        Fields { b: [0; 80], n: 0 }
    }
}

impl Fields {
    fn byte(&mut self, v: u8) {
        self.b[self.n] = v;
        self.n += 1;
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    fn u64_le(&mut self, v: u64) {
        self.b[self.n..self.n + 8].copy_from_slice(&v.to_le_bytes());
        self.n += 8;
    }

    fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
}

pub fn put_end(out: &mut Vec<u8>, session: u64, at_us: u64) {
    framed(out, END, session, |out| put_varint(out, at_us));
}

/// Reads fields off a record's bytes.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.b.split_first()?;
            self.b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn u8(&mut self) -> Option<u8> {
        let (&byte, rest) = self.b.split_first()?;
        self.b = rest;
        Some(byte)
    }

    fn u64_le(&mut self) -> Option<u64> {
        let (v, rest) = self.b.split_first_chunk::<8>()?;
        self.b = rest;
        Some(u64::from_le_bytes(*v))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        if n > self.b.len() {
            return None;
        }
        let (v, rest) = self.b.split_at(n);
        self.b = rest;
        Some(v)
    }

    fn string(&mut self) -> Option<String> {
        Some(String::from_utf8_lossy(self.bytes()?).into_owned())
    }

    fn pairs(&mut self) -> Option<Vec<(String, String)>> {
        let n = self.varint()?;
        let mut v = Vec::new();
        for _ in 0..n {
            v.push((self.string()?, self.string()?));
        }
        Some(v)
    }
}

/// Where a chunk's records stop making sense.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("a record length cut short after {after} records")]
    LengthCutShort { after: usize },
    #[error("a record of {len} bytes where {left} are left")]
    RecordCutShort { len: usize, left: usize },
    #[error("record {index} does not decode")]
    Undecodable { index: usize },
}

/// Decodes the records of a chunk's bytes. Err: where the bytes stop making sense.
pub fn decode(mut b: &[u8]) -> Result<Vec<Record>, DecodeError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let Some((len, rest)) = b.split_first_chunk::<4>() else {
            return Err(DecodeError::LengthCutShort { after: out.len() });
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(DecodeError::RecordCutShort { len, left: rest.len() });
        }
        let (body, rest) = rest.split_at(len);
        b = rest;
        if body.first() == Some(&EXCHANGE) {
            let Some((command, result)) = decode_exchange(body) else {
                return Err(DecodeError::Undecodable { index: out.len() });
            };
            out.extend([command, result]);
            continue;
        }
        match decode_one(body) {
            Some(Some(r)) => out.push(r),
            Some(None) => {}
            None => return Err(DecodeError::Undecodable { index: out.len() }),
        }
    }
    Ok(out)
}

/// An `Exchange` record's body: its command and its result.
fn decode_exchange(body: &[u8]) -> Option<(Record, Record)> {
    let mut r = Reader { b: body.get(1..)? };
    let (session, at_us, number, flags, len) = (r.varint()?, r.varint()?, r.varint()?, r.u8()?, r.varint()?);
    let payload = r.bytes()?.to_vec();
    let error = u16::try_from(r.varint()?).ok()?;
    let (affected, rows, latency_us) = (r.varint()?, r.varint()?, r.varint()?);
    let stmt_id = u32::try_from(r.varint()?).ok()?;
    let (ordered, unordered) = match r.u8()? {
        0 => (0, 0),
        1 => {
            let ordered = r.u64_le()?;
            (ordered, super::sums::unordered_of_one(ordered))
        }
        2 => (r.u64_le()?, r.u64_le()?),
        _ => return None,
    };
    let summary = Summary { error, affected, rows, ordered, unordered, latency_us, stmt_id };
    Some((Record::Command { session, at_us, number, flags, len, payload }, Record::Result { session, number, summary }))
}

/// One record's body; Some(None) for a kind this version does not know.
fn decode_one(body: &[u8]) -> Option<Option<Record>> {
    let mut r = Reader { b: body };
    let kind = r.u8()?;
    let session = r.varint()?;
    Some(Some(match kind {
        BEGIN => {
            let at_us = r.varint()?;
            let user = r.string()?;
            let schema = if r.u8()? == 1 { Some(r.string()?) } else { None };
            let client = r.string()?;
            let collation = r.u8()?;
            let capabilities = u32::try_from(r.varint()?).ok()?;
            let in_transaction = r.u8()? != 0;
            let (variables, sql_prepared, user_variables) = (r.pairs()?, r.pairs()?, r.pairs()?);
            let mut prepared = Vec::new();
            for _ in 0..r.varint()? {
                prepared.push((u32::try_from(r.varint()?).ok()?, r.bytes()?.to_vec(), r.bytes()?.to_vec()));
            }
            let backend = r.string()?;
            let begin = Begin {
                user,
                schema,
                client,
                collation,
                capabilities,
                in_transaction,
                variables,
                prepared,
                sql_prepared,
                user_variables,
                backend,
            };
            Record::Begin { session, at_us, begin: Box::new(begin) }
        }
        COMMAND => {
            let (at_us, number, flags, len) = (r.varint()?, r.varint()?, r.u8()?, r.varint()?);
            Record::Command { session, at_us, number, flags, len, payload: r.bytes()?.to_vec() }
        }
        RESULT => {
            let number = r.varint()?;
            let error = u16::try_from(r.varint()?).ok()?;
            let (affected, rows) = (r.varint()?, r.varint()?);
            let (ordered, unordered, latency_us) = (r.u64_le()?, r.u64_le()?, r.varint()?);
            let stmt_id = u32::try_from(r.varint()?).ok()?;
            Record::Result { session, number, summary: Summary { error, affected, rows, ordered, unordered, latency_us, stmt_id } }
        }
        END => Record::End { session, at_us: r.varint()? },
        _ => return Some(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_as_written_and_unknown_kinds_are_skipped() {
        let begin = Begin {
            user: "app".into(),
            schema: Some("test".into()),
            client: "127.0.0.1:5000".into(),
            collation: 45,
            capabilities: 0x00ff_ffff,
            in_transaction: true,
            variables: vec![("time_zone".into(), "'+02:00'".into())],
            prepared: vec![(7, b"SELECT ?".to_vec(), vec![8, 0])],
            sql_prepared: vec![("s".into(), "SELECT 1".into())],
            user_variables: vec![("x".into(), "42".into())],
            backend: "db1".into(),
        };
        let summary = Summary { error: 1062, affected: 3, rows: 300, ordered: u64::MAX, unordered: 1, latency_us: 1234, stmt_id: 5 };
        let mut b = Vec::new();
        put_begin(&mut b, 9, 10, &begin);
        put_command(&mut b, 9, 11, 1, flag::TRUNCATED, 1 << 40, b"\x03SELECT");
        // A kind from a later version.
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&[99, 9, 0]);
        put_result(&mut b, 9, 1, &summary);
        put_end(&mut b, 9, u64::MAX);
        let got = decode(&b).unwrap();
        assert_eq!(
            got,
            [
                Record::Begin { session: 9, at_us: 10, begin: Box::new(begin) },
                Record::Command { session: 9, at_us: 11, number: 1, flags: flag::TRUNCATED, len: 1 << 40, payload: b"\x03SELECT".to_vec() },
                Record::Result { session: 9, number: 1, summary },
                Record::End { session: 9, at_us: u64::MAX },
            ]
        );
    }

    #[test]
    fn an_exchange_comes_back_as_its_command_and_result_and_is_shorter() {
        let one = crate::capture::sums::unordered_of_one(77);
        let shapes = [(0, 0, 0), (1, 77, one), (2, 77, 78), (1, 77, 0), (u64::MAX, u64::MAX, 5)];
        for (rows, ordered, unordered) in shapes {
            let summary = Summary { error: 1064, affected: 2, rows, ordered, unordered, latency_us: u64::MAX, stmt_id: u32::MAX };
            let mut b = Vec::new();
            put_exchange(&mut b, 300, 1 << 33, 7, flag::REDACTED, 9, b"\x17\x01\x00\x00\x00", &summary);
            let mut two = Vec::new();
            put_command(&mut two, 300, 1 << 33, 7, flag::REDACTED, 9, b"\x17\x01\x00\x00\x00");
            put_result(&mut two, 300, 7, &summary);
            assert_eq!(decode(&b).unwrap(), decode(&two).unwrap(), "{rows} rows");
            assert!(b.len() < two.len());
        }
        let mut b = Vec::new();
        let summary = Summary { rows: 1, ordered: 77, unordered: one, ..Summary::default() };
        put_exchange(&mut b, 1, 2, 3, 0, 6, b"\x03SELECT", &summary);
        for cut in 1..b.len() {
            assert!(decode(&b[..cut]).is_err(), "{cut}");
        }
        for i in 4..b.len() {
            let mut c = b.clone();
            c[i] ^= 0xff;
            let _ = decode(&c);
        }
    }

    #[test]
    fn cut_or_corrupt_bytes_are_an_error_not_a_panic() {
        let mut b = Vec::new();
        put_command(&mut b, 1, 2, 3, 0, 6, b"\x03SELECT");
        for cut in 0..b.len() {
            let r = decode(&b[..cut]);
            assert!(cut == 0 || r.is_err(), "{cut}: {r:?}");
        }
        for i in 4..b.len() {
            let mut c = b.clone();
            c[i] ^= 0xff;
            let _ = decode(&c);
        }
    }
}
