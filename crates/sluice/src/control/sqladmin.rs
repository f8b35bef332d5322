//! The SQL admin listener (`[admin] sql_listen`): operators connect with the mysql client, as
//! one of `[[admin.sql_users]]`, and read the same data as the HTTP API through read-only
//! SELECTs over tables (`backends`, `sessions`, `digests`, `config`, `instances`), or run the
//! verbs as statements (`DRAIN BACKEND 'a'`, `UNDRAIN BACKEND 'a'`, `RELOAD CONFIG`, `KILL
//! SESSION 42`, `SWITCHOVER TO 'b'`). A statement it does not know gets a MySQL error naming those it does.

use std::sync::Arc;
use std::sync::OnceLock;

use regex::Regex;
use serde_json::{Map, Value};
use sluice_proto::basic::{eof_payload, err_payload, ok_payload};
use sluice_proto::consts::{cap, com, status};
use sluice_proto::handshake::{Greeting, HandshakeResponse, write_auth_switch};
use sluice_proto::packet::put_lenenc;
use sluice_proto::{auth, resultset};

use crate::auth::{Check, Users};
use crate::ctx::Ctx;
use crate::net::{PacketConn, Stream};

const TABLES: &str = "backends, sessions, digests, config, instances, failovers";
const STATEMENTS: &str = "SELECT columns FROM table [WHERE column = 'value'] [LIMIT n], SHOW TABLES, DRAIN BACKEND 'name', \
UNDRAIN BACKEND 'name', RELOAD CONFIG, KILL SESSION id, SWITCHOVER TO 'name'";

/// Accepts admin connections until the process ends.
/// Serves the SQL admin listener: at most `[admin] max_connections` sessions at once (more
/// wait in the backlog), each logged in within `request_timeout` and closed after 60 times that
/// without a statement.
pub async fn serve(ctx: Arc<Ctx>, l: tokio::net::TcpListener) {
    let slots = Arc::new(tokio::sync::Semaphore::new(ctx.config().admin.max_connections.max(1)));
    let mut backoff = crate::net::AcceptBackoff::default();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match l.accept().await {
            Ok((s, peer)) => {
                backoff.succeeded();
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    // (The users in force now: a reload changes them.)
                    let users = Users::from_config(&ctx.config().admin.sql_users, 0);
                    if let Err(e) = session(&ctx, PacketConn::new(Stream::Tcp(s)), &users).await {
                        tracing::info!(client = %peer, error = %e, "SQL admin session ended");
                    }
                    drop(slot);
                });
            }
            Err(e) => backoff.failed(&e, &ctx.metrics.accept_errors).await,
        }
    }
}

/// Why a SQL admin session ended before its client quit (the client's doing, or its
/// connection's).
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no {0} within {1:?}")]
    Timeout(&'static str, std::time::Duration),
    #[error("{0}")]
    Refused(String),
}

async fn session(ctx: &Arc<Ctx>, mut c: PacketConn, users: &Users) -> Result<(), Ended> {
    let limit = ctx.config().admin.request_timeout;
    tokio::time::timeout(limit, login(&mut c, users)).await.map_err(|_| Ended::Timeout("login", limit))??;
    loop {
        let Ok(cmd) = tokio::time::timeout(limit * 60, read_command(&mut c)).await else {
            return Err(Ended::Timeout("statement", limit * 60));
        };
        let cmd = cmd?;
        match cmd.first() {
            Some(&com::QUIT) | None => return Ok(()),
            Some(&com::QUERY) => {
                let sql = String::from_utf8_lossy(&cmd[1..]).into_owned();
                let answer = run(ctx, &sql).await;
                tokio::time::timeout(limit * 12, reply(&mut c, answer))
                    .await
                    .map_err(|_| Ended::Timeout("read of the answer by the client", limit * 12))??;
            }
            Some(&com::PING) | Some(&com::INIT_DB) => write_ok(&mut c, 1, "").await?,
            Some(_) => {
                reply(&mut c, Answer::Error(1047, "this admin listener answers COM_QUERY, COM_PING and COM_QUIT only".into())).await?
            }
        }
    }
}

