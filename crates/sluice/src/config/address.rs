//! Where a backend or listener lives: `HOST:PORT` or a Unix socket's path.

use std::path::PathBuf;

/// Where a backend or listener lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(a) => write!(f, "{a}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Parses `HOST:PORT` (resolving names such as `localhost`) or an absolute socket path.
pub fn parse_address(s: &str) -> Result<Address, super::InvalidValue> {
    if let Some(p) = s.strip_prefix("unix:") {
        return Ok(Address::Unix(PathBuf::from(p)));
    }
    if s.starts_with('/') {
        return Ok(Address::Unix(PathBuf::from(s)));
    }
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| super::InvalidValue(format!("invalid address {s:?}: {e}")))?
        .next()
        .map(Address::Tcp)
        .ok_or_else(|| super::InvalidValue(format!("address {s:?} resolves to nothing")))
}
