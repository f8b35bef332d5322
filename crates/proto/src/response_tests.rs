use super::*;
use crate::basic::{eof_payload, err_payload, ok_payload};
use crate::packet::{frame, put_lenenc};

/// Builds a response stream packet by packet.
struct Stream {
    out: Vec<u8>,
    seq: u8,
}

impl Stream {
    fn new() -> Self {
        Stream { out: Vec::new(), seq: 1 }
    }
    fn packet(&mut self, payload: &[u8]) -> &mut Self {
        self.seq = frame(&mut self.out, payload, self.seq);
        self
    }
    fn ok(&mut self, st: u16) -> &mut Self {
        let mut p = Vec::new();
        ok_payload(&mut p, 0, 1, 0, st, 0);
        self.packet(&p)
    }
    fn ok_eof(&mut self, st: u16) -> &mut Self {
        let mut p = Vec::new();
        ok_payload(&mut p, 0xfe, 0, 0, st, 0);
        self.packet(&p)
    }
    fn eof(&mut self, st: u16) -> &mut Self {
        let mut p = Vec::new();
        eof_payload(&mut p, 0, st);
        self.packet(&p)
    }
    fn err(&mut self) -> &mut Self {
        let mut p = Vec::new();
        err_payload(&mut p, 1064, b"42000", "syntax");
        self.packet(&p)
    }
    fn count(&mut self, n: u64) -> &mut Self {
        let mut p = Vec::new();
        put_lenenc(&mut p, n);
        self.packet(&p)
    }
    fn coldef(&mut self) -> &mut Self {
        self.packet(b"\x03def\x00\x00\x00\x01a\x00\x0c\x21\x00\x0b\x00\x00\x00\x03\x00\x00\x00\x00\x00")
    }
    fn row(&mut self, v: &[u8]) -> &mut Self {
        let mut p = Vec::new();
        put_lenenc(&mut p, v.len() as u64);
        p.extend_from_slice(v);
        self.packet(&p)
    }
}

#[derive(Default, Debug, PartialEq)]
struct Count {
    oks: usize,
    eofs: usize,
    errs: usize,
    rows: usize,
    /// Each row's payload, as the sink got it (whole or in pieces).
    payloads: Vec<Vec<u8>>,
    sets: usize,
    prepared: Option<(u32, u16, u16)>,
}

impl Sink for Count {
    fn ok(&mut self, _: &basic::Ok<'_>) {
        self.oks += 1;
    }
    fn eof(&mut self, _: u16, _: u16) {
        self.eofs += 1;
    }
    fn err(&mut self, _: &basic::Err<'_>) {
        self.errs += 1;
    }
    fn result_set(&mut self, _: u64) {
        self.sets += 1;
    }
    fn row(&mut self, payload: &[u8]) {
        self.rows += 1;
        self.payloads.push(payload.to_vec());
    }
    fn row_more(&mut self, bytes: &[u8]) {
        self.payloads.last_mut().expect("a row began").extend_from_slice(bytes);
    }
    fn prepared(&mut self, id: u32, c: u16, p: u16) {
        self.prepared = Some((id, c, p));
    }
}

