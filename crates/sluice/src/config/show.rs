//! How the configuration in force is shown (`GET /config`): durations as the file writes them,
//! secrets masked.

use std::time::Duration;

use serde::Serializer;

use super::ClientTls;

/// A duration as "1500ms".
pub fn duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}ms", d.as_millis()))
}

/// A secret: whether one is set, never what it is.
pub fn masked<T, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_some("********"),
        None => s.serialize_none(),
    }
}

impl serde::Serialize for ClientTls {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ClientTls::Off => s.serialize_str("off"),
            ClientTls::SelfSigned => s.serialize_str("auto"),
            ClientTls::Files(f) => f.serialize(s),
        }
    }
}

/// Keys whose values are secrets (shown masked by `GET /config`): an error about one names the
/// key and the line, never the value.
pub fn is_secret_key(key: &str) -> bool {
    matches!(key.rsplit('.').next(), Some("password" | "password_hash" | "token" | "secret" | "passphrase"))
}

/// A parser's message with the values it quotes (between backquotes or double quotes) taken out.
pub fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quote = None;
    for c in message.chars() {
        match quote {
            Some(q) if c == q => {
                out.push_str("(not shown)");
                quote = None;
            }
            Some(_) => {}
            None if c == '`' || c == '"' => quote = Some(c),
            None => out.push(c),
        }
    }
    if quote.is_some() {
        out.push_str("(not shown)");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn errors_never_echo_a_secret() {
        for (text, secret) in [
            ("[[users]]\nname = \"a\"\npassword = 77123456789\n", "77123456789"),
            ("[[users]]\nname = \"a\"\npassword = [\"hunter2\"]\n", "hunter2"),
            ("[admin]\ntoken = 4242424242\n", "4242424242"),
            ("[health]\nuser = \"m\"\npassword = true\n", "true"),
        ] {
            let e = super::super::Config::parse(text).unwrap_err();
            assert!(!e.message.contains(secret), "{}", e.message);
            assert!(e.line.is_some(), "{}", e.message);
        }
        let e = super::super::Config::parse("[[users]]\nname = \"a\"\npassword = 7\n").unwrap_err();
        assert!(e.message.starts_with("users.password:") || e.message.contains("password"), "the key is named: {}", e.message);
    }
}
