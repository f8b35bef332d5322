//! PROXY protocol on listeners: connections from the trusted networks begin with a header (v1
//! or v2) whose client address sluice uses (sessions, logs, query rules); such a connection
//! without a valid header is closed; other peers send none.

mod common;

use common::*;
use mysql_async::prelude::*;
use tokio::io::AsyncWriteExt;

/// A load balancer in front of sluice: each connection it accepts is relayed to `to`, after
/// the header `header` makes. Returns its address.
async fn balancer(to: String, header: fn() -> Vec<u8>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = l.accept().await else { return };
            let to = to.clone();
            tokio::spawn(async move {
                let mut up = tokio::net::TcpStream::connect(&to).await.unwrap();
                up.write_all(&header()).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
            });
        }
    });
    addr
}

fn v1() -> Vec<u8> {
    b"PROXY TCP4 203.0.113.9 127.0.0.1 40000 6033\r\n".to_vec()
}

fn v2() -> Vec<u8> {
    let mut h = Vec::new();
    sluice_proto::proxy_header::write_v2(&mut h, "[2001:db8::7]:41000".parse().unwrap(), "[::1]:6033".parse().unwrap());
    h
}

fn garbage() -> Vec<u8> {
    b"PROXY TCP4 not-an-address\r\n".to_vec()
}

fn clients(s: &SluiceProc) -> Vec<String> {
    let list: serde_json::Value = serde_json::from_str(&admin_get(s, "/sessions", None).1).unwrap();
    list.as_array().unwrap().iter().map(|x| x["client"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_balancer_gives_the_client_address_and_others_cannot() {
    let db = shared_db();
    let s = TestConfig::new()
        .listener("proxy_protocol = [\"127.0.0.1/32\"]\n")
        .proxy("handshake_timeout = \"1s\"\n")
        .dbs(&[db])
        .app_users()
        .rule("client = \"203.0.113.0/24\"\nmatch = \"^select \\\\? from dual\"\nblock = \"not from the documentation network\"\n")
        .start();

    // v1: the session, and the rules, see the client's address.
    let lb = balancer(s.listen.clone(), v1).await;
    let mut c = connect(&lb, "app", "apppw").await;
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    assert_eq!(clients(&s), ["203.0.113.9:40000"]);
    let e = c.query_drop("SELECT 5 FROM DUAL").await.expect_err("the rule for that network blocks it").to_string();
    assert!(e.contains("not from the documentation network"), "{e}");
    c.disconnect().await.unwrap();

    // v2, IPv6.
    let lb2 = balancer(s.listen.clone(), v2).await;
    let mut c = connect(&lb2, "app", "apppw").await;
    c.query_drop("SELECT 5 FROM DUAL").await.expect("another network");
    assert_eq!(clients(&s), ["[2001:db8::7]:41000"]);
    c.disconnect().await.unwrap();

    // A trusted peer must send a header: none (it waits for a greeting that never comes), or
    // a bad one, and the connection is closed and counted.
    let none = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw"))).await;
    assert!(none.is_err(), "no header from a trusted peer");
    let lb3 = balancer(s.listen.clone(), garbage).await;
    let bad = mysql_async::Conn::new(mysql_async::Opts::from(opts(&lb3, "app", "apppw"))).await;
    assert!(bad.is_err(), "a bad header");
    assert_eq!(metric(&s, "sluice_rejected_connections_total{reason=\"proxy_header\"}"), 2);
    assert!(s.log_shows("closing a connection from a PROXY protocol peer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_outside_the_trusted_networks_send_no_header() {
    let db = shared_db();
    let s = TestConfig::new().listener("proxy_protocol = [\"10.0.0.0/8\"]\n").dbs(&[db]).app_users().start();
    let mut c = app(&s).await;
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    assert!(clients(&s)[0].starts_with("127.0.0.1:"));
    c.disconnect().await.unwrap();
    // A header from an untrusted peer is not taken for one: the login fails.
    let lb = balancer(s.listen.clone(), v1).await;
    assert!(mysql_async::Conn::new(mysql_async::Opts::from(opts(&lb, "app", "apppw"))).await.is_err());
}

/// What the server says of the session's own connection: its host (address:port) and USER().
async fn seen_by_server(c: &mut mysql_async::Conn) -> (String, String) {
    let host: Option<String> = c.query_first("SELECT host FROM information_schema.processlist WHERE id = CONNECTION_ID()").await.unwrap();
    let user: Option<String> = c.query_first("SELECT USER()").await.unwrap();
    (host.unwrap(), user.unwrap())
}

/// A backend with `send_proxy` is told each client's own address (the one a trusted balancer
/// gave sluice), in either version; a pooled connection opened for one address does not serve
/// a client of another; health checks (LOCAL / UNKNOWN) keep the backend up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_sent_the_header_see_each_clients_address() {
    let db = sluice_testkit::mariadb::MariaDb::start_with(&["--proxy-protocol-networks=127.0.0.0/8".to_string()]);
    for version in ["v1", "v2"] {
        let s = TestConfig::new()
            .listener("proxy_protocol = [\"127.0.0.1/32\"]\n")
            .backend_with(&db.addr(), &format!("send_proxy = \"{version}\"\n"))
            .table("health", "interval = \"100ms\"\nuser = \"monitor\"\npassword = \"monitorpw\"\n")
            .app_users()
            .start();
        let lb = balancer(s.listen.clone(), v1).await;
        let mut c = connect(&lb, "app", "apppw").await;
        let (host, user) = seen_by_server(&mut c).await;
        assert_eq!((host.as_str(), user.as_str()), ("203.0.113.9:40000", "app@203.0.113.9"), "{version}");
        c.disconnect().await.unwrap();
        let backend = || json(&admin_get(&s, "/backends", None).1)[0].clone();
        wait_for("its connection is pooled", || backend()["pooled"] == 1);

        let lb6 = balancer(s.listen.clone(), v2).await;
        let mut c6 = connect(&lb6, "app", "apppw").await;
        let (host, user) = seen_by_server(&mut c6).await;
        assert!(host.contains("2001:db8::7") && user.contains("2001:db8::7"), "{version}: {host} {user}");
        c6.disconnect().await.unwrap();

        // The health checks (with a monitor login) pass all along.
        let checks = backend()["checks"].as_u64().unwrap();
        wait_for("more health checks pass", || {
            let b = backend();
            b["checks"].as_u64().unwrap() > checks + 2 && b["consecutive_ok"].as_u64().unwrap() > 2
        });
        assert_eq!(backend()["up"], true);
    }
}
