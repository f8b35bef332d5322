//! `[cluster]`: several sluice instances that share their backends, users and drains through
//! etcd (`crate::control::cluster`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{BackendConfig, UserConfig, duration};

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// etcd endpoints, `https://HOST:PORT` or `http://HOST:PORT` (its v3 JSON API); none: no
    /// cluster. Whoever can write the store can add backends and users: protect it as the
    /// configuration file (TLS with a client certificate, and etcd's authentication).
    pub etcd: Vec<String>,
    /// The CA bundle that etcd's certificate must chain to (`https://` endpoints need it).
    pub tls_ca: Option<PathBuf>,
    /// The client certificate and key sluice presents to etcd (its `--client-cert-auth`).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// etcd's user and password (its `auth enable`): sluice authenticates and sends the token.
    pub user: Option<String>,
    #[serde(serialize_with = "super::show::masked")]
    pub password: Option<String>,
    /// The keys of this cluster begin with this.
    pub prefix: String,
    /// This instance's name in `{prefix}instances/`; default: its admin address, else its pid.
    pub name: Option<String>,
    /// Its registration lives this long without being renewed (renewed every third of it).
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub lease_ttl: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd: Vec::new(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            user: None,
            password: None,
            prefix: "/sluice/".into(),
            name: None,
            lease_ttl: Duration::from_secs(10),
        }
    }
}

/// What the cluster's store says, laid over the configuration file: its backends, when it
/// has any, replace the file's; so do its users; and the backends it names as drained drain.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shared {
    pub backends: Vec<BackendConfig>,
    pub users: Vec<UserConfig>,
    pub drained: Vec<String>,
}

impl Shared {
    /// `c` with the store's backends and users in place of the file's (where it has some).
    pub fn overlay(&self, mut c: super::Config) -> super::Config {
        if !self.backends.is_empty() {
            c.backends = self.backends.clone();
        }
        if !self.users.is_empty() {
            c.users = self.users.clone();
        }
        c
    }
}
