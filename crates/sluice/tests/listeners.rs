//! Listeners anyone can reach, held open by someone hostile: the admin listeners serve a bounded
//! number of connections and time out idle ones, so they can never take the descriptors the
//! data plane needs; a sluice out of descriptors backs off its accepts and counts them, and
//! never blames a backend for its own state.

mod common;

use std::net::TcpStream;

use common::*;
use mysql_async::prelude::*;

fn backend_up(s: &SluiceProc) -> bool {
    json(&admin_get(s, "/backends", None).1).as_array().unwrap().iter().all(|b| b["up"] == true)
}

/// 40 idle connections to each admin listener: sluice holds at most `max_connections` of each
/// (the rest wait in the kernel's backlog), closes them after `request_timeout`, and the data
/// plane and the health checks go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_admin_listeners_are_capped_and_timed_out() {
    let db = shared_db();
    let s = TestConfig::new()
        .admin("sql_listen = \"127.0.0.1:0\"\nmax_connections = 8\nrequest_timeout = \"1s\"\n[[admin.sql_users]]\nname = \"ops\"\npassword = \"opspw\"\n")
        .app_users()
        .dbs(&[db])
        .start();
    let sql = sql_admin_addr(&s);
    let before = fd_count(&s);
    let mut held = Vec::new();
    for _ in 0..40 {
        for addr in [s.admin.as_deref().unwrap(), sql.as_str()] {
            if let Ok(t) = TcpStream::connect(addr) {
                held.push(t);
            }
        }
    }
    // Sluice takes 8 of each and no more (and a few for its own work).
    wait_for("sluice takes its share of the idle connections", || fd_count(&s) >= before + 2 * 8);
    let during = fd_count(&s);
    assert!(during <= before + 2 * 8 + 8, "descriptors went from {before} to {during} with 80 idle admin connections");
    let mut c = app(&s).await;
    assert_eq!(c.query_first::<u32, _>("SELECT 7").await.unwrap(), Some(7));
    // The idle ones are closed after the request timeout: the API answers again.
    wait_for("the admin API answers", || admin_get(&s, "/health", None).0 == 200);
    assert!(backend_up(&s));
    drop(held);
    c.disconnect().await.unwrap();
}

/// Sluice run with few descriptors: clients past them fail to connect; the accepts that failed
/// are counted, the backend is never marked down for it, and once the clients go, logins work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_is_sluices_own_fault_and_passes() {
    let db = shared_db();
    let path = config_path("few-fds");
    let cfg = TestConfig::new().app_users().dbs(&[db]).table("health", "interval = \"200ms\"\nfall = 1\n").text();
    std::fs::write(&path, cfg).unwrap();
    let args = ["--nofile=96:96".to_string(), bin().display().to_string(), "--config".into(), path.display().to_string()];
    let s = SluiceProc::start(std::path::Path::new("/usr/bin/prlimit"), &args);
    let mut held = Vec::new();
    for _ in 0..200 {
        if let Ok(t) = TcpStream::connect(&s.listen) {
            held.push(t);
        }
    }
    wait_for("accepts fail for want of descriptors", || metric(&s, "sluice_accept_errors_total") > 0);
    // A health check ran meanwhile (every 200 ms; one failure marks a backend down) and could
    // not connect either.
    wait_for("a health check meets the want of descriptors", || s.log_text().contains("health check not made"));
    assert!(backend_up(&s), "the backend was blamed for sluice's own want of descriptors: {}", admin_get(&s, "/backends", None).1);
    assert!(s.log_shows("accept failed"), "the failures are logged");
    drop(held);
    wait_for("a login works again", || {
        let rt = tokio::runtime::Handle::current();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                rt.block_on(async {
                    match mysql_async::Conn::new(opts(&s.listen, "app", "apppw")).await {
                        Ok(mut c) => c.query_first::<u32, _>("SELECT 1").await.is_ok(),
                        Err(_) => false,
                    }
                })
            })
            .join()
            .unwrap()
        })
    });
}
