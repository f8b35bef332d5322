//! OK, ERR and EOF packets, and the session-state-tracking data carried by OK packets.

use crate::packet::{Malformed, Reader, put_lenenc};

/// A parsed OK packet (also the OK-shaped EOF that ends result sets under DEPRECATE_EOF).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ok<'a> {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
    pub info: &'a [u8],
    /// Raw session-state-change block (only with SESSION_TRACK and SESSION_STATE_CHANGED).
    pub session_state: &'a [u8],
}

impl<'a> Ok<'a> {
    /// Parses an OK payload (first byte 0x00 or 0xfe). `session_track` is whether
    /// CLIENT_SESSION_TRACK was negotiated on this connection.
    pub fn parse(payload: &'a [u8], session_track: bool) -> Result<Ok<'a>, Malformed> {
        let mut r = Reader::new(payload);
        let h = r.u8("ok header")?;
        if h != 0x00 && h != 0xfe {
            return Err(Malformed("ok header"));
        }
        let affected_rows = r.lenenc("affected rows")?;
        let last_insert_id = r.lenenc("last insert id")?;
        let status = r.u16("status")?;
        let warnings = r.u16("warnings")?;
        let mut ok = Ok { affected_rows, last_insert_id, status, warnings, ..Default::default() };
        if session_track {
            if !r.is_empty() {
                ok.info = r.lenenc_bytes("info")?;
            }
            if status & crate::consts::status::SESSION_STATE_CHANGED != 0 && !r.is_empty() {
                ok.session_state = r.lenenc_bytes("session state")?;
            }
        } else {
            ok.info = r.rest();
        }
        Ok(ok)
    }
}

fn lenenc_len(n: u64) -> usize {
    match n {
        0..=0xfa => 1,
        0xfb..=0xffff => 3,
        0x1_0000..=0xff_ffff => 4,
        _ => 9,
    }
}

/// Length of an OK payload without its info string and session-state block.
pub fn ok_fixed_len(ok: &Ok<'_>) -> usize {
    1 + lenenc_len(ok.affected_rows) + lenenc_len(ok.last_insert_id) + 4
}

/// Rewrites an OK payload that carries SESSION_TRACK data (a length-encoded info string and a
/// state-change block) into the form a client without CLIENT_SESSION_TRACK expects: without
/// the state block, and with the info as a plain string (MySQL) or still length-encoded
/// (`lenenc_info`: MariaDB servers always send it so). Returns None when nothing changes.
pub fn strip_session_track(payload: &[u8], lenenc_info: bool) -> Option<Vec<u8>> {
    let ok = Ok::parse(payload, true).ok()?;
    let mut plain = Vec::with_capacity(payload.len());
    let status = ok.status & !crate::consts::status::SESSION_STATE_CHANGED;
    ok_payload(&mut plain, payload[0], ok.affected_rows, ok.last_insert_id, status, ok.warnings);
    if lenenc_info {
        if !ok.info.is_empty() {
            crate::packet::put_lenenc_bytes(&mut plain, ok.info);
        }
    } else {
        plain.extend_from_slice(ok.info);
    }
    (plain != payload).then_some(plain)
}

/// What a client's own session reports of its state changes: its `session_track_*` settings,
/// where sluice's backend connection tracks more (every variable, and state changes) for its own
/// needs. Only system variables and the state-change entry are filtered: the schema and
/// transaction entries follow settings sluice leaves as the client set them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    /// `session_track_system_variables` as the server shows it: names separated by commas, or `*`.
    pub variables: Box<[u8]>,
    /// `session_track_state_change`.
    pub state_change: bool,
}

impl Default for Tracked {
    /// MariaDB's defaults.
    fn default() -> Tracked {
        Tracked {
            variables: b"autocommit,character_set_client,character_set_connection,character_set_results,time_zone"[..].into(),
            state_change: false,
        }
    }
}

impl Tracked {
    /// Whether the client's session would report `change`.
    pub fn wants(&self, change: &StateChange<'_>) -> bool {
        match change {
            StateChange::SystemVariable { name, .. } => {
                &*self.variables == b"*" || self.variables.split(|&c| c == b',').any(|n| n.trim_ascii().eq_ignore_ascii_case(name))
            }
            StateChange::StateChanged => self.state_change,
            _ => true,
        }
    }