/// Feeds `stream` to a tracker `chunk` bytes at a time the way the relay does (unconsumed bytes
/// stay in the buffer) and returns the bytes forwarded and the final state.
fn drive(t: &mut ResponseTracker, stream: &[u8], chunk: usize, sink: &mut Count) -> (usize, State) {
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut forwarded = 0;
    loop {
        let s = t.scan(&buf, sink).expect("well-formed stream");
        forwarded += s.consumed;
        buf.drain(..s.consumed);
        if s.state != State::Pending {
            return (forwarded, s.state);
        }
        assert!(fed < stream.len(), "tracker wants more than the stream has");
        let n = chunk.min(stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
    }
}

fn check(expect: Expect, deprecate_eof: bool, stream: &[u8]) -> Count {
    let mut last = None;
    for chunk in [1, 2, 3, 7, 64, usize::MAX] {
        let mut t = ResponseTracker::new(deprecate_eof, true);
        t.start(expect, 0);
        let mut c = Count::default();
        let (n, state) = drive(&mut t, stream, chunk, &mut c);
        assert_eq!(n, stream.len(), "chunk {chunk}: response must end exactly at the stream's end");
        assert_eq!(state, State::Done);
        // Whole rows at once (the fast path) and byte by byte (the general path) agree.
        if let Some(prev) = &last {
            assert_eq!(prev, &c, "chunk {chunk}");
        }
        last = Some(c);
    }
    last.unwrap()
}

#[test]
fn ok_and_err() {
    let c = check(Expect::Results, true, &Stream::new().ok(status::AUTOCOMMIT).out);
    assert_eq!(c.oks, 1);
    let c = check(Expect::Results, true, &Stream::new().err().out);
    assert_eq!(c.errs, 1);
}

#[test]
fn text_result_classic_eof() {
    let mut s = Stream::new();
    s.count(2).coldef().coldef().eof(0).row(b"").row(b"x").eof(status::AUTOCOMMIT);
    let c = check(Expect::Results, false, &s.out);
    assert_eq!((c.sets, c.rows, c.eofs), (1, 2, 2));
    // Each row's payload reaches the sink, whether the buffer held it whole or in pieces.
    assert_eq!(c.payloads, [b"\x00".to_vec(), b"\x01x".to_vec()]);
}

#[test]
fn text_result_deprecate_eof_with_empty_string_rows() {
    // A row whose first column is the empty string starts with 0x00 and must not end the result.
    let mut s = Stream::new();
    s.count(1).coldef().row(b"").row(b"").ok_eof(status::AUTOCOMMIT);
    let c = check(Expect::Results, true, &s.out);
    assert_eq!((c.rows, c.oks), (2, 1));
}

#[test]
fn multi_results() {
    let mut s = Stream::new();
    s.count(1).coldef().row(b"1").ok_eof(status::MORE_RESULTS_EXISTS);
    s.ok(status::MORE_RESULTS_EXISTS);
    s.count(1).coldef().row(b"2").ok_eof(0);
    let c = check(Expect::Results, true, &s.out);
    assert_eq!((c.sets, c.rows, c.oks), (2, 2, 3));
}

#[test]
fn error_in_the_middle_of_rows() {
    let mut s = Stream::new();
    s.count(1).coldef().row(b"1").err();
    let c = check(Expect::Results, true, &s.out);
    assert_eq!((c.rows, c.errs), (1, 1));
}

#[test]
fn rows_larger_than_one_packet() {
    let big = vec![b'z'; MAX_PAYLOAD * 2 + 100];
    let mut s = Stream::new();
    s.count(1).coldef().row(&big).row(b"small").ok_eof(0);
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    let mut c = Count::default();
    let (n, st) = drive(&mut t, &s.out, 1 << 20, &mut c);
    assert_eq!((n, st, c.rows), (s.out.len(), State::Done, 2));
    // The payload of a row continued over three packets, without their headers.
    let mut whole = Vec::new();
    put_lenenc(&mut whole, big.len() as u64);
    whole.extend_from_slice(&big);
    assert!(c.payloads[0] == whole, "the long row's payload is whole");
    assert_eq!(c.payloads[1], b"\x05small");
}

#[test]
fn row_that_starts_with_fe_is_a_row() {
    // A text value of 16 MiB or more starts with the lenenc marker 0xfe.
    let big = vec![b'q'; MAX_PAYLOAD + 5];
    let mut s = Stream::new();
    s.count(1).coldef().row(&big).ok_eof(0);
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    let mut c = Count::default();
    let (n, _) = drive(&mut t, &s.out, 1 << 16, &mut c);
    assert_eq!((n, c.rows, c.oks), (s.out.len(), 1, 1));
}

#[test]
fn prepare_with_params_and_columns() {
    let mut p = vec![0u8];
    p.extend_from_slice(&7u32.to_le_bytes());
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&1u16.to_le_bytes());
    p.extend_from_slice(&[0, 0, 0]);
    for deprecate in [false, true] {
        let mut s = Stream::new();
        s.packet(&p).coldef();
        if !deprecate {
            s.eof(0);
        }
        s.coldef().coldef();
        if !deprecate {
            s.eof(0);
        }
        let c = check(Expect::Prepare, deprecate, &s.out);
        assert_eq!(c.prepared, Some((7, 2, 1)));
    }
}

