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
    /// Its data folder (64 MiB of preallocated log at least), removed when it stops.
    dir: std::path::PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A CA, etcd's certificate (for 127.0.0.1) and a client certificate, in PEM files.
struct Pki {
    ca: std::path::PathBuf,
    server: (std::path::PathBuf, std::path::PathBuf),
    client: (std::path::PathBuf, std::path::PathBuf),
}

impl Pki {
    fn make() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let dir = sluice_testkit::mariadb::work_root().join(format!("pki-{}-{}", std::process::id(), sluice_testkit::unique_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        ca.distinguished_name.push(DnType::CommonName, "sluice test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |name: &str, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(sans).unwrap();
            // (etcd's gateway refuses a client certificate with a common name once its
            // authentication is on: the client's has only an organization.)
            p.distinguished_name = rcgen::DistinguishedName::new();
            p.distinguished_name.push(if name == "etcd" { DnType::CommonName } else { DnType::OrganizationName }, name);
            p.extended_key_usages = usages;
            let cert = p.signed_by(&key, &issuer).unwrap();
            let (c, k) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            (c, k)
        };
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let server = leaf("etcd", vec!["127.0.0.1".into(), "localhost".into()], vec![ServerAuth, ClientAuth]);
        let client = leaf("sluice-client", vec![], vec![ClientAuth]);
        let ca_path = dir.join("ca.pem");
        std::fs::write(&ca_path, ca_cert.pem()).unwrap();
        Pki { ca: ca_path, server, client }
    }
}

impl EtcdServer {
    fn start() -> EtcdServer {
        EtcdServer::start_with(None)
    }

