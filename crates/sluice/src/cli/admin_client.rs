//! `sluice ctl`: the admin API from a shell. Tables for people, `--json` for scripts (the API's
//! own answer), and exit codes that say what happened:
//!
//! - 0: done;
//! - 1: refused (the API answered 4xx: not found, a bad request, a conflict, a refused reload);
//! - 2: a bad command line, or a configuration file that cannot be read;
//! - 3: the admin API cannot be reached (or answered something that is not HTTP);
//! - 4: sluice failed (5xx, or 503 from `status`: draining or no backend up).
//!
//! The address and token come from `--admin`/`--token`, else `SLUICE_ADMIN`/`SLUICE_ADMIN_TOKEN`,
//! else the configuration file's `[admin]` (`--config`), else 127.0.0.1:6034.

use crate::config::InvalidValue;
use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;

use crate::cli::{CtlArgs, CtlVerb};

/// What a verb asks of the API.
struct Call {
    method: &'static str,
    path: String,
    body: Option<Value>,
}

fn get(path: impl Into<String>) -> Call {
    Call { method: "GET", path: path.into(), body: None }
}

fn post(path: impl Into<String>) -> Call {
    Call { method: "POST", path: path.into(), body: None }
}

/// Percent-encodes a path segment (a backend's name may be `HOST:PORT`).
fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn call_of(verb: &CtlVerb) -> Result<Call, InvalidValue> {
    Ok(match verb {
        CtlVerb::Status => get("/health"),
        CtlVerb::Backends => get("/backends"),
        CtlVerb::Sessions => get("/sessions"),
        CtlVerb::Drain { backend } => post(format!("/backends/{}/drain", segment(backend))),
        CtlVerb::Undrain { backend } => post(format!("/backends/{}/undrain", segment(backend))),
        CtlVerb::Weight { backend, value } => post(format!("/backends/{}/weight?value={value}", segment(backend))),
        CtlVerb::Move { session, to } => {
            post(format!("/sessions/{session}/move{}", to.as_deref().map(|b| format!("?to={}", segment(b))).unwrap_or_default()))
        }
        CtlVerb::Kill { session } => post(format!("/sessions/{session}/kill")),
        CtlVerb::Reload => post("/config/reload"),
        CtlVerb::Upgrade => post("/upgrade"),
        CtlVerb::Config => get("/config"),
        CtlVerb::Switchover { backend } => {
            Call { method: "POST", path: "/cluster/switchover".into(), body: Some(serde_json::json!({ "to": backend })) }
        }
        CtlVerb::Failovers => get("/cluster/failover"),
        CtlVerb::Instances => get("/cluster/instances"),
        CtlVerb::Digests { top, by } => get(format!("/digests?top={top}&by={}", segment(by))),
        CtlVerb::Capture { action, options } => match action.as_str() {
            "status" => get("/capture"),
            "stop" => post("/capture/stop"),
            "open" => post("/capture/open"),
            "start" => {
                let body: Value = serde_json::from_str(options.as_deref().unwrap_or("{}"))
                    .map_err(|e| InvalidValue(format!("capture start: the options are not JSON: {e}")))?;
                Call { method: "POST", path: "/capture/start".into(), body: Some(body) }
            }
            other => return Err(InvalidValue(format!("capture: expected start, stop, open or status, not {other:?}"))),
        },
    })
}

/// Runs `sluice ctl`; the exit code.
pub fn run(args: &CtlArgs) -> i32 {
    let (admin, token) = match target(args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice ctl: {e}");
            return 2;
        }
    };
    let call = match call_of(&args.verb) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice ctl: {e}");
            return 2;
        }
    };
    let (status, body) = match request(&admin, token.as_deref(), &call) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice ctl: cannot reach the admin API at {admin}: {e}");
            return 3;
        }
    };
    let value: Value = serde_json::from_str(&body).unwrap_or(Value::String(body.clone()));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or(body));
    } else if status < 400 || (status == 503 && matches!(args.verb, CtlVerb::Status)) {
        print!("{}", render(&args.verb, &value));
    } else {
        let why = value.get("error").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| body.trim().to_string());
        eprintln!("sluice ctl: {status}: {why}");
    }
    match status {
        200..=299 => 0,
        503 if matches!(args.verb, CtlVerb::Status) => 4,
        400..=499 => 1,
        _ => 4,
    }
}

/// The admin API's address and token.
fn target(args: &CtlArgs) -> Result<(String, Option<String>), crate::config::ConfigError> {
    let file = match &args.config {
        Some(p) => Some(crate::config::Config::load(p)?),
        None => None,
    };
    let admin = args
        .admin
        .clone()
        .or_else(|| std::env::var("SLUICE_ADMIN").ok())
        .or_else(|| file.as_ref().and_then(|c| c.admin.listen.as_ref().map(|a| a.get_ref().clone())))
        .unwrap_or_else(|| "127.0.0.1:6034".into());
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var("SLUICE_ADMIN_TOKEN").ok())
        .or_else(|| file.as_ref().and_then(|c| c.admin.token.clone()));
    Ok((admin, token))
}

