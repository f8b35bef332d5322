//! A minimal blocking MySQL client that speaks raw packets: for commands that client libraries
//! do not expose (cursors, long data, COM_STATISTICS, COM_FIELD_LIST, COM_SET_OPTION) and for
//! sending malformed traffic on purpose.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sluice_proto::auth;
use sluice_proto::consts::{cap, com};
use sluice_proto::handshake::{AuthSwitch, Greeting, HandshakeResponse};
use sluice_proto::packet::frame;
use sluice_proto::response::{Expect, NoSink, ResponseTracker, State};

pub struct Raw {
    pub s: TcpStream,
    pub greeting: Option<Greeting>,
    pub caps: u32,
}

pub const CLIENT_CAPS: u32 = cap::LONG_PASSWORD
    | cap::LONG_FLAG
    | cap::PROTOCOL_41
    | cap::TRANSACTIONS
    | cap::SECURE_CONNECTION
    | cap::MULTI_STATEMENTS
    | cap::MULTI_RESULTS
    | cap::PS_MULTI_RESULTS
    | cap::PLUGIN_AUTH
    | cap::PLUGIN_AUTH_LENENC_DATA
    | cap::DEPRECATE_EOF
    | cap::LOCAL_FILES;

impl Raw {
    /// A plain TCP connection, nothing read yet.
    pub fn connect(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        Raw { s, greeting: None, caps: 0 }
    }

    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.s.write_all(bytes)
    }

    pub fn write_packet(&mut self, seq: u8, payload: &[u8]) -> io::Result<()> {
        let mut out = Vec::new();
        frame(&mut out, payload, seq);
        self.s.write_all(&out)
    }

    /// Reads one physical packet.
    pub fn read_packet(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let mut h = [0u8; 4];
        self.s.read_exact(&mut h)?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
        let mut p = vec![0u8; len];
        self.s.read_exact(&mut p)?;
        Ok((h[3], p))
    }

    /// True when the peer closed the connection (reads EOF or a reset) within the read timeout.
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1024];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }

    /// Connects and logs in with mysql_native_password (following one auth switch).
    pub fn login(addr: &str, user: &str, password: &str, db: Option<&str>) -> Raw {
        Self::login_caps(addr, user, password, db, CLIENT_CAPS)
    }

    pub fn login_caps(addr: &str, user: &str, password: &str, db: Option<&str>, caps: u32) -> Raw {
        Self::login_as(addr, user, password, db, caps, 45)
    }

    /// Logs in with `caps` and the character set and collation `collation` (an id).
    pub fn login_as(addr: &str, user: &str, password: &str, db: Option<&str>, caps: u32, collation: u8) -> Raw {
        Self::login_full(addr, user, password, db, caps, collation, &[])
    }

    /// Logs in sending connection attributes (CLIENT_CONNECT_ATTRS).
    pub fn login_attrs(addr: &str, user: &str, password: &str, attributes: &[(&str, &str)]) -> Raw {
        Self::login_full(addr, user, password, None, CLIENT_CAPS | cap::CONNECT_ATTRS, 45, attributes)
    }

    fn login_full(addr: &str, user: &str, password: &str, db: Option<&str>, caps: u32, collation: u8, attributes: &[(&str, &str)]) -> Raw {
        let mut r = Raw::connect(addr);
        let (_, g) = r.read_packet().expect("greeting");
        let g = Greeting::parse(&g).expect("parse greeting");
        let caps = caps & (g.capabilities | cap::LONG_PASSWORD) | if db.is_some() { cap::CONNECT_WITH_DB } else { 0 };
        let reply = |scramble: &[u8]| {
            if password.is_empty() {
                Vec::new()
            } else {
                auth::native_reply_from_stage1(scramble, &auth::native_stage1(password.as_bytes())).to_vec()
            }
        };
        let hr = HandshakeResponse {
            capabilities: caps,
            max_packet: 1 << 30,
            collation,
            user: user.as_bytes().to_vec(),
            auth_response: reply(&g.scramble),
            database: db.map(|d| d.as_bytes().to_vec()),
            auth_plugin: Some(auth::NATIVE.to_vec()),
            attributes: attributes.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect(),
            ..Default::default()
        };
        let mut out = Vec::new();
        hr.write(&mut out);
        r.write_packet(1, &out).expect("send handshake response");
        loop {
            let (seq, p) = r.read_packet().expect("login reply");
            match p.first() {
                Some(0x00) => break,
                Some(0xfe) => {
                    let sw = AuthSwitch::parse(&p).expect("auth switch");
                    assert_eq!(sw.plugin, auth::NATIVE, "raw client only speaks mysql_native_password");
                    r.write_packet(seq + 1, &reply(sw.data)).expect("auth reply");
                }
                _ => panic!("login failed: {}", String::from_utf8_lossy(&p)),
            }
        }
        r.caps = caps;
        r.greeting = Some(g);
        r
    }

    /// Sends a command and reads its whole response; returns the response packets' payloads.
    pub fn command(&mut self, payload: &[u8]) -> Vec<Vec<u8>> {
        let expect = match payload[0] {
            com::STMT_PREPARE => Expect::Prepare,
            com::STMT_FETCH => Expect::Rows,
            com::FIELD_LIST => Expect::FieldList,
            com::STATISTICS => Expect::Single,
            com::STMT_CLOSE | com::STMT_SEND_LONG_DATA | com::QUIT => Expect::Nothing,
            // The flags byte after the statement id asks for a cursor.
            com::STMT_EXECUTE if payload.get(5).is_some_and(|f| f & 7 != 0) => Expect::Cursor,
            _ => Expect::Results,
        };
        self.write_packet(0, payload).expect("send command");
        self.response(expect)
    }

    /// Reads a response of the given shape, packet by packet.
    pub fn response(&mut self, expect: Expect) -> Vec<Vec<u8>> {
        let mut t = ResponseTracker::new(self.caps & cap::DEPRECATE_EOF != 0, self.caps & cap::SESSION_TRACK != 0);
        t.start(expect, 0);
        let mut packets = Vec::new();
        if t.is_done() {
            return packets;
        }
        loop {
            let (seq, p) = self.read_packet().expect("response packet");
            let mut framed = Vec::new();
            frame(&mut framed, &p, seq);
            let scan = t.scan(&framed, &mut NoSink).expect("well-formed response");
            packets.push(p);
            match scan.state {
                State::Done => return packets,
                State::LocalInfile => panic!("unexpected LOCAL INFILE request"),
                State::Pending | State::Rewrite { .. } | State::Held => {}
            }
        }
    }

    /// COM_STMT_PREPARE of `sql`: (statement id, columns, params) from its PREPARE_OK.
    pub fn prepare(&mut self, sql: &str) -> (u32, u16, u16) {
        let mut p = vec![com::STMT_PREPARE];
        p.extend_from_slice(sql.as_bytes());
        let ok = &self.command(&p)[0];
        assert_eq!(ok[0], 0, "PREPARE_OK expected, got {}", String::from_utf8_lossy(ok));
        (u32::from_le_bytes([ok[1], ok[2], ok[3], ok[4]]), u16::from_le_bytes([ok[5], ok[6]]), u16::from_le_bytes([ok[7], ok[8]]))
    }

    pub fn query(&mut self, sql: &str) -> Vec<Vec<u8>> {
        let mut p = vec![com::QUERY];
        p.extend_from_slice(sql.as_bytes());
        self.command(&p)
    }

    /// The one row of a text result, each value as a string (None: NULL); panics on an error.
    pub fn row(&mut self, sql: &str) -> Vec<Option<String>> {
        let packets = self.query(sql);
        if let Some(code) = packets.first().and_then(|p| err_code(p)) {
            panic!("{sql}: error {code}: {}", String::from_utf8_lossy(&packets[0]));
        }
        let columns = sluice_proto::packet::Reader::new(&packets[0]).lenenc("column count").expect("column count") as usize;
        // Column count, definitions, (an EOF without DEPRECATE_EOF,) the row, the terminator.
        let row = &packets[packets.len() - 2];
        sluice_proto::uservar::row_values(row, columns)
            .expect("one row")
            .into_iter()
            .map(|v| v.map(|b| String::from_utf8_lossy(b).into_owned()))
            .collect()
    }
}

/// The ERR code of a packet, if it is an ERR.
pub fn err_code(p: &[u8]) -> Option<u16> {
    (p.first() == Some(&0xff) && p.len() >= 3).then(|| u16::from_le_bytes([p[1], p[2]]))
}
