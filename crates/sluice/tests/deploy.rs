//! The files in deploy/ (Grafana dashboard, Prometheus alert rules, systemd unit) name only what
//! sluice really exports and accepts: every metric, and every label they group by, is checked
//! against a running sluice's /metrics.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::*;
use mysql_async::prelude::*;

fn deploy(file: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Metric names and label names of a /metrics text.
fn exported(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut names, mut labels) = (BTreeSet::new(), BTreeSet::from(["le".to_string(), "instance".into(), "job".into()]));
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = line.split(['{', ' ']).next().unwrap();
        names.insert(name.to_string());
        if let Some((_, rest)) = line.split_once('{') {
            for pair in rest.split_once('}').unwrap().0.split(',') {
                labels.insert(pair.split('=').next().unwrap().to_string());
            }
        }
    }
    (names, labels)
}

/// The `sluice_...` names in a query expression, and the labels of its `by (...)` clauses.
fn named_in(expr: &str) -> (Vec<String>, Vec<String>) {
    let metrics = regex_like_words(expr).into_iter().filter(|w| w.starts_with("sluice_")).collect();
    let mut labels = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        let inner = &rest[i + 4..];
        let end = inner.find(')').unwrap();
        labels.extend(inner[..end].split(',').map(|l| l.trim().to_string()));
        rest = &inner[end..];
    }
    (metrics, labels)
}

fn regex_like_words(s: &str) -> Vec<String> {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).map(str::to_string).collect()
}

fn check(what: &str, expr: &str, names: &BTreeSet<String>, labels: &BTreeSet<String>) {
    let (m, l) = named_in(expr);
    for name in m {
        assert!(names.contains(&name), "{what}: {name} is not exported ({expr})");
    }
    for label in l {
        assert!(labels.contains(&label), "{what}: no metric has a label {label} ({expr})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_name_only_what_metrics_exports() {
    let db = shared_db();
    let s = TestConfig::new().dbs(&[db]).app_users().start();
    let mut c = app(&s).await;
    let _: Option<u32> = c.query_first("SELECT 1").await.unwrap();
    c.disconnect().await.unwrap();
    let (names, labels) = exported(&admin_get(&s, "/metrics", None).1);

    let dash: serde_json::Value = serde_json::from_str(&deploy("grafana/sluice.json")).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut exprs = 0;
    for p in panels {
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {} has no queries", p["title"]));
        for t in targets {
            check(p["title"].as_str().unwrap(), t["expr"].as_str().expect("expr"), &names, &labels);
            exprs += 1;
        }
    }
    assert!(exprs >= panels.len());

    let rules = deploy("prometheus/sluice-alerts.yml");
    let alerts: Vec<&str> = rules.lines().filter(|l| l.trim_start().starts_with("- alert:")).collect();
    let expressions: Vec<&str> = rules.lines().filter_map(|l| l.trim_start().strip_prefix("expr:")).collect();
    assert!(alerts.len() >= 8 && alerts.len() == expressions.len(), "{} alerts, {} expressions", alerts.len(), expressions.len());
    for e in expressions {
        check("alert rule", e, &names, &labels);
    }
}

#[test]
fn the_systemd_unit_runs_commands_sluice_accepts() {
    let unit = deploy("systemd/sluice.service");
    let line = |key: &str| unit.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key}")).to_string();
    let pre = line("ExecStartPre=");
    let start = line("ExecStart=");
    assert!(start.contains("--config /etc/sluice/sluice.toml") && line("ExecReload=").contains("-HUP"), "{unit}");
    // The check it runs first, on a real file.
    let cfg = config_path("unit");
    std::fs::write(&cfg, TestConfig::new().backend("127.0.0.1:3306").text()).unwrap();
    let args: Vec<String> =
        pre.split_whitespace().skip(1).map(|a| if a == "/etc/sluice/sluice.toml" { cfg.display().to_string() } else { a.into() }).collect();
    let out = std::process::Command::new(bin()).args(&args).output().unwrap();
    assert!(out.status.success(), "{pre}: {}", String::from_utf8_lossy(&out.stderr));
}
