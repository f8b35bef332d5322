//! Python's most used pure-Python MySQL driver, PyMySQL (from PyPI), directly and through
//! sluice in every mode: passthrough, users mode, sessions moved at every safe point,
//! multiplexing, multiplexing with a park at every command, and the read/write split in front
//! of a primary and a replica (against the primary directly). Its published package carries no
//! tests, so `tests/python/behaviours.py` runs the behaviours its suite checks where a proxy
//! could differ and prints what the driver saw; every scenario must see through sluice what it
//! sees directly. (SQLAlchemy's suite runs over it too: `tests/orm_suite.rs`.)

mod common;

use std::process::Command;

use common::*;

const SCRIPT: &str = include_str!("python/behaviours.py");

/// What the driver saw against `addr`, scenario by scenario.
fn behaviours(env: &PythonEnv, addr: &str) -> Seen {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let script = env.sqlalchemy.with_file_name("behaviours.py");
    std::fs::write(&script, SCRIPT).expect("write the script");
    let out = Command::new(&env.python).arg(&script).args([host, port]).output().expect("run python");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "python: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => panic!("python printed no JSON object:\n{text}\n{}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn pymysql_sees_through_sluice_what_it_sees_directly() {
    let env = python_env();
    compare_behaviours(|addr| behaviours(&env, addr));
}
