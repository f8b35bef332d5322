//! Command line: `sluice [--config FILE] [quick-start flags]` and `sluice check-config FILE`.

pub mod admin_client;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{BackendConfig, Config, ConfigError, ListenerConfig, RuntimeFlavor};

#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "A MySQL-protocol database proxy")]
pub struct Cli {
    /// Configuration file (TOML). Flags below override what it says.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Listen on HOST:PORT or a Unix socket path (repeatable). Default 127.0.0.1:6033.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// A backend HOST:PORT or Unix socket path (repeatable).
    #[arg(long = "backend", value_name = "ADDR")]
    pub backend: Vec<String>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Admin HTTP API address, e.g. 127.0.0.1:6034.
    #[arg(long)]
    pub admin: Option<String>,
    /// The health checks' monitor user: checks log in as it, and with it they read each
    /// backend's replication role and lag (`[health] user`/`password`). Its password comes from
    /// `--monitor-password-file` or the SLUICE_MONITOR_PASSWORD environment variable (USER:PASSWORD
    /// is still taken, and shows the password to every local user in the process list).
    #[arg(long, value_name = "USER")]
    pub monitor: Option<String>,
    /// A file holding the monitor user's password (a regular file; one trailing newline is cut).
    #[arg(long, value_name = "FILE")]
    pub monitor_password_file: Option<PathBuf>,
    /// Runtime flavour: per-core or multi.
    #[arg(long, value_parser = parse_flavor)]
    pub runtime: Option<RuntimeFlavor>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file without starting.
    CheckConfig { file: PathBuf },
    /// Look into a traffic capture.
    #[command(subcommand)]
    Capture(CaptureCommand),
    /// Play a traffic capture against a server and compare the results with the captured ones.
    Replay(crate::replay::Args),
    /// Talk to a running sluice through its admin API (exit codes: 0 done, 1 refused, 2 bad
    /// command line, 3 unreachable, 4 sluice failed or is not ready).
    Ctl(CtlArgs),
}

#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The admin API, HOST:PORT (else SLUICE_ADMIN, else the config file's, else 127.0.0.1:6034).
    #[arg(long)]
    pub admin: Option<String>,
    /// The admin token (else SLUICE_ADMIN_TOKEN, else the config file's).
    #[arg(long)]
    pub token: Option<String>,
    /// Take the admin address and token from this configuration file.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub verb: CtlVerb,
}

