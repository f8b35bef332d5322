//! `[failover]`: sluice promotes a replica when the primary is lost, switches the primary over
//! on request, and rejoins a returning server as a replica (`crate::control::failover`).

use std::time::Duration;

use serde::Deserialize;

use super::{BackendConfig, HealthConfig, InvalidValue, Role, duration};

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverConfig {
    /// Promote a replica when the primary has been down for `after` (switchover and rejoin
    /// work whenever `user` is set).
    pub enabled: bool,
    /// The account that changes replication: `SUPER` (or `READ_ONLY ADMIN`, `REPLICATION
    /// SLAVE ADMIN`, `SLAVE MONITOR` and `BINLOG ADMIN`) on every backend.
    pub user: Option<String>,
    #[serde(serialize_with = "super::show::masked")]
    pub password: Option<String>,
    /// The account replicas read the primary's binary log with (`REPLICATION SLAVE`), given to
    /// a server sluice makes a replica; default: `user` and `password`.
    pub replication_user: Option<String>,
    #[serde(serialize_with = "super::show::masked")]
    pub replication_password: Option<String>,
    /// How long the primary must fail its health checks before a replica is promoted (counted
    /// in failed checks: at least `health.fall` of them).
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub after: Duration,
    /// How long a replica about to be promoted may take to apply what it has received (and,
    /// in a switchover, to catch up with the primary).
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub catch_up_timeout: Duration,
    /// How long sessions' next statements may wait while the primary changes, and how long a
    /// switchover waits for open transactions to end before it goes on.
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub hold_timeout: Duration,
    /// Make a returning server a replica of the primary when its transactions are a prefix of
    /// the primary's (otherwise it is kept out and shown as diverged).
    pub rejoin: bool,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            enabled: false,
            user: None,
            password: None,
            replication_user: None,
            replication_password: None,
            after: Duration::from_secs(3),
            catch_up_timeout: Duration::from_secs(10),
            hold_timeout: Duration::from_secs(10),
            rejoin: true,
        }
    }
}

impl FailoverConfig {
    /// Whether sluice manages replication at all (failover, switchover, rejoin).
    pub fn manages(&self) -> bool {
        self.user.is_some()
    }

    /// The account and password replicas replicate with.
    pub fn replication_account(&self) -> (&str, &str) {
        match &self.replication_user {
            Some(u) => (u, self.replication_password.as_deref().unwrap_or_default()),
            None => (self.user.as_deref().unwrap_or_default(), self.password.as_deref().unwrap_or_default()),
        }
    }

    /// How many failed checks in a row make the primary lost.
    pub fn failed_checks(&self, health: &HealthConfig) -> u32 {
        let interval = health.interval.as_millis().max(1);
        let n = self.after.as_millis().div_ceil(interval);
        u32::try_from(n).unwrap_or(u32::MAX).max(health.fall)
    }

    /// What a configuration must have for sluice to manage replication.
    pub fn check(&self, backends: &[BackendConfig], health: &HealthConfig) -> Result<(), InvalidValue> {
        if self.enabled && self.user.is_none() {
            return Err(InvalidValue("failover.enabled needs failover.user and failover.password".into()));
        }
        if !self.manages() {
            return Ok(());
        }
        if self.user.is_some() != self.password.is_some() {
            return Err(InvalidValue("failover.user needs failover.password".into()));
        }
        if health.user.is_none() {
            return Err(InvalidValue(
                "failover needs health.user: the health checks read each backend's GTID position and replication".into(),
            ));
        }
        for b in backends {
            if b.role != Role::Auto {
                let name = b.display_name();
                return Err(InvalidValue(format!(
                    "backend {name}: failover decides which backend is the primary; its role must be \"auto\""
                )));
            }
            if b.address.get_ref().starts_with('/') || b.address.get_ref().starts_with("unix:") {
                let name = b.display_name();
                return Err(InvalidValue(format!(
                    "backend {name}: failover points replicas at a primary by host and port; a Unix socket cannot be one"
                )));
            }
        }
        Ok(())
    }
}

impl super::Config {
    /// Whether users-mode sessions keep their transactions to replay them
    /// (`routing.transaction_replay`, on by default with `failover.enabled`).
    pub fn replays_transactions(&self) -> bool {
        self.routing.transaction_replay.unwrap_or(self.failover.enabled)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn check(text: &str) -> Result<Config, String> {
        Config::parse(text).map_err(|e| e.message)
    }

    const BACKENDS: &str = "[[backends]]\naddress = \"127.0.0.1:3306\"\n[[backends]]\naddress = \"127.0.0.1:3307\"\n";
    const MONITOR: &str = "[health]\nuser = \"monitor\"\npassword = \"m\"\n";

    #[test]
    fn failover_needs_its_account_the_monitor_and_auto_roles() {
        let e = check(&format!("{BACKENDS}{MONITOR}[failover]\nenabled = true\n")).unwrap_err();
        assert!(e.contains("failover.enabled needs failover.user"), "{e}");
        let e = check(&format!("{BACKENDS}[failover]\nenabled = true\nuser = \"f\"\npassword = \"p\"\n")).unwrap_err();
        assert!(e.contains("failover needs health.user"), "{e}");
        let fixed = "[[backends]]\naddress = \"127.0.0.1:3306\"\nrole = \"primary\"\n";
        let e = check(&format!("{fixed}{MONITOR}[failover]\nuser = \"f\"\npassword = \"p\"\n")).unwrap_err();
        assert!(e.contains("its role must be \"auto\""), "{e}");
        let c = check(&format!("{BACKENDS}{MONITOR}[failover]\nenabled = true\nuser = \"f\"\npassword = \"p\"\n")).unwrap();
        assert!(c.failover.manages() && c.replays_transactions(), "transaction replay is on with failover");
        assert_eq!(c.failover.replication_account(), ("f", "p"));
        let c = check(&format!(
            "{BACKENDS}{MONITOR}[failover]\nenabled = true\nuser = \"f\"\npassword = \"p\"\n[routing]\ntransaction_replay = false\n"
        ))
        .unwrap();
        assert!(!c.replays_transactions());
        assert!(!check(BACKENDS).unwrap().replays_transactions(), "off without failover");
    }

    #[test]
    fn the_wait_before_a_failover_is_counted_in_failed_checks() {
        let c = check(&format!("{BACKENDS}{MONITOR}[failover]\nafter = \"3s\"\n")).unwrap();
        assert_eq!(c.failover.failed_checks(&c.health), 3, "3 s at a check every 2 s: 2, but at least fall (3)");
        let c = check(&format!("{BACKENDS}[health]\ninterval = \"500ms\"\nfall = 2\n[failover]\nafter = \"3s\"\n")).unwrap();
        assert_eq!(c.failover.failed_checks(&c.health), 6);
    }
}
