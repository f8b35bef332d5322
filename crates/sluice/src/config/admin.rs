//! `[admin]`: the admin HTTP API and the SQL admin listener.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::UserConfig;

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `HOST:PORT` of the admin HTTP API; unset disables it.
    pub listen: Option<Spanned<String>>,
    /// Bearer token required on every admin request when set.
    #[serde(serialize_with = "super::show::masked")]
    pub token: Option<String>,
    /// `HOST:PORT` of the SQL admin listener (the mysql client's way in); unset disables it.
    #[serde(default)]
    pub sql_listen: Option<Spanned<String>>,
    /// Who may log in to the SQL admin listener (as `[[users]]`: name, password or
    /// password_hash).
    #[serde(default)]
    pub sql_users: Vec<UserConfig>,
    /// Host names the admin API answers to (the `Host` header), besides IP addresses and
    /// `localhost`: a page of another site that rebinds its name to sluice's address is refused.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Connections each admin listener (HTTP and SQL) serves at once; more wait in the backlog.
    #[serde(default = "admin_max_connections")]
    pub max_connections: usize,
    /// How long a request's head (HTTP) or a login (SQL) may take, and an HTTP exchange at
    /// most 12 times that.
    #[serde(default = "admin_request_timeout", deserialize_with = "super::duration", serialize_with = "super::show::duration")]
    pub request_timeout: Duration,
}

fn admin_max_connections() -> usize {
    32
}

fn admin_request_timeout() -> Duration {
    Duration::from_secs(10)
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: None,
            token: None,
            sql_listen: None,
            sql_users: Vec::new(),
            hosts: Vec::new(),
            max_connections: admin_max_connections(),
            request_timeout: admin_request_timeout(),
        }
    }
}
