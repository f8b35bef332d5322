//! Everything sluice asks of the operating system that Rust's type system cannot check: every
//! `unsafe` block of the crate is here, each with the reason it is sound (`SAFETY:`), behind a
//! safe function. The rest of the crate denies `unsafe` code.

pub mod epoll;
pub mod fdpass;
mod files;
pub mod process;
pub mod socket;

pub use files::{Dir, PathError, Problem, read_regular};