#[test]
fn cursor_open_ends_after_metadata() {
    let mut s = Stream::new();
    s.count(1).coldef().eof(status::CURSOR_EXISTS);
    check(Expect::Cursor, false, &s.out);
    let mut s = Stream::new();
    s.row(b"1").eof(status::CURSOR_EXISTS | status::LAST_ROW_SENT);
    check(Expect::Rows, false, &s.out);
}

/// MariaDB sets the cursor-exists flag on the column definitions' EOF of a result set that a
/// procedure with a cursor returns inside a CALL: the rows and the CALL's final OK follow.
#[test]
fn cursor_flag_without_a_cursor_request_is_not_a_cursor() {
    let mut s = Stream::new();
    s.count(1).coldef().eof(status::CURSOR_EXISTS | status::MORE_RESULTS_EXISTS);
    s.row(b"1").row(b"2").eof(status::CURSOR_EXISTS | status::MORE_RESULTS_EXISTS);
    s.ok(0);
    let c = check(Expect::Results, false, &s.out);
    assert_eq!((c.rows, c.sets, c.oks), (2, 1, 1));
}

/// The more-results flag continues only a response that can have several results: rows
/// fetched from a cursor, a field list and single replies end at their terminator.
#[test]
fn more_results_flag_only_where_results_may_follow() {
    let mut s = Stream::new();
    s.row(b"1").eof(status::MORE_RESULTS_EXISTS | status::CURSOR_EXISTS);
    check(Expect::Rows, false, &s.out);
    let mut s = Stream::new();
    s.coldef().eof(status::MORE_RESULTS_EXISTS);
    check(Expect::FieldList, false, &s.out);
    check(Expect::Reply, true, &Stream::new().ok(status::MORE_RESULTS_EXISTS).out);
    check(Expect::Reply, false, &Stream::new().eof(status::MORE_RESULTS_EXISTS).out);
    // Where it is followed, the response goes on after it.
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    let first = Stream::new().ok(status::MORE_RESULTS_EXISTS).out.clone();
    assert_eq!(t.scan(&first, &mut NoSink).unwrap().state, State::Pending);
}

#[test]
fn local_infile_only_in_answer_to_statements() {
    let s = Stream::new().packet(b"\xfb/etc/passwd").out.clone();
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Reply, 0);
    assert!(t.scan(&s, &mut NoSink).is_err());
}

#[test]
fn local_infile_pauses_and_resumes() {
    let s = Stream::new().packet(b"\xfb/tmp/data.csv").out.clone();
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    let r = t.scan(&s, &mut NoSink).unwrap();
    assert_eq!((r.consumed, r.state), (s.len(), State::LocalInfile));
    t.after_infile();
    let ok = Stream::new().ok(0).out.clone();
    let r = t.scan(&ok, &mut NoSink).unwrap();
    assert_eq!((r.consumed, r.state), (ok.len(), State::Done));
}

#[test]
fn field_list_and_single_and_nothing() {
    let mut s = Stream::new();
    s.coldef().coldef().eof(0);
    check(Expect::FieldList, false, &s.out);
    check(Expect::Single, true, &Stream::new().packet(b"Uptime: 5").out);
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Nothing, 0);
    assert_eq!(t.scan(&[], &mut NoSink).unwrap().state, State::Done);
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let mut t = ResponseTracker::new(false, true);
    t.start(Expect::Results, 0);
    let mut s = Stream::new();
    s.count(1).coldef().packet(b"\x42nonsense");
    assert!(t.scan(&s.out, &mut NoSink).is_err());
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    assert!(t.scan(&[0xff, 0xff, 0xff, 0, 0], &mut NoSink).is_err());
}

#[test]
fn session_track_ok_is_reported_for_rewrite() {
    let mut p = Vec::new();
    ok_payload(&mut p, 0, 1, 0, status::SESSION_STATE_CHANGED, 0);
    crate::packet::put_lenenc_bytes(&mut p, b"");
    crate::packet::put_lenenc_bytes(&mut p, b"\x01\x02\x01x");
    let mut s = Stream::new();
    s.packet(&p);
    let mut t = ResponseTracker::new(true, true).strip_session_track(true, true);
    t.start(Expect::Results, 0);
    let r = t.scan(&s.out, &mut NoSink).unwrap();
    assert_eq!((r.consumed, r.state), (0, State::Rewrite { len: s.out.len() }));
    assert!(t.is_done());
    // A client that asked for SESSION_TRACK gets the packet as it is.
    let mut t = ResponseTracker::new(true, true).strip_session_track(false, true);
    t.start(Expect::Results, 0);
    assert_eq!(t.scan(&s.out, &mut NoSink).unwrap().state, State::Done);
}