/// The login: a greeting, the client's answer, its check (an auth switch to the native plugin
/// when needed).
async fn login(c: &mut PacketConn, users: &Users) -> Result<(), Ended> {
    let scramble = auth::make_scramble(random());
    let caps = cap::LONG_PASSWORD
        | cap::LONG_FLAG
        | cap::CONNECT_WITH_DB
        | cap::PROTOCOL_41
        | cap::TRANSACTIONS
        | cap::SECURE_CONNECTION
        | cap::PLUGIN_AUTH
        | cap::PLUGIN_AUTH_LENENC_DATA
        | cap::CONNECT_ATTRS;
    let g = Greeting {
        server_version: format!("5.5.5-10.11.0-sluice-admin-{}", env!("CARGO_PKG_VERSION")).into_bytes(),
        connection_id: 1,
        scramble: scramble.to_vec(),
        capabilities: caps,
        mariadb_capabilities: 0,
        collation: 45,
        status: status::AUTOCOMMIT,
        auth_plugin: auth::NATIVE.to_vec(),
    };
    let mut p = Vec::new();
    g.write(&mut p);
    c.write_packet(&p, 0).await?;
    let (seq, payload) = c.read_packet(1 << 16).await?;
    let hr = HandshakeResponse::parse(&payload).map_err(|_| Ended::Refused("a malformed handshake response".into()))?;
    let name = String::from_utf8_lossy(&hr.user).into_owned();
    let mut seq = seq.wrapping_add(1);
    let plugin = hr.auth_plugin.clone().unwrap_or_else(|| auth::NATIVE.to_vec());
    let ok = match users.get(&name) {
        None => {
            crate::auth::phantom_check(&scramble, &hr.auth_response);
            false
        }
        Some(u) => match u.check(&plugin, &scramble, &hr.auth_response) {
            Check::Ok => true,
            Check::Denied => false,
            Check::SwitchToNative | Check::FullAuth => {
                let mut p = Vec::new();
                write_auth_switch(&mut p, auth::NATIVE, &scramble);
                c.write_packet(&p, seq).await?;
                let (s, reply) = c.read_packet(1 << 16).await?;
                seq = s.wrapping_add(1);
                matches!(u.check(auth::NATIVE, &scramble, &reply), Check::Ok)
            }
        },
    };
    if !ok {
        let mut p = Vec::new();
        err_payload(&mut p, 1045, b"28000", &format!("Access denied for user '{name}' to the sluice admin listener"));
        c.write_packet(&p, seq).await?;
        return Err(Ended::Refused(format!("access denied for {name}")));
    }
    write_ok(c, seq, "").await?;
    tracing::info!(user = %name, "SQL admin session began");
    Ok(())
}

/// The next command; a statement larger than any this listener answers gets an error the
/// client can show, then the connection is closed: the end sent first, then the rest of what
/// the client sends read and dropped for a moment (bounded), so that the close does not reset
/// the connection under a client still writing, which would lose the error before it is read.
async fn read_command(c: &mut PacketConn) -> Result<Vec<u8>, Ended> {
    match c.read_packet(MAX_STATEMENT).await {
        Ok((_, cmd)) => Ok(cmd),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            let msg = format!("a statement of more than {MAX_STATEMENT} bytes: this admin listener takes none that long");
            reply(c, Answer::Error(1153, msg)).await?;
            linger(&mut c.stream).await;
            Err(Ended::Io(e))
        }
        Err(e) => Err(Ended::Io(e)),
    }
}

/// Sends the end of the connection, then reads and drops what the client still sends: for at
/// most a second, or 64 MiB.
async fn linger(stream: &mut Stream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let drain = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut left = 64usize << 20;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
}

/// The largest statement the listener reads.
const MAX_STATEMENT: usize = 1 << 20;

fn random() -> [u8; 20] {
    let mut r = [0u8; 20];
    let _ = aws_lc_rs::rand::fill(&mut r);
    r
}

/// What a statement answers.
enum Answer {
    Rows { table: String, columns: Vec<String>, rows: Vec<Vec<Option<String>>> },
    Done(String),
    Error(u16, String),
}