/// One HTTP/1.1 exchange with the admin API (`Connection: close`); the status and the body.
fn request(admin: &str, token: Option<&str>, call: &Call) -> Result<(u16, String), std::io::Error> {
    use std::net::ToSocketAddrs;
    let addr = admin.to_socket_addrs()?.next().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    // (The API takes a mutation only as JSON: `{}` when there is nothing to say.)
    let body = call.body.as_ref().map(Value::to_string).unwrap_or_else(|| if call.method == "GET" { String::new() } else { "{}".into() });
    let mut head =
        format!("{} {} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\nContent-Length: {}\r\n", call.method, call.path, body.len());
    if call.method != "GET" {
        head.push_str("Content-Type: application/json\r\n");
    }
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    s.write_all(format!("{head}\r\n{body}").as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<(u16, String), std::io::Error> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| not_http(format!("not an HTTP response: {text:?}")))?;
    let status =
        head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| not_http(format!("not an HTTP response: {head:?}")))?;
    let chunked =
        head.lines().any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked"));
    Ok((status, if chunked { dechunk(body) } else { body.to_string() }))
}

fn not_http(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The answer as a person reads it.
fn render(verb: &CtlVerb, v: &Value) -> String {
    let s = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match verb {
        CtlVerb::Status => format!(
            "{}{}\nbackends up: {} of {}\nsessions: {}\n",
            s(&v["status"]),
            v["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default(),
            s(&v["backends_up"]),
            s(&v["backends"]),
            s(&v["sessions"])
        ),
        CtlVerb::Backends => table(
            &["NAME", "ADDRESS", "UP", "WEIGHT", "SESSIONS", "ROLE", "DRAINING", "REASON"],
            rows(v, |b| {
                vec![
                    s(&b["name"]),
                    s(&b["address"]),
                    s(&b["up"]),
                    s(&b["weight"]),
                    s(&b["sessions"]),
                    s(&b["serves_as"]),
                    s(&b["draining"]),
                    if b["fenced"].is_null() { s(&b["reason"]) } else { format!("fenced: {}", s(&b["fenced"]["reason"])) },
                ]
            }),
        ),
        CtlVerb::Sessions => table(
            &["ID", "USER", "CLIENT", "BACKEND", "SCHEMA", "QUERIES", "PINS", "MOVE"],
            rows(v, |x| {
                let pins = x["pins"].as_array().map(|p| p.iter().map(&s).collect::<Vec<_>>().join(",")).filter(|p| !p.is_empty());
                vec![
                    s(&x["id"]),
                    s(&x["state"]["user"]),
                    s(&x["client"]),
                    s(&x["backend"]),
                    s(&x["state"]["schema"]),
                    s(&x["queries"]),
                    pins.unwrap_or_else(|| "-".into()),
                    s(&x["move_asked"]),
                ]
            }),
        ),
        CtlVerb::Instances => table(
            &["NAME", "ADMIN", "LISTENERS", "PID", "VERSION"],
            rows(v, |i| {
                let listeners = i["listeners"].as_array().map(|l| l.iter().map(&s).collect::<Vec<_>>().join(",")).unwrap_or_default();
                vec![s(&i["name"]), s(&i["admin"]), listeners, s(&i["pid"]), s(&i["version"])]
            }),
        ),
        CtlVerb::Digests { .. } => table(
            &["DIGEST", "COUNT", "ERRORS", "AVG_US", "P99_US", "TEXT"],
            rows(&v["digests"], |d| {
                vec![s(&d["digest"]), s(&d["count"]), s(&d["errors"]), s(&d["avg_us"]), s(&d["p99_us"]), s(&d["text"])]
            }),
        ),
        CtlVerb::Switchover { .. } => format!("{}\n", s(&v["message"])),
        CtlVerb::Failovers => format!(
            "primary: {}\nlast position seen: {}\n{}",
            s(&v["primary"]),
            s(&v["last_seen"]),
            table(
                &["AT", "OPERATION", "RESULT", "BACKEND", "MS", "MESSAGE"],
                rows(&v["events"], |e| vec![
                    s(&e["at"]),
                    s(&e["operation"]),
                    s(&e["result"]),
                    s(&e["backend"]),
                    s(&e["took_ms"]),
                    s(&e["message"])
                ]),
            )
        ),
        _ => format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()),
    }
}

fn rows(v: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array().map(|a| a.iter().map(row).collect()).unwrap_or_default()
}

/// Columns padded to their widest cell.
fn table(head: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&width).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(head.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_and_tables() {
        assert_eq!(parse_response(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}").unwrap(), (404, "{}".into()));
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (200, "abcde".into()));
        assert!(parse_response(b"garbage").is_err());
        assert_eq!(table(&["A", "BB"], vec![vec!["xyz".into(), "1".into()]]), "A    BB\nxyz  1\n");
        assert_eq!(segment("127.0.0.1:3306"), "127.0.0.1%3A3306");
    }
}
