//! Entry points for the fuzz targets (`fuzz/`), one per parser or state machine that reads bytes
//! from the network. Each must return normally for every input: no panic, no endless loop, no
//! unbounded allocation. The corpora in `fuzz/corpus/` are replayed through these functions by
//! the ordinary test suite.

use crate::basic::{self, Err, Ok};
use crate::compress::{self, Algorithm, FRAME_HEADER, FrameHeader};
use crate::handshake::{AuthSwitch, ChangeUser, Greeting, HandshakeResponse, is_ssl_request};
use crate::packet::RequestWalker;
use crate::response::{Expect, NoSink, ResponseTracker, State};

/// Every target, by name (the directory name of its corpus).
/// A fuzz target: its name and its entry point.
pub type Target = (&'static str, fn(&[u8]));

pub const TARGETS: &[Target] = &[
    ("client_handshake", client_handshake),
    ("server_packet", server_packet),
    ("response_stream", response_stream),
    ("request_stream", request_stream),
    ("compressed", compressed),
    ("sql", sql),
    ("rw", rw),
    ("digest", digest),
    ("proxy_header", proxy_header),
];

/// The first bytes of a connection from a trusted load balancer: a header that parses is no
/// longer than the input, and a version 2 header sluice writes parses back to its source.
pub fn proxy_header(data: &[u8]) {
    use crate::proxy_header::{Parsed, parse, write_v2};
    if let Parsed::Header { len, source } = parse(data) {
        assert!(len <= data.len(), "a header within the input");
        if let Some(s) = source {
            let mut out = Vec::new();
            write_v2(&mut out, s, s);
            assert_eq!(parse(&out), Parsed::Header { len: out.len(), source: Some(s) });
        }
    }
}

/// What a client sends while logging in: handshake response, SSL request, COM_CHANGE_USER.
/// A response that parses must survive being written and parsed again unchanged.
pub fn client_handshake(data: &[u8]) {
    let _ = is_ssl_request(data);
    if let Ok(hr) = HandshakeResponse::parse(data) {
        let mut out = Vec::new();
        hr.write(&mut out);
        let again = HandshakeResponse::parse(&out);
        assert!(again.is_ok(), "a written handshake response must parse");
    }
    let caps = data.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
    let _ = ChangeUser::parse(data, caps);
}

/// Single server packets: greeting, auth switch, OK (both forms), ERR, state-change blocks.
pub fn server_packet(data: &[u8]) {
    if let Ok(g) = Greeting::parse(data) {
        let mut out = Vec::new();
        g.write(&mut out);
    }
    let _ = AuthSwitch::parse(data);
    for track in [false, true] {
        if let Ok(ok) = Ok::parse(data, track) {
            for _ in basic::state_changes(ok.session_state) {}
        }
    }
    let _ = Err::parse(data);
    let _ = basic::terminator_status(data, true);
    let _ = basic::terminator_status(data, false);
    let _ = basic::strip_session_track(data, true);
    let _ = basic::strip_session_track(data, false);
    // A user variable read back: a column definition, a row, the literal made of them.
    let _ = crate::uservar::column_type(data);
    if let Some(v) = crate::uservar::row_values(data, crate::uservar::COLUMNS) {
        let _ = crate::uservar::literal(data[0], 0, v[0], v[1], v[2], v[3]);
    }
}

/// A response stream as the relay sees it: the first byte picks the command's response shape
/// and the negotiated flags, the second the read size (and, in its high bit, a hold after the
/// first result); the rest arrives in reads of that size.
pub fn response_stream(data: &[u8]) {
    let (Some(&mode), Some(&chunk)) = (data.first(), data.get(1)) else {
        return;
    };
    let expect =
        [Expect::Results, Expect::Cursor, Expect::Reply, Expect::Prepare, Expect::Rows, Expect::FieldList, Expect::Single, Expect::Nothing]
            [(mode & 7) as usize];
    let mut t = ResponseTracker::new(mode & 8 != 0, mode & 16 != 0).strip_session_track(mode & 32 != 0, mode & 64 != 0);
    t.start(expect, 0);
    t.hold_at(u32::from(chunk >> 7));
    let stream = &data[2..];
    let chunk = usize::from(chunk & 0x7f).max(1);
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    loop {
        let Ok(scan) = t.scan(&buf, &mut NoSink) else {
            return;
        };
        assert!(scan.consumed <= buf.len());
        buf.drain(..scan.consumed);
        match scan.state {
            State::Done => return,
            State::Held => {
                assert_eq!(t.results(), 1);
                if t.is_done() {
                    return;
                }
            }
            State::LocalInfile => t.after_infile(),
            State::Rewrite { len } => {
                assert!(len <= buf.len());
                buf.drain(..len);
            }
            State::Pending => {
                if fed == stream.len() {
                    return;
                }
                let n = chunk.min(stream.len() - fed);
                buf.extend_from_slice(&stream[fed..fed + n]);
                fed += n;
            }
        }
    }
}

/// Client packets delimited as the relay forwards them: a request, then an upload.
pub fn request_stream(data: &[u8]) {
    for mut w in [RequestWalker::request(), RequestWalker::until_empty()] {
        let mut buf = Vec::new();
        for chunk in data.chunks(7) {
            buf.extend_from_slice(chunk);
            let n = w.scan(&buf);
            assert!(n <= buf.len());
            buf.drain(..n);
            if w.done {
                break;
            }
        }
    }
}

/// Compressed frames, with both algorithms. Inflation is bounded by the frame header.
pub fn compressed(data: &[u8]) {
    let mut rest = data;
    while let Some(h) = FrameHeader::parse(rest) {
        let body = &rest[FRAME_HEADER..];
        let n = h.compressed_len.min(body.len());
        for alg in [Algorithm::Zlib, Algorithm::Zstd { level: 1 }] {
            let mut out = Vec::new();
            if compress::decompress(alg, &h, &body[..n], &mut out).is_ok() {
                assert!(out.len() <= compress::MAX_FRAME);
            }
        }
        rest = &body[n..];
    }
}

/// SQL text as the relay looks at it.
pub fn sql(data: &[u8]) {
    let _ = crate::sql::find_kills(data, false);
    if let Some(kills) = crate::sql::find_kills(data, true) {
        assert!(kills.statements >= 1 && !kills.found.is_empty());
        for f in &kills.found {
            // An id's place is its digits in the text it was found in (the query's, for one not quoted).
            if let (crate::sql::KillTarget::Id { kill, at }, false) = (&f.target, f.quoted) {
                assert_eq!(data[at.clone()].iter().filter(|c| c.is_ascii_digit()).count(), at.len());
                assert_eq!(std::str::from_utf8(&data[at.clone()]).ok().and_then(|t| t.parse().ok()), Some(kill.id));
            }
        }
    }
    for st in crate::lexer::statements(data) {
        for t in st {
            assert!(t.at.start < t.at.end && t.at.end <= data.len());
        }
    }
    // Redaction is total, and never longer than the text.
    if crate::secret::may_carry(data) {
        assert!(crate::secret::redacted(data).len() <= data.len());
    }
    let hazards = crate::sql::hazards(data);
    // A PREPARE sluice follows is one of the hazards the lexer reports.
    if crate::sql::sql_prepare(data).is_some() {
        assert!(hazards & crate::sql::hazard::SQL_PREPARE != 0);
    }
    // A user variable named is one the hazards report (so that it is read back).
    let names = crate::sql::user_variables(data);
    if !names.is_empty() {
        assert!(hazards & crate::sql::hazard::USER_VARIABLE != 0, "{names:?}");
        let _ = crate::uservar::read_back_query(&names);
    }
}

/// Read/write classification: total, and consistent over a query of several statements (a read
/// repeated is still a read; anything else repeated is still not one).
pub fn rw(data: &[u8]) {
    use crate::rw::{Class, classify};
    let class = classify(data);
    let mut twice = data.to_vec();
    twice.push(b';');
    twice.extend_from_slice(data);
    assert_eq!(classify(&twice) == Class::Read, class == Class::Read, "{:?}", String::from_utf8_lossy(data));
}

/// Digests: total, and the normalized text normalizes to itself with the same digest; a
/// statement's key is total in both lexer modes.
pub fn digest(data: &[u8]) {
    use crate::digest::{digest, normalize};
    use crate::lexer::Mode;
    for mode in [Mode::DEFAULT, Mode { no_backslash_escapes: true, ansi_quotes: true }] {
        let _ = crate::scan::scan_keyed(data, mode, [1, 2]);
        let _ = crate::sql::shape_hazards(data, mode);
    }
    let mut once = Vec::new();
    normalize(data, &mut once, usize::MAX);
    let mut twice = Vec::new();
    normalize(&once, &mut twice, usize::MAX);
    assert_eq!(once, twice, "{:?}", String::from_utf8_lossy(data));
    assert_eq!(digest(&once), digest(data), "{:?}", String::from_utf8_lossy(data));
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Replays every committed corpus input through its target.
    #[test]
    fn corpora_replay_cleanly() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
        let mut inputs = 0;
        for (name, target) in super::TARGETS {
            let dir = root.join(name);
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()));
            for entry in entries {
                let path = entry.expect("corpus entry").path();
                let data = std::fs::read(&path).expect("corpus file");
                target(&data);
                inputs += 1;
            }
        }
        assert!(inputs >= super::TARGETS.len(), "every target has a corpus");
    }
}
