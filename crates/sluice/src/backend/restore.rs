//! Bringing a backend connection to a session's state: the schema, the session variables, the
//! multi-statements option and the last insert id that differ are sent in one round trip
//! (`COM_INIT_DB`, one `SET`, `COM_SET_OPTION`, pipelined), and prepared statements are
//! prepared again on first use. The set-up runs before the session's statement rather than
//! pipelined with it: when a part of it fails, the statement must not run in the wrong state.

use std::time::Duration;

use sluice_proto::consts::{cap, com};
use sluice_proto::packet::frame;
use sluice_proto::response::{Expect, ResponseTracker, Sink, State};
use tokio::io::AsyncReadExt;

use super::link::{TRACK_ALL, sluice_owns};
use super::shared::ConnState;
use crate::error::{Error, Result, Side};
use crate::net::{BUF_SIZE, PacketConn};
use crate::session::SessionState;
use sluice_proto::uservar;

/// Sends `conn` what differs between its state (`have`) and the session's (`want`, with
/// `multi`: whether the session runs multi-statements), and reads the answers, within `limit`.
/// On success `have` is the session's state.
pub async fn bring(conn: &mut PacketConn, have: &mut ConnState, want: &SessionState, caps: u32, limit: Duration) -> Result<()> {
    let mut out = Vec::new();
    let mut expect = Vec::new();
    let mut payload = Vec::new();
    // (A connection with a schema cannot be made to have none: a session without one keeps it.)
    let schema = want.schema.is_some() && want.schema != have.schema;
    if let Some(s) = want.schema.as_ref().filter(|_| schema) {
        payload.push(com::INIT_DB);
        payload.extend_from_slice(s.as_bytes());
        frame(&mut out, &payload, 0);
        expect.push(Expect::Reply);
    }
    if let Some(set) = set_statement(have, want) {
        payload.clear();
        payload.push(com::QUERY);
        payload.extend_from_slice(&set);
        frame(&mut out, &payload, 0);
        expect.push(Expect::Results);
    }
    if want.multi_statements != have.multi_statements {
        // COM_SET_OPTION: 0 turns multi-statements on, 1 off.
        frame(&mut out, &[com::SET_OPTION, u8::from(!want.multi_statements), 0], 0);
        expect.push(Expect::Reply);
    }
    // SQL-prepared statements last: they resolve names in the schema and variables above.
    for query in sql_prepare_statements(have, want) {
        payload.clear();
        payload.push(com::QUERY);
        payload.extend_from_slice(&query);
        frame(&mut out, &payload, 0);
        expect.push(Expect::Results);
    }
    if out.is_empty() {
        return Ok(());
    }
    super::conn::bounded(limit, "session restore", async {
        conn.stream.write_within(Duration::ZERO, &out).await.map_err(|e| Error::io(Side::Backend, "restoring the session", e))?;
        let mut tracker = tracker(caps);
        let mut sink = Collect::default();
        for e in expect {
            read_response(&mut tracker, e, conn, &mut sink).await?;
        }
        match sink.error {
            // The server refused the session's own state (a schema dropped since): the
            // session's statement gets its error.
            Some((code, state, msg)) => Err(Error::new(Side::Client, code, format!("restoring the session's state: {msg}")).state(&state)),
            None => Ok(()),
        }
    })
    .await?;
    have.take_on(want);
    have.tracking = true;
    Ok(())
}

/// What the session's own `session_track_*` settings are, read in the same round trip that
/// sets [`TRACK_ALL`] (which hides them from the server's answers).
const TRACKED_NOW: &[u8] = b"SELECT @@session_track_system_variables, @@session_track_state_change, @@session.sql_mode";

