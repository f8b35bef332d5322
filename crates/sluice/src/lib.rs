//! sluice: a MySQL-protocol proxy. See docs/ARCHITECTURE.md for how a connection flows through
//! these modules.

#![deny(unsafe_code)]

pub(crate) mod auth;
pub(crate) mod backend;
pub mod capture;
pub mod cli;
pub mod config;
pub mod control;
pub mod ctx;
pub(crate) mod error;
pub(crate) mod frontend;
pub(crate) mod metrics;
pub mod net;
pub mod replay;
pub(crate) mod route;
pub mod runtime;
pub(crate) mod session;
#[allow(unsafe_code)]
pub mod sys;
pub(crate) mod worker;
