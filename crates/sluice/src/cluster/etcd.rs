//! A small client of etcd's v3 JSON API (its gRPC gateway, `POST /v3/...`): calls, and the
//! streams of watch and lease keep-alive, over plain HTTP/1.1. Keys and values travel in
//! base64, as the gateway wants them.

use std::time::Duration;

use base64::Engine;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a call (or the start of a stream) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Etcd {
    /// `HOST:PORT` of each endpoint, tried in turn.
    endpoints: Vec<String>,
}

pub fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

pub fn unb64(v: &Value) -> Vec<u8> {
    v.as_str().and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok()).unwrap_or_default()
}

/// The end of the range of keys that begin with `prefix` (its last byte plus one).
pub fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    pub fn new(urls: &[String]) -> Result<Etcd, String> {
        let endpoints: Vec<String> = urls
            .iter()
            .map(|u| {
                let hostport = u.strip_prefix("http://").ok_or_else(|| format!("cluster.etcd: {u:?}: only http:// endpoints"))?;
                Ok(hostport.trim_end_matches('/').to_string())
            })
            .collect::<Result<_, String>>()?;
        if endpoints.is_empty() {
            return Err("cluster.etcd names no endpoint".into());
        }
        Ok(Etcd { endpoints })
    }

    /// One call; its JSON answer.
    pub async fn call(&self, path: &str, body: &Value) -> Result<Value, String> {
        let mut s = self.stream(path, body).await?;
        tokio::time::timeout(CALL_TIMEOUT, s.next())
            .await
            .map_err(|_| format!("etcd {path}: timed out"))??
            .ok_or_else(|| format!("etcd {path}: empty answer"))
    }

    /// A request whose answer is a stream of JSON messages (or one).
    pub async fn stream(&self, path: &str, body: &Value) -> Result<Stream, String> {
        let mut last = String::new();
        for e in &self.endpoints {
            match tokio::time::timeout(CALL_TIMEOUT, Stream::open(e, path, body)).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(err)) => last = format!("etcd {e}{path}: {err}"),
                Err(_) => last = format!("etcd {e}{path}: timed out"),
            }
        }
        Err(last)
    }

    /// The keys that begin with `prefix`: the store's revision, and each (key, value).
    pub async fn range(&self, prefix: &str) -> Result<(u64, Vec<(String, Vec<u8>)>), String> {
        let answer =
            self.call("/v3/kv/range", &serde_json::json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&range_end(prefix)) })).await?;
        let revision = answer["header"]["revision"].as_str().and_then(|r| r.parse().ok()).unwrap_or(0);
        let kvs = answer["kvs"].as_array().map(|a| a.as_slice()).unwrap_or_default();
        Ok((revision, kvs.iter().map(|kv| (String::from_utf8_lossy(&unb64(&kv["key"])).into_owned(), unb64(&kv["value"]))).collect()))
    }
}

/// The answer of a streaming call, message by message.
pub struct Stream {
    conn: TcpStream,
    /// Bytes read and not yet taken apart.
    raw: Vec<u8>,
    /// The body so far (chunks joined), not yet split into messages.
    body: Vec<u8>,
    chunked: bool,
    /// Content-Length of an answer that is not chunked (None once it was read).
    length: Option<usize>,
}

impl Stream {
    async fn open(endpoint: &str, path: &str, body: &Value) -> Result<Stream, String> {
        let mut conn = TcpStream::connect(endpoint).await.map_err(|e| e.to_string())?;
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut s = Stream { conn, raw: Vec::new(), body: Vec::new(), chunked: false, length: None };
        let head = loop {
            if let Some(i) = s.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&s.raw[..i]).into_owned();
                s.raw.drain(..i + 4);
                break head;
            }
            s.fill().await?;
        };
        let status = head.split_whitespace().nth(1).unwrap_or("");
        let lower = head.to_ascii_lowercase();
        s.chunked = lower.contains("transfer-encoding: chunked");
        s.length = lower.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
        if status != "200" {
            let mut more = Vec::new();
            let _ = tokio::time::timeout(Duration::from_millis(200), s.conn.read_to_end(&mut more)).await;
            s.raw.extend_from_slice(&more);
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&s.raw)));
        }
        Ok(s)
    }

    async fn fill(&mut self) -> Result<usize, String> {
        let mut buf = [0u8; 16 << 10];
        let n = self.conn.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("etcd closed the connection".into());
        }
        self.raw.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    /// The next message; None when the answer ended.
    pub async fn next(&mut self) -> Result<Option<Value>, String> {
        loop {
            if let Some(i) = self.body.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.body.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map(Some).map_err(|e| format!("etcd answered something that is not JSON: {e}"));
            }
            if !self.chunked {
                // One message: the whole body.
                let Some(len) = self.length.take() else { return Ok(None) };
                while self.raw.len() < len {
                    self.fill().await?;
                }
                return serde_json::from_slice(&self.raw[..len]).map(Some).map_err(|e| format!("etcd: {e}"));
            }
            match self.take_chunk()? {
                Some(0) => return Ok(None),
                Some(_) => {}
                None => {
                    self.fill().await?;
                }
            }
        }
    }

    /// Moves one whole chunk from `raw` to `body`: its size, or None when it is not all there.
    fn take_chunk(&mut self) -> Result<Option<usize>, String> {
        let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let size_text = String::from_utf8_lossy(&self.raw[..eol]);
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).map_err(|_| "etcd: a bad chunk".to_string())?;
        if self.raw.len() < eol + 2 + size + 2 {
            return Ok(None);
        }
        self.body.extend_from_slice(&self.raw[eol + 2..eol + 2 + size]);
        self.raw.drain(..eol + 2 + size + 2);
        Ok(Some(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_endpoints() {
        assert_eq!(range_end("/sluice/"), b"/sluice0");
        assert_eq!(range_end("a\u{7f}"), b"a\x80");
        assert!(Etcd::new(&["https://x:1".into()]).is_err());
        assert_eq!(Etcd::new(&["http://127.0.0.1:2379/".into()]).unwrap().endpoints, ["127.0.0.1:2379"]);
        assert_eq!(unb64(&Value::String(b64(b"key"))), b"key");
    }
}
