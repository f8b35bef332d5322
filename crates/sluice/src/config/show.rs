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
