//! An ORM's own test suite over a Python driver: SQLAlchemy's tests (from its source
//! distribution on PyPI) with PyMySQL, run against one MariaDB server set up as production
//! servers run (TLS, the performance schema, the binary log): directly, through sluice in
//! passthrough, in users mode, moving every session to a fresh connection at every safe point,
//! multiplexing, and through the read/write split in front of a primary and a replica (without
//! and with optimistic transactions).
//! Per-test outcomes are compared: every test that passes directly must pass through sluice
//! (a test that does not is run again, twice at most, since a few depend on timing).
//!
//! PyMySQL turns autocommit off at connect, as most Python applications run: implicit
//! transactions, savepoints before any table is touched, SQLAlchemy's pool rolling back at
//! check-in. The suite is a chosen part of SQLAlchemy's (`SUITE`), to keep the run short.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use common::*;
use sluice_testkit::Topology;

/// The parts of SQLAlchemy's suite that run: the MySQL dialect, the engine's and the ORM's
/// transactions and sessions, types, and the shared suite every dialect must pass.
const SUITE: [&str; 7] = [
    "test/dialect/mysql",
    "test/orm/test_transaction.py",
    "test/orm/test_session.py",
    "test/engine/test_transaction.py",
    "test/engine/test_execute.py",
    "test/sql/test_types.py",
    "test/dialect/test_suite.py",
];

/// Writes each test's outcome as a JSON line (a pytest plugin).
const PLUGIN: &str = r#"import json, os

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        text = str(report.longrepr)[-3000:] if report.failed else ""
        outcome = "error" if report.when != "call" and report.failed else report.outcome
        with open(os.environ["SLUICE_OUTCOMES"], "a") as f:
            f.write(json.dumps({"id": report.nodeid, "outcome": outcome, "text": text}) + "\n")
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    Fail,
    Skip,
}

struct Run {
    label: String,
    outcome: BTreeMap<String, Outcome>,
    text: BTreeMap<String, String>,
}

impl Run {
    fn with(&self, o: Outcome) -> BTreeSet<String> {
        self.outcome.iter().filter(|(_, v)| **v == o).map(|(k, _)| k.clone()).collect()
    }

    fn summary(&self) -> String {
        let (p, f, s) = (self.with(Outcome::Pass).len(), self.with(Outcome::Fail).len(), self.with(Outcome::Skip).len());
        format!("{}: {p} passed, {f} failed, {s} skipped", self.label)
    }

    fn explain(&self, names: &BTreeSet<String>) -> String {
        names.iter().take(15).map(|n| format!("--- {n} in run \"{}\":\n{}\n", self.label, self.text.get(n).map_or("", |t| t))).collect()
    }
}

