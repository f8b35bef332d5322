//! `[cluster]`: several sluice instances that share their backends, users and drains through
//! etcd (`crate::cluster`).

use std::time::Duration;

use serde::Deserialize;

use super::{BackendConfig, UserConfig, duration};

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// etcd endpoints, `http://HOST:PORT` (its v3 JSON API); none: no cluster.
    pub etcd: Vec<String>,
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
        ClusterConfig { etcd: Vec::new(), prefix: "/sluice/".into(), name: None, lease_ttl: Duration::from_secs(10) }
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
