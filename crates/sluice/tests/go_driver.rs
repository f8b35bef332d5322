//! The test suite of the Go MySQL driver (github.com/go-sql-driver/mysql, latest v1 release,
//! fetched from the Go module proxy) run against one MariaDB server with TLS: directly, through
//! sluice, through sluice with client TLS, and in users mode through sluice moving every
//! session to a fresh connection at every safe point, then multiplexing. Per-test outcomes are
//! compared.
//!
//! The driver's suite covers compression by itself: every `runTests` case also runs on a
//! `compress=true` connection (subtests named `.../compress`), and TLS in `TestTLS`, which runs
//! in every run since both the server and sluice offer TLS. For the TLS run, a small extra test
//! file written into the copy of the suite appends `tls=skip-verify` to the suite's DSN, so that
//! nearly every test logs in over TLS; sluice has no TLS configuration (it presents its own
//! self-signed certificate) and its backend leg follows the client's ("auto"), which the extra
//! test checks: the whole path is encrypted. `go_sql_driver_suite_in_front_of_tidb` makes the
//! same comparison in front of a TiDB server. Every test that passes directly must pass through
//! sluice; since some of the driver's tests depend on timing, one that does not is run again
//! (twice at most) before it counts as broken by sluice.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const MODULE: &str = "github.com/go-sql-driver/mysql";
/// Bound on one run of the suite (go test kills itself after it).
const GO_TEST_TIMEOUT: &str = "10m";
/// Tests not run: TestConnectorReturnsTimeout dials 1.1.1.1:1234 expecting a connect timeout;
/// where that address answers (sandboxes, proxies) the driver crashes on its nil logger and
/// takes the whole test binary down. It never talks to a MySQL server anyway.
const SKIP: &str = "^TestConnectorReturnsTimeout$";
/// Database the suite works in (MYSQL_TEST_DBNAME); recreated before every run.
const DB_NAME: &str = "gotest";

/// Appends `tls=skip-verify` to the suite's DSN when SLUICE_GO_TLS is set (the driver then
/// refuses to go on without TLS), and a test showing that it did and that the server's end of
/// the path is encrypted too. File names are sorted when compiling, so this `init` runs after
/// the one in driver_test.go that sets `dsn`.
const TLS_HOOK: &str = r#"package mysql

import (
	"database/sql"
	"os"
	"testing"
)

// Added by sluice's go_driver integration test.
func init() {
	if os.Getenv("SLUICE_GO_TLS") != "" {
		dsn += "&tls=skip-verify"
	}
}

