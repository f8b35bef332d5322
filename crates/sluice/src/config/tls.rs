//! `tls` and `[tls]`: TLS for client connections, and reading the PEM files the
//! configuration names.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// TLS for client connections.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ClientTls {
    /// `tls = "auto"` (the default): a self-signed certificate generated in memory at start and
    /// replaced before it expires.
    #[default]
    SelfSigned,
    /// `tls = "off"`: no TLS; clients that ask for it are refused.
    Off,
    /// A `[tls]` table: certificate and key files.
    Files(TlsConfig),
}

impl<'de> Deserialize<'de> for ClientTls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ClientTls;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\", \"off\", or a [tls] table with cert and key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ClientTls, E> {
                match v {
                    "auto" => Ok(ClientTls::SelfSigned),
                    "off" => Ok(ClientTls::Off),
                    _ => Err(E::custom(format!("tls: expected \"auto\", \"off\" or a [tls] table with cert and key, not {v:?}"))),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ClientTls, A::Error> {
                TlsConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ClientTls::Files)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: Spanned<PathBuf>,
    pub key: Spanned<PathBuf>,
}

/// Reads the PEM certificates of a file the configuration names (`[tls] cert`, `tls_ca`).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let data = crate::sys::read_regular(path, MAX_PEM)?;
    let pem = |e: rustls::pki_types::pem::Error| PemError::Pem { path: path.to_path_buf(), why: e.to_string() };
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&data).collect::<Result<_, _>>().map_err(pem)?;
    if certs.is_empty() {
        return Err(PemError::Pem { path: path.to_path_buf(), why: "no certificate found".into() });
    }
    Ok(certs)
}

/// A certificate or key file that cannot be used (the configuration's fault, or its file's).
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error(transparent)]
    Path(#[from] crate::sys::PathError),
    #[error("{}: {why}", path.display())]
    Pem { path: std::path::PathBuf, why: String },
}

/// The largest certificate or key file read (a chain of many certificates fits).
const MAX_PEM: u64 = 1 << 20;

/// Reads the PEM private key of a file the configuration names (`[tls] key`).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let data = crate::sys::read_regular(path, MAX_PEM)?;
    PrivateKeyDer::from_pem_slice(&data).map_err(|e| PemError::Pem {
        path: path.to_path_buf(),
        why: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no private key found".into(),
            e => e.to_string(),
        },
    })
}
