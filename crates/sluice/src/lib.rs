//! sluice: a MySQL-protocol proxy. See docs/ARCHITECTURE.md for how a connection flows through
//! these modules.

pub mod admin;
pub mod auth;
pub mod backend;
pub mod cache;
pub mod capture;
pub mod cli;
pub mod config;
pub mod control;
pub mod ctx;
pub mod deadline;
pub mod digest;
pub mod error;
pub mod frontend;
pub mod gtid;
pub mod metrics;
pub mod net;
pub mod parking;
pub mod rebalance;
pub mod reload;
pub mod replay;
pub mod rules;
pub mod runtime;
pub mod session;
pub mod tls;
pub mod vars;