/// A hold stops the scan right after the result it names, also when that result's OK is
/// reported for rewriting first; an error before it ends the response short of it.
#[test]
fn a_hold_stops_after_the_result_it_names() {
    let more = status::MORE_RESULTS_EXISTS;
    let mut s = Stream::new();
    s.ok(more).ok(more).ok(0);
    let one = s.out.len() / 3;
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    t.hold_at(2);
    let r = t.scan(&s.out, &mut NoSink).unwrap();
    assert_eq!((r.consumed, r.state, t.results()), (2 * one, State::Held, 2));
    assert_eq!(t.scan(&s.out[2 * one..], &mut NoSink).unwrap(), Scan { consumed: one, state: State::Done });
    // The OK that ends the held result carries state the client does not track.
    let mut p = Vec::new();
    ok_payload(&mut p, 0, 1, 0, status::SESSION_STATE_CHANGED | more, 0);
    crate::packet::put_lenenc_bytes(&mut p, b"");
    crate::packet::put_lenenc_bytes(&mut p, b"\x01\x02\x01x");
    let mut s = Stream::new();
    s.packet(&p).ok(0);
    let mut t = ResponseTracker::new(true, true).strip_session_track(true, true);
    t.start(Expect::Results, 0);
    t.hold_at(1);
    let len = HEADER + p.len();
    assert_eq!(t.scan(&s.out, &mut NoSink).unwrap().state, State::Rewrite { len });
    assert_eq!(t.scan(&s.out[len..], &mut NoSink).unwrap(), Scan { consumed: 0, state: State::Held });
    assert_eq!(t.scan(&s.out[len..], &mut NoSink).unwrap().state, State::Done);
    // An error first: no hold.
    let mut s = Stream::new();
    s.packet(b"\xff\x7a\x04#42S02no such table");
    let mut t = ResponseTracker::new(true, true);
    t.start(Expect::Results, 0);
    t.hold_at(1);
    assert_eq!(t.scan(&s.out, &mut NoSink).unwrap().state, State::Done);
    assert_eq!(t.results(), 0);
}

#[test]
fn rows_of_one_length_are_walked_in_groups_as_one_by_one() {
    // Runs shorter and longer than a group, broken by rows of other lengths; the last run's rows
    // as long as the packets after them (7 bytes): the result set's end (an OK marked 0xfe) and
    // the OKs of the statements that followed it, which no group may take for rows.
    let runs = [(3, 6), (1, 9), (20, 6), (9, 5), (GROUP, 6), (GROUP * 3 + 1, 4), (GROUP + 2, 6)];
    let mut s = Stream::new();
    s.count(1).coldef();
    let mut expected = Vec::new();
    // Where each run ends, and how many rows came before.
    let mut run_ends = Vec::new();
    for (i, &(n, len)) in runs.iter().enumerate() {
        for k in 0..n {
            let v = vec![b'a' + i as u8 + (k % 3) as u8; len];
            s.row(&v);
            expected.push([&[len as u8][..], &v].concat());
        }
        run_ends.push((s.out.len(), expected.len()));
    }
    let rows_end = s.out.len();
    s.ok_eof(status::MORE_RESULTS_EXISTS);
    for _ in 0..GROUP {
        s.ok(status::MORE_RESULTS_EXISTS);
    }
    assert_eq!(s.out.len() - rows_end, (GROUP + 1) * (HEADER + 7), "the packets after the rows are as long as they are");
    s.ok(0);
    let c = check(Expect::Results, true, &s.out);
    assert_eq!((c.rows, c.oks), (expected.len(), GROUP + 2));
    assert_eq!(c.payloads, expected);
    // Stopped at a run's end (a group's, or a single row's), the walk knows the last row's
    // sequence number.
    for (end, rows) in run_ends {
        let mut t = ResponseTracker::new(true, true);
        t.start(Expect::Results, 0);
        let scan = t.scan(&s.out[..end], &mut Count::default()).expect("well-formed");
        assert_eq!((scan.consumed, scan.state), (end, State::Pending));
        assert_eq!(t.last_seq, (2 + rows) as u8, "after {rows} rows");
    }
}
