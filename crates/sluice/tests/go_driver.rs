//! The test suite of the Go MySQL driver (github.com/go-sql-driver/mysql, latest v1 release,
//! fetched from the Go module proxy) run three times against one MariaDB server: directly,
//! through sluice, and through sluice with client TLS. Per-test outcomes are compared.
//!
//! The driver's suite covers compression by itself: every `runTests` case also runs on a
//! `compress=true` connection (subtests named `.../compress`). For TLS, a small extra test file
//! written into the copy of the suite appends `tls=skip-verify` to the suite's DSN, so that
//! nearly every test logs in over TLS.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const MODULE: &str = "github.com/go-sql-driver/mysql";
/// Bound on one run of the suite (go test kills itself after it).
const GO_TEST_TIMEOUT: &str = "20m";
/// Tests not run: TestConnectorReturnsTimeout dials 1.1.1.1:1234 expecting a connect timeout;
/// where that address answers (sandboxes, proxies) the driver crashes on its nil logger and
/// takes the whole test binary down. It never talks to a MySQL server anyway.
const SKIP: &str = "^TestConnectorReturnsTimeout$";
/// Database the suite works in (MYSQL_TEST_DBNAME); recreated before every run.
const DB_NAME: &str = "gotest";

/// Appends `tls=skip-verify` to the suite's DSN when SLUICE_GO_TLS is set. File names are
/// sorted when compiling, so this `init` runs after the one in driver_test.go that sets `dsn`.
const TLS_HOOK: &str = r#"package mysql

import "os"

// Added by sluice's go_driver integration test.
func init() {
	if os.Getenv("SLUICE_GO_TLS") != "" {
		dsn += "&tls=skip-verify"
	}
}
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    Fail,
    Skip,
}

/// Per-test results of one run of the suite, with each test's own output.
struct Run {
    label: &'static str,
    outcome: BTreeMap<String, Outcome>,
    output: BTreeMap<String, String>,
    /// Output not attributed to a test (build errors, panics, the final summary).
    other: String,
}

impl Run {
    fn with(&self, o: Outcome) -> BTreeSet<String> {
        self.outcome.iter().filter(|(_, v)| **v == o).map(|(k, _)| k.clone()).collect()
    }
    fn not_passed(&self) -> BTreeSet<String> {
        self.outcome.iter().filter(|(_, v)| **v != Outcome::Pass).map(|(k, _)| k.clone()).collect()
    }
    fn summary(&self) -> String {
        let (p, f, s) = (self.with(Outcome::Pass).len(), self.with(Outcome::Fail).len(), self.with(Outcome::Skip).len());
        format!("{}: {p} passed, {f} failed, {s} skipped", self.label)
    }
    /// The driver's output for the named tests, for failure messages.
    fn explain(&self, names: &BTreeSet<String>) -> String {
        let mut s = String::new();
        for n in names {
            let out = self.output.get(n).map(String::as_str).unwrap_or("");
            let tail: String = out.chars().rev().take(3000).collect::<Vec<_>>().into_iter().rev().collect();
            s.push_str(&format!("--- {n} ({:?}) in run \"{}\":\n{tail}\n", self.outcome.get(n), self.label));
        }
        s
    }
}

fn go_bin() -> PathBuf {
    let p = PathBuf::from("/usr/local/go/bin/go");
    if p.exists() { p } else { PathBuf::from("go") }
}

/// A `go` command with its module cache, build cache and GOPATH under the testkit directory.
fn go_cmd(go_root: &Path) -> Command {
    let mut c = Command::new(go_bin());
    c.env("GOPATH", go_root.join("path"))
        .env("GOMODCACHE", go_root.join("path/pkg/mod"))
        .env("GOCACHE", go_root.join("cache"))
        .env("GOFLAGS", "-modcacherw")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    c
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create source dir");
    for e in std::fs::read_dir(from).expect("read module dir").map(|e| e.expect("dir entry")) {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().expect("file type").is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::write(&dst, std::fs::read(&src).expect("read module file")).expect("write source file");
        }
    }
}