#[derive(Debug, Subcommand)]
pub enum CtlVerb {
    /// Ready, draining or unavailable; backends up; sessions.
    Status,
    /// Each backend: up, weight, sessions, role, draining.
    Backends,
    /// Each session: user, client, backend, queries, pins (why it cannot move now).
    Sessions,
    /// No new session goes to the backend; its sessions move at their next safe point.
    Drain { backend: String },
    /// The backend takes sessions again.
    Undrain { backend: String },
    /// Sets a backend's weight.
    Weight { backend: String, value: u32 },
    /// Moves a session at its next safe point (to another backend, or the one named).
    Move {
        session: u32,
        #[arg(long)]
        to: Option<String>,
    },
    /// Closes a session (its client sees the connection end).
    Kill { session: u32 },
    /// Reads the configuration file again and applies it.
    Reload,
    /// Starts the binary sluice was started from (as it is on disk now) and hands it the
    /// listening sockets; the old process serves its sessions until they end.
    Upgrade,
    /// Makes the backend named the primary: the primary is made read-only, the backend catches
    /// up, is promoted, and the old primary becomes its replica (`[failover]` user needed).
    Switchover { backend: String },
    /// What failover knows: the primary, and the failovers, switchovers and rejoins made or refused.
    Failovers,
    /// The configuration in force (secrets masked).
    Config,
    /// The instances registered in the cluster's etcd (`[cluster]`).
    Instances,
    /// The busiest statement digests.
    Digests {
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// total_time, count, errors, rows, max, p99 or last_seen.
        #[arg(long, default_value = "total_time")]
        by: String,
    },
    /// Traffic capture: start (with JSON options), stop, open (a consistent start's gate), status.
    Capture {
        action: String,
        /// For start: the options as JSON, e.g. '{"name": "cap", "duration": "60s"}'.
        options: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum CaptureCommand {
    /// Print what a capture directory holds, and some of its records.
    Inspect {
        dir: PathBuf,
        /// Print this many records, one per line.
        #[arg(long, default_value_t = 0)]
        dump: usize,
        /// Only the records of this session.
        #[arg(long)]
        session: Option<u64>,
        /// The key file of an encrypted capture.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
}

fn parse_flavor(s: &str) -> Result<RuntimeFlavor, crate::config::InvalidValue> {
    match s {
        "per-core" => Ok(RuntimeFlavor::PerCore),
        "multi" => Ok(RuntimeFlavor::Multi),
        _ => Err(crate::config::InvalidValue("expected per-core or multi".into())),
    }
}

fn flag_err(m: String) -> ConfigError {
    ConfigError { file: None, line: None, message: m }
}

fn spanned(s: &str) -> toml::Spanned<String> {
    // Values from flags have no position in a file.
    toml::Spanned::new(0..0, s.to_string())
}

impl Cli {
    /// The monitor user and its password: from `--monitor-password-file`, else from
    /// SLUICE_MONITOR_PASSWORD, else from `--monitor USER:PASSWORD` (with a warning).
    fn monitor_login(&self, m: &str) -> Result<(String, String), ConfigError> {
        if let Some(f) = &self.monitor_password_file {
            let raw = crate::sys::read_regular(f, 4096).map_err(|e| flag_err(format!("--monitor-password-file: {e}")))?;
            let text = String::from_utf8(raw).map_err(|_| flag_err("--monitor-password-file: not UTF-8".into()))?;
            let password = text.strip_suffix('\n').unwrap_or(&text);
            return Ok((m.to_string(), password.strip_suffix('\r').unwrap_or(password).to_string()));
        }
        if let Ok(p) = std::env::var("SLUICE_MONITOR_PASSWORD") {
            return Ok((m.to_string(), p));
        }
        let (user, password) = m.split_once(':').ok_or_else(|| {
            flag_err("--monitor: give the password in --monitor-password-file or SLUICE_MONITOR_PASSWORD (or USER:PASSWORD)".into())
        })?;
        tracing::warn!(
            "--monitor USER:PASSWORD shows the password to every local user in the process list: use --monitor-password-file or SLUICE_MONITOR_PASSWORD"
        );
        Ok((user.to_string(), password.to_string()))
    }

    /// The configuration: the file (if any) with the flags applied on top.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        if !self.listen.is_empty() {
            cfg.listeners = self
                .listen
                .iter()
                .map(|a| ListenerConfig { address: spanned(a), auth: None, multiplex: None, proxy_protocol: Vec::new() })
                .collect();
        }
        if cfg.listeners.is_empty() {
            cfg.listeners.push(ListenerConfig {
                address: spanned("127.0.0.1:6033"),
                auth: None,
                multiplex: None,
                proxy_protocol: Vec::new(),
            });
        }
        if !self.backend.is_empty() {
            cfg.backends = self
                .backend
                .iter()
                .map(|a| BackendConfig {
                    address: spanned(a),
                    name: None,
                    weight: 1,
                    tls: None,
                    tls_ca: None,
                    tls_skip_verify: false,
                    role: Default::default(),
                    group: None,
                    candidate: true,
                    priority: 0,
                    send_proxy: None,
                    status: None,
                })
                .collect();
        }
        if let Some(w) = self.workers {
            cfg.proxy.workers = w;
        }
        if let Some(r) = self.runtime {
            cfg.proxy.runtime = r;
        }
        if let Some(m) = &self.monitor {
            let (user, password) = self.monitor_login(m)?;
            cfg.health.user = Some(user);
            cfg.health.password = Some(password);
        }
        if let Some(a) = &self.admin {
            cfg.admin.listen = Some(spanned(a));
        }
        for l in &cfg.listeners {
            crate::config::parse_address(l.address.get_ref()).map_err(|m| flag_err(format!("--listen: {m}")))?;
        }
        for b in &cfg.backends {
            crate::config::parse_address(b.address.get_ref()).map_err(|m| flag_err(format!("--backend: {m}")))?;
        }
        if let Some(a) = &cfg.admin.listen {
            crate::config::parse_address(a.get_ref()).map_err(|m| flag_err(format!("--admin: {m}")))?;
        }
        if cfg.backends.is_empty() && cfg.cluster.etcd.is_empty() {
            return Err(flag_err(
                "no backends: give --backend HOST:PORT, [[backends]] in the config file, or a [cluster] whose etcd names them".into(),
            ));
        }
        Ok(cfg)
    }
}
