//! Configuration: one TOML file (see `sluice.example.toml`), or the quick-start flags.
//! Errors name the key and the line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

mod address;
mod admin;
mod capture;
mod cluster;
mod failover;
mod live;
mod routing;
mod rules;
mod show;
mod tls;
pub use address::{Address, parse_address};
pub use admin::AdminConfig;
pub use capture::CaptureConfig;
pub use cluster::{ClusterConfig, Shared};
pub use failover::FailoverConfig;
pub use live::{Live, Source, fixed_changes};
pub use routing::{CausalReads, ReadOnlyTransactions, RoutingConfig};
pub use rules::{DigestsConfig, Network, RuleConfig, parse_digest};
pub use tls::{ClientTls, PemError, TlsConfig, load_certs, load_key};

#[derive(Debug, Clone, Deserialize, serde::Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub proxy: ProxyConfig,
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub users: Vec<UserConfig>,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    /// Where statements run: the read/write split over a primary and its replicas.
    #[serde(default)]
    pub routing: RoutingConfig,
    /// Query rules, tried in order (`rules.rs`).
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    #[serde(default)]
    pub digests: DigestsConfig,
    /// Where traffic captures are written.
    #[serde(default)]
    pub capture: CaptureConfig,
    /// TLS for client connections: a generated self-signed certificate unless configured.
    #[serde(default)]
    pub tls: ClientTls,
    /// Instances sharing backends, users and drains through etcd.
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Promotion of a replica when the primary is lost; switchover; rejoin.
    #[serde(default)]
    pub failover: FailoverConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeFlavor {
    /// One current-thread runtime per worker thread, each with its own SO_REUSEPORT listener.
    #[default]
    PerCore,
    /// One tokio multi-thread runtime with work stealing.
    Multi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    #[default]
    LeastConnections,
    RoundRobin,
    WeightedRandom,
    /// Least connections over weights scaled by what each backend reports: its response time
    /// (health probes), and a TiDB server's CPU and memory use (`backend::load`).
    LeastLatency,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    /// Sluice relays the client's login to the backend and never knows a password.
    Passthrough,
    /// Sluice checks passwords against `[[users]]` and logs in to backends itself.
    Users,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Worker threads; 0 means one per core.
    pub workers: usize,
    pub runtime: RuntimeFlavor,
    pub balance: Policy,
    pub max_connections: usize,
    /// Per-user limit on client connections; 0 means none.
    pub max_connections_per_user: usize,
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub handshake_timeout: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub connect_timeout: Duration,
    /// Client connections idle longer than this are closed; 0 disables.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub idle_timeout: Duration,
    /// A backend silent this long while a response is due (or not reading a request) fails
    /// the session; 0 disables.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub response_timeout: Duration,
    /// A client not reading what sluice writes for this long is disconnected; 0 disables.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub client_write_timeout: Duration,
    /// A client that stops sending for this long in the middle of a request (or of a file for
    /// LOAD DATA LOCAL, or an auth exchange) is disconnected; 0 disables.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub client_read_timeout: Duration,
    /// Largest command a client may send, in bytes (across 16 MiB packet boundaries).
    pub max_packet_size: u64,
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub shutdown_timeout: Duration,
    /// After an upgrade, the sessions the old process could not hand over end at their next
    /// transaction boundary once this long passed (0: they are served until they end).
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub upgrade_drain_after: Duration,
    /// The auth plugin sluice's greeting names in users mode: "mysql_native_password" or
    /// "caching_sha2_password".
    pub auth_plugin: AuthPlugin,
    /// Idle backend connections kept for reuse, per backend and worker; 0 disables pooling.
    pub pool_idle_max: usize,
    /// A pooled backend connection unused for this long is closed.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub pool_idle_timeout: Duration,
    /// TLS to backends unless a backend says otherwise (`backends.tls`).
    pub backend_tls: BackendTls,
    /// Users-mode sessions give their backend connection back at every safe point and take
    /// one of the same user and backend at their next statement (also per listener).
    pub multiplex: bool,
    /// Most connections sluice opens to one backend for sessions (health checks aside),
    /// shared out among the workers; 0: no limit.
    pub max_backend_connections: usize,
    /// How long a statement (or login) waits for a connection when a backend is at
    /// `max_backend_connections` before it gets an error.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub queue_timeout: Duration,
    /// Sessions that cannot move (passthrough) are closed at their next safe point once their
    /// backend has been draining this long.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub drain_timeout: Duration,
    /// Sessions move from the busiest backends (by weight) until each holds its share within
    /// one session: after a backend joins, comes back up, or is undrained.
    pub rebalance: bool,
    /// Most sessions the rebalancer moves per second, per worker.
    pub rebalance_rate: u32,
    /// A session is not moved by the rebalancer twice within this.
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub rebalance_interval: Duration,
    /// Testing aid: users-mode sessions move to a fresh connection on the next backend at every
    /// safe point, so that a client library's test suite runs across many connections.
    pub move_every_statement: bool,
    /// Testing aid: multiplexed sessions park (`frontend/idle/`) whenever they wait for a
    /// command, not only once idle for a second, so that a client library's test suite runs
    /// through parks.
    pub park_every_command: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AuthPlugin {
    #[default]
    MysqlNativePassword,
    CachingSha2Password,
}

impl AuthPlugin {
    pub fn name(self) -> &'static [u8] {
        match self {
            AuthPlugin::MysqlNativePassword => sluice_proto::auth::NATIVE,
            AuthPlugin::CachingSha2Password => sluice_proto::auth::CACHING_SHA2,
        }
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            workers: 0,
            runtime: RuntimeFlavor::PerCore,
            balance: Policy::LeastConnections,
            max_connections: 10_000,
            max_connections_per_user: 0,
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::ZERO,
            response_timeout: Duration::from_secs(3600),
            client_write_timeout: Duration::from_secs(60),
            client_read_timeout: Duration::from_secs(30),
            max_packet_size: 1 << 30,
            shutdown_timeout: Duration::from_secs(30),
            upgrade_drain_after: Duration::ZERO,
            auth_plugin: AuthPlugin::MysqlNativePassword,
            pool_idle_max: 16,
            pool_idle_timeout: Duration::from_secs(60),
            backend_tls: BackendTls::Auto,
            multiplex: false,
            max_backend_connections: 0,
            queue_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(60),
            rebalance: true,
            rebalance_rate: 50,
            rebalance_interval: Duration::from_secs(60),
            move_every_statement: false,
            park_every_command: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// `HOST:PORT` for TCP, or an absolute path for a Unix socket.
    pub address: Spanned<String>,
    /// Defaults to `users` when `[[users]]` are configured, else `passthrough`.
    pub auth: Option<AuthMode>,
    /// Multiplex this listener's sessions; unset: `proxy.multiplex`.
    pub multiplex: Option<bool>,
    /// Networks (load balancers) whose connections begin with a PROXY protocol header (v1 or
    /// v2) that gives the client's real address; connections from elsewhere send none.
    #[serde(default)]
    pub proxy_protocol: Vec<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// `HOST:PORT`, or an absolute path for a Unix socket.
    pub address: Spanned<String>,
    /// A name for logs, metrics and the admin API; defaults to the address.
    pub name: Option<String>,
    #[serde(default = "one")]
    pub weight: u32,
    /// TLS to this backend: "auto", "on" or "off" (`true` and `false` mean "on" and "off");
    /// unset: `proxy.backend_tls`.
    #[serde(default, deserialize_with = "backend_tls")]
    pub tls: Option<BackendTls>,
    /// CA bundle to verify the backend's certificate; the system roots are not used.
    pub tls_ca: Option<Spanned<PathBuf>>,
    /// Skip certificate verification when TLS is "on" without tls_ca.
    #[serde(default)]
    pub tls_skip_verify: bool,
    /// Its part in replication: "auto" (read from `@@read_only` by the health checks' monitor
    /// user; writable until read), "primary" or "replica".
    #[serde(default)]
    pub role: Role,
    /// A group that query rules may route to.
    pub group: Option<String>,
    /// A failover may promote it (a replica with `false` never becomes the primary).
    #[serde(default = "yes")]
    pub candidate: bool,
    /// Among replicas equally advanced, a failover promotes the one of highest priority.
    #[serde(default)]
    pub priority: u32,
    /// Begin every connection to it with a PROXY protocol header ("v1" or "v2"), so that the
    /// server sees each client's own address (MariaDB's `proxy_protocol_networks` must name
    /// sluice's). Sluice's own connections (health checks) send LOCAL (v1: UNKNOWN). Pooled
    /// and shared connections then serve only clients of the address they were opened for.
    pub send_proxy: Option<SendProxy>,
    /// A TiDB server's status address (`HOST:PORT`, its `status.status-port`): each health
    /// check reads `/status` there, and a server that reports itself shutting down (its
    /// graceful wait after SIGTERM) takes no new session while every session leaves it.
    pub status: Option<String>,
}

/// The PROXY protocol version sent to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SendProxy {
    V1,
    V2,
}