    /// Whether an OK's state block holds an entry the client's session would not report.
    pub fn filters(&self, ok: &Ok<'_>) -> bool {
        ok.status & crate::consts::status::SESSION_STATE_CHANGED != 0 && entries(ok.session_state).any(|(_, c)| !self.wants(&c))
    }
}

/// Each entry of a session-state-change block, as its bytes and parsed.
fn entries(block: &[u8]) -> impl Iterator<Item = (&[u8], StateChange<'_>)> {
    let mut rest = block;
    std::iter::from_fn(move || {
        let change = state_changes(rest).next()?;
        let mut r = Reader::new(rest);
        r.u8("kind").ok()?;
        r.lenenc_bytes("data").ok()?;
        let (raw, after) = rest.split_at(rest.len() - r.remaining());
        rest = after;
        Some((raw, change))
    })
}

/// Rewrites an OK payload (with CLIENT_SESSION_TRACK) to hold only the state changes `t`
/// wants; without any left, the session-state-changed flag is cleared and the block left out,
/// as the client's own session would send it. None when nothing changes.
pub fn filter_session_track(payload: &[u8], t: &Tracked) -> Option<Vec<u8>> {
    let ok = Ok::parse(payload, true).ok()?;
    if !t.filters(&ok) {
        return None;
    }
    let mut block = Vec::with_capacity(ok.session_state.len());
    for (raw, change) in entries(ok.session_state) {
        if t.wants(&change) {
            block.extend_from_slice(raw);
        }
    }
    let mut out = Vec::with_capacity(payload.len());
    let mut status = ok.status;
    if block.is_empty() {
        status &= !crate::consts::status::SESSION_STATE_CHANGED;
    }
    ok_payload(&mut out, payload[0], ok.affected_rows, ok.last_insert_id, status, ok.warnings);
    if !block.is_empty() || !ok.info.is_empty() {
        crate::packet::put_lenenc_bytes(&mut out, ok.info);
    }
    if !block.is_empty() {
        crate::packet::put_lenenc_bytes(&mut out, &block);
    }
    Some(out)
}

/// Reads only the status flags of an OK or EOF payload; cheap, for the hot path.
/// A 0xfe packet is an OK-shaped terminator when DEPRECATE_EOF was negotiated, else a classic EOF.
pub fn terminator_status(payload: &[u8], deprecate_eof: bool) -> Option<u16> {
    match payload.first()? {
        0xfe if !deprecate_eof => {
            // Classic EOF: 0xfe, warnings(2), status(2).
            Some(u16::from_le_bytes([*payload.get(3)?, *payload.get(4)?]))
        }
        0x00 | 0xfe => {
            let mut r = Reader::new(payload);
            r.u8("h").ok()?;
            r.lenenc("a").ok()?;
            r.lenenc("b").ok()?;
            r.u16("s").ok()
        }
        _ => None,
    }
}

/// A parsed ERR packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Err<'a> {
    pub code: u16,
    pub sql_state: [u8; 5],
    pub message: &'a [u8],
}

impl<'a> Err<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Err<'a>, Malformed> {
        let mut r = Reader::new(payload);
        if r.u8("err header")? != 0xff {
            return Err(Malformed("err header"));
        }
        let code = r.u16("error code")?;
        let mut sql_state = NO_SQL_STATE;
        if r.peek() == Some(b'#') && r.remaining() >= 6 {
            r.u8("#")?;
            sql_state.copy_from_slice(r.bytes(5, "sql state")?);
        }
        Ok(Err { code, sql_state, message: r.rest() })
    }
}

/// The SQL state of an ERR packet that carried none (servers omit it before the handshake).
pub const NO_SQL_STATE: [u8; 5] = [0; 5];

/// Builds an ERR payload; with [`NO_SQL_STATE`] the state marker is left out.
pub fn err_payload(out: &mut Vec<u8>, code: u16, sql_state: &[u8; 5], message: &str) {
    out.push(0xff);
    out.extend_from_slice(&code.to_le_bytes());
    if *sql_state != NO_SQL_STATE {
        out.push(b'#');
        out.extend_from_slice(sql_state);
    }
    out.extend_from_slice(message.as_bytes());
}