/// Sets [`TRACK_ALL`] on `conn` and returns the tracking its session had before (what the
/// client's own session tracks: the server's defaults after a login or a reset, or what the
/// client set), and its `sql_mode` (after COM_CHANGE_USER or COM_RESET_CONNECTION, the
/// server's, not the one the login's capabilities gave it), within `limit`.
pub async fn track_all(conn: &mut PacketConn, caps: u32, limit: Duration) -> Result<(sluice_proto::basic::Tracked, String)> {
    super::conn::bounded(limit, "session set-up", async {
        let mut out = Vec::with_capacity(TRACKED_NOW.len() + TRACK_ALL.len() + 10);
        for sql in [TRACKED_NOW, TRACK_ALL] {
            let mut p = Vec::with_capacity(sql.len() + 1);
            p.push(com::QUERY);
            p.extend_from_slice(sql);
            sluice_proto::packet::frame(&mut out, &p, 0);
        }
        conn.stream.write_within(Duration::ZERO, &out).await.map_err(|e| Error::io(Side::Backend, "session set-up", e))?;
        let packets = read_text_result(conn, caps, "session set-up").await?;
        let (_, r) = conn.read_packet(1 << 20).await.map_err(|e| Error::io(Side::Backend, "session set-up", e))?;
        match r.first() {
            Some(0x00) => {}
            Some(0xff) => return Err(Error::from_backend_err(&r)),
            _ => return Err(Error::backend("unexpected answer to a set-up statement")),
        }
        let row = match &packets[..] {
            [_, _, _, _, row] => sluice_proto::uservar::row_values(row, 3),
            _ => None,
        };
        match row.as_deref() {
            Some([Some(vars), Some(change), Some(mode)]) => Ok((
                sluice_proto::basic::Tracked { variables: (*vars).into(), state_change: matches!(*change, b"1" | b"ON" | b"on") },
                String::from_utf8_lossy(mode).into_owned(),
            )),
            _ => Err(Error::backend("unexpected answer to the tracking query")),
        }
    })
    .await
}

/// The queries that make `have`'s SQL-prepared statements `want`'s: each `PREPARE` the session
/// ran that the connection does not have, and a `DEALLOCATE PREPARE` for each one it has that
/// the session does not (another session's, which this one must not see).
fn sql_prepare_statements(have: &ConnState, want: &SessionState) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (name, query) in &want.sql_prepared {
        if have.sql_prepared.get(name) != Some(query) {
            out.push(query.as_bytes().to_vec());
        }
    }
    for name in have.sql_prepared.keys() {
        if !want.sql_prepared.contains_key(name) {
            out.push(format!("DEALLOCATE PREPARE `{}`", name.replace('`', "``")).into_bytes());
        }
    }
    out
}

/// Whether [`bring`] has anything to send.
pub fn differs(have: &ConnState, want: &SessionState) -> bool {
    (want.schema.is_some() && want.schema != have.schema)
        || !have.tracking
        || have.variables != want.variables
        || have.last_insert_id != want.last_insert_id
        || have.multi_statements != want.multi_statements
        || have.sql_prepared != want.sql_prepared
        || have.user_variables != want.user_variables
}