/// A backend's part in a replication topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// What the backend says: a replica when `@@read_only` is on, else the primary.
    #[default]
    Auto,
    Primary,
    Replica,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Auto => "auto",
            Role::Primary => "primary",
            Role::Replica => "replica",
        }
    }
}

impl BackendConfig {
    /// The TLS mode in force for this backend.
    pub fn tls_mode(&self, p: &ProxyConfig) -> BackendTls {
        self.tls.unwrap_or(p.backend_tls)
    }

    /// Its name, or else its address.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.address.get_ref().clone())
    }

    /// Its name and group follow [`check_name`]; an address that names it (no name given) is
    /// at most 255 bytes of `A-Z a-z 0-9 . _ : - / [ ]`.
    pub fn check_names(&self) -> Result<(), InvalidValue> {
        if let Some(n) = &self.name {
            check_name("backends.name", n)?;
        }
        if let Some(g) = &self.group {
            check_name("backends.group", g)?;
        }
        let a = self.address.get_ref();
        let plain = a.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-/[]".contains(&b));
        if !(1..=255).contains(&a.len()) || !plain {
            return Err(InvalidValue("backends.address: 1 to 255 of A-Z a-z 0-9 . _ : - / [ ]".into()));
        }
        Ok(())
    }
}

/// One rule for the names of backends, groups and rules: 1 to 64 of `A-Z a-z 0-9 . _ : -`
/// (no blank, control, bidi or markup character; short enough for every label and URL).
pub fn check_name(what: &str, name: &str) -> Result<(), InvalidValue> {
    let ok = (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok { Ok(()) } else { Err(InvalidValue(format!("{what}: a name is 1 to 64 of A-Z a-z 0-9 . _ : -"))) }
}

/// A value that cannot be used, in the configuration or in a request or argument that carries
/// one: the fault of whoever wrote it. The text says which value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// When sluice's connection to a backend uses TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendTls {
    /// When the client's connection to sluice is TLS and the backend offers TLS. The backend's
    /// certificate is verified only against `tls_ca`, when one is configured.
    #[default]
    Auto,
    /// Always; a backend that does not offer TLS cannot be used.
    On,
    /// Never.
    Off,
}

