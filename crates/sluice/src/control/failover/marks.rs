//! The commit table (`[routing] commit_table`) on the primary, tended by failover's user: made
//! when a primary is first known (or a new one promoted), and its rows older than a day
//! deleted once an hour. Sessions write their row in it just before each write transaction's
//! COMMIT (`frontend/commit_mark.rs`); a row is looked at only in the seconds after a COMMIT
//! was lost, so a day-old one is of no use.

use std::time::{Duration, Instant};

use super::steps;
use crate::backend::Backend;
use crate::backend::manage::Failure;
use crate::config::Config;

/// How often old rows are deleted.
const SWEEP: Duration = Duration::from_secs(3600);

/// What was done to the commit table, and on which primary.
#[derive(Default)]
pub struct CommitTable {
    /// The primary it was made on (by backend index).
    made_on: Option<usize>,
    /// When its old rows were last deleted.
    swept: Option<Instant>,
    /// The last failure said (said once until it changes).
    said: Option<String>,
}

impl CommitTable {
    /// Makes the table on `primary` if it was not made there yet, and deletes old rows when due.
    pub async fn tend(&mut self, c: &Config, primary: &Backend) {
        let Some(table) = c.routing.commit_table.as_deref() else { return };
        let made = self.made_on == Some(primary.index);
        if made && self.swept.is_some_and(|t| t.elapsed() < SWEEP) {
            return;
        }
        match self.work(c, primary, table, made).await {
            Ok(()) => self.said = None,
            Err(Failure { reason, .. }) => {
                if self.said.as_deref() != Some(reason.as_str()) {
                    tracing::warn!(backend = %primary.name, table, "the commit table: {reason}; a lost COMMIT's outcome stays unknown");
                    self.said = Some(reason);
                }
                // (Tried again at the next check.)
            }
        }
    }

    async fn work(&mut self, c: &Config, primary: &Backend, table: &str, made: bool) -> Result<(), Failure> {
        let mut m = steps::connect(primary, &c.failover, c.health.timeout).await?;
        let quoted = crate::config::RoutingConfig::quote_table(table);
        if !made {
            for sql in create(table, &quoted) {
                m.query(&sql).await?;
            }
            self.made_on = Some(primary.index);
            tracing::info!(backend = %primary.name, table, "the commit table is ready");
        }
        m.query(&format!("DELETE FROM {quoted} WHERE at < NOW() - INTERVAL 1 DAY")).await?;
        self.swept = Some(Instant::now());
        m.quit().await;
        Ok(())
    }
}

/// The statements that make the table: a row per session (its random key), the sequence number
/// of its last write transaction, and when it was written.
fn create(table: &str, quoted: &str) -> [String; 2] {
    let schema = table.split_once('.').map_or(table, |(s, _)| s);
    [
        format!("CREATE DATABASE IF NOT EXISTS `{schema}`"),
        format!(
            "CREATE TABLE IF NOT EXISTS {quoted} (id BINARY(16) NOT NULL PRIMARY KEY, seq BIGINT UNSIGNED NOT NULL, \
             at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP) ENGINE=InnoDB"
        ),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_is_quoted_part_by_part() {
        let [db, table] = super::create("s.c", "`s`.`c`");
        assert_eq!(db, "CREATE DATABASE IF NOT EXISTS `s`");
        assert!(table.starts_with("CREATE TABLE IF NOT EXISTS `s`.`c` (id BINARY(16)"), "{table}");
    }
}
