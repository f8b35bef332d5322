//! Protocol constants: capability flags, server status flags, command bytes, error codes.

/// Client/server capability flags (the lower 32 bits of the handshake).
pub mod cap {
    pub const LONG_PASSWORD: u32 = 1;
    pub const FOUND_ROWS: u32 = 1 << 1;
    pub const LONG_FLAG: u32 = 1 << 2;
    pub const CONNECT_WITH_DB: u32 = 1 << 3;
    pub const NO_SCHEMA: u32 = 1 << 4;
    pub const COMPRESS: u32 = 1 << 5;
    pub const ODBC: u32 = 1 << 6;
    pub const LOCAL_FILES: u32 = 1 << 7;
    pub const IGNORE_SPACE: u32 = 1 << 8;
    pub const PROTOCOL_41: u32 = 1 << 9;
    pub const INTERACTIVE: u32 = 1 << 10;
    pub const SSL: u32 = 1 << 11;
    pub const IGNORE_SIGPIPE: u32 = 1 << 12;
    pub const TRANSACTIONS: u32 = 1 << 13;
    pub const RESERVED: u32 = 1 << 14;
    pub const SECURE_CONNECTION: u32 = 1 << 15;
    pub const MULTI_STATEMENTS: u32 = 1 << 16;
    pub const MULTI_RESULTS: u32 = 1 << 17;
    pub const PS_MULTI_RESULTS: u32 = 1 << 18;
    pub const PLUGIN_AUTH: u32 = 1 << 19;
    pub const CONNECT_ATTRS: u32 = 1 << 20;
    pub const PLUGIN_AUTH_LENENC_DATA: u32 = 1 << 21;
    pub const CAN_HANDLE_EXPIRED_PASSWORDS: u32 = 1 << 22;
    pub const SESSION_TRACK: u32 = 1 << 23;
    pub const DEPRECATE_EOF: u32 = 1 << 24;
    pub const OPTIONAL_RESULTSET_METADATA: u32 = 1 << 25;
    pub const ZSTD_COMPRESSION: u32 = 1 << 26;
    pub const QUERY_ATTRIBUTES: u32 = 1 << 27;
    pub const SSL_VERIFY_SERVER_CERT: u32 = 1 << 30;
    pub const REMEMBER_OPTIONS: u32 = 1 << 31;

    /// What sluice itself can speak on the client side. The backend's capabilities and the
    /// client's request are intersected with this set. `SSL`, `COMPRESS` and
    /// `ZSTD_COMPRESSION` are terminated by sluice and removed again when talking to a backend.
    pub const SLUICE_SUPPORTED: u32 = LONG_PASSWORD
        | FOUND_ROWS
        | LONG_FLAG
        | CONNECT_WITH_DB
        | NO_SCHEMA
        | ODBC
        | LOCAL_FILES
        | IGNORE_SPACE
        | PROTOCOL_41
        | INTERACTIVE
        | IGNORE_SIGPIPE
        | TRANSACTIONS
        | RESERVED
        | SECURE_CONNECTION
        | MULTI_STATEMENTS
        | MULTI_RESULTS
        | PS_MULTI_RESULTS
        | PLUGIN_AUTH
        | CONNECT_ATTRS
        | PLUGIN_AUTH_LENENC_DATA
        | CAN_HANDLE_EXPIRED_PASSWORDS
        | SESSION_TRACK
        | DEPRECATE_EOF
        | QUERY_ATTRIBUTES;

    /// Capabilities that belong to one leg only (the transport), never forwarded.
    pub const TRANSPORT: u32 = SSL | COMPRESS | ZSTD_COMPRESSION | SSL_VERIFY_SERVER_CERT;
}