async fn write_ok(c: &mut PacketConn, seq: u8, info: &str) -> Result<(), Ended> {
    let mut p = Vec::new();
    ok_payload(&mut p, 0, 0, 0, status::AUTOCOMMIT, 0);
    if !info.is_empty() {
        sluice_proto::packet::put_lenenc_bytes(&mut p, info.as_bytes());
    }
    c.write_packet(&p, seq).await.map(|_| ()).map_err(Ended::Io)
}

async fn reply(c: &mut PacketConn, a: Answer) -> Result<(), Ended> {
    match a {
        Answer::Done(info) => write_ok(c, 1, &info).await,
        Answer::Error(code, msg) => {
            let mut p = Vec::new();
            let state = if code == 1064 {
                b"42000"
            } else if code == 1146 {
                b"42S02"
            } else if code == 1054 {
                b"42S22"
            } else {
                b"HY000"
            };
            err_payload(&mut p, code, state, &msg);
            c.write_packet(&p, 1).await.map(|_| ()).map_err(Ended::Io)
        }
        Answer::Rows { table, columns, rows } => {
            let mut seq = 1u8;
            let mut p = Vec::new();
            put_lenenc(&mut p, columns.len() as u64);
            seq = c.write_packet(&p, seq).await?;
            for name in &columns {
                p.clear();
                resultset::column_def(&mut p, &table, name);
                seq = c.write_packet(&p, seq).await?;
            }
            p.clear();
            eof_payload(&mut p, 0, status::AUTOCOMMIT);
            seq = c.write_packet(&p, seq).await?;
            for r in &rows {
                p.clear();
                let values: Vec<Option<&str>> = r.iter().map(|v| v.as_deref()).collect();
                resultset::text_row(&mut p, &values);
                seq = c.write_packet(&p, seq).await?;
            }
            p.clear();
            eof_payload(&mut p, 0, status::AUTOCOMMIT);
            c.write_packet(&p, seq).await.map(|_| ()).map_err(Ended::Io)
        }
    }
}

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a valid pattern"))
}

/// Answers one statement.
async fn run(ctx: &Arc<Ctx>, sql: &str) -> Answer {
    static SELECT: OnceLock<Regex> = OnceLock::new();
    let sql = sql.trim().trim_end_matches(';').trim();
    let lower = sql.to_ascii_lowercase();
    let one =
        |name: &str, value: &str| Answer::Rows { table: String::new(), columns: vec![name.into()], rows: vec![vec![Some(value.into())]] };
    if let Some(vars) = lower.strip_prefix("select @@") {
        // What clients ask on connecting (`@@version_comment`, `@@max_allowed_packet`, ...).
        let vars = vars.trim_end_matches("limit 1").trim();
        let names: Vec<String> = vars.split(',').map(|v| v.trim().trim_start_matches("@@").to_string()).collect();
        let value = |n: &str| match n {
            "version_comment" => Some("sluice admin".to_string()),
            "max_allowed_packet" => Some((1u32 << 24).to_string()),
            "wait_timeout" | "interactive_timeout" => Some("28800".to_string()),
            "version" => Some(env!("CARGO_PKG_VERSION").to_string()),
            _ => None,
        };
        let rows = vec![names.iter().map(|n| value(n)).collect()];
        return Answer::Rows { table: String::new(), columns: names.iter().map(|n| format!("@@{n}")).collect(), rows };
    }
    if lower == "select 1" {
        return one("1", "1");
    }
    if lower == "select version()" {
        return one("version()", env!("CARGO_PKG_VERSION"));
    }
    if lower == "select database()" {
        return Answer::Rows { table: String::new(), columns: vec!["database()".into()], rows: vec![vec![None]] };
    }
    if lower.starts_with("set ") {
        return set(&lower);
    }
    if lower == "show tables" {
        let rows = TABLES.split(", ").map(|t| vec![Some(t.to_string())]).collect();
        return Answer::Rows { table: String::new(), columns: vec!["Tables_in_sluice".into()], rows };
    }
    let select =
        re(&SELECT, r"(?is)^select\s+(.+?)\s+from\s+`?(\w+)`?(?:\s+where\s+`?(\w+)`?\s*=\s*(?:'([^']*)'|(\S+?)))?(?:\s+limit\s+(\d+))?$");
    if let Some(m) = select.captures(sql) {
        let want = m.get(1).map_or("", |x| x.as_str());
        let table = m[2].to_ascii_lowercase();
        let filter = m.get(3).map(|col| (col.as_str().to_string(), m.get(4).or(m.get(5)).map_or("", |v| v.as_str()).to_string()));
        let limit = m.get(6).and_then(|l| l.as_str().parse().ok()).unwrap_or(usize::MAX);
        return select_from(ctx, &table, want, filter, limit).await;
    }
    if let Some(answer) = run_verb(ctx, sql).await {
        return answer;
    }
    Answer::Error(1064, format!("sluice's admin listener does not know this statement; it knows: {STATEMENTS}"))
}