func TestSluiceTLSHook(t *testing.T) {
	if os.Getenv("SLUICE_GO_TLS") == "" {
		t.Skip("SLUICE_GO_TLS not set")
	}
	if cfg, err := ParseDSN(dsn); err != nil || cfg.TLSConfig != "skip-verify" {
		t.Fatalf("DSN %q does not ask for TLS (%v)", dsn, err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var name, cipher string
	if err := db.QueryRow("SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil {
		t.Fatal(err)
	}
	if cipher == "" {
		t.Fatal("the server's connection is not encrypted")
	}
	t.Logf("Ssl_cipher: %s", cipher)
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
    label: String,
    outcome: BTreeMap<String, Outcome>,
    output: BTreeMap<String, String>,
    /// Output not attributed to a test (build errors, panics, the final summary).
    other: String,
}

impl Run {
    fn with(&self, o: Outcome) -> BTreeSet<String> {
        self.outcome.iter().filter(|(_, v)| **v == o).map(|(k, _)| k.clone()).collect()
    }
    fn summary(&self) -> String {
        let (p, f, s) = (self.with(Outcome::Pass).len(), self.with(Outcome::Fail).len(), self.with(Outcome::Skip).len());
        format!("{}: {p} passed, {f} failed, {s} skipped", self.label)
    }
    /// The driver's output for the named tests, for failure messages: tests whose output is
    /// only their verdict (parents of failed subtests, tests that never ran) are left out.
    fn explain(&self, names: &BTreeSet<String>) -> String {
        let mut s = String::new();
        for (i, n) in names.iter().filter(|n| self.output.get(*n).is_some_and(|o| o.lines().any(is_message))).enumerate() {
            if i == 20 {
                s.push_str("(output of further tests left out)\n");
                break;
            }
            let text = self.output[n].lines().filter(|l| is_message(l)).collect::<Vec<_>>().join("\n");
            let start = (text.len().saturating_sub(3000)..).find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            s.push_str(&format!("--- {n} ({:?}) in run \"{}\":\n{}\n", self.outcome.get(n), self.label, &text[start..]));
        }
        s
    }
}

/// Whether a line of a test's output says more than that the test ran, paused or ended.
fn is_message(line: &str) -> bool {
    !["=== ", "--- PASS", "--- FAIL", "--- SKIP"].iter().any(|p| line.trim_start().starts_with(p))
}

/// A `go` command with its module cache, build cache and GOPATH under the testkit directory.
fn go_cmd(go_root: &Path) -> Command {
    let installed = Path::new("/usr/local/go/bin/go");
    let mut c = Command::new(if installed.exists() { installed } else { Path::new("go") });
    c.env("GOPATH", go_root.join("path"))
        .env("GOMODCACHE", go_root.join("path/pkg/mod"))
        .env("GOCACHE", go_root.join("cache"))
        .env("GOFLAGS", "-modcacherw")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    c
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
    // One copy per test (runs may share the target directory); copies left by
    // processes that are gone are removed. The last copy stays, with the suite's output.
    let srcs = go_root.join("src");
    for e in std::fs::read_dir(&srcs).into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    // The tests of this file run at once: each has its own copy (the process id stays last).
    let src = srcs.join(format!("mysql-{version}-{}-{}", sluice_testkit::unique_id(), std::process::id()));
    copy_tree(&module_dir, &src);
    std::fs::write(src.join("zz_sluice_tls_hook_test.go"), TLS_HOOK).expect("write TLS hook");
    (src, version)
}

/// Where the suite runs: MariaDB itself or a sluice in front of it, with or without TLS.
struct Target<'a> {
    label: &'static str,
    addr: &'a str,
    tls: bool,
}

/// A copy of the driver's suite and the server it works on.
struct Suite {
    go_root: PathBuf,
    src: PathBuf,
    /// A connection to the server held from the start, for the statements that make the
    /// suite's database: the server may be at its connection limit between runs (sluice keeps
    /// the connections of TestConcurrent in its pool).
    admin: std::cell::RefCell<Raw>,
}

impl Suite {
    /// Runs the suite (or only the named top-level tests) against `t` in a freshly created
    /// database and collects per-test results from `go test -json`.
    fn run(&self, t: &Target, only: Option<&BTreeSet<String>>) -> Run {
        for sql in [format!("DROP DATABASE IF EXISTS {DB_NAME}"), format!("CREATE DATABASE {DB_NAME}")] {
            let answer = self.admin.borrow_mut().query(&sql);
            assert!(answer.first().is_some_and(|p| err_code(p).is_none()), "{sql}: {answer:?}");
        }
        let mut cmd = go_cmd(&self.go_root);
        cmd.args(["test", "-json", "-count=1", &format!("-timeout={GO_TEST_TIMEOUT}"), "-skip", SKIP])
            .current_dir(&self.src)
            .env("MYSQL_TEST_USER", "app")
            .env("MYSQL_TEST_PASS", "apppw")
            .env("MYSQL_TEST_PROT", "tcp")
            .env("MYSQL_TEST_ADDR", t.addr)
            .env("MYSQL_TEST_DBNAME", DB_NAME)
            .env("MYSQL_TEST_CONCURRENT", "1");
        if let Some(names) = only {
            let top: BTreeSet<&str> = names.iter().map(|n| n.split('/').next().unwrap_or(n)).collect();
            cmd.arg(format!("-run=^({})$", top.into_iter().collect::<Vec<_>>().join("|")));
        }
        if t.tls {
            cmd.env("SLUICE_GO_TLS", "1");
        } else {
            cmd.env_remove("SLUICE_GO_TLS");
        }
        let out = cmd.arg(".").output().expect("run go test");
        let label = if only.is_some() { format!("{} (again)", t.label) } else { t.label.to_string() };
        let raw = self.src.join(format!("results-{}.json", label.replace([' ', '(', ')'], "-")));
        std::fs::write(&raw, &out.stdout).expect("save go test output");
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
                // A test still running when the suite ended (a timeout, a crash) has failed.
                "run" | "fail" => Outcome::Fail,
                "pass" => Outcome::Pass,
                "skip" => Outcome::Skip,
                _ => continue,
            };
            run.outcome.insert(test.to_string(), outcome);
        }
        run.other.push_str(&String::from_utf8_lossy(&out.stderr));
        let (failed, skipped) = (run.with(Outcome::Fail), run.with(Outcome::Skip));
        eprintln!("{} (go test: {}, output in {}); failed: {failed:?}; skipped: {skipped:?}", run.summary(), out.status, raw.display());
        run
    }

    /// Tests that pass in `base` but not in `got` (run against `t`). Some of the driver's tests
    /// depend on timing (a cancelled SLEEP(1) must return within 500 ms, an INSERT must be done
    /// after a second), so each such test is run again against `t`, up to twice; only tests
    /// that never pass there are reported, with the driver's output from their last run.
    /// The tests that pass in `base` but not in `got` (run again twice to tell a flake), but
    /// those named in `unordered` (and their subtests).
    fn lost_passes(&self, base: &Run, got: &Run, t: &Target, unordered: &[&str]) -> Option<String> {
        let mut lost: BTreeSet<String> = base.with(Outcome::Pass).difference(&got.with(Outcome::Pass)).cloned().collect();
        lost.retain(|n| !unordered.iter().any(|u| n == u || n.strip_prefix(u).is_some_and(|rest| rest.starts_with('/'))));
        let mut last = None;
        for _ in 0..2 {
            if lost.is_empty() {
                break;
            }
            let again = self.run(t, Some(&lost));
            lost.retain(|n| again.outcome.get(n) != Some(&Outcome::Pass));
            last = Some(again);
        }
        let n = base.with(Outcome::Pass).len();
        let why = last.as_ref().unwrap_or(got).explain(&lost);
        (!lost.is_empty()).then(|| format!("{} of {n} tests pass {} but not {}: {lost:?}\n{why}", lost.len(), base.label, t.label))
    }
}