/// MariaDB extended capabilities (sent in the handshake filler bytes when CLIENT_MYSQL (LONG_PASSWORD)
/// is absent from the server greeting).
pub mod mariadb_cap {
    pub const PROGRESS: u32 = 1;
    pub const COM_MULTI: u32 = 1 << 1;
    pub const STMT_BULK_OPERATIONS: u32 = 1 << 2;
    pub const EXTENDED_TYPE_INFO: u32 = 1 << 3;
    pub const CACHE_METADATA: u32 = 1 << 4;
    /// Extended capabilities sluice can relay: bulk operations and extended type info change
    /// only packet contents, not the framing sluice follows.
    pub const SLUICE_SUPPORTED: u32 = STMT_BULK_OPERATIONS | EXTENDED_TYPE_INFO;
}

/// Server status flags (OK, EOF packets and the greeting).
pub mod status {
    pub const IN_TRANS: u16 = 1;
    pub const AUTOCOMMIT: u16 = 1 << 1;
    pub const MORE_RESULTS_EXISTS: u16 = 1 << 3;
    pub const NO_GOOD_INDEX_USED: u16 = 1 << 4;
    pub const NO_INDEX_USED: u16 = 1 << 5;
    pub const CURSOR_EXISTS: u16 = 1 << 6;
    pub const LAST_ROW_SENT: u16 = 1 << 7;
    pub const DB_DROPPED: u16 = 1 << 8;
    pub const NO_BACKSLASH_ESCAPES: u16 = 1 << 9;
    pub const METADATA_CHANGED: u16 = 1 << 10;
    pub const QUERY_WAS_SLOW: u16 = 1 << 11;
    pub const PS_OUT_PARAMS: u16 = 1 << 12;
    pub const IN_TRANS_READONLY: u16 = 1 << 13;
    pub const SESSION_STATE_CHANGED: u16 = 1 << 14;
}

/// Command bytes (first payload byte of a client command packet).
pub mod com {
    pub const SLEEP: u8 = 0x00;
    pub const QUIT: u8 = 0x01;
    pub const INIT_DB: u8 = 0x02;
    pub const QUERY: u8 = 0x03;
    pub const FIELD_LIST: u8 = 0x04;
    pub const CREATE_DB: u8 = 0x05;
    pub const DROP_DB: u8 = 0x06;
    pub const REFRESH: u8 = 0x07;
    pub const SHUTDOWN: u8 = 0x08;
    pub const STATISTICS: u8 = 0x09;
    pub const PROCESS_INFO: u8 = 0x0a;
    pub const CONNECT: u8 = 0x0b;
    pub const PROCESS_KILL: u8 = 0x0c;
    pub const DEBUG: u8 = 0x0d;
    pub const PING: u8 = 0x0e;
    pub const TIME: u8 = 0x0f;
    pub const DELAYED_INSERT: u8 = 0x10;
    pub const CHANGE_USER: u8 = 0x11;
    pub const BINLOG_DUMP: u8 = 0x12;
    pub const TABLE_DUMP: u8 = 0x13;
    pub const CONNECT_OUT: u8 = 0x14;
    pub const REGISTER_SLAVE: u8 = 0x15;
    pub const STMT_PREPARE: u8 = 0x16;
    pub const STMT_EXECUTE: u8 = 0x17;
    pub const STMT_SEND_LONG_DATA: u8 = 0x18;
    pub const STMT_CLOSE: u8 = 0x19;
    pub const STMT_RESET: u8 = 0x1a;
    pub const SET_OPTION: u8 = 0x1b;
    pub const STMT_FETCH: u8 = 0x1c;
    pub const DAEMON: u8 = 0x1d;
    pub const BINLOG_DUMP_GTID: u8 = 0x1e;
    pub const RESET_CONNECTION: u8 = 0x1f;
    /// MariaDB: COM_STMT_BULK_EXECUTE.
    pub const STMT_BULK_EXECUTE: u8 = 0xfa;

