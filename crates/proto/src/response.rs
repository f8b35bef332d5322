//! Following a server's response stream header by header.
//!
//! The relay hands every chunk it reads from a backend to [`ResponseTracker::scan`], which walks
//! the packet headers, looks inside only the packets that carry state (OK, ERR, EOF, column
//! counts, PREPARE_OK) and reports how many bytes may be forwarded and whether the response is
//! complete. Row data and column definitions are skipped by length, so they can be forwarded
//! straight from the read buffer, including partial packets of any size.

use crate::basic;
use crate::consts::{MAX_PAYLOAD, status};
use crate::packet::{HEADER, Header, Malformed, Reader};

/// The shape of the response a command gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// OK, ERR, LOCAL INFILE request or one or more result sets (COM_QUERY, COM_STMT_EXECUTE
    /// without a cursor, COM_PROCESS_INFO, COM_STMT_BULK_EXECUTE). The cursor-exists flag is
    /// not a cursor here: MariaDB sets it on result sets inside a CALL whose rows still follow.
    Results,
    /// The answer to a COM_STMT_EXECUTE that asked for a cursor: as [`Expect::Results`], but a
    /// result set whose column definitions end with the cursor-exists flag ends the response
    /// (its rows come through COM_STMT_FETCH).
    Cursor,
    /// A single OK, ERR or EOF (COM_PING, COM_INIT_DB, COM_SET_OPTION, COM_STMT_RESET, ...): a
    /// more-results flag on it is not trusted.
    Reply,
    /// PREPARE_OK with parameter and column definitions, or ERR.
    Prepare,
    /// Rows until a terminator (COM_STMT_FETCH).
    Rows,
    /// Column definitions until EOF (COM_FIELD_LIST).
    FieldList,
    /// Exactly one packet of any content (COM_STATISTICS).
    Single,
    /// No response at all (COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA, COM_QUIT).
    Nothing,
}

impl Expect {
    /// The response a command gets, by its first bytes (`head`: the command byte and at least
    /// what follows up to an execute's flags byte, which says whether it opens a cursor).
    /// Commands a proxy handles apart (COM_QUIT, COM_CHANGE_USER, replication) are its own
    /// business; anything unknown is taken for [`Expect::Results`].
    #[inline]
    pub fn of(head: &[u8]) -> Expect {
        use crate::consts::com;
        match head.first().copied().unwrap_or(com::QUERY) {
            com::STMT_PREPARE => Expect::Prepare,
            // The flags byte after the statement id: a cursor type other than none.
            com::STMT_EXECUTE if head.get(5).is_some_and(|f| f & 7 != 0) => Expect::Cursor,
            com::STMT_FETCH => Expect::Rows,
            com::FIELD_LIST => Expect::FieldList,
            com::STATISTICS => Expect::Single,
            com::STMT_CLOSE | com::STMT_SEND_LONG_DATA | com::QUIT => Expect::Nothing,
            com::PING
            | com::INIT_DB
            | com::REFRESH
            | com::SHUTDOWN
            | com::DEBUG
            | com::SET_OPTION
            | com::STMT_RESET
            | com::RESET_CONNECTION
            | com::CREATE_DB
            | com::DROP_DB => Expect::Reply,
            _ => Expect::Results,
        }
    }
}