#[test]
fn go_sql_driver_suite_directly_and_through_sluice() {
    let go_root = sluice_testkit::mariadb::work_root().join("go");
    std::fs::create_dir_all(&go_root).expect("create go dir");
    let (src, version) = fetch_driver(&go_root);
    eprintln!("{MODULE} {version} in {}", src.display());

    // As production servers run: the performance schema on (the connection-attributes test
    // skips itself without it) and the binary log on.
    let (db, _) = start_tls_db_with(&PRODUCTION_LIKE);
    // TestConcurrent opens @@max_connections connections at once and accepts "Error 1040: Too
    // many connections" for those over the limit. The harness allows 4000, more than MariaDB's
    // listen backlog (connects would fail at random even directly), so the limit is lowered,
    // and half of it is taken by sessions held for the whole test: every run reaches it.
    db.sql("SET GLOBAL max_connections = 100");
    let admin = std::cell::RefCell::new(Raw::login(&db.addr(), "app", "apppw", None));
    let _held: Vec<Raw> = (0..50).map(|_| Raw::login(&db.addr(), "app", "apppw", None)).collect();
    let suite = Suite { go_root, src, admin };

    let addr = db.addr();
    let direct = suite.run(&Target { label: "directly", addr: &addr, tls: false }, None);
    let passed = direct.with(Outcome::Pass);
    let why = format!("{}\n{}", direct.explain(&direct.with(Outcome::Fail)), direct.other);
    assert!(passed.len() > 50, "only {} tests passed directly; the comparison would be vacuous\n{why}", passed.len());
    assert!(passed.iter().any(|t| t.ends_with("/compress")), "no compressed-protocol subtest passed directly\n{why}");
    let mut problems = Vec::new();

    // The suite's own DSN (no TLS asked; TestTLS asks for it): everything that passes directly
    // passes. (A test failing or skipped directly may do anything through sluice: that is not
    // sluice's doing.)
    let sluice = start_sluice(&[&db], &[]);
    let target = Target { label: "through sluice", addr: &sluice.listen, tls: false };
    let through = suite.run(&target, None);
    problems.extend(suite.lost_passes(&direct, &through, &target, &[]));
    drop(sluice);

    // The driver over TLS to sluice, with sluice's own certificate (nothing configured), and
    // sluice over TLS to the server: every test that passes directly must pass.
    let tls_sluice = start_sluice(&[&db], &[]);
    let target = Target { label: "through sluice with TLS", addr: &tls_sluice.listen, tls: true };
    let tls = suite.run(&target, None);
    let hook = tls.outcome.get("TestSluiceTLSHook");
    let why = format!("{}\n{}", tls.explain(&BTreeSet::from(["TestSluiceTLSHook".to_string()])), tls.other);
    assert_eq!(hook, Some(&Outcome::Pass), "the TLS run did not ask for TLS, or its server connection was plain\n{why}");
    problems.extend(suite.lost_passes(&direct, &tls, &target, &[]));

    drop(tls_sluice);

    // Users mode in front of two addresses of the one server (TCP and its Unix socket, so that
    // the data is shared): sessions moved to a fresh connection on the other address at every
    // safe point, then multiplexed. Everything that passes directly must pass.
    let mut runs = vec![direct, through, tls];
    for (label, keys, moves) in [
        ("through sluice moving sessions at every safe point", "move_every_statement = true\n", "test"),
        ("through sluice multiplexing", "multiplex = true\n", ""),
        ("through sluice multiplexing and parking at every command", "multiplex = true\npark_every_command = true\n", "park"),
    ] {
        let socket = db.socket.display().to_string();
        let s = TestConfig::new().proxy(keys).backend(&addr).backend(&socket).app_users().start();
        let target = Target { label, addr: &s.listen, tls: false };
        let run = suite.run(&target, None);
        problems.extend(suite.lost_passes(&runs[0], &run, &target, &[]));
        if moves == "park" {
            let n = metric(&s, "sluice_session_parks_total");
            assert!(n > 1000, "sessions parked only {n} times in the run {label}");
        } else if !moves.is_empty() {
            let n = metric(&s, &format!("sluice_session_moves_total{{reason=\"{moves}\",result=\"moved\"}}"));
            assert!(n > 1000, "only {n} sessions moved in the run {label}");
        }
        runs.push(run);
    }

    let summaries = runs.iter().map(Run::summary).collect::<Vec<_>>().join("\n");
    assert!(problems.is_empty(), "{}\n{summaries}", problems.join("\n"));
}