    /// A stable, short name for metrics and logs.
    pub fn name(cmd: u8) -> &'static str {
        NAMES[name_index(cmd)]
    }

    /// Where `cmd`'s name is in [`NAMES`] (command bytes that share a name share its index).
    #[inline]
    pub fn name_index(cmd: u8) -> usize {
        match cmd {
            QUERY => 0,
            STMT_EXECUTE => 1,
            STMT_FETCH => 2,
            STMT_PREPARE => 3,
            STMT_CLOSE => 4,
            PING => 5,
            SLEEP => 6,
            QUIT => 7,
            INIT_DB => 8,
            FIELD_LIST => 9,
            CREATE_DB => 10,
            DROP_DB => 11,
            REFRESH => 12,
            SHUTDOWN => 13,
            STATISTICS => 14,
            PROCESS_INFO => 15,
            PROCESS_KILL => 16,
            DEBUG => 17,
            CHANGE_USER => 18,
            BINLOG_DUMP | BINLOG_DUMP_GTID => 19,
            STMT_SEND_LONG_DATA => 20,
            STMT_RESET => 21,
            SET_OPTION => 22,
            RESET_CONNECTION => 23,
            STMT_BULK_EXECUTE => 24,
            _ => 25,
        }
    }

    /// Every command name `name` can return, the commonest commands' first.
    pub const NAMES: [&str; 26] = [
        "query",
        "stmt_execute",
        "stmt_fetch",
        "stmt_prepare",
        "stmt_close",
        "ping",
        "sleep",
        "quit",
        "init_db",
        "field_list",
        "create_db",
        "drop_db",
        "refresh",
        "shutdown",
        "statistics",
        "process_info",
        "process_kill",
        "debug",
        "change_user",
        "binlog_dump",
        "stmt_send_long_data",
        "stmt_reset",
        "set_option",
        "reset_connection",
        "stmt_bulk_execute",
        "other",
    ];
}

/// Error codes sluice itself sends (MySQL/MariaDB server error numbers, so clients map them).
pub mod err {
    pub const CON_COUNT: u16 = 1040;
    pub const HANDSHAKE: u16 = 1043;
    pub const ACCESS_DENIED: u16 = 1045;
    pub const NO_DB: u16 = 1046;
    pub const UNKNOWN_COM: u16 = 1047;
    pub const NET_PACKET_TOO_LARGE: u16 = 1153;
    pub const NET_READ_ERROR: u16 = 1158;
    pub const NET_READ_INTERRUPTED: u16 = 1159;
    pub const NET_PACKETS_OUT_OF_ORDER: u16 = 1156;
    pub const NET_UNCOMPRESS: u16 = 1157;
    pub const TOO_MANY_USER_CONNECTIONS: u16 = 1203;
    pub const NOT_SUPPORTED_YET: u16 = 1235;
    pub const UNKNOWN_STMT_HANDLER: u16 = 1243;
    pub const NO_SUCH_THREAD: u16 = 1094;
    pub const SECURE_TRANSPORT_REQUIRED: u16 = 3159;
    pub const SERVER_SHUTDOWN: u16 = 1053;
    /// MariaDB's notice to a connection that was killed.
    pub const CONNECTION_KILLED: u16 = 1927;
    /// No backend could take the session (a server-side code: clients refuse 2xxx codes from
    /// a server before login).
    pub const NO_BACKEND: u16 = 1105;
    pub const SERVER_LOST: u16 = 2013;
    pub const UNKNOWN_ERROR: u16 = 1105;
    /// ER_OUT_OF_RESOURCES.
    pub const OUT_OF_RESOURCES: u16 = 1041;
    /// ER_ERROR_DURING_COMMIT: whether a transaction committed is not known.
    pub const ERROR_DURING_COMMIT: u16 = 1180;
    /// ER_LOCK_DEADLOCK (SQLSTATE 40001): the transaction was rolled back; run it again.
    pub const LOCK_DEADLOCK: u16 = 1213;
}

/// Default collation for a new session when the client names none: utf8mb4_general_ci.
pub const DEFAULT_COLLATION: u8 = 45;

/// Largest payload of one physical packet; larger payloads continue in the next packet.
pub const MAX_PAYLOAD: usize = 0xff_ffff;
