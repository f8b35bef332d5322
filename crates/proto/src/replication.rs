//! What a backend says about its place in a replication topology, read by the health checks:
//! whether it is read-only, its GTID position, and, for a replica, whether it replicates and how
//! far behind it is. The queries, and parsers for their text results.

use crate::packet::Reader;
use crate::uservar::row_values;

/// The first query: read-only or writable, the GTID position of the server's own log, and
/// the position of what it has applied (its own log's, and as a replica, what it replicated).
pub const SERVER_QUERY: &[u8] = b"SELECT @@read_only, @@gtid_binlog_pos, @@gtid_current_pos";

/// The second query (it needs the `SLAVE MONITOR` privilege; without it a backend's lag is
/// unknown).
pub const REPLICA_QUERY: &[u8] = b"SHOW SLAVE STATUS";

/// The answer to [`SERVER_QUERY`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerRole {
    pub read_only: bool,
    pub gtid_binlog_pos: String,
    pub gtid_current_pos: String,
}

/// The answer to [`REPLICA_QUERY`] (its first row: the default connection).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaStatus {
    /// Both replication threads run.
    pub running: bool,
    /// `Seconds_Behind_Master` (None: NULL, which the server reports while a thread is stopped).
    pub seconds_behind: Option<u64>,
    /// `Gtid_IO_Pos`: the last GTID received from the primary.
    pub gtid_io_pos: String,
    /// `Master_Host:Master_Port`: the server it replicates from.
    pub source: String,
    /// `Last_SQL_Error` or, when it is empty, `Last_IO_Error`.
    pub last_error: String,
    /// `SQL_Delay`: seconds it waits before applying a transaction (`MASTER_DELAY`).
    pub delay: u64,
}

/// The name of a column from its definition (protocol 4.1).
pub fn column_name(def: &[u8]) -> Option<&[u8]> {
    let mut r = Reader::new(def);
    for what in ["catalog", "schema", "table", "org_table"] {
        r.lenenc_bytes(what).ok()?;
    }
    r.lenenc_bytes("name").ok()
}

/// Parses the one row of [`SERVER_QUERY`].
pub fn server_role(row: &[u8]) -> Option<ServerRole> {
    let v = row_values(row, 3)?;
    let read_only = match v[0]? {
        b"1" | b"ON" => true,
        b"0" | b"OFF" => false,
        _ => return None,
    };
    let text = |i: usize| String::from_utf8_lossy(v[i].unwrap_or_default()).into_owned();
    Some(ServerRole { read_only, gtid_binlog_pos: text(1), gtid_current_pos: text(2) })
}

/// Parses the result of [`REPLICA_QUERY`]: its column definitions and rows. None when the
/// server replicates from nobody (no row) or the result is not what MariaDB sends.
pub fn replica_status(defs: &[Vec<u8>], rows: &[Vec<u8>]) -> Option<ReplicaStatus> {
    let row = rows.first()?;
    let values = row_values(row, defs.len())?;
    let get = |name: &str| -> Option<&[u8]> {
        let i = defs.iter().position(|d| column_name(d).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())))?;
        values[i]
    };
    let text = |name: &str| get(name).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
    let yes = |name: &str| get(name) == Some(b"Yes".as_slice());
    let seconds_behind = get("Seconds_Behind_Master").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
    let last_error = match text("Last_SQL_Error") {
        e if e.is_empty() => text("Last_IO_Error"),
        e => e,
    };
    Some(ReplicaStatus {
        running: yes("Slave_IO_Running") && yes("Slave_SQL_Running"),
        seconds_behind,
        gtid_io_pos: text("Gtid_IO_Pos"),
        source: format!("{}:{}", text("Master_Host"), text("Master_Port")),
        last_error,
        delay: get("SQL_Delay").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::put_lenenc_bytes;

    fn def(name: &str) -> Vec<u8> {
        let mut d = Vec::new();
        for s in ["def", "", "", "", name, name] {
            put_lenenc_bytes(&mut d, s.as_bytes());
        }
        d.extend_from_slice(&[0x0c, 33, 0, 0, 1, 0, 0, 253, 0, 0, 0, 0, 0]);
        d
    }

    fn row(values: &[Option<&str>]) -> Vec<u8> {
        let mut r = Vec::new();
        for v in values {
            match v {
                Some(s) => put_lenenc_bytes(&mut r, s.as_bytes()),
                None => r.push(0xfb),
            }
        }
        r
    }

    #[test]
    fn the_server_query_reads_read_only_and_the_position() {
        assert_eq!(
            server_role(&row(&[Some("1"), Some("0-1-42"), Some("0-1-42,1-2-3")])),
            Some(ServerRole { read_only: true, gtid_binlog_pos: "0-1-42".into(), gtid_current_pos: "0-1-42,1-2-3".into() })
        );
        assert_eq!(server_role(&row(&[Some("0"), Some(""), Some("")])).map(|r| r.read_only), Some(false));
        assert_eq!(server_role(&row(&[Some("maybe"), Some(""), Some("")])), None);
        assert_eq!(server_role(&row(&[Some("1"), Some("")])), None, "a short row");
        assert_eq!(server_role(&row(&[None, Some(""), Some("")])), None);
    }

    #[test]
    fn the_replica_status_is_found_by_column_name() {
        let names = [
            "Slave_IO_State",
            "Master_Host",
            "Master_Port",
            "Slave_IO_Running",
            "Slave_SQL_Running",
            "Last_IO_Error",
            "Last_SQL_Error",
            "Seconds_Behind_Master",
            "Gtid_IO_Pos",
            "SQL_Delay",
        ];
        let defs: Vec<Vec<u8>> = names.iter().map(|n| def(n)).collect();
        assert_eq!(column_name(&defs[7]), Some(b"Seconds_Behind_Master".as_slice()));
        let running = row(&[
            Some("Waiting"),
            Some("127.0.0.1"),
            Some("3306"),
            Some("Yes"),
            Some("Yes"),
            Some(""),
            Some(""),
            Some("7"),
            Some("0-1-9"),
            Some("30"),
        ]);
        assert_eq!(
            replica_status(&defs, &[running]),
            Some(ReplicaStatus {
                running: true,
                seconds_behind: Some(7),
                gtid_io_pos: "0-1-9".into(),
                source: "127.0.0.1:3306".into(),
                last_error: String::new(),
                delay: 30,
            })
        );
        let stopped = row(&[
            Some(""),
            Some("127.0.0.1"),
            Some("3306"),
            Some("Yes"),
            Some("No"),
            Some(""),
            Some("Duplicate entry"),
            None,
            Some(""),
            Some("0"),
        ]);
        let s = replica_status(&defs, &[stopped]).expect("a status");
        assert!(!s.running);
        assert_eq!(s.seconds_behind, None);
        assert_eq!(s.last_error, "Duplicate entry");
        assert_eq!(replica_status(&defs, &[]), None, "no row: not a replica");
        assert_eq!(replica_status(&defs, &[row(&[Some("x")])]), None, "a row that does not match its columns");
    }
}
