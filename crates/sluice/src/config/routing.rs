//! `[routing]`: where statements run (the read/write split over a primary and its replicas).

use std::time::Duration;

use serde::Deserialize;

use super::duration;

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Users-mode sessions send reads to replicas and the rest to the primary, statement by
    /// statement (they multiplex, whatever `proxy.multiplex` says).
    pub split: bool,
    /// A replica further behind than this (`Seconds_Behind_Master`) serves no reads until it
    /// catches up; 0: no bound on lag (a replica that does not replicate still serves none).
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub max_replica_lag: Duration,
    /// Where `START TRANSACTION READ ONLY` runs: "primary" or "replica".
    pub read_only_transactions: ReadOnlyTransactions,
    /// "session": a read sent to a replica after the session wrote first waits there (in the
    /// same round trip) for the session's last GTID; "global": for the latest GTID any session
    /// wrote through sluice; "none": it does not.
    pub causal_reads: CausalReads,
    /// How long that wait may last before the read runs on the primary instead (0: the replica
    /// must have the write already).
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub causal_reads_timeout: Duration,
    /// Statements waiting for each shadow backend of a mirroring rule; more are dropped.
    pub mirror_queue: usize,
    /// Bytes the result cache of rules with `cache_ttl` may hold (an answer larger than a
    /// sixteenth of it is not kept).
    pub cache_size: usize,
    /// Users-mode sessions keep the statements of their open transaction and a checksum of
    /// each result; when the transaction's backend is lost, it is run again on the primary
    /// and goes on if every result is the same. An autocommit read lost is run again.
    /// Unset: on with `[failover] enabled`.
    pub transaction_replay: Option<bool>,
    /// How long a session whose backend was lost waits for a primary to replay on.
    #[serde(deserialize_with = "duration", serialize_with = "super::show::duration")]
    pub transaction_replay_timeout: Duration,
    /// Bytes of statements a transaction may keep; a larger one is not replayed (its client
    /// gets the error of the lost connection).
    pub transaction_replay_max_size: usize,
    /// With the split: a transaction (and with autocommit off, every implicit one) begins on a
    /// replica; at its first write it is run again on the primary and goes on there if every
    /// result is the same, else the client gets error 1213 for it (`frontend/optimistic.rs`).
    pub optimistic_transactions: bool,
    /// With transaction replay: a table (`schema.table`) that each write transaction writes
    /// its session's row to just before its COMMIT (`frontend/commit_mark.rs`). A COMMIT whose
    /// connection was lost is then looked up on the primary: answered when it committed,
    /// replayed when it did not. Unset: its client is told its outcome is unknown (1180).
    /// Failover's user creates the table; the users need SELECT, INSERT and UPDATE on it.
    pub commit_table: Option<String>,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            split: false,
            max_replica_lag: Duration::from_secs(10),
            read_only_transactions: ReadOnlyTransactions::Primary,
            causal_reads: CausalReads::None,
            causal_reads_timeout: Duration::from_secs(1),
            mirror_queue: 1000,
            cache_size: 64 << 20,
            transaction_replay: None,
            transaction_replay_timeout: Duration::from_secs(30),
            transaction_replay_max_size: 1 << 20,
            optimistic_transactions: false,
            commit_table: None,
        }
    }
}

impl RoutingConfig {
    /// `commit_table` names a table as `schema.table`, each of letters, digits, `_` and `$`.
    pub fn check_commit_table(&self) -> Result<(), super::InvalidValue> {
        let Some(t) = &self.commit_table else { return Ok(()) };
        let part = |p: &str| !p.is_empty() && p.len() <= 64 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$');
        match t.split_once('.') {
            Some((schema, table)) if part(schema) && part(table) => Ok(()),
            _ => Err(super::InvalidValue(format!("routing.commit_table: expected schema.table (letters, digits, _ and $), got {t:?}"))),
        }
    }

    /// `schema.table` quoted, part by part (the parts were checked to be plain names).
    pub fn quote_table(table: &str) -> String {
        let (schema, name) = table.split_once('.').unwrap_or(("", table));
        format!("`{schema}`.`{name}`")
    }
}

/// Whether a session's reads on replicas see its own writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CausalReads {
    #[default]
    None,
    Session,
    Global,
}

/// Where the split sends a read-only transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReadOnlyTransactions {
    /// With the writes: it sees what the session wrote just before.
    #[default]
    Primary,
    /// To a replica, as reads go.
    Replica,
}