impl BackendTls {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendTls::Auto => "auto",
            BackendTls::On => "on",
            BackendTls::Off => "off",
        }
    }
}

/// `backends.tls`: a mode, or a boolean as in earlier versions (`true` = "on", `false` = "off").
fn backend_tls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BackendTls>, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = Option<BackendTls>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("\"auto\", \"on\", \"off\", true or false")
        }
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok(Some(if v { BackendTls::On } else { BackendTls::Off }))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            match v {
                "auto" => Ok(Some(BackendTls::Auto)),
                "on" => Ok(Some(BackendTls::On)),
                "off" => Ok(Some(BackendTls::Off)),
                _ => Err(E::custom(format!("backends.tls: expected \"auto\", \"on\", \"off\", true or false, not {v:?}"))),
            }
        }
    }
    d.deserialize_any(V)
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// Clear-text password.
    #[serde(serialize_with = "show::masked")]
    pub password: Option<String>,
    /// mysql_native_password hash: `*` and 40 hex digits, as in mysql.user.
    #[serde(serialize_with = "show::masked")]
    pub password_hash: Option<Spanned<String>>,
    #[serde(default)]
    pub max_connections: usize,
    #[serde(default)]
    pub require_tls: bool,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "show::duration")]
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// With a monitor user, checks log in and ping; without, they read the greeting and leave.
    pub user: Option<String>,
    #[serde(serialize_with = "show::masked")]
    pub password: Option<String>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig { interval: Duration::from_secs(2), timeout: Duration::from_secs(1), rise: 2, fall: 3, user: None, password: None }
    }
}