/// The verbs: DRAIN / UNDRAIN BACKEND, RELOAD CONFIG, SWITCHOVER TO, KILL SESSION (None: the
/// statement is none of them).
async fn run_verb(ctx: &Arc<Ctx>, sql: &str) -> Option<Answer> {
    static VERB: OnceLock<Regex> = OnceLock::new();
    static RELOAD: OnceLock<Regex> = OnceLock::new();
    static SWITCHOVER: OnceLock<Regex> = OnceLock::new();
    static KILL_SESSION: OnceLock<Regex> = OnceLock::new();
    if let Some(m) = re(&VERB, r"(?i)^(drain|undrain)\s+backend\s+'([^']+)'$").captures(sql) {
        let Some(b) = ctx.backends.by_name(&m[2]) else {
            let names: Vec<String> = ctx.backends.list().iter().map(|b| b.name.clone()).collect();
            return Some(Answer::Error(1105, format!("no backend '{}': backends are {}", &m[2], names.join(", "))));
        };
        if m[1].eq_ignore_ascii_case("drain") {
            let asked = crate::control::start_drain(ctx, &b);
            return Some(Answer::Done(format!("draining {}: {asked} sessions asked to move", b.name)));
        }
        crate::control::undrain(ctx, &b);
        return Some(Answer::Done(format!("{} undrained", b.name)));
    }
    if re(&RELOAD, r"(?i)^reload\s+config(uration)?$").is_match(sql) {
        return Some(match crate::control::reload::reload(ctx) {
            Ok(out) => Answer::Done(serde_json::to_string(&out).unwrap_or_default()),
            Err(refused) => Answer::Error(1105, format!("reload refused: {refused}")),
        });
    }
    if let Some(m) = re(&SWITCHOVER, r"(?i)^switchover\s+to\s+'([^']+)'$").captures(sql) {
        return Some(match crate::control::failover::switchover(ctx, &m[1]).await {
            Ok(message) => Answer::Done(message),
            Err(e) => Answer::Error(1105, format!("switchover refused: {e}")),
        });
    }
    let m = re(&KILL_SESSION, r"(?i)^kill\s+(?:session\s+)?(\d+)$").captures(sql)?;
    let id = &m[1];
    Some(match id.parse::<u32>().ok().and_then(|id| ctx.sessions.get(id)) {
        Some(h) => {
            h.kill();
            Answer::Done(format!("session {} killed", h.id))
        }
        None => Answer::Error(1094, format!("Unknown thread id: {id} (SELECT id FROM sessions lists them)")),
    })
}

/// A `SET`: drivers set their session up on connecting, which is accepted and changes nothing.
/// A password is not one of those: the listener's users are configured, never set here.
fn set(lower: &str) -> Answer {
    if lower.split_whitespace().nth(1).is_some_and(|w| w.starts_with("password")) {
        return Answer::Error(
            1227,
            "SET PASSWORD changes nothing here: the admin listener's users and their password_hash are in [[admin.sql_users]] (reload to change them)".into(),
        );
    }
    Answer::Done(String::new())
}