/// The `SET` that makes `have`'s variables `want`'s (a variable the session never changed goes
/// back to its default), with variable tracking turned on first when it is not yet.
fn set_statement(have: &ConnState, want: &SessionState) -> Option<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    if !have.tracking {
        parts.push(TRACK_ALL.strip_prefix(b"SET ").unwrap_or(TRACK_ALL).to_vec());
    }
    // (Character sets first: the connection's collation, which follows them, comes last.)
    let mut vars: Vec<(&str, Vec<u8>)> = Vec::new();
    let separate = |name: &str| sluice_owns(name) || CONNECTION_CHARSET.contains(&name) || !valid_name(name);
    for (name, value) in &want.variables {
        if !separate(name) && have.variables.get(name) != Some(value) {
            let mut p = format!("{name}=").into_bytes();
            match value {
                // A character set of NULL is reported as an empty value.
                "" if name.starts_with("character_set_") => p.extend_from_slice(b"NULL"),
                _ => set_value(&mut p, value),
            }
            vars.push((name, p));
        }
    }
    for name in have.variables.keys() {
        if !want.variables.contains_key(name) && !separate(name) {
            vars.push((name, login_value(name, want.collation).unwrap_or_else(|| format!("{name}=DEFAULT").into_bytes())));
        }
    }
    vars.sort_by_key(|(name, _)| !name.starts_with("character_set_"));
    parts.extend(vars.into_iter().map(|(_, p)| p));
    parts.extend(connection_charset(have, want));
    if want.last_insert_id != have.last_insert_id {
        parts.push(format!("last_insert_id={}", want.last_insert_id).into_bytes());
    }
    // User variables: the session's values, and NULL for another session's.
    for (name, value) in &want.user_variables {
        if have.user_variables.get(name) != Some(value) {
            parts.push(user_variable(name, value));
        }
    }
    for name in have.user_variables.keys() {
        if !want.user_variables.contains_key(name) {
            parts.push(user_variable(name, "NULL"));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let mut set = b"SET ".to_vec();
    set.extend_from_slice(&parts.join(&b", "[..]));
    Some(set)
}

/// The connection's character set and collation: setting one sets the other, and the server
/// reports only the one a statement named (`SessionState::apply_ok` keeps a collation only
/// while it is in force; `SET NAMES ... COLLATE` is noted from its text).
const CONNECTION_CHARSET: [&str; 2] = ["character_set_connection", "collation_connection"];

/// What brings the connection's character set and collation to the session's: its collation
/// (which sets the character set), else its character set (with that set's default collation),
/// else those of its login. Nothing when both agree.
fn connection_charset(have: &ConnState, want: &SessionState) -> Option<Vec<u8>> {
    if CONNECTION_CHARSET.iter().all(|n| have.variables.get(n) == want.variables.get(n)) {
        return None;
    }
    let mut p = Vec::new();
    match (want.variables.get("character_set_connection"), want.variables.get("collation_connection")) {
        (_, Some(collation)) => {
            p.extend_from_slice(b"collation_connection=");
            set_value(&mut p, collation);
        }
        (Some(charset), None) => {
            p.extend_from_slice(b"character_set_connection=");
            set_value(&mut p, charset);
        }
        (None, None) => p = login_value("collation_connection", want.collation).unwrap_or_else(|| b"collation_connection=DEFAULT".to_vec()),
    }
    Some(p)
}

/// The assignment that gives `name` back the value a login with `collation` gave it, for the
/// variables the login's collation sets (their `DEFAULT` is the server's, not the login's).
/// None: any other variable, or no collation known.
fn login_value(name: &str, collation: u8) -> Option<Vec<u8>> {
    let column = match name {
        "character_set_client" | "character_set_connection" | "character_set_results" => "CHARACTER_SET_NAME",
        "collation_connection" => "COLLATION_NAME",
        _ => return None,
    };
    (collation != 0).then(|| format!("{name}=(SELECT {column} FROM information_schema.COLLATIONS WHERE ID={collation})").into_bytes())
}

fn user_variable(name: &str, value: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(name.len() + value.len() + 4);
    uservar::write_name(&mut p, name);
    p.push(b'=');
    p.extend_from_slice(value.as_bytes());
    p
}

/// Reads the values of user variables `names` on `conn` (in the session's state), each as the
/// literal that sets it again. None: a value sluice cannot write back exactly, or the server
/// refused the query; the session then stays on its connection.
pub async fn read_variables(conn: &mut PacketConn, names: &[String], caps: u32, limit: Duration) -> Result<Option<Vec<(String, String)>>> {
    let what = "reading user variables back";
    super::conn::bounded(limit, what, async {
        let mut payload = vec![com::QUERY];
        payload.extend_from_slice(&uservar::read_back_query(names));
        conn.write_packet(&payload, 0).await.map_err(|e| Error::io(Side::Backend, what, e))?;
        let packets = read_text_result(conn, caps, what).await?;
        let columns = names.len() * uservar::COLUMNS;
        let refused = |why: &str| {
            tracing::debug!(variables = ?names, why, "user variables cannot be carried to another connection");
            Ok(None)
        };
        let [_, defs @ .., row] = &packets[..] else { return refused("the server refused the query") };
        if defs.len() != columns {
            return refused("unexpected columns");
        }
        let Some(values) = uservar::row_values(row, columns) else { return refused("malformed row") };
        let mut out = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let v = &values[i * uservar::COLUMNS..(i + 1) * uservar::COLUMNS];
            let Some((ty, flags)) = uservar::column_type(&defs[i * uservar::COLUMNS]) else { return refused("malformed column") };
            match uservar::literal(ty, flags, v[0], v[1], v[2], v[3]) {
                Some(lit) => out.push((name.clone(), lit)),
                None => return refused("a value sluice cannot write back"),
            }
        }
        Ok(Some(out))
    })
    .await
}

