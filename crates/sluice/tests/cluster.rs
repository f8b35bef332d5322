//! Many instances sharing backends, users and drains through a real etcd (Debian's
//! etcd-server): three sluice instances follow what the store says, a drain set there drains
//! everywhere, and each registers itself under a lease that `sluice ctl instances` lists.

mod common;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

use base64::Engine;
use common::*;
use mysql_async::prelude::*;

/// An etcd server on loopback ports, in its own data directory.
struct EtcdServer {
    child: Child,
    client: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl EtcdServer {
    fn start() -> EtcdServer {
        let scripts = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/setup.sh");
        assert!(Command::new("bash").arg(scripts).arg("etcd-server").status().unwrap().success(), "install etcd-server");
        let dir = sluice_testkit::mariadb::work_root().join(format!("etcd-{}-{}", std::process::id(), sluice_testkit::unique_id()));
        let (client, peer) = (free_port(), free_port());
        let log = std::fs::File::create(dir.with_extension("log")).unwrap();
        let child = Command::new("etcd")
            .args(["--data-dir", &dir.display().to_string(), "--name", "t"])
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args([
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &format!("t=http://127.0.0.1:{peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let e = EtcdServer { child, client: format!("127.0.0.1:{client}") };
        wait_for("etcd answers", || e.call("/v3/kv/range", r#"{"key": "AA=="}"#).is_ok());
        e
    }

    fn call(&self, path: &str, body: &str) -> Result<String, String> {
        let mut s = std::net::TcpStream::connect(&self.client).map_err(|e| e.to_string())?;
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| e.to_string())?;
        if !out.starts_with("HTTP/1.1 200") {
            return Err(out);
        }
        Ok(out)
    }

    fn put(&self, key: &str, value: &str) {
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        self.call("/v3/kv/put", &format!(r#"{{"key": "{}", "value": "{}"}}"#, b(key), b(value))).unwrap();
    }

    fn delete(&self, key: &str) {
        let b = base64::engine::general_purpose::STANDARD.encode(key);
        self.call("/v3/kv/deleterange", &format!(r#"{{"key": "{b}"}}"#)).unwrap();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn backends(s: &SluiceProc) -> Vec<(String, u64, bool)> {
    let list: serde_json::Value = serde_json::from_str(&admin_get(s, "/backends", None).1).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|b| (b["name"].as_str().unwrap().into(), b["weight"].as_u64().unwrap(), b["draining"].as_bool().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_follow_the_store_and_drain_together() {
    let db = shared_db();
    let etcd = EtcdServer::start();
    let prefix = format!("/t{}/", sluice_testkit::unique_id());
    let late = format!("late{}", sluice_testkit::unique_id());
    db.sql(&format!("CREATE USER IF NOT EXISTS '{late}'@'%' IDENTIFIED BY 'latepw'"));
    etcd.put(&format!("{prefix}backends/a"), &format!(r#"{{"address": "{}"}}"#, db.addr()));
    let start = |name: &str| {
        TestConfig::new()
            .app_users()
            .table(
                "cluster",
                &format!("etcd = [\"http://{}\"]\nprefix = \"{prefix}\"\nname = \"{name}\"\nlease_ttl = \"2s\"\n", etcd.client),
            )
            .start()
    };
    let (i1, i2, i3) = (start("i1"), start("i2"), start("i3"));
    let all = [&i1, &i2, &i3];
    for s in all {
        wait_for("the store's backend", || backends(s) == [("a".into(), 1, false)]);
        let mut c = app(s).await;
        assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
        c.disconnect().await.unwrap();
    }
    let mut held = app(&i1).await;
    let _: Option<u32> = held.query_first("SELECT 1").await.unwrap();

    // A backend added with its weight, everywhere.
    etcd.put(&format!("{prefix}backends/b"), &format!(r#"{{"address": "{}", "weight": 3}}"#, db.addr()));
    for s in all {
        wait_for("b added", || backends(s) == [("a".into(), 1, false), ("b".into(), 3, false)]);
    }
    // A drain set in the store drains on every instance; the session on a moves to b.
    etcd.put(&format!("{prefix}drain/a"), "");
    for s in all {
        wait_for("a draining", || backends(s)[0] == ("a".into(), 1, true));
    }
    let _: Option<u32> = held.query_first("SELECT 2").await.unwrap();
    let sessions: serde_json::Value = serde_json::from_str(&admin_get(&i1, "/sessions", None).1).unwrap();
    assert_eq!(sessions[0]["backend"], "b", "{sessions}");
    etcd.delete(&format!("{prefix}drain/a"));
    for s in all {
        wait_for("a undrained", || backends(s)[0] == ("a".into(), 1, false));
    }

    // Users from the store replace the file's.
    etcd.put(&format!("{prefix}users/app"), r#"{"password": "apppw"}"#);
    etcd.put(&format!("{prefix}users/{late}"), r#"{"password": "latepw"}"#);
    for s in all {
        let mut ok = false;
        for _ in 0..200 {
            if let Ok(c) = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, &late, "latepw"))).await {
                c.disconnect().await.unwrap();
                ok = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(ok, "the store's user logs in on every instance");
    }
    let e = mysql_async::Conn::new(mysql_async::Opts::from(opts(&i2.listen, "other", "otherpw"))).await.expect_err("not in the store");
    assert!(e.to_string().contains("1045"), "{e}");

    // Every instance is registered; one that ends is gone once its lease expires.
    let instances = |s: &SluiceProc| {
        let out = Command::new(bin()).args(["ctl", "--admin", s.admin.as_deref().unwrap(), "instances"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ["i1", "i2", "i3"]
            .into_iter()
            .filter(|n| text.lines().any(|l| l.starts_with(&format!("{n} "))))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(instances(&i1), ["i1", "i2", "i3"]);
    drop(i2);
    wait_for("i2's registration expired", || instances(&i3) == ["i1", "i3"]);
    held.disconnect().await.unwrap();
}