    /// With TLS on its client port (and client certificates required) when `pki` is given.
    /// Its ports are free when chosen, but another test may take one before etcd binds it
    /// (etcd then exits): it is started again on other ports.
    fn start_with(pki: Option<&Pki>) -> EtcdServer {
        let scripts = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/setup.sh");
        assert!(Command::new("bash").arg(scripts).arg("etcd-server").status().unwrap().success(), "install etcd-server");
        for _ in 0..5 {
            let mut e = EtcdServer::spawn(pki);
            // Up: it answers (or, behind TLS, its client port takes connections).
            let up = |e: &EtcdServer| match pki {
                None => e.call("/v3/kv/range", r#"{"key": "AA=="}"#).is_ok(),
                Some(_) => std::net::TcpStream::connect(&e.client).is_ok(),
            };
            let mut exited = false;
            let ready = try_wait_for(|| {
                exited = e.child.try_wait().ok().flatten().is_some();
                exited || up(&e)
            });
            if exited || e.child.try_wait().ok().flatten().is_some() {
                continue;
            }
            assert!(ready, "etcd answers");
            return e;
        }
        panic!("etcd could not bind its ports five times over");
    }

    fn spawn(pki: Option<&Pki>) -> EtcdServer {
        let dir = sluice_testkit::mariadb::work_root().join(format!("etcd-{}-{}", std::process::id(), sluice_testkit::unique_id()));
        let (client, peer) = (free_port(), free_port());
        let log = std::fs::File::create(dir.with_extension("log")).unwrap();
        let scheme = if pki.is_some() { "https" } else { "http" };
        let mut cmd = Command::new("etcd");
        if let Some(p) = pki {
            let path = |p: &std::path::Path| p.display().to_string();
            cmd.args(["--cert-file", &path(&p.server.0), "--key-file", &path(&p.server.1), "--trusted-ca-file", &path(&p.ca)])
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--data-dir", &dir.display().to_string(), "--name", "t"])
            .args([
                "--listen-client-urls",
                &format!("{scheme}://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("{scheme}://127.0.0.1:{client}"),
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
        EtcdServer { child, client: format!("127.0.0.1:{client}"), dir }
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
        let _ = std::fs::remove_dir_all(&self.dir);
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

/// A store that only TLS clients with a certificate its CA signed reach, and with etcd's
/// authentication on: sluice follows it with `tls_ca`, `tls_cert`/`tls_key`, `user` and
/// `password`; without its certificate or with a wrong password it takes nothing from it, and
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_behind_tls_client_certificates_and_authentication() {
    use sluice::config::ClusterConfig;
    use sluice::control::cluster::etcd::{Etcd, b64};
    let db = shared_db();
    let pki = Pki::make();
    let etcd = EtcdServer::start_with(Some(&pki));
    let url = format!("https://{}", etcd.client);
    let tls = ClusterConfig {
        etcd: vec![url.clone()],
        tls_ca: Some(pki.ca.clone()),
        tls_cert: Some(pki.client.0.clone()),
        tls_key: Some(pki.client.1.clone()),
        ..ClusterConfig::default()
    };
    let open = Etcd::new(&tls).unwrap();
    let mut ready = false;
    for _ in 0..200 {
        if open.call("/v3/kv/range", &serde_json::json!({ "key": "AA==" })).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ready, "etcd answers over TLS");
    for (path, body) in [
        ("/v3/auth/user/add", serde_json::json!({ "name": "root", "password": "rootpw" })),
        ("/v3/auth/user/grant", serde_json::json!({ "user": "root", "role": "root" })),
        ("/v3/auth/enable", serde_json::json!({})),
    ] {
        open.call(path, &body).await.unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let root = ClusterConfig { user: Some("root".into()), password: Some("rootpw".into()), ..tls.clone() };
    let prefix = format!("/t{}/", sluice_testkit::unique_id());
    let put = serde_json::json!({ "key": b64(format!("{prefix}backends/a").as_bytes()), "value": b64(format!(r#"{{"address": "{}"}}"#, db.addr()).as_bytes()) });
    Etcd::new(&root).unwrap().call("/v3/kv/put", &put).await.unwrap();

    let start = |extra: &str| {
        let keys = format!("etcd = [\"{url}\"]\nprefix = \"{prefix}\"\ntls_ca = \"{}\"\nlease_ttl = \"2s\"\n{extra}", pki.ca.display());
        TestConfig::new().app_users().table("cluster", &keys).start()
    };
    let cert = format!("tls_cert = \"{}\"\ntls_key = \"{}\"\n", pki.client.0.display(), pki.client.1.display());
    let s = start(&format!("{cert}user = \"root\"\npassword = \"rootpw\"\n"));
    wait_for("the store's backend", || backends(&s) == [("a".into(), 1, false)]);
    let mut c = app(&s).await;
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    c.disconnect().await.unwrap();
    assert!(!s.log_text().contains("rootpw"), "the password is never logged");

    for (extra, why) in [
        ("user = \"root\"\npassword = \"rootpw\"\n".to_string(), "no client certificate"),
        (format!("{cert}user = \"root\"\npassword = \"wrong\"\n"), "a wrong password"),
    ] {
        let s = start(&extra);
        wait_for(why, || s.log_text().lines().any(|l| l.contains("etcd") && (l.contains("WARN") || l.contains("ERROR"))));
        assert!(backends(&s).is_empty(), "{why}: nothing taken from the store");
        assert!(!s.log_text().contains("rootpw") && !s.log_text().contains("wrong\""), "{why}: no password in the log");
    }
}

fn failover_state(s: &SluiceProc) -> serde_json::Value {
    serde_json::from_str(&admin_get(s, "/cluster/failover", None).1).unwrap()
}

fn failovers(s: &SluiceProc) -> Vec<serde_json::Value> {
    let v = failover_state(s);
    v["events"].as_array().unwrap().iter().filter(|e| e["operation"] == "failover").cloned().collect()
}

/// Two instances with `[failover]` in one cluster: one is elected and acts, the other follows.
/// A killed primary is replaced once; the other instance's sessions go on at the new primary;
/// when the acting instance ends, the other takes over and rejoins the old primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_of_a_cluster_acts_on_a_lost_primary() {
    let mut t = sluice_testkit::Topology::start(2);
    let etcd = EtcdServer::start();
    let prefix = format!("/t{}/", sluice_testkit::unique_id());
    let start = |name: &str| {
        let mut c = TestConfig::new()
            .app_users()
            .table(
                "cluster",
                &format!("etcd = [\"http://{}\"]\nprefix = \"{prefix}\"\nname = \"{name}\"\nlease_ttl = \"2s\"\n", etcd.client),
            )
            .table(
                "health",
                "interval = \"100ms\"\ntimeout = \"500ms\"\nfall = 2\nrise = 2\nuser = \"monitor\"\npassword = \"monitorpw\"\n",
            )
            .table("failover", "enabled = true\nuser = \"app\"\npassword = \"apppw\"\nafter = \"300ms\"\n");
        for (i, s) in t.servers.iter().enumerate() {
            c = c.backend_with(&s.addr(), &format!("name = \"s{i}\"\n"));
        }
        c.start()
    };
    let mut instances = vec![Some(start("i1")), Some(start("i2"))];
    let acting = |all: &[Option<SluiceProc>]| -> Vec<usize> {
        (0..all.len()).filter(|&i| all[i].as_ref().is_some_and(|s| failover_state(s)["acting"] == true)).collect()
    };
    wait_for("one instance elected", || {
        let a = acting(&instances);
        a.len() == 1 && instances.iter().flatten().all(|s| failover_state(s)["leader"] == format!("i{}", a[0] + 1).as_str())
    });
    let (lead, follower) = match acting(&instances)[..] {
        [0] => (0, 1),
        _ => (1, 0),
    };
    for s in instances.iter().flatten() {
        wait_for("the primary known", || failover_state(s)["primary"] == "s0");
    }
    let mut idle = app(instances[follower].as_ref().unwrap()).await;
    idle.query_drop("CREATE TABLE test.elected (id INT PRIMARY KEY)").await.unwrap();
    idle.exec_drop("INSERT INTO test.elected VALUES (?)", (1,)).await.unwrap();
    t.wait_caught_up();
    let last = t.primary_gtid();
    for s in instances.iter().flatten() {
        wait_for("the primary's last write seen", || failover_state(s)["last_seen"] == last.as_str());
    }

    t.servers[0].kill();
    let (l, f) = (instances[lead].as_ref().unwrap(), instances[follower].as_ref().unwrap());
    wait_for("the acting instance's failover", || !failovers(l).is_empty());
    assert_eq!(failovers(l)[0]["result"], "done", "{}", failover_state(l));
    let new = failover_state(l)["primary"].clone();
    wait_for("the other instance following the new primary", || failover_state(f)["primary"] == new);
    assert!(failovers(f).is_empty(), "the other instance promotes nothing: {}", failover_state(f));
    assert_eq!(metric_sum(l, "sluice_failovers_total{") + metric_sum(f, "sluice_failovers_total{"), 1);
    let new_port = t.servers[new.as_str().unwrap()[1..].parse::<usize>().unwrap()].port;
    idle.exec_drop("INSERT INTO test.elected VALUES (?)", (2,)).await.unwrap();
    assert_eq!(idle.query_first::<u16, _>("SELECT @@port").await.unwrap(), Some(new_port));
    assert_eq!(f.log_text().matches("following the primary the acting instance made").count(), 1);

    // The acting instance ends: the other is elected, and it is the one to rejoin the old primary.
    instances[lead] = None;
    wait_for("the other instance elected", || acting(&instances) == [follower]);
    t.servers[0].restart();
    let f = instances[follower].as_ref().unwrap();
    wait_for("the old primary rejoined", || {
        failover_state(f)["events"].as_array().unwrap().iter().any(|e| e["operation"] == "rejoin" && e["result"] == "done")
    });
    assert!(failovers(f).is_empty(), "no second promotion: {}", failover_state(f));
    assert_eq!(t.servers[0].sql("SELECT @@read_only").trim(), "1");
    drop(idle);
}