/// What a `SET` or `USE` left on a connection to a server that reports no session state
/// (TiDB): its schema, and the values of the session variables `names` (a variable the server
/// does not know is an error: None, and the session stays on its connection).
pub struct Settings {
    pub schema: Option<String>,
    pub values: Vec<(String, String)>,
}

/// Reads the schema and the session variables `names` back on `conn`; None when the server
/// refused the query or sluice cannot name a variable.
pub async fn read_settings(conn: &mut PacketConn, names: &[String], caps: u32, limit: Duration) -> Result<Option<Settings>> {
    let what = "reading session variables back";
    if !names.iter().all(|n| valid_name(n)) {
        return Ok(None);
    }
    super::conn::bounded(limit, what, async {
        let mut payload = b"\x03SELECT DATABASE()".to_vec();
        for n in names {
            payload.extend_from_slice(format!(", @@SESSION.{n}").as_bytes());
        }
        conn.write_packet(&payload, 0).await.map_err(|e| Error::io(Side::Backend, what, e))?;
        let packets = read_text_result(conn, caps, what).await?;
        let [_, defs @ .., row] = &packets[..] else { return Ok(None) };
        if defs.len() != names.len() + 1 {
            return Ok(None);
        }
        let Some(values) = sluice_proto::uservar::row_values(row, names.len() + 1) else { return Ok(None) };
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let values_of = names.iter().zip(&values[1..]).map(|(n, v)| {
            // (A character set of NULL is kept as the server reports it: empty.)
            let value = match v {
                Some(v) => text(v),
                None if n.starts_with("character_set_") => String::new(),
                None => "NULL".into(),
            };
            (n.clone(), value)
        });
        Ok(Some(Settings { schema: values[0].map(text), values: values_of.collect() }))
    })
    .await
}

/// Reads a whole text result off `conn`: the first packet (an OK or ERR, or the column count),
/// then the column definitions and the rows (EOF packets left out), or the ERR that ended it.
/// A row too large for one packet is read to the end and the result given as an ERR: no user
/// variable value worth carrying, nor any status sluice reads, is that large.
pub async fn read_text_result(conn: &mut PacketConn, caps: u32, what: &'static str) -> Result<Vec<Vec<u8>>> {
    use sluice_proto::consts::MAX_PAYLOAD;
    use sluice_proto::packet::Reader;
    let io = |e| Error::io(Side::Backend, what, e);
    let (_, first) = conn.read_packet(MAX_PAYLOAD).await.map_err(io)?;
    if matches!(first.first(), Some(0x00 | 0xff)) {
        return Ok(vec![first]);
    }
    let columns = Reader::new(&first).lenenc("column count").map_err(|e| Error::malformed(Side::Backend, e))?;
    let mut out = vec![first];
    for _ in 0..columns {
        out.push(conn.read_packet(MAX_PAYLOAD).await.map_err(io)?.1);
    }
    if caps & cap::DEPRECATE_EOF == 0 {
        conn.read_packet(MAX_PAYLOAD).await.map_err(io)?;
    }
    let mut too_large = false;
    loop {
        let (_, p) = conn.read_packet(MAX_PAYLOAD).await.map_err(io)?;
        let continued = too_large;
        too_large = p.len() == MAX_PAYLOAD;
        match p.first() {
            _ if continued => {}
            Some(0xff) => return Ok(vec![p]),
            Some(0xfe) if p.len() < MAX_PAYLOAD => break,
            _ if too_large => out.push(vec![0xff]),
            _ => out.push(p),
        }
    }
    Ok(if out.iter().any(|p| p == &[0xff]) { vec![vec![0xff]] } else { out })
}

