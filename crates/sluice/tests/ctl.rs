//! `sluice ctl` against a running sluice: tables, `--json`, the verbs, and exit codes that
//! mean something (0 done, 1 refused, 2 bad command line, 3 unreachable, 4 not ready).

mod common;

use common::*;
use mysql_async::prelude::*;

/// Runs `sluice ctl ARGS` with `SLUICE_ADMIN` set to `admin` (if given): exit code, stdout,
/// stderr.
fn ctl_at(admin: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("ctl").args(args).env_remove("SLUICE_ADMIN").env_remove("SLUICE_ADMIN_TOKEN");
    if let Some(a) = admin {
        cmd.env("SLUICE_ADMIN", a);
    }
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn ctl(args: &[&str]) -> (i32, String, String) {
    ctl_at(None, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_shows_drains_moves_kills_and_says_what_failed() {
    let db = shared_db();
    let path = config_path("ctl");
    let cfg = TestConfig::new()
        .admin("token = \"sesame\"\n")
        .app_users()
        .backend_with(&db.addr(), "name = \"main\"\n")
        .backend_with(&db.addr(), "name = \"spare\"\n");
    std::fs::write(&path, cfg.text()).unwrap();
    let s = start_sluice_file(&path);
    let admin = s.admin.clone().unwrap();
    let with = |rest: &[&str]| {
        let mut a = vec!["--admin", admin.as_str(), "--token", "sesame"];
        a.extend_from_slice(rest);
        ctl(&a)
    };

    let (code, out, _) = with(&["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ready") && out.contains("backends up: 2 of 2"), "{out}");
    let (code, out, _) = with(&["backends"]);
    assert_eq!(code, 0);
    assert!(out.lines().next().unwrap().starts_with("NAME") && out.contains("main") && out.contains("spare"), "{out}");

    // The address from the environment, the token from the configuration file; JSON.
    let (code, out, err) = ctl_at(Some(&admin), &["--config", &path.display().to_string(), "--json", "sessions"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap().as_array().unwrap().len(), 0);

    let mut c = app(&s).await;
    let _: Option<u32> = c.query_first("SELECT 1").await.unwrap();
    let list: serde_json::Value = serde_json::from_str(&admin_get_token(&s, "/sessions", "sesame")).unwrap();
    let id = list[0]["id"].as_u64().unwrap().to_string();
    let on = list[0]["backend"].as_str().unwrap().to_string();
    let other = if on == "main" { "spare" } else { "main" };
    let (code, out, _) = with(&["sessions"]);
    assert_eq!(code, 0);
    assert!(out.contains(&id) && out.contains("app") && out.contains(&on), "{out}");

    // Drain the session's backend: it moves; undrain.
    let (code, _, err) = with(&["drain", &on]);
    assert_eq!(code, 0, "{err}");
    let _: Option<u32> = c.query_first("SELECT 2").await.unwrap();
    wait_for("the session moved off the drained backend", || with(&["sessions"]).1.contains(other));
    assert_eq!(with(&["undrain", &on]).0, 0);
    assert_eq!(with(&["move", &id, "--to", &on]).0, 0);
    let _: Option<u32> = c.query_first("SELECT 3").await.unwrap();

    // Refusals: exit 1, and the reason on stderr.
    let (code, _, err) = with(&["drain", "nowhere"]);
    assert_eq!(code, 1);
    assert!(err.contains("404") && err.contains("no backend nowhere"), "{err}");
    let (code, _, err) = ctl(&["--admin", &admin, "backends"]);
    assert_eq!(code, 1, "no token: {err}");
    let (code, _, err) = with(&["capture", "rewind"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = ctl(&["--admin", "127.0.0.1:1", "status"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot reach"), "{err}");

    // A reload through ctl, then a kill: the client's connection ends.
    assert_eq!(with(&["reload"]).0, 0);
    assert_eq!(with(&["kill", &id]).0, 0);
    wait_for("the killed session ended", || admin_get_token(&s, "/sessions", "sesame").trim() == "[]");
    assert!(c.query_first::<u32, _>("SELECT 4").await.is_err(), "the killed session's client sees its connection end");
}

fn admin_get_token(s: &SluiceProc, path: &str, token: &str) -> String {
    admin_get(s, path, Some(token)).1
}