/// The longest duration a setting takes: a year. Longer ones would overflow the clock
/// arithmetic they feed (`Instant + Duration`), so they are refused when the file is read.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses "250ms", "10s", "5m", "2h", or a bare number of seconds, up to [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, InvalidValue> {
    let invalid = || InvalidValue(format!("invalid duration {s:?} (use e.g. \"500ms\", \"10s\", \"5m\")"));
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| invalid())?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(invalid()),
    };
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        Ok(_) => Err(too_long(s)),
        Err(_) if secs.is_finite() && secs > 0.0 => Err(too_long(s)),
        Err(_) => Err(invalid()),
    }
}

fn too_long(s: &str) -> InvalidValue {
    InvalidValue(format!("duration {s:?} is too long (at most {} days)", MAX_DURATION.as_secs() / 86400))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    let text = match Raw::deserialize(d)? {
        Raw::Secs(n) => n.to_string(),
        Raw::Text(s) => s,
    };
    parse_duration(&text).map_err(serde::de::Error::custom)
}

/// A duration that may be absent (`#[serde(default)]` gives None).
pub fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Secs(n)) => parse_duration(&n.to_string()).map(Some).map_err(serde::de::Error::custom),
        Some(Raw::Text(s)) => parse_duration(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

/// Writes an optional duration as [`optional_duration`] reads it ("1500ms").
pub fn show_optional_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&format!("{}ms", d.as_millis())),
        None => s.serialize_none(),
    }
}

/// A configuration error, with the line it refers to when known.
#[derive(Debug)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.file, self.line) {
            (Some(p), Some(l)) => write!(f, "{}:{}: {}", p.display(), l, self.message),
            (Some(p), None) => write!(f, "{}: {}", p.display(), self.message),
            (None, _) => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// The dotted key whose value is at `offset` (`proxy.idle_timeout`), read from the text: the