/// Prepares `sql` on `conn`: its statement id, column and parameter counts.
pub async fn prepare(conn: &mut PacketConn, sql: &str, caps: u32, limit: Duration) -> Result<(u32, u16, u16)> {
    super::conn::bounded(limit, "preparing a statement again", async {
        let mut payload = Vec::with_capacity(sql.len() + 1);
        payload.push(com::STMT_PREPARE);
        payload.extend_from_slice(sql.as_bytes());
        conn.write_packet(&payload, 0).await.map_err(|e| Error::io(Side::Backend, "preparing a statement again", e))?;
        let mut sink = Collect::default();
        read_response(&mut tracker(caps), Expect::Prepare, conn, &mut sink).await?;
        match (sink.error, sink.prepared) {
            (None, Some(p)) => Ok(p),
            (Some((code, state, msg)), _) => {
                Err(Error::new(Side::Client, code, format!("preparing a statement again: {msg}")).state(&state))
            }
            (None, _) => Err(Error::backend("preparing a statement again: no statement id")),
        }
    })
    .await
}

/// Reads one whole response off `conn` and drops it: the answer to a statement that will run
/// elsewhere.
pub async fn discard_response(conn: &mut PacketConn, caps: u32, expect: Expect) -> Result<()> {
    read_response(&mut tracker(caps), expect, conn, &mut Collect::default()).await
}

fn tracker(caps: u32) -> ResponseTracker {
    ResponseTracker::new(caps & cap::DEPRECATE_EOF != 0, caps & cap::SESSION_TRACK != 0)
}

/// Reads one whole response off `conn`, without forwarding it.
async fn read_response(tracker: &mut ResponseTracker, expect: Expect, conn: &mut PacketConn, sink: &mut Collect) -> Result<()> {
    use bytes::Buf;
    tracker.start(expect, 0);
    loop {
        let scan = tracker.scan(&conn.rbuf, sink).map_err(|e| Error::malformed(Side::Backend, e))?;
        conn.rbuf.advance(scan.consumed);
        match scan.state {
            State::Done => return Ok(()),
            State::Rewrite { len } => conn.rbuf.advance(len),
            // (No hold is asked for here: the scan goes on.)
            State::Held => {}
            State::LocalInfile => return Err(Error::backend("unexpected LOCAL INFILE request while restoring a session")),
            State::Pending => {
                conn.rbuf.reserve(BUF_SIZE);
                match conn.stream.read_buf(&mut conn.rbuf).await {
                    Ok(0) => return Err(Error::backend("the backend closed the connection while a session was restored")),
                    Ok(_) => {}
                    Err(e) => return Err(Error::io(Side::Backend, "restoring the session", e)),
                }
            }
        }
    }
}

#[derive(Default)]
struct Collect {
    /// The first error: its code, SQL state and message.
    error: Option<(u16, [u8; 5], String)>,
    prepared: Option<(u32, u16, u16)>,
}

impl Sink for Collect {
    fn err(&mut self, e: &sluice_proto::basic::Err<'_>) {
        self.error.get_or_insert_with(|| (e.code, e.sql_state, String::from_utf8_lossy(e.message).into_owned()));
    }
    fn prepared(&mut self, id: u32, columns: u16, params: u16) {
        self.prepared = Some((id, columns, params));
    }
}