impl PythonEnv {
    /// Runs the suite (or only the tests named) against `addr`, in fresh databases.
    fn run(&self, label: &str, addr: &str, db: &MariaDb, only: Option<&BTreeSet<String>>) -> Run {
        db.sql(
            "DROP DATABASE IF EXISTS test; DROP DATABASE IF EXISTS test_schema; DROP DATABASE IF EXISTS test_schema_2; \
             CREATE DATABASE test CHARACTER SET utf8mb4; CREATE DATABASE test_schema CHARACTER SET utf8mb4; \
             CREATE DATABASE test_schema_2 CHARACTER SET utf8mb4",
        );
        let file: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let outcomes = self.sqlalchemy.join(format!("outcomes-{file}-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&outcomes);
        std::fs::write(self.sqlalchemy.join("sluice_outcomes.py"), PLUGIN).expect("write the plugin");
        let mut cmd = Command::new(&self.python);
        cmd.args(["-m", "pytest", "-p", "sluice_outcomes", "-p", "no:cacheprovider", "-q", "--tb=short"])
            .arg(format!("--dburi=mysql+pymysql://app:apppw@{addr}/test?charset=utf8mb4"))
            .current_dir(&self.sqlalchemy)
            .env("PYTHONPATH", format!("{}:{}", self.sqlalchemy.join("lib").display(), self.sqlalchemy.display()))
            .env("DISABLE_SQLALCHEMY_CEXT_RUNTIME", "1")
            .env("SLUICE_OUTCOMES", &outcomes);
        match only {
            Some(names) => cmd.args(names),
            None => cmd.args(SUITE),
        };
        let out = cmd.output().expect("run pytest");
        let mut run = Run { label: label.to_string(), outcome: BTreeMap::new(), text: BTreeMap::new() };
        for line in std::fs::read_to_string(&outcomes).unwrap_or_default().lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let id = v["id"].as_str().unwrap_or_default().to_string();
            let o = match v["outcome"].as_str() {
                Some("passed") => Outcome::Pass,
                Some("skipped") => Outcome::Skip,
                _ => Outcome::Fail,
            };
            // (A test that failed in its set-up or tear-down failed, whatever its call did.)
            if run.outcome.get(&id) != Some(&Outcome::Fail) {
                run.outcome.insert(id.clone(), o);
            }
            if let Some(t) = v["text"].as_str().filter(|t| !t.is_empty()) {
                run.text.insert(id, t.to_string());
            }
        }
        let tail = String::from_utf8_lossy(&out.stdout);
        let tail = tail.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        eprintln!("{} (pytest: {}, {tail}); failed: {:?}", run.summary(), out.status, run.with(Outcome::Fail));
        run
    }

    /// Tests that pass in `base` but not in `got`, each run again up to twice against `addr`.
    fn lost_passes(&self, base: &Run, got: &Run, addr: &str, db: &MariaDb) -> Option<String> {
        let mut lost: BTreeSet<String> = base.with(Outcome::Pass).difference(&got.with(Outcome::Pass)).cloned().collect();
        let mut last = None;
        for _ in 0..2 {
            // (Many lost at once is no matter of timing: not run again.)
            if lost.is_empty() || lost.len() > 50 {
                break;
            }
            let again = self.run(&format!("{} (again)", got.label), addr, db, Some(&lost));
            lost.retain(|n| again.outcome.get(n) != Some(&Outcome::Pass));
            last = Some(again);
        }
        let why = last.as_ref().unwrap_or(got).explain(&lost);
        let n = base.with(Outcome::Pass).len();
        let names: Vec<&String> = lost.iter().take(30).collect();
        (!lost.is_empty())
            .then(|| format!("{} of {n} tests pass {} but not {} (the first 30: {names:?})\n{why}", lost.len(), base.label, got.label))
    }
}

#[test]
fn sqlalchemy_suite_over_pymysql_directly_and_through_sluice() {
    let env = python_env();
    let (db, _) = start_tls_db_with(&PRODUCTION_LIKE);
    let direct = env.run("directly", &db.addr(), &db, None);
    let passed = direct.with(Outcome::Pass);
    assert!(passed.len() > 1000, "only {} tests passed directly; the comparison would be vacuous", passed.len());
    let mut problems = Vec::new();
    let mut summaries = vec![direct.summary()];
    let socket = db.socket.display().to_string();
    let modes: [(&str, TestConfig); 4] = [
        ("through sluice", TestConfig::new().backend(&db.addr())),
        ("through sluice in users mode", TestConfig::new().backend(&db.addr()).app_users()),
        (
            "through sluice moving sessions at every safe point",
            TestConfig::new().proxy("move_every_statement = true\n").backend(&db.addr()).backend(&socket).app_users(),
        ),
        (
            "through sluice multiplexing",
            TestConfig::new().proxy("multiplex = true\nmax_backend_connections = 16\n").backend(&db.addr()).app_users(),
        ),
    ];
    for (label, config) in modes {
        let s = config.start();
        let run = env.run(label, &s.listen, &db, None);
        problems.extend(env.lost_passes(&direct, &run, &s.listen, &db));
        summaries.push(run.summary());
    }
    summaries.push(split_run(&env, &mut problems));
    let summaries = summaries.join("\n");
    eprintln!("{summaries}");
    assert!(problems.is_empty(), "{}\n{summaries}", problems.join("\n"));
}

/// The read/write split in front of a primary and a replica: the suite directly against the
/// primary, then through the split; returns the split run's summary.
fn split_run(env: &PythonEnv, problems: &mut Vec<String>) -> String {
    let t = Topology::start(1);
    let primary = t.primary();
    let direct = env.run("directly (primary)", &primary.addr(), primary, None);
    let s = split_sluice(&t);
    let replica = &t.servers[1];
    let selects =
        || replica.sql("SHOW GLOBAL STATUS LIKE 'Com_select'").split_whitespace().last().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    let before = selects();
    let run = env.run("through the read/write split", &s.listen, primary, None);
    problems.extend(env.lost_passes(&direct, &run, &s.listen, primary));
    let counts = |s: &SluiceProc| {
        let to_replicas = metric_sum(s, "sluice_split_statements_total{to=\"replica\"");
        let to_primary = metric_sum(s, "sluice_split_statements_total{to=\"primary\"");
        format!("{to_primary} statements to the primary, {to_replicas} to the replica")
    };
    let plain = format!("{} ({}; SELECTs run on the replica: {})", run.summary(), counts(&s), selects() - before);
    drop(s);
    let before = selects();
    // Optimistic transactions: PyMySQL's implicit transactions begin on the replica, which
    // waits for every write made through sluice before (the suite reads, on one connection,
    // what it wrote on another).
    let s = split_sluice_with(&t, "optimistic_transactions = true\ncausal_reads = \"global\"\n");
    let run = env.run("through the split with optimistic transactions", &s.listen, primary, None);
    problems.extend(env.lost_passes(&direct, &run, &s.listen, primary));
    let replays: Vec<String> = admin_get(&s, "/metrics", None)
        .1
        .lines()
        .filter(|l| l.starts_with("sluice_transaction_replays_total"))
        .map(|l| l.trim_start_matches("sluice_transaction_replays_total").to_string())
        .collect();
    format!(
        "{plain}\n{} ({}; SELECTs run on the replica: {}; transactions moved to the primary: {})",
        run.summary(),
        counts(&s),
        selects() - before,
        replays.join(" ")
    )
}