/// Downloads the latest v1 release of the driver and returns a writable copy of its source
/// (with the TLS hook added) and its version.
fn fetch_driver(go_root: &Path) -> (PathBuf, String) {
    let out = go_cmd(go_root)
        .args(["mod", "download", "-json", &format!("{MODULE}@latest")])
        .current_dir(go_root)
        .output()
        .expect("run go mod download");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("go mod download ({e}): {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    assert!(out.status.success() && info.get("Error").is_none(), "go mod download failed: {info}");
    let version = info["Version"].as_str().expect("module version").to_string();
    assert!(version.starts_with("v1."), "expected a v1 release, got {version}");
    let module_dir = PathBuf::from(info["Dir"].as_str().expect("module dir"));
    let src = go_root.join(format!("src/mysql-{version}"));
    let _ = std::fs::remove_dir_all(&src);
    copy_tree(&module_dir, &src);
    std::fs::write(src.join("zz_sluice_tls_hook_test.go"), TLS_HOOK).expect("write TLS hook");
    (src, version)
}

/// Runs the suite against `addr` in a freshly created database and collects per-test results
/// from `go test -json`.
fn run_suite(db: &MariaDb, go_root: &Path, src: &Path, label: &'static str, addr: &str, tls: bool) -> Run {
    db.sql(&format!("DROP DATABASE IF EXISTS {DB_NAME}; CREATE DATABASE {DB_NAME}"));
    let mut cmd = go_cmd(go_root);
    cmd.args(["test", "-json", "-count=1", &format!("-timeout={GO_TEST_TIMEOUT}"), "-skip", SKIP, "."])
        .current_dir(src)
        .env("MYSQL_TEST_USER", "app")
        .env("MYSQL_TEST_PASS", "apppw")
        .env("MYSQL_TEST_PROT", "tcp")
        .env("MYSQL_TEST_ADDR", addr)
        .env("MYSQL_TEST_DBNAME", DB_NAME)
        .env("MYSQL_TEST_CONCURRENT", "1");
    if tls {
        cmd.env("SLUICE_GO_TLS", "1");
    } else {
        cmd.env_remove("SLUICE_GO_TLS");
    }
    let out = cmd.output().expect("run go test");
    let mut run = Run { label, outcome: BTreeMap::new(), output: BTreeMap::new(), other: String::new() };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            run.other.push_str(line);
            run.other.push('\n');
            continue;
        };
        let text = ev["Output"].as_str().unwrap_or("");
        let Some(test) = ev["Test"].as_str() else {
            run.other.push_str(text);
            continue;
        };
        let outcome = match ev["Action"].as_str().unwrap_or("") {
            "output" => {
                run.output.entry(test.to_string()).or_default().push_str(text);
                continue;
            }
            // A test still running when the suite ended (a timeout or a crash) counts as failed.
            "run" => Outcome::Fail,
            "pass" => Outcome::Pass,
            "skip" => Outcome::Skip,
            "fail" => Outcome::Fail,
            _ => continue,
        };
        run.outcome.insert(test.to_string(), outcome);
    }
    run.other.push_str(&String::from_utf8_lossy(&out.stderr));
    eprintln!("{} (go test: {}); failed: {:?}; skipped: {:?}", run.summary(), out.status, run.with(Outcome::Fail), run.with(Outcome::Skip));
    run
}

/// Tests that pass in `base` but not in `got`, with the driver's output for them.
fn lost_passes(base: &Run, got: &Run) -> Option<String> {
    let lost: BTreeSet<String> = base.with(Outcome::Pass).difference(&got.with(Outcome::Pass)).cloned().collect();
    (!lost.is_empty()).then(|| {
        let n = base.with(Outcome::Pass).len();
        format!("{} of {n} tests pass in run \"{}\" but not in run \"{}\": {lost:?}\n{}", lost.len(), base.label, got.label, got.explain(&lost))
    })
}

#[test]
fn go_sql_driver_suite_directly_and_through_sluice() {
    let go_root = sluice_testkit::mariadb::work_root().join("go");
    std::fs::create_dir_all(&go_root).expect("create go dir");
    let (src, version) = fetch_driver(&go_root);
    eprintln!("{MODULE} {version} in {}", src.display());

    let db = MariaDb::start();
    let direct = run_suite(&db, &go_root, &src, "direct", &db.addr(), false);
    let passed = direct.with(Outcome::Pass);
    let why = format!("{}\n{}", direct.explain(&direct.with(Outcome::Fail)), direct.other);
    assert!(passed.len() > 50, "only {} tests passed directly; the comparison would be vacuous\n{why}", passed.len());
    assert!(passed.iter().any(|t| t.ends_with("/compress")), "no compressed-protocol subtest passed directly\n{why}");
    let mut problems = Vec::new();

    // Plain sluice: the same tests pass, and the same tests fail or are skipped.
    let sluice = start_sluice(&[&db], &[]);
    let through = run_suite(&db, &go_root, &src, "through sluice", &sluice.listen, false);
    problems.extend(lost_passes(&direct, &through));
    let gained: BTreeSet<String> = direct.not_passed().difference(&through.not_passed()).cloned().collect();
    if !gained.is_empty() {
        problems.push(format!("tests failed/skipped directly but not through sluice: {gained:?}\n{}", direct.explain(&gained)));
    }
    drop(sluice);

    // Sluice with client TLS (MariaDB has none in the harness): every test that passes
    // directly must pass with TLS between the driver and sluice.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("self-signed certificate");
    let dir = sluice_testkit::mariadb::work_root();
    let tag = format!("{}-{}", std::process::id(), sluice_testkit::unique_id());
    let (cert_path, key_path) = (dir.join(format!("go-tls-{tag}.pem")), dir.join(format!("go-tls-{tag}.key")));
    std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).expect("write key");
    let tls_sluice = start_sluice_config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n{}\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        backends_toml(&[&db]),
        cert_path.display(),
        key_path.display()
    ));
    let tls = run_suite(&db, &go_root, &src, "through sluice with TLS", &tls_sluice.listen, true);
    problems.extend(lost_passes(&direct, &tls));
    let _ = std::fs::remove_file(&cert_path);
    let _ = std::fs::remove_file(&key_path);

    let summaries = [&direct, &through, &tls].map(Run::summary).join("\n");
    assert!(problems.is_empty(), "{}\n{summaries}", problems.join("\n"));
}