/// Variable names as the backend reports them: letters, digits and `_`.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Writes a variable's value as SQL: numbers bare, NULL as NULL, anything else as a string
/// literal in hex (no quoting or escaping to get wrong, whatever the sql_mode).
fn set_value(out: &mut Vec<u8>, value: &str) {
    let numeric = {
        let digits = value.strip_prefix('-').unwrap_or(value);
        !digits.is_empty() && digits.bytes().filter(|&c| c == b'.').count() <= 1 && digits.bytes().all(|c| c.is_ascii_digit() || c == b'.')
    };
    if numeric || value == "NULL" {
        out.extend_from_slice(value.as_bytes());
    } else if value.is_empty() {
        out.extend_from_slice(b"''");
    } else {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.extend_from_slice(b"_utf8mb4 X'");
        for b in value.bytes() {
            out.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
        out.push(b'\'');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_sql_literals() {
        let lit = |v: &str| {
            let mut o = Vec::new();
            set_value(&mut o, v);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(lit("28800"), "28800");
        assert_eq!(lit("-1.5"), "-1.5");
        assert_eq!(lit("NULL"), "NULL");
        assert_eq!(lit(""), "''");
        assert_eq!(lit("ON"), "_utf8mb4 X'4f4e'");
        assert_eq!(lit("1.2.3"), "_utf8mb4 X'312e322e33'");
        assert!(valid_name("sql_mode"));
        assert!(!valid_name("a; DROP"));
    }

    #[test]
    fn only_the_difference_is_set() {
        let mut have = ConnState { tracking: true, ..Default::default() };
        have.variables.insert("sql_mode".into(), "ANSI".into());
        have.variables.insert("time_zone".into(), "+00:00".into());
        let mut want = SessionState::default();
        want.variables.insert("sql_mode".into(), "ANSI".into());
        want.variables.insert("autocommit".into(), "OFF".into());
        let set = String::from_utf8(set_statement(&have, &want).unwrap()).unwrap();
        assert_eq!(set, "SET autocommit=_utf8mb4 X'4f4646', time_zone=DEFAULT");
        // Character sets go back to those of the session's login, NULL stays NULL, and a
        // character set comes before the collation it would reset.
        have.variables.insert("character_set_client".into(), "latin1".into());
        have.variables.insert("collation_connection".into(), "latin1_bin".into());
        want.collation = 45;
        want.variables.insert("character_set_results".into(), String::new());
        let set = String::from_utf8(set_statement(&have, &want).unwrap()).unwrap();
        assert_eq!(
            set,
            "SET character_set_results=NULL, character_set_client=(SELECT CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE ID=45), \
             autocommit=_utf8mb4 X'4f4646', time_zone=DEFAULT, \
             collation_connection=(SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE ID=45)"
        );
        // The session's own collation, or its character set's default one.
        want.variables.insert("character_set_connection".into(), "utf8mb4".into());
        let set = String::from_utf8(set_statement(&have, &want).unwrap()).unwrap();
        assert!(set.ends_with(", character_set_connection=_utf8mb4 X'757466386d6234'"), "{set}");
        want.variables.insert("collation_connection".into(), "utf8mb4_bin".into());
        let set = String::from_utf8(set_statement(&have, &want).unwrap()).unwrap();
        assert!(set.ends_with(", collation_connection=_utf8mb4 X'757466386d62345f62696e'"), "{set}");
        want.variables.remove("character_set_connection");
        want.variables.remove("collation_connection");
        have.variables.remove("character_set_client");
        have.variables.remove("collation_connection");
        want.variables.remove("character_set_results");
        want.variables = have.variables.clone();
        assert!(set_statement(&have, &want).is_none(), "nothing differs");
        want.last_insert_id = 7;
        assert_eq!(set_statement(&have, &want).unwrap(), b"SET last_insert_id=7");
        have.tracking = false;
        want.last_insert_id = 0;
        assert_eq!(set_statement(&have, &want).unwrap(), b"SET SESSION session_track_system_variables='*', session_track_state_change=ON");
    }
}
