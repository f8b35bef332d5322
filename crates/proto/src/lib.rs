//! The MySQL client/server protocol as sluice speaks it, with no I/O: packet framing, the
//! connection-phase packets, password scrambles, the compressed framing, and the tracker that
//! follows a server's response stream. Every function takes bytes and returns values or
//! `Malformed`, so all of it can be fuzzed and tested in isolation.

#![forbid(unsafe_code)]

pub mod auth;
pub mod basic;
pub mod compress;
pub mod consts;
pub mod digest;
pub mod fuzzing;
pub mod gtid;
pub mod handshake;
pub mod lexer;
pub mod packet;
pub mod proxy_header;
pub mod replication;
pub mod response;
pub mod resultset;
pub mod rw;
pub mod scan;
pub mod secret;
pub mod sql;
pub mod uservar;

pub use packet::Malformed;