/// The configuration that moves every session at every safe point.
const MOVE: &str = "move_every_statement = true\n";

/// Tests that expect `SELECT 1 UNION SELECT 0` to return its rows in order, which TiDB does not
/// promise (it may run the two sides in parallel): left out of the comparison in front of TiDB.
const UNORDERED_ON_TIDB: [&str; 1] = ["TestStmtMultiRows"];

/// The same comparison in front of a TiDB server (`sluice_testkit::TiDb`): directly, through
/// sluice (passthrough), with TLS (the backend leg following the client's), moving every
/// passthrough session to a new connection at every safe point by its TiDB session states,
/// alternating between the server's two addresses (TCP and its Unix socket), and in users mode
/// moving sessions as on MariaDB, then multiplexing. Every test that passes directly must pass
/// through sluice, but those that expect an order TiDB does not promise.
#[test]
fn go_sql_driver_suite_in_front_of_tidb() {
    let go_root = sluice_testkit::mariadb::work_root().join("go");
    std::fs::create_dir_all(&go_root).expect("create go dir");
    let (src, version) = fetch_driver(&go_root);
    eprintln!("{MODULE} {version} in {}", src.display());
    let db = sluice_testkit::TiDb::start();
    let admin = std::cell::RefCell::new(Raw::login(&db.addr(), "app", "apppw", None));
    let suite = Suite { go_root, src, admin };
    let addr = db.addr();
    let socket = db.socket.display().to_string();

    let direct = suite.run(&Target { label: "TiDB directly", addr: &addr, tls: false }, None);
    let passed = direct.with(Outcome::Pass);
    let why = format!("{}\n{}", direct.explain(&direct.with(Outcome::Fail)), direct.other);
    assert!(passed.len() > 50, "only {} tests passed directly against TiDB; the comparison would be vacuous\n{why}", passed.len());
    let mut problems = Vec::new();
    let mut runs = vec![direct];
    for (label, auth, keys, tls) in [
        ("through sluice in front of TiDB", "passthrough", "", false),
        ("through sluice in front of TiDB with TLS", "passthrough", "", true),
        ("through sluice in front of TiDB moving passthrough sessions by their states", "passthrough", MOVE, false),
        ("through sluice in front of TiDB in users mode moving sessions", "users", MOVE, false),
        ("through sluice in front of TiDB in users mode multiplexing", "users", "multiplex = true\n", false),
    ] {
        let moves = keys == MOVE;
        let mut config = TestConfig::new().proxy(keys).listener(&format!("auth = \"{auth}\"\n")).backend(&addr);
        if moves {
            config = config.backend(&socket);
        }
        if auth == "users" {
            config = config.app_users();
        }
        let s = config.start();
        let target = Target { label, addr: &s.listen, tls };
        let run = suite.run(&target, None);
        if tls {
            let why = format!("{}\n{}", run.explain(&BTreeSet::from(["TestSluiceTLSHook".to_string()])), run.other);
            assert_eq!(run.outcome.get("TestSluiceTLSHook"), Some(&Outcome::Pass), "the TLS run's path to TiDB was not encrypted\n{why}");
        }
        problems.extend(suite.lost_passes(&runs[0], &run, &target, &UNORDERED_ON_TIDB));
        if moves {
            let n = metric(&s, "sluice_session_moves_total{reason=\"test\",result=\"moved\"}");
            assert!(n > 1000, "only {n} sessions moved in the run {label}");
        }
        runs.push(run);
    }
    let summaries = runs.iter().map(Run::summary).collect::<Vec<_>>().join("\n");
    assert!(problems.is_empty(), "{}\n{summaries}", problems.join("\n"));
}
