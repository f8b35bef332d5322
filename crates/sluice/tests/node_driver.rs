//! Node.js's most used MySQL driver (`mysql2`, from the npm registry) directly and through
//! sluice in every mode: passthrough, users mode, sessions moved at every safe point,
//! multiplexing, multiplexing with a park at every command, and the read/write split in front
//! of a primary and a replica (against the primary directly). The published package carries no
//! tests, so `tests/node/behaviours.js` runs the behaviours its suite checks where a proxy could differ (characters outside the BMP among sessions of
//! other character sets, multi-statement OK packets and status flags, errors, types, LOAD DATA
//! LOCAL, change of user, KILL of an idle pooled connection (alone, and among other statements
//! as the driver's own pool test sends it), prepared statements closed in a
//! loop, savepoints with autocommit off) and prints what the driver saw; every scenario must
//! see through sluice what it sees directly.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

const MYSQL2: &str = "mysql2@3.24.6";
const SCRIPT: &str = include_str!("node/behaviours.js");

/// The drivers installed under the testkit directory (once), and the script beside them.
fn install() -> PathBuf {
    let dir = sluice_testkit::mariadb::work_root().join("node");
    let _lock = sluice_testkit::mariadb::FileLock::acquire(&dir.with_extension("lock"));
    let ready = dir.join(format!("ready-{MYSQL2}"));
    if !ready.exists() {
        std::fs::create_dir_all(&dir).expect("create node dir");
        let out = Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--no-save", "--prefix"])
            .arg(&dir)
            .arg(MYSQL2)
            .output()
            .expect("run npm (scripts/browser.sh installs Node.js)");
        assert!(out.status.success(), "npm install: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        std::fs::write(&ready, "").expect("mark ready");
    }
    std::fs::write(dir.join("behaviours.js"), SCRIPT).expect("write the script");
    dir
}

/// What the drivers saw against `addr`, scenario by scenario.
fn behaviours(dir: &PathBuf, addr: &str) -> Seen {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let out = Command::new("node").arg(dir.join("behaviours.js")).args([host, port]).current_dir(dir).output().expect("run node");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "node: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => panic!("node printed no JSON object:\n{text}\n{}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn node_driver_sees_through_sluice_what_it_sees_directly() {
    let dir = install();
    compare_behaviours(|addr| behaviours(&dir, addr));
}
