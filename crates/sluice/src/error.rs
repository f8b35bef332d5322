//! Typed errors that say whose fault a failure was and whether retrying is safe.

use std::fmt;

use sluice_proto::consts::err as code;

/// Who caused a failure: decides the log level, the metric label and the client's error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something wrong, stalled, or went away.
    Client,
    /// A backend refused, failed, died or sent something wrong.
    Backend,
    /// Sluice itself: a limit, shutdown, or an internal failure.
    Proxy,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Backend => "backend",
            Side::Proxy => "proxy",
        }
    }
}

/// Whether the operation that failed may be retried elsewhere without the client noticing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing reached a backend yet (connect failure): another backend may be tried.
    Safe,
    /// A command was sent: retrying could run it twice.
    Unsafe,
    /// A command was sent and its backend connection lost before any of its answer reached
    /// the client: it may have run; the client has seen nothing of it (transaction replay
    /// decides what to do).
    Unanswered,
}

/// Why an upgrade failed: the old process goes on as before.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// A system call on the way failed (sluice's host).
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// The other process did not play its part (it did not start, or said something else),
    /// or this one is shutting down.
    #[error("{0}")]
    Refused(String),
}

#[derive(Debug)]
pub struct Error {
    pub side: Side,
    pub retry: Retry,
    /// MySQL error code sent to the client, if it is still there to receive one.
    pub code: u16,
    pub sql_state: [u8; 5],
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(side: Side, code: u16, message: impl Into<String>) -> Error {
        Error { side, retry: Retry::Unsafe, code, sql_state: *b"HY000", message: message.into() }
    }

    pub fn client(message: impl Into<String>) -> Error {
        Error::new(Side::Client, code::HANDSHAKE, message).state(b"08S01")
    }

    pub fn backend(message: impl Into<String>) -> Error {
        Error::new(Side::Backend, code::SERVER_LOST, message).state(b"08S01")
    }

    pub fn proxy(code: u16, message: impl Into<String>) -> Error {
        Error::new(Side::Proxy, code, message)
    }

    /// The connection to a backend could not be made; nothing was sent.
    /// A connection to a backend could not be made for want of sluice's own resources (out
    /// of descriptors or memory): sluice's fault, not the backend's, and safe to retry.
    pub fn local_resources(message: impl Into<String>) -> Error {
        Error { retry: Retry::Safe, ..Error::new(Side::Proxy, code::OUT_OF_RESOURCES, message).state(b"HY000") }
    }

    /// A connect's failure: [`Error::local_resources`] when the error is sluice's own (out of
    /// descriptors, buffers or memory), else the backend's ([`Error::connect`]).
    pub fn from_connect(e: &std::io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                Error::local_resources(format!("sluice is out of descriptors or memory: {e}"))
            }
            _ => Error::connect(format!("connect: {e}")),
        }
    }

    pub fn connect(message: impl Into<String>) -> Error {
        Error { retry: Retry::Safe, ..Error::new(Side::Backend, code::NO_BACKEND, message).state(b"08S01") }
    }

    /// A backend answered the connection with an ERR instead of a greeting.
    pub fn is_backend_refusal(&self) -> bool {
        self.side == Side::Backend && self.retry == Retry::Safe && self.code != code::NO_BACKEND
    }

    pub fn state(mut self, s: &[u8; 5]) -> Error {
        self.sql_state = *s;
        self
    }

    pub fn io(side: Side, what: &str, e: std::io::Error) -> Error {
        match side {
            Side::Backend => Error::backend(format!("{what}: {e}")),
            _ => Error::new(side, code::NET_READ_ERROR, format!("{what}: {e}")).state(b"08S01"),
        }
    }

    /// A client's read that failed: one that timed out is the server's 1159 (its
    /// `net_read_timeout`), any other 1158.
    pub fn client_read(what: &str, e: std::io::Error) -> Error {
        let code = if e.kind() == std::io::ErrorKind::TimedOut { code::NET_READ_INTERRUPTED } else { code::NET_READ_ERROR };
        Error::new(Side::Client, code, format!("{what}: {e}")).state(b"08S01")
    }

    /// A backend's ERR packet (`payload`) as an error carrying its code and SQL state.
    pub fn from_backend_err(payload: &[u8]) -> Error {
        match sluice_proto::basic::Err::parse(payload) {
            Ok(e) => {
                let mut err = Error::backend(String::from_utf8_lossy(e.message).into_owned());
                err.code = e.code;
                err.sql_state = e.sql_state;
                err
            }
            Err(e) => Error::malformed(Side::Backend, e),
        }
    }

    pub fn malformed(side: Side, e: sluice_proto::Malformed) -> Error {
        match side {
            Side::Backend => Error::backend(format!("backend sent a {e}")),
            _ => Error::new(side, code::NET_READ_ERROR, format!("{e}")).state(b"08S01"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error {}: {}", self.side.as_str(), self.code, self.message)
    }
}

impl std::error::Error for Error {}