/// The rows of a table, each an object (the HTTP API's JSON).
async fn table_rows(ctx: &Ctx, table: &str) -> Result<Vec<Map<String, Value>>, Answer> {
    let list = match table {
        "backends" => serde_json::to_value(crate::control::admin::backend_views(ctx)).unwrap_or_default(),
        "sessions" => serde_json::to_value(ctx.sessions.all().iter().map(|h| h.snapshot()).collect::<Vec<_>>()).unwrap_or_default(),
        "digests" => serde_json::to_value(ctx.digests.top(1000, crate::route::digest::By::TotalTime)).unwrap_or_default(),
        "config" => {
            let mut rows = Vec::new();
            flatten("", &serde_json::to_value(&**ctx.config()).unwrap_or_default(), &mut rows);
            Value::Array(rows.into_iter().map(|(k, v)| serde_json::json!({ "key": k, "value": v })).collect())
        }
        "failovers" => serde_json::to_value(ctx.backends.topology.events()).unwrap_or_default(),
        "instances" if ctx.config().cluster.etcd.is_empty() => Value::Array(Vec::new()),
        "instances" => Value::Array(crate::control::cluster::instances(ctx).await.map_err(|e| Answer::Error(1105, e.to_string()))?),
        other => return Err(Answer::Error(1146, format!("Table 'sluice.{other}' doesn't exist: the tables are {TABLES}"))),
    };
    Ok(list.as_array().map(|a| a.iter().filter_map(|r| r.as_object().map(lift)).collect()).unwrap_or_default())
}

/// An object with the fields of its object fields lifted beside its own (a session's `state`).
fn lift(o: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in o {
        match v {
            Value::Object(inner) if k == "state" => {
                for (ik, iv) in inner {
                    out.insert(if o.contains_key(ik) { format!("{k}_{ik}") } else { ik.clone() }, iv.clone());
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// Every leaf of `v` as (path, value): `proxy.max_connections`, `backends[0].address`.
fn flatten(path: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(o) => o.iter().for_each(|(k, x)| flatten(&if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, x, out)),
        Value::Array(a) if a.iter().any(|x| x.is_object()) => {
            a.iter().enumerate().for_each(|(i, x)| flatten(&format!("{path}[{i}]"), x, out))
        }
        _ => out.push((path.to_string(), v.clone())),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

async fn select_from(ctx: &Ctx, table: &str, want: &str, filter: Option<(String, String)>, limit: usize) -> Answer {
    let rows = match table_rows(ctx, table).await {
        Ok(r) => r,
        Err(a) => return a,
    };
    let mut all: Vec<String> = Vec::new();
    if rows.is_empty() {
        // No row to take the columns from: a session's are those of any session; the other
        // tables' their key column (a result needs one column at least).
        all = match table {
            "sessions" => {
                let sample = crate::session::SessionHandle::new(0, String::new(), "".into()).snapshot();
                serde_json::to_value(sample).ok().and_then(|v| v.as_object().map(|o| lift(o).keys().cloned().collect())).unwrap_or_default()
            }
            "backends" | "instances" => vec!["name".into()],
            "digests" => vec!["digest".into()],
            _ => vec!["key".into()],
        };
    }
    for r in &rows {
        for k in r.keys() {
            if !all.contains(k) {
                all.push(k.clone());
            }
        }
    }
    let columns: Vec<String> =
        if want.trim() == "*" { all.clone() } else { want.split(',').map(|c| c.trim().trim_matches('`').to_string()).collect() };
    let known = |c: &str| all.iter().any(|a| a == c) || rows.is_empty();
    for c in columns.iter().chain(filter.iter().map(|f| &f.0)) {
        if !known(c) {
            return Answer::Error(1054, format!("Unknown column '{c}' in {table}: its columns are {}", all.join(", ")));
        }
    }
    let rows = rows
        .iter()
        .filter(|r| filter.as_ref().is_none_or(|(col, value)| r.get(col).and_then(text).as_deref() == Some(value.as_str())))
        .take(limit)
        .map(|r| columns.iter().map(|c| r.get(c).and_then(text)).collect())
        .collect();
    Answer::Rows { table: table.to_string(), columns, rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_flatten_to_keys() {
        let mut out = Vec::new();
        flatten("", &serde_json::json!({ "proxy": { "workers": 2 }, "backends": [{ "address": "a" }], "rules": [] }), &mut out);
        let keys: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["backends[0].address", "proxy.workers", "rules"]);
        let lifted = lift(serde_json::json!({ "id": 1, "state": { "user": "app", "id": 9 } }).as_object().unwrap());
        assert_eq!(lifted.get("user"), Some(&Value::String("app".into())));
        assert_eq!(lifted.get("state_id"), Some(&Value::from(9)));
    }
}
