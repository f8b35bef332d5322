//! The configuration file: parsing, defaults and validation.

use super::*;

#[test]
fn pem_files() {
    let dir = std::env::temp_dir().join(format!("sluice-pem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key, empty) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("empty.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    std::fs::write(&empty, "nothing here\n").unwrap();
    assert_eq!(load_certs(&cert).unwrap().len(), 1);
    assert!(load_key(&key).is_ok());
    assert!(load_certs(&empty).unwrap_err().to_string().contains("no certificate found"));
    assert!(load_key(&cert).unwrap_err().to_string().contains("no private key found"));
    assert!(load_key(&dir.join("missing.pem")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn example_config_is_valid() {
    let text = include_str!("../../../../sluice.example.toml");
    let cfg = Config::parse(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(!cfg.backends.is_empty());
}

#[test]
fn errors_name_key_and_line() {
    let e = Config::parse("[proxy]\nworkers = 2\nbogus = 1\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("bogus"), "{}", e.message);
    let e = Config::parse("[[backends]]\n\naddress = \"nohost:notaport\"\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("backends.address"), "{}", e.message);
    let e = Config::parse("[proxy]\nconnect_timeout = \"5 parsecs\"\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    let e = Config::parse("[[users]]\nname = \"a\"\npassword_hash = \"abc\"\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    // Durations that would overflow the clock arithmetic they feed are refused, with key and line.
    for (key, value) in
        [("idle_timeout", "\"1e20s\""), ("shutdown_timeout", "18446744073709551615"), ("response_timeout", "\"9999999999h\"")]
    {
        let e = Config::parse(&format!("[proxy]\nworkers = 1\n{key} = {value}\n")).unwrap_err();
        assert_eq!(e.line, Some(3), "{key}");
        assert!(e.message.contains("too long"), "{key}: {}", e.message);
        assert!(e.message.starts_with(&format!("proxy.{key}: ")), "{key}: {e}");
    }
}

#[test]
fn client_tls_is_generated_unless_configured_or_off() {
    assert!(matches!(Config::parse("").unwrap().tls, ClientTls::SelfSigned));
    assert!(matches!(Config::parse("tls = \"auto\"\n").unwrap().tls, ClientTls::SelfSigned));
    assert!(matches!(Config::parse("tls = \"off\"\n[proxy]\nworkers = 1\n").unwrap().tls, ClientTls::Off));
    let e = Config::parse("\ntls = \"of\"\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("tls: expected"), "{}", e.message);
    let e = Config::parse("[tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("tls.cert") && e.message.contains("/nonexistent/cert.pem"), "{}", e.message);
    let e = Config::parse("[tls]\ncert = \"c\"\nkye = \"k\"\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("kye"), "{}", e.message);
}

#[test]
fn backend_tls_modes_and_their_checks() {
    let backend = |extra: &str| format!("[[backends]]\naddress = \"127.0.0.1:3306\"\n{extra}");
    let mode = |text: &str| {
        let cfg = Config::parse(text).unwrap_or_else(|e| panic!("{e}"));
        cfg.backends[0].tls_mode(&cfg.proxy)
    };
    assert_eq!(mode(&backend("")), BackendTls::Auto);
    assert_eq!(mode(&backend("tls = false\n")), BackendTls::Off);
    assert_eq!(mode(&backend("tls = true\ntls_skip_verify = true\n")), BackendTls::On);
    assert_eq!(mode(&format!("[proxy]\nbackend_tls = \"off\"\n{}", backend(""))), BackendTls::Off);
    assert_eq!(mode(&format!("[proxy]\nbackend_tls = \"off\"\n{}", backend("tls = \"auto\"\n"))), BackendTls::Auto);
    // "on" verifies the certificate unless told not to.
    let e = Config::parse(&backend("tls = true\n")).unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("tls_ca"), "{}", e.message);
    let e = Config::parse(&format!("[proxy]\nbackend_tls = \"on\"\n\n{}", backend(""))).unwrap_err();
    assert_eq!(e.line, Some(5));
    let e = Config::parse(&backend("tls = \"sometimes\"\n")).unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("backends.tls"), "{}", e.message);
    let e = Config::parse(&backend("tls_ca = \"/nonexistent/ca.pem\"\n")).unwrap_err();
    assert_eq!(e.line, Some(3));
    let e = Config::parse(&backend("tls_skip_verify = true\ntls_ca = \"/nonexistent/ca.pem\"\n")).unwrap_err();
    assert_eq!(e.line, Some(4));
    assert!(e.message.contains("not both"), "{}", e.message);
    let e = Config::parse("[proxy]\nbackend_tls = \"yes\"\n").unwrap_err();
    assert_eq!(e.line, Some(2));
}

#[test]
fn the_split_needs_users_mode() {
    let backend = "[[backends]]\naddress = \"127.0.0.1:3306\"\n";
    let e = Config::parse(&format!("[routing]\nsplit = true\n{backend}")).unwrap_err();
    assert!(e.message.contains("routing.split needs a users-mode listener"), "{}", e.message);
    let users = "[[users]]\nname = \"app\"\npassword = \"apppw\"\n";
    let cfg = Config::parse(&format!("[routing]\nsplit = true\nmax_replica_lag = \"3s\"\n{backend}{users}")).unwrap();
    assert_eq!(cfg.routing.max_replica_lag, Duration::from_secs(3));
    assert_eq!(cfg.routing.read_only_transactions, ReadOnlyTransactions::Primary);
}

#[test]
fn durations() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
    assert!(parse_duration("x").is_err());
    assert!(parse_duration("-1s").is_err());
    assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
    for huge in ["8761h", "1e20", "99999999999999999999999s", "18446744073709551615"] {
        assert!(parse_duration(huge).unwrap_err().0.contains("too long"), "{huge}");
    }
}

#[test]
fn the_commit_table_is_a_plain_schema_and_table() {
    let c = Config::parse("[routing]\ncommit_table = \"sluice.commits\"\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routing.commit_table.as_deref(), Some("sluice.commits"));
    assert_eq!(super::RoutingConfig::quote_table("sluice.commits"), "`sluice`.`commits`");
    for bad in ["commits", "a.b.c", "a`.b", ".b", "a.", "a b.c"] {
        let e = Config::parse(&format!("[routing]\ncommit_table = \"{bad}\"\n")).unwrap_err();
        assert!(e.message.starts_with("routing.commit_table: expected schema.table"), "{bad}: {e}");
    }
}