/// Builds an ERR payload sent instead of a greeting: before capabilities are negotiated there
/// is no SQL state marker.
pub fn err_payload_pre_handshake(out: &mut Vec<u8>, code: u16, message: &str) {
    out.push(0xff);
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// Builds an OK payload (header 0x00, or 0xfe when it stands in for an EOF).
pub fn ok_payload(out: &mut Vec<u8>, header: u8, affected: u64, insert_id: u64, status: u16, warnings: u16) {
    out.push(header);
    put_lenenc(out, affected);
    put_lenenc(out, insert_id);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&warnings.to_le_bytes());
}

/// Builds a classic EOF payload.
pub fn eof_payload(out: &mut Vec<u8>, warnings: u16, status: u16) {
    out.push(0xfe);
    out.extend_from_slice(&warnings.to_le_bytes());
    out.extend_from_slice(&status.to_le_bytes());
}

/// One entry of the session-state-change block of an OK packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange<'a> {
    SystemVariable { name: &'a [u8], value: &'a [u8] },
    Schema(&'a [u8]),
    StateChanged,
    Gtids(&'a [u8]),
    TransactionCharacteristics(&'a [u8]),
    TransactionState(&'a [u8]),
    Other(u8),
}

/// Iterates over the entries of a session-state-change block. Stops at the first malformed entry.
pub fn state_changes(block: &[u8]) -> impl Iterator<Item = StateChange<'_>> {
    let mut r = Reader::new(block);
    std::iter::from_fn(move || {
        if r.is_empty() {
            return None;
        }
        let kind = r.u8("kind").ok()?;
        let data = r.lenenc_bytes("data").ok()?;
        let mut d = Reader::new(data);
        Some(match kind {
            0 => {
                let name = d.lenenc_bytes("name").ok()?;
                let value = d.lenenc_bytes("value").ok()?;
                StateChange::SystemVariable { name, value }
            }
            1 => StateChange::Schema(d.lenenc_bytes("schema").ok()?),
            2 => StateChange::StateChanged,
            3 => StateChange::Gtids(data),
            4 => StateChange::TransactionCharacteristics(d.lenenc_bytes("chars").ok()?),
            5 => StateChange::TransactionState(d.lenenc_bytes("state").ok()?),
            k => StateChange::Other(k),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::status;

    #[test]
    fn ok_with_session_track() {
        let mut p = Vec::new();
        ok_payload(&mut p, 0, 3, 7, status::AUTOCOMMIT | status::SESSION_STATE_CHANGED, 1);
        crate::packet::put_lenenc_bytes(&mut p, b"");
        let mut block = Vec::new();
        block.push(1);
        crate::packet::put_lenenc_bytes(&mut block, b"\x04test");
        block.push(0);
        let mut var = Vec::new();
        crate::packet::put_lenenc_bytes(&mut var, b"autocommit");
        crate::packet::put_lenenc_bytes(&mut var, b"OFF");
        crate::packet::put_lenenc_bytes(&mut block, &var);
        crate::packet::put_lenenc_bytes(&mut p, &block);
        let ok = Ok::parse(&p, true).unwrap();
        assert_eq!((ok.affected_rows, ok.last_insert_id, ok.warnings), (3, 7, 1));
        let changes: Vec<_> = state_changes(ok.session_state).collect();
        assert_eq!(changes, vec![StateChange::Schema(b"test"), StateChange::SystemVariable { name: b"autocommit", value: b"OFF" }]);
        assert_eq!(terminator_status(&p, true), Some(status::AUTOCOMMIT | status::SESSION_STATE_CHANGED));
    }

    #[test]
    fn strip_session_track_info() {
        let mut p = Vec::new();
        ok_payload(&mut p, 0, 1, 0, status::SESSION_STATE_CHANGED | status::AUTOCOMMIT, 0);
        crate::packet::put_lenenc_bytes(&mut p, b"Rows matched: 1");
        crate::packet::put_lenenc_bytes(&mut p, b"\x01\x05\x04test");
        let plain = strip_session_track(&p, false).unwrap();
        let ok = Ok::parse(&plain, false).unwrap();
        assert_eq!((ok.status, ok.info), (status::AUTOCOMMIT, &b"Rows matched: 1"[..]));
        let mariadb = strip_session_track(&p, true).unwrap();
        let ok = Ok::parse(&mariadb, true).unwrap();
        assert_eq!((ok.status, ok.info, ok.session_state), (status::AUTOCOMMIT, &b"Rows matched: 1"[..], &b""[..]));
        let mut bare = Vec::new();
        ok_payload(&mut bare, 0, 0, 0, status::AUTOCOMMIT, 0);
        assert_eq!(strip_session_track(&bare, false), None);
    }

    #[test]
    fn only_what_the_client_tracks_is_left() {
        let entry = |kind: u8, data: &[u8]| {
            let mut e = vec![kind];
            crate::packet::put_lenenc_bytes(&mut e, data);
            e
        };
        let var = |name: &[u8], value: &[u8]| {
            let mut v = Vec::new();
            crate::packet::put_lenenc_bytes(&mut v, name);
            crate::packet::put_lenenc_bytes(&mut v, value);
            entry(0, &v)
        };
        let ok_with = |block: &[u8]| {
            let mut p = Vec::new();
            ok_payload(&mut p, 0, 1, 0, status::SESSION_STATE_CHANGED | status::AUTOCOMMIT | status::MORE_RESULTS_EXISTS, 0);
            crate::packet::put_lenenc_bytes(&mut p, b"");
            crate::packet::put_lenenc_bytes(&mut p, block);
            p
        };
        let t = Tracked::default();
        // A user variable set: the state changed, which the client does not track.
        let p = ok_with(&entry(2, b"1"));
        let out = filter_session_track(&p, &t).unwrap();
        let ok = Ok::parse(&out, true).unwrap();
        assert_eq!((ok.status, ok.session_state), (status::AUTOCOMMIT | status::MORE_RESULTS_EXISTS, &b""[..]));
        assert_eq!(out.len(), basic_len(&ok), "no info and no block: {out:?}");
        // A time zone and the GTID of a write: only the time zone stays.
        let mut block = var(b"last_gtid", b"0-1-5");
        block.extend(var(b"TIME_ZONE", b"+01:00"));
        block.extend(entry(2, b"1"));
        let out = filter_session_track(&ok_with(&block), &t).unwrap();
        let ok = Ok::parse(&out, true).unwrap();
        assert_ne!(ok.status & status::SESSION_STATE_CHANGED, 0);
        let changes: Vec<_> = state_changes(ok.session_state).collect();
        assert_eq!(changes, vec![StateChange::SystemVariable { name: b"TIME_ZONE", value: b"+01:00" }]);
        // What the client tracks itself passes as it is.
        let all = Tracked { variables: b"*"[..].into(), state_change: true };
        assert_eq!(filter_session_track(&ok_with(&block), &all), None);
        let mut schema = entry(1, b"\x02db");
        schema.extend(var(b"autocommit", b"OFF"));
        assert_eq!(filter_session_track(&ok_with(&schema), &t), None);
        let some = Tracked { variables: b"sql_mode, last_gtid"[..].into(), state_change: false };
        let out = filter_session_track(&ok_with(&block), &some).unwrap();
        let changes: Vec<_> = state_changes(Ok::parse(&out, true).unwrap().session_state).collect();
        assert_eq!(changes, vec![StateChange::SystemVariable { name: b"last_gtid", value: b"0-1-5" }]);
    }

    fn basic_len(ok: &Ok<'_>) -> usize {
        ok_fixed_len(ok)
    }

    #[test]
    fn err_round_trip() {
        let mut p = Vec::new();
        err_payload(&mut p, 1045, b"28000", "Access denied");
        let e = Err::parse(&p).unwrap();
        assert_eq!((e.code, &e.sql_state, e.message), (1045, b"28000", &b"Access denied"[..]));
    }

    #[test]
    fn classic_eof_status() {
        let mut p = Vec::new();
        eof_payload(&mut p, 0, status::MORE_RESULTS_EXISTS);
        assert_eq!(terminator_status(&p, false), Some(status::MORE_RESULTS_EXISTS));
    }
}
