//! The web dashboard in a real browser (Debian's Chromium, driven by playwright-core): the page
//! loads from the admin API and fetches nothing elsewhere, refuses to show data without the
//! token, its charts take points under load, and a drain from its button takes effect.

mod common;

use std::path::PathBuf;

use common::*;
use mysql_async::prelude::*;

/// Installs the browser tooling when missing (scripts/browser.sh); its directory.
fn browser_dir() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("bash").arg(root.join("scripts/browser.sh")).output().expect("run scripts/browser.sh");
    assert!(out.status.success(), "scripts/browser.sh: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_live_figures_and_drains_from_its_button() {
    let dir = browser_dir();
    let script = dir.join("dashboard.mjs");
    std::fs::copy(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.mjs"), &script).unwrap();
    let db = shared_db();
    let s = TestConfig::new()
        .admin("token = \"dash-secret\"\n")
        .app_users()
        .backend_with(&db.addr(), "name = \"left\"\n")
        .backend_with(&db.addr(), "name = \"right\"\n")
        .table("digests", "enabled = true\n")
        .start();

    // Load while the browser watches.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..2 {
        let mut c = app(&s).await;
        let stop = stop.clone();
        load.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: Option<u32> = c.query_first("SELECT 1").await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            c.disconnect().await.unwrap();
        }));
    }

    let shot = sluice_testkit::mariadb::work_root().join(format!("dashboard-{}.png", std::process::id()));
    let url = format!("http://{}/", s.admin.as_deref().unwrap());
    let (u, sh) = (url.clone(), shot.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node").arg(&script).args([&u, "dash-secret", "left"]).arg(&sh).output()
    })
    .await
    .unwrap()
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let seen: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)));
    assert!(seen.get("error").is_none() && seen.get("page_error").is_none(), "{seen}");
    assert_eq!(seen["title"], "sluice");
    assert!(seen["without_token"].as_str().unwrap().contains("token"), "{seen}");
    assert!(seen["status"].as_str().unwrap().starts_with("ready"), "{seen}");
    assert!(seen["qps_points"].as_u64().unwrap() >= 4 && seen["qps"].as_f64().unwrap() > 0.0, "{seen}");
    assert!(seen["sessions_shown"].as_u64().unwrap() >= 2, "{seen}");
    for r in seen["requests"].as_array().unwrap() {
        assert!(r.as_str().unwrap().starts_with(&url), "the page fetched {r}");
    }
    assert_eq!(seen["after_drain"], "draining");
    // Its code and style come from files of its own, under a policy that allows no other.
    assert_eq!((seen["inline_scripts"].as_u64(), seen["csp_violations"].as_u64()), (Some(0), Some(0)), "{seen}");
    assert_eq!(seen["csp_reports"], serde_json::json!([]), "{seen}");
    let backends: serde_json::Value = serde_json::from_str(&admin_get(&s, "/backends", Some("dash-secret")).1).unwrap();
    let left = backends.as_array().unwrap().iter().find(|b| b["name"] == "left").unwrap();
    assert_eq!(left["draining"], true, "the drain from the page took effect: {left}");
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}
