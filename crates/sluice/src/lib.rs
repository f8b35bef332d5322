//! sluice: a MySQL-protocol proxy. See docs/ARCHITECTURE.md for how a connection flows through
//! these modules.

#![deny(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod capture;
pub mod cli;
pub mod config;
pub mod control;
pub mod ctx;
pub mod error;
pub mod frontend;
pub mod metrics;
pub mod net;
pub mod replay;
pub mod route;
pub mod runtime;
pub mod session;
#[allow(unsafe_code)]
pub mod sys;