/// key before `=` on that line and the table header above it.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = &text[..offset.min(text.len())];
    let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    let key = line.split_once('=')?.0.trim();
    let table = before.lines().rev().skip(1).map(str::trim).find(|l| l.starts_with('['));
    let table = table.map(|t| t.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = crate::sys::read_regular(path, 16 << 20);
        let text = bytes
            .map_err(|e| e.to_string())
            .and_then(|b| String::from_utf8(b).map_err(|_| "not UTF-8 text".to_string()))
            .map_err(|e| ConfigError { file: Some(path.to_path_buf()), line: None, message: format!("cannot read: {e}") })?;
        Config::parse(&text).map_err(|mut e| {
            e.file = Some(path.to_path_buf());
            e
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let key = e.span().and_then(|s| key_at(text, s.start));
            // The value of a secret is never echoed, whatever was wrong with it.
            let message =
                if key.as_deref().is_some_and(show::is_secret_key) { show::without_values(e.message()) } else { e.message().to_string() };
            let key = key.filter(|k| !message.contains(k.as_str()));
            ConfigError {
                file: None,
                line: e.span().map(|s| line_of(text, s.start)),
                message: match key {
                    Some(k) => format!("{k}: {message}"),
                    None => message,
                },
            }
        })?;
        cfg.validate(text)?;
        Ok(cfg)
    }

    fn validate(&self, text: &str) -> Result<(), ConfigError> {
        let at = |span: std::ops::Range<usize>, message: String| ConfigError { file: None, line: Some(line_of(text, span.start)), message };
        for l in &self.listeners {
            parse_address(l.address.get_ref()).map_err(|m| at(l.address.span(), format!("listeners.address: {m}")))?;
            for n in &l.proxy_protocol {
                Network::parse(n.get_ref()).map_err(|m| at(n.span(), format!("listeners.proxy_protocol: {m}")))?;
            }
        }
        for b in &self.backends {
            b.check_names().map_err(|m| at(b.address.span(), m.0))?;
            parse_address(b.address.get_ref()).map_err(|m| at(b.address.span(), format!("backends.address: {m}")))?;
            if b.weight == 0 {
                return Err(at(b.address.span(), "backends.weight must be at least 1".into()));
            }
            self.validate_backend_tls(b, &at)?;
        }
        if let ClientTls::Files(t) = &self.tls {
            load_certs(t.cert.get_ref()).map_err(|m| at(t.cert.span(), format!("tls.cert: {m}")))?;
            load_key(t.key.get_ref()).map_err(|m| at(t.key.span(), format!("tls.key: {m}")))?;
        }
        if let Some(a) = &self.admin.listen {
            parse_address(a.get_ref()).map_err(|m| at(a.span(), format!("admin.listen: {m}")))?;
        }
        if let Some(a) = &self.admin.sql_listen {
            parse_address(a.get_ref()).map_err(|m| at(a.span(), format!("admin.sql_listen: {m}")))?;
            if self.admin.sql_users.is_empty() {
                return Err(at(a.span(), "admin.sql_listen needs [[admin.sql_users]] to log in with".into()));
            }
        }
        for u in self.users.iter().chain(&self.admin.sql_users) {
            match (&u.password, &u.password_hash) {
                (Some(_), Some(h)) => {
                    return Err(at(h.span(), format!("users {:?}: set password or password_hash, not both", u.name)));
                }
                (None, Some(h)) if sluice_proto::auth::parse_native_hash(h.get_ref()).is_none() => {
                    return Err(at(h.span(), "users.password_hash: expected '*' and 40 hex digits".into()));
                }
                _ => {}
            }
        }
        let workers = self.lanes();
        if self.proxy.max_backend_connections != 0 && self.proxy.max_backend_connections < workers {
            let m = format!(
                "proxy.max_backend_connections ({}) is shared out among {workers} workers: set at least {workers}, or fewer workers",
                self.proxy.max_backend_connections
            );
            return Err(ConfigError { file: None, line: None, message: m });
        }
        if self.health.rise == 0 || self.health.fall == 0 {
            return Err(ConfigError { file: None, line: None, message: "health.rise and health.fall must be at least 1".into() });
        }
        // (With no listener configured, the default one is in users mode when users are.)
        let users_mode = if self.listeners.is_empty() {
            !self.users.is_empty()
        } else {
            self.listeners.iter().any(|l| self.auth_mode(l) == AuthMode::Users)
        };
        if self.routing.split && !users_mode {
            let m = "routing.split needs a users-mode listener ([[users]]): sluice logs in to the primary and the replicas on a session's behalf, which it cannot do for a login it only relays";
            return Err(ConfigError { file: None, line: None, message: m.into() });
        }
        let names = self.backends.iter().flat_map(|b| [b.name.as_deref(), Some(b.address.get_ref().as_str()), b.group.as_deref()]);
        let targets: Vec<&str> = names.flatten().collect();
        for (i, r) in self.rules.iter().enumerate() {
            r.check(i, text, &targets)?;
        }
        if self.health.user.is_some() != self.health.password.is_some() && self.health.password.is_some() {
            return Err(ConfigError { file: None, line: None, message: "health.password needs health.user".into() });
        }
        self.failover.check(&self.backends, &self.health).map_err(|e| ConfigError { file: None, line: None, message: e.0 })?;
        self.routing.check_commit_table().map_err(|e| ConfigError { file: None, line: None, message: e.0 })?;
        Ok(())
    }

    /// A backend's TLS settings: "on" needs something to verify the certificate with (or an
    /// explicit `tls_skip_verify`), and a CA bundle must load.
    fn validate_backend_tls(
        &self,
        b: &BackendConfig,
        at: &impl Fn(std::ops::Range<usize>, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let name = b.address.get_ref();
        if let Some(ca) = &b.tls_ca {
            if b.tls_skip_verify {
                return Err(at(ca.span(), format!("backend {name}: set tls_ca or tls_skip_verify, not both")));
            }
            load_certs(ca.get_ref()).map_err(|m| at(ca.span(), format!("backends.tls_ca: {m}")))?;
        } else if b.tls_mode(&self.proxy) == BackendTls::On && !b.tls_skip_verify {
            let m = "TLS is \"on\" but nothing verifies the backend's certificate: set tls_ca (or tls_skip_verify = true)";
            return Err(at(b.address.span(), format!("backend {name}: {m}")));
        }
        Ok(())
    }

    /// The auth mode a listener uses.
    pub fn auth_mode(&self, l: &ListenerConfig) -> AuthMode {
        l.auth.unwrap_or(if self.users.is_empty() { AuthMode::Passthrough } else { AuthMode::Users })
    }

    /// How many workers own connections apart (each its share of `max_backend_connections`):
    /// every per-core worker, or the one shared runtime.
    pub fn lanes(&self) -> usize {
        if self.proxy.runtime == RuntimeFlavor::PerCore { self.workers() } else { 1 }
    }

    pub fn workers(&self) -> usize {
        if self.proxy.workers > 0 { self.proxy.workers } else { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) }
    }
}

#[cfg(test)]
mod tests;