/// Receives what the tracker finds in the packets it inspects.
pub trait Sink {
    /// An OK packet, or the OK-shaped terminator of a result set.
    fn ok(&mut self, _ok: &basic::Ok<'_>) {}
    /// The status flags and warning count of a classic EOF packet.
    fn eof(&mut self, _status: u16, _warnings: u16) {}
    fn err(&mut self, _err: &basic::Err<'_>) {}
    /// A result set begins (column count known).
    fn result_set(&mut self, _columns: u64) {}
    /// A row begins: its payload when the buffer holds it whole, else nothing, and the payload
    /// follows through [`Sink::row_more`] as it passes (a row longer than the buffer, or one of
    /// 16 MiB and more, continued in further packets).
    fn row(&mut self, _payload: &[u8]) {}
    /// More of the payload of the row last begun.
    fn row_more(&mut self, _bytes: &[u8]) {}
    fn prepared(&mut self, _stmt_id: u32, _columns: u16, _params: u16) {}
}

/// A sink that ignores everything.
pub struct NoSink;
impl Sink for NoSink {}

/// The warning count of a classic EOF packet (0xfe, warnings, status).
fn eof_warnings(p: &[u8]) -> u16 {
    match p {
        [0xfe, a, b, _, _, ..] => u16::from_le_bytes([*a, *b]),
        _ => 0,
    }
}

/// Result of one scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Bytes of the input that belong to the response and may be forwarded now.
    pub consumed: usize,
    pub state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// More of the response is to come.
    Pending,
    /// The response is complete; `consumed` ends exactly at its end.
    Done,
    /// `consumed` ends with the terminator of the result [`ResponseTracker::hold_at`] named:
    /// the caller acts before it scans on (the response may be complete too).
    Held,
    /// The server asked for a LOCAL INFILE upload; the client's data packets follow, ending with
    /// an empty packet, after which [`ResponseTracker::after_infile`] resumes tracking.
    LocalInfile,
    /// The `len` bytes after `consumed` are an OK packet (already processed) that carries
    /// SESSION_TRACK data the client did not ask for: the caller sends a rewritten copy
    /// (see [`crate::basic::strip_session_track`]) instead, skips them, and scans on.
    Rewrite { len: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    First,
    Columns(u64),
    ColumnsEof,
    Rows,
    PrepareOk,
    Params { left: u16, columns: u16 },
    ParamsEof { columns: u16 },
    PrepareColumns(u16),
    PrepareColumnsEof,
    FieldList,
    Single,
    Done,
}

/// [`ResponseTracker::after`]: the OK just read is reported as [`State::Rewrite`].
const REWRITE: u8 = 1;
/// [`ResponseTracker::after`]: the result [`ResponseTracker::hold_at`] names just ended.
const HOLD: u8 = 2;

/// Follows one response. Reusable: call [`ResponseTracker::start`] for every command.
#[derive(Debug, Clone)]
pub struct ResponseTracker {
    phase: Phase,
    deprecate_eof: bool,
    session_track: bool,
    /// The client lacks CLIENT_SESSION_TRACK while the server sends it: OKs with tracking data
    /// are reported as [`State::Rewrite`].
    strip_session_track: bool,
    /// The server writes OK info length-encoded even without SESSION_TRACK (MariaDB).
    lenenc_info: bool,
    /// The client has CLIENT_SESSION_TRACK and tracks less than the server reports: OKs with
    /// state changes it would not see are reported as [`State::Rewrite`].
    filter: Option<Box<basic::Tracked>>,
    /// What the scan reports after the control packet just read ([`REWRITE`], [`HOLD`]).
    after: u8,
    /// Results of the command that ended in an OK or EOF so far.
    results: u32,
    /// The scan holds ([`State::Held`]) once this many have (0: never).
    hold_at: u32,
    /// Payload bytes of the current packet still to pass without looking.
    skip: usize,
    /// The packet being skipped is 0xffffff long: the next one continues it.
    continued: bool,
    /// The bytes being skipped are a row's ([`Sink::row_more`]).
    in_row: bool,
    /// The command may be answered by several results (the more-results flag is followed).
    multi: bool,
    /// The command asked for a cursor (the cursor-exists flag after column definitions ends
    /// the response).
    cursor: bool,
    /// Status flags of the last OK/EOF seen.
    pub last_status: Option<u16>,
    /// Sequence id of the last packet header seen.
    pub last_seq: u8,
}

impl ResponseTracker {
    pub fn new(deprecate_eof: bool, session_track: bool) -> Self {
        ResponseTracker {
            phase: Phase::Done,
            deprecate_eof,
            session_track,
            strip_session_track: false,
            lenenc_info: false,
            filter: None,
            after: 0,
            results: 0,
            hold_at: 0,
            skip: 0,
            continued: false,
            in_row: false,
            multi: false,
            cursor: false,
            last_status: None,
            last_seq: 0,
        }
    }

    /// Reports OKs with SESSION_TRACK data for rewriting (client without CLIENT_SESSION_TRACK).
    /// `lenenc_info`: the server is MariaDB, whose OK info is length-encoded either way.
    pub fn strip_session_track(mut self, on: bool, lenenc_info: bool) -> Self {
        self.strip_session_track = on && self.session_track;
        self.lenenc_info = lenenc_info;
        self
    }

    /// Reports OKs with state changes that `client` does not track for rewriting (a client
    /// with CLIENT_SESSION_TRACK; None: pass them as they come).
    pub fn filter_session_track(&mut self, client: Option<basic::Tracked>) {
        self.filter = client.filter(|_| self.session_track && !self.strip_session_track).map(Box::new);
    }

    /// What the client should get for an OK reported as [`State::Rewrite`] (None: the OK as it is).
    pub fn rewrite_ok(&self, payload: &[u8]) -> Option<Vec<u8>> {
        match &self.filter {
            Some(t) => basic::filter_session_track(payload, t),
            None => basic::strip_session_track(payload, self.lenenc_info),
        }
    }

    /// Begins following the response to a new command whose last packet had sequence id
    /// `request_seq` (the response continues from there).
    /// Whether any of the response was seen since [`ResponseTracker::start`] (for a command
    /// answered by OK, ERR or results).
    pub fn begun(&self) -> bool {
        !matches!(self.phase, Phase::First)
    }

    pub fn start(&mut self, expect: Expect, request_seq: u8) {
        self.last_seq = request_seq;
        self.multi = matches!(expect, Expect::Results | Expect::Cursor);
        self.cursor = expect == Expect::Cursor;
        self.phase = match expect {
            Expect::Results | Expect::Cursor | Expect::Reply => Phase::First,
            Expect::Prepare => Phase::PrepareOk,
            Expect::Rows => Phase::Rows,
            Expect::FieldList => Phase::FieldList,
            Expect::Single => Phase::Single,
            Expect::Nothing => Phase::Done,
        };
        self.skip = 0;
        self.continued = false;
        self.in_row = false;
        self.last_status = None;
        self.results = 0;
        self.hold_at = 0;
    }

    /// Makes the scan stop ([`State::Held`]) right after the `n`th result of the command ends
    /// in an OK or EOF (0: never), as a KILL among other statements needs.
    pub fn hold_at(&mut self, n: u32) {
        self.hold_at = n;
    }

    /// How many results of the command have ended in an OK or EOF.
    pub fn results(&self) -> u32 {
        self.results
    }

    /// Resumes after the client finished a LOCAL INFILE upload: the server answers OK or ERR.
    pub fn after_infile(&mut self) {
        self.phase = Phase::First;
    }

    pub fn lenenc_info(&self) -> bool {
        self.lenenc_info
    }

    /// True when the next byte would start a packet (an error can be injected cleanly).
    pub fn at_packet_boundary(&self) -> bool {
        self.skip == 0 && !self.continued
    }

    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Walks the packets in `buf` (the unforwarded bytes of the response, starting at a packet
    /// boundary or inside a packet being skipped).
    pub fn scan<S: Sink>(&mut self, buf: &[u8], sink: &mut S) -> Result<Scan, Malformed> {
        if self.after == HOLD {
            // (Due at the OK last reported for rewriting: the hold comes after it.)
            self.after = 0;
            return Ok(Scan { consumed: 0, state: State::Held });
        }
        let mut pos = 0;
        loop {
            if matches!(self.phase, Phase::Rows) && self.skip == 0 && !self.continued {
                pos = skip_whole_rows(buf, pos, &mut self.last_seq, sink);
            }
            if self.skip > 0 {
                let n = self.skip.min(buf.len() - pos);
                if self.in_row {
                    sink.row_more(&buf[pos..pos + n]);
                }
                pos += n;
                self.skip -= n;
                if self.skip > 0 {
                    return Ok(Scan { consumed: pos, state: State::Pending });
                }
                if matches!(self.phase, Phase::Done) && !self.continued {
                    return Ok(Scan { consumed: pos, state: State::Done });
                }
                continue;
            }
            if matches!(self.phase, Phase::Done) && !self.continued {
                return Ok(Scan { consumed: pos, state: State::Done });
            }
            let Some(h) = Header::parse(&buf[pos..]) else {
                return Ok(Scan { consumed: pos, state: State::Pending });
            };
            self.last_seq = h.seq;
            let body = &buf[pos + HEADER..];
            if self.continued {
                self.continued = h.continues();
                pos += HEADER;
                self.skip = h.len;
                continue;
            }
            if h.len > 0 && body.is_empty() {
                return Ok(Scan { consumed: pos, state: State::Pending });
            }
            let first = if h.len > 0 { Some(body[0]) } else { None };
            self.in_row = false;
            if self.inspect(first, h.len) {
                if h.len >= MAX_PAYLOAD {
                    return Err(Malformed("oversized control packet"));
                }
                if body.len() < h.len {
                    return Ok(Scan { consumed: pos, state: State::Pending });
                }
                let start = pos;
                pos += HEADER + h.len;
                if self.control(&body[..h.len], sink)? {
                    return Ok(Scan { consumed: pos, state: State::LocalInfile });
                }
                if self.after != 0 {
                    if self.after & REWRITE != 0 {
                        self.after &= !REWRITE;
                        return Ok(Scan { consumed: start, state: State::Rewrite { len: HEADER + h.len } });
                    }
                    self.after = 0;
                    return Ok(Scan { consumed: pos, state: State::Held });
                }
            } else {
                self.data(first, sink);
                self.continued = h.continues();
                pos += HEADER;
                self.skip = h.len;
            }
        }
    }

    /// Whether a packet starting with `first` must be read whole and looked into.
    fn inspect(&self, first: Option<u8>, len: usize) -> bool {
        match self.phase {
            Phase::First | Phase::ColumnsEof | Phase::PrepareOk | Phase::ParamsEof { .. } | Phase::PrepareColumnsEof => true,
            Phase::Rows | Phase::FieldList => match first {
                Some(0xff) => true,
                Some(0xfe) => len < MAX_PAYLOAD,
                _ => false,
            },
            Phase::Columns(_) | Phase::Params { .. } | Phase::PrepareColumns(_) | Phase::Single | Phase::Done => false,
        }
    }

    /// A packet passed by length: a column or parameter definition, a row, or a lone answer.
    fn data<S: Sink>(&mut self, _first: Option<u8>, sink: &mut S) {
        self.phase = match self.phase {
            Phase::Columns(n) if n > 1 => Phase::Columns(n - 1),
            Phase::Columns(_) => {
                if self.deprecate_eof {
                    Phase::Rows
                } else {
                    Phase::ColumnsEof
                }
            }
            Phase::Rows => {
                sink.row(&[]);
                self.in_row = true;
                Phase::Rows
            }
            Phase::Params { left, columns } if left > 1 => Phase::Params { left: left - 1, columns },
            Phase::Params { columns, .. } => {
                if self.deprecate_eof {
                    self.after_params(columns)
                } else {
                    Phase::ParamsEof { columns }
                }
            }
            Phase::PrepareColumns(n) if n > 1 => Phase::PrepareColumns(n - 1),
            Phase::PrepareColumns(_) => {
                if self.deprecate_eof {
                    Phase::Done
                } else {
                    Phase::PrepareColumnsEof
                }
            }
            Phase::Single => Phase::Done,
            other => other,
        };
    }

    fn after_params(&self, columns: u16) -> Phase {
        if columns > 0 { Phase::PrepareColumns(columns) } else { Phase::Done }
    }

    /// A packet read whole. Returns true when it is a LOCAL INFILE request.
    fn control<S: Sink>(&mut self, p: &[u8], sink: &mut S) -> Result<bool, Malformed> {
        let first = p.first().copied();
        match self.phase {
            Phase::First => match first {
                Some(0x00) | Some(0xfe) => self.terminator(p, sink)?,
                Some(0xff) => self.error(p, sink)?,
                Some(0xfb) if self.multi => {
                    self.phase = Phase::Done;
                    return Ok(true);
                }
                Some(_) => {
                    let n = Reader::new(p).lenenc("column count")?;
                    if n == 0 {
                        return Err(Malformed("zero column count"));
                    }
                    sink.result_set(n);
                    self.phase = Phase::Columns(n);
                }
                None => return Err(Malformed("empty response packet")),
            },
            Phase::ColumnsEof => match first {
                Some(0xfe) => {
                    let st = basic::terminator_status(p, self.deprecate_eof).ok_or(Malformed("eof"))?;
                    sink.eof(st, eof_warnings(p));
                    self.last_status = Some(st);
                    // A cursor was opened: rows come later through COM_STMT_FETCH. Only an
                    // execute that asked for one gets one; elsewhere the flag is noise.
                    self.phase = if self.cursor && st & status::CURSOR_EXISTS != 0 { Phase::Done } else { Phase::Rows };
                }
                Some(0xff) => self.error(p, sink)?,
                _ => return Err(Malformed("expected EOF after column definitions")),
            },
            Phase::Rows | Phase::FieldList => match first {
                Some(0xff) => self.error(p, sink)?,
                _ => self.terminator(p, sink)?,
            },
            Phase::PrepareOk => match first {
                Some(0x00) => {
                    let mut r = Reader::new(p);
                    r.u8("prepare ok")?;
                    let id = r.u32("statement id")?;
                    let columns = r.u16("column count")?;
                    let params = r.u16("parameter count")?;
                    sink.prepared(id, columns, params);
                    self.phase = if params > 0 { Phase::Params { left: params, columns } } else { self.after_params(columns) };
                }
                Some(0xff) => self.error(p, sink)?,
                _ => return Err(Malformed("expected PREPARE_OK")),
            },
            Phase::ParamsEof { columns } => {
                self.expect_eof(p, sink)?;
                self.phase = self.after_params(columns);
            }
            Phase::PrepareColumnsEof => {
                self.expect_eof(p, sink)?;
                self.phase = Phase::Done;
            }
            _ => {}
        }
        Ok(false)
    }

    fn expect_eof<S: Sink>(&mut self, p: &[u8], sink: &mut S) -> Result<(), Malformed> {
        if p.first() != Some(&0xfe) {
            return Err(Malformed("expected EOF"));
        }
        let st = basic::terminator_status(p, self.deprecate_eof).ok_or(Malformed("eof"))?;
        sink.eof(st, eof_warnings(p));
        Ok(())
    }

    /// OK or EOF ending a statement's result: more results may follow.
    fn terminator<S: Sink>(&mut self, p: &[u8], sink: &mut S) -> Result<(), Malformed> {
        let st = if p[0] == 0xfe && !self.deprecate_eof {
            let st = basic::terminator_status(p, self.deprecate_eof).ok_or(Malformed("eof"))?;
            sink.eof(st, eof_warnings(p));
            st
        } else {
            let ok = basic::Ok::parse(p, self.session_track)?;
            sink.ok(&ok);
            let rewrite = if self.strip_session_track {
                ok.status & status::SESSION_STATE_CHANGED != 0 || (!self.lenenc_info && p.len() > basic::ok_fixed_len(&ok))
            } else {
                self.filter.as_ref().is_some_and(|t| t.filters(&ok))
            };
            self.after = u8::from(rewrite) * REWRITE;
            ok.status
        };
        self.last_status = Some(st);
        self.results += 1;
        if self.results == self.hold_at {
            self.after |= HOLD;
        }
        // Only a command that may have several results has another one coming: rows fetched
        // from a cursor, a field list or a single reply end at their terminator.
        let more = self.multi && st & status::MORE_RESULTS_EXISTS != 0;
        self.phase = if more { Phase::First } else { Phase::Done };
        Ok(())
    }

    fn error<S: Sink>(&mut self, p: &[u8], sink: &mut S) -> Result<(), Malformed> {
        let e = basic::Err::parse(p)?;
        sink.err(&e);
        self.phase = Phase::Done;
        Ok(())
    }
}

/// The hot loop of a result set: steps over complete row packets from `pos`, looking only at
/// each header and first byte, and stops before anything else (a terminator, an error, a packet
/// that continues in the next one, or an incomplete packet), which the general path handles.
///
/// Each header says where the next one is, so a plain walk waits for every load in turn. Rows
/// of one length (fixed-width columns, binary rows of numbers and dates) are checked in groups
/// instead ([`equal_rows`]), whose loads do not wait for each other.
#[inline]
fn skip_whole_rows<S: Sink>(buf: &[u8], mut pos: usize, last_seq: &mut u8, sink: &mut S) -> usize {
    let mut seq = None;
    // The last row's length, while groups of rows of that length are worth trying.
    let mut previous = None;
    while let Some(b) = buf.get(pos..).and_then(|rest| rest.first_chunk::<{ HEADER + 1 }>()) {
        let len = u32::from_le_bytes([b[0], b[1], b[2], 0]) as usize;
        // (`buf.len() - pos` is at least HEADER + 1 here.)
        if len == 0 || len >= MAX_PAYLOAD || b[HEADER] >= 0xfe || buf.len() - pos - HEADER < len {
            break;
        }
        if previous == Some(len) {
            let rows = equal_rows(buf, pos, len);
            if rows > 0 {
                for _ in 0..rows {
                    sink.row(&buf[pos + HEADER..pos + HEADER + len]);
                    pos += HEADER + len;
                }
                // (The sequence number of the group's last row.)
                seq = Some(buf[pos - HEADER - len + 3]);
                continue;
            }
            // No group here: none is tried again until two rows in a row have one length.
            previous = None;
        } else {
            previous = Some(len);
        }
        sink.row(&buf[pos + HEADER..pos + HEADER + len]);
        seq = Some(b[3]);
        pos += HEADER + len;
    }
    if let Some(s) = seq {
        *last_seq = s;
    }
    pos
}

/// Rows checked at once by [`equal_rows`].
const GROUP: usize = 8;

/// How many whole row packets of payload length `len` follow one another from `pos` (a packet's
/// start), counted in groups of [`GROUP`]: 0 when the next group is not all such rows, or does
/// not fit in `buf`. Every header is read at a packet's start, as the walk would read it: the
/// one before it says so. (Not inlined: the walk of a short result stays small.)
#[inline(never)]
fn equal_rows(buf: &[u8], pos: usize, len: usize) -> usize {
    let stride = HEADER + len;
    let mut rows = 0;
    while let Some(group) = buf.get(pos + rows * stride..pos + (rows + GROUP) * stride) {
        let mut all = true;
        for row in group.chunks_exact(stride) {
            let same = u32::from_le_bytes([row[0], row[1], row[2], 0]) as usize == len;
            all &= same & (row[HEADER] < 0xfe);
        }
        if !all {
            break;
        }
        rows += GROUP;
    }
    rows
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
