//! Connection-phase packets: the server greeting, the client's handshake response (and its
//! SSL-request prefix), auth-switch requests.

use crate::consts::cap;
use crate::packet::{Malformed, Reader, put_lenenc, put_lenenc_bytes, put_nul_str};

/// The server's initial handshake packet (protocol version 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub server_version: Vec<u8>,
    pub connection_id: u32,
    /// The full scramble (part 1 and part 2, without the trailing NUL).
    pub scramble: Vec<u8>,
    pub capabilities: u32,
    /// MariaDB extended capabilities (zero for MySQL servers).
    pub mariadb_capabilities: u32,
    pub collation: u8,
    pub status: u16,
    pub auth_plugin: Vec<u8>,
}

impl Greeting {
    pub fn parse(payload: &[u8]) -> Result<Greeting, Malformed> {
        let mut r = Reader::new(payload);
        match r.u8("protocol version")? {
            10 => {}
            0xff => return Err(Malformed("server sent an error instead of a greeting")),
            _ => return Err(Malformed("unsupported protocol version")),
        }
        let server_version = r.nul_str("server version")?.to_vec();
        let connection_id = r.u32("connection id")?;
        let mut scramble = r.bytes(8, "scramble")?.to_vec();
        r.u8("filler")?;
        let mut capabilities = r.u16("capabilities")? as u32;
        let mut g = Greeting {
            server_version,
            connection_id,
            scramble: Vec::new(),
            capabilities,
            mariadb_capabilities: 0,
            collation: 0,
            status: 0,
            auth_plugin: Vec::new(),
        };
        if r.is_empty() {
            g.scramble = scramble;
            return Ok(g);
        }
        g.collation = r.u8("collation")?;
        g.status = r.u16("status")?;
        capabilities |= (r.u16("capabilities")? as u32) << 16;
        g.capabilities = capabilities;
        let data_len = r.u8("auth data length")? as usize;
        let reserved = r.bytes(10, "reserved")?;
        if capabilities & cap::LONG_PASSWORD == 0 {
            g.mariadb_capabilities = u32::from_le_bytes([reserved[6], reserved[7], reserved[8], reserved[9]]);
        }
        if capabilities & cap::SECURE_CONNECTION != 0 {
            let n = data_len.saturating_sub(8).max(13).min(r.remaining());
            let part2 = r.bytes(n, "scramble part 2")?;
            let part2 = part2.strip_suffix(&[0]).unwrap_or(part2);
            scramble.extend_from_slice(part2);
        }
        g.scramble = scramble;
        if capabilities & cap::PLUGIN_AUTH != 0 {
            g.auth_plugin = r.nul_str_or_rest().to_vec();
        }
        Ok(g)
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(10);
        put_nul_str(out, &self.server_version);
        out.extend_from_slice(&self.connection_id.to_le_bytes());
        let (p1, p2) = self.scramble.split_at(self.scramble.len().min(8));
        out.extend_from_slice(p1);
        out.extend(std::iter::repeat_n(0u8, 8 - p1.len()));
        out.push(0);
        out.extend_from_slice(&(self.capabilities as u16).to_le_bytes());
        out.push(self.collation);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&((self.capabilities >> 16) as u16).to_le_bytes());
        let auth_len = if self.capabilities & cap::PLUGIN_AUTH != 0 { self.scramble.len() + 1 } else { 0 };
        out.push(auth_len as u8);
        out.extend_from_slice(&[0u8; 6]);
        if self.capabilities & cap::LONG_PASSWORD == 0 {
            out.extend_from_slice(&self.mariadb_capabilities.to_le_bytes());
        } else {
            out.extend_from_slice(&[0u8; 4]);
        }
        if self.capabilities & cap::SECURE_CONNECTION != 0 {
            out.extend_from_slice(p2);
            out.extend(std::iter::repeat_n(0u8, 12usize.saturating_sub(p2.len())));
            out.push(0);
        }
        if self.capabilities & cap::PLUGIN_AUTH != 0 {
            put_nul_str(out, &self.auth_plugin);
        }
    }
}

/// The client's handshake response (HandshakeResponse41).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandshakeResponse {
    pub capabilities: u32,
    pub mariadb_capabilities: u32,
    pub max_packet: u32,
    pub collation: u8,
    pub user: Vec<u8>,
    pub auth_response: Vec<u8>,
    pub database: Option<Vec<u8>>,
    pub auth_plugin: Option<Vec<u8>>,
    /// Connection attributes, as key/value pairs.
    pub attributes: Vec<(Vec<u8>, Vec<u8>)>,
    pub zstd_level: Option<u8>,
}

/// Length of an SSL request (the fixed prefix of a handshake response).
pub const SSL_REQUEST_LEN: usize = 32;

/// True when `payload` is an SSL request rather than a full handshake response.
pub fn is_ssl_request(payload: &[u8]) -> bool {
    payload.len() == SSL_REQUEST_LEN && {
        let caps = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        caps & cap::SSL != 0
    }
}

impl HandshakeResponse {
    pub fn parse(payload: &[u8]) -> Result<HandshakeResponse, Malformed> {
        let mut r = Reader::new(payload);
        let capabilities = r.u32("capabilities")?;
        if capabilities & cap::PROTOCOL_41 == 0 {
            return Err(Malformed("client does not speak protocol 4.1"));
        }
        let max_packet = r.u32("max packet")?;
        let collation = r.u8("collation")?;
        let filler = r.bytes(23, "filler")?;
        let mariadb_capabilities =
            if capabilities & cap::LONG_PASSWORD == 0 { u32::from_le_bytes([filler[19], filler[20], filler[21], filler[22]]) } else { 0 };
        let user = r.nul_str("user")?.to_vec();
        let auth_response = if capabilities & cap::PLUGIN_AUTH_LENENC_DATA != 0 {
            r.lenenc_bytes("auth response")?
        } else if capabilities & cap::SECURE_CONNECTION != 0 {
            let n = r.u8("auth response length")? as usize;
            r.bytes(n, "auth response")?
        } else {
            r.nul_str("auth response")?
        }
        .to_vec();
        let mut hr =
            HandshakeResponse { capabilities, mariadb_capabilities, max_packet, collation, user, auth_response, ..Default::default() };
        if capabilities & cap::CONNECT_WITH_DB != 0 && !r.is_empty() {
            hr.database = Some(r.nul_str_or_rest().to_vec());
        }
        if capabilities & cap::PLUGIN_AUTH != 0 && !r.is_empty() {
            hr.auth_plugin = Some(r.nul_str_or_rest().to_vec());
        }
        if capabilities & cap::CONNECT_ATTRS != 0 && !r.is_empty() {
            let block = r.lenenc_bytes("attributes")?;
            let mut a = Reader::new(block);
            while !a.is_empty() {
                let k = a.lenenc_bytes("attribute key")?.to_vec();
                let v = a.lenenc_bytes("attribute value")?.to_vec();
                hr.attributes.push((k, v));
            }
        }
        if capabilities & cap::ZSTD_COMPRESSION != 0 && !r.is_empty() {
            hr.zstd_level = Some(r.u8("zstd level")?);
        }
        Ok(hr)
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.capabilities.to_le_bytes());
        out.extend_from_slice(&self.max_packet.to_le_bytes());
        out.push(self.collation);
        out.extend_from_slice(&[0u8; 19]);
        if self.capabilities & cap::LONG_PASSWORD == 0 {
            out.extend_from_slice(&self.mariadb_capabilities.to_le_bytes());
        } else {
            out.extend_from_slice(&[0u8; 4]);
        }
        put_nul_str(out, &self.user);
        if self.capabilities & cap::PLUGIN_AUTH_LENENC_DATA != 0 {
            put_lenenc_bytes(out, &self.auth_response);
        } else if self.capabilities & cap::SECURE_CONNECTION != 0 {
            out.push(self.auth_response.len().min(255) as u8);
            out.extend_from_slice(&self.auth_response[..self.auth_response.len().min(255)]);
        } else {
            put_nul_str(out, &self.auth_response);
        }
        if self.capabilities & cap::CONNECT_WITH_DB != 0 {
            put_nul_str(out, self.database.as_deref().unwrap_or_default());
        }
        if self.capabilities & cap::PLUGIN_AUTH != 0 {
            put_nul_str(out, self.auth_plugin.as_deref().unwrap_or_default());
        }
        if self.capabilities & cap::CONNECT_ATTRS != 0 {
            let mut block = Vec::new();
            for (k, v) in &self.attributes {
                put_lenenc_bytes(&mut block, k);
                put_lenenc_bytes(&mut block, v);
            }
            put_lenenc(out, block.len() as u64);
            out.extend_from_slice(&block);
        }
        if self.capabilities & cap::ZSTD_COMPRESSION != 0 {
            out.push(self.zstd_level.unwrap_or(3));
        }
    }
}

impl HandshakeResponse {
    /// The COM_CHANGE_USER that makes an already logged-in connection this client's: same user,
    /// schema, character set and attributes, with `plugin` named and no auth data. `caps` are
    /// those in force on that connection (attributes are sent only with CONNECT_ATTRS).
    pub fn change_user(&self, caps: u32, plugin: &[u8]) -> ChangeUser {
        let attributes = (caps & cap::CONNECT_ATTRS != 0).then(|| {
            let mut block = Vec::new();
            for (k, v) in &self.attributes {
                put_lenenc_bytes(&mut block, k);
                put_lenenc_bytes(&mut block, v);
            }
            let mut out = Vec::with_capacity(block.len() + 9);
            put_lenenc(&mut out, block.len() as u64);
            out.extend_from_slice(&block);
            out
        });
        ChangeUser {
            user: self.user.clone(),
            auth_response: Vec::new(),
            database: self.database.clone().unwrap_or_default(),
            collation: Some(self.collation as u16),
            auth_plugin: Some(plugin.to_vec()),
            attributes,
        }
    }
}

/// Writes an SSL request payload.
pub fn write_ssl_request(out: &mut Vec<u8>, capabilities: u32, mariadb_capabilities: u32, max_packet: u32, collation: u8) {
    out.extend_from_slice(&(capabilities | cap::SSL).to_le_bytes());
    out.extend_from_slice(&max_packet.to_le_bytes());
    out.push(collation);
    out.extend_from_slice(&[0u8; 19]);
    out.extend_from_slice(&mariadb_capabilities.to_le_bytes());
}

/// An auth-switch request (0xfe) from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSwitch<'a> {
    pub plugin: &'a [u8],
    /// Plugin data without a trailing NUL.
    pub data: &'a [u8],
}

impl<'a> AuthSwitch<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<AuthSwitch<'a>, Malformed> {
        let mut r = Reader::new(payload);
        if r.u8("auth switch header")? != 0xfe {
            return Err(Malformed("auth switch header"));
        }
        let plugin = r.nul_str_or_rest();
        let data = r.rest();
        let data = data.strip_suffix(&[0]).unwrap_or(data);
        Ok(AuthSwitch { plugin, data })
    }
}

/// Writes an auth-switch request payload (data gets the customary trailing NUL).
pub fn write_auth_switch(out: &mut Vec<u8>, plugin: &[u8], data: &[u8]) {
    out.push(0xfe);
    put_nul_str(out, plugin);
    put_nul_str(out, data);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Greeting {
        Greeting {
            server_version: b"5.5.5-10.11.19-MariaDB".to_vec(),
            connection_id: 42,
            scramble: (1..=20).collect(),
            capabilities: cap::SLUICE_SUPPORTED & !cap::LONG_PASSWORD,
            mariadb_capabilities: 0x1c,
            collation: 45,
            status: 2,
            auth_plugin: b"mysql_native_password".to_vec(),
        }
    }

    #[test]
    fn greeting_round_trip() {
        let g = greeting();
        let mut out = Vec::new();
        g.write(&mut out);
        assert_eq!(Greeting::parse(&out).unwrap(), g);
    }

    #[test]
    fn response_round_trip() {
        let hr = HandshakeResponse {
            capabilities: cap::SLUICE_SUPPORTED | cap::ZSTD_COMPRESSION,
            mariadb_capabilities: 0,
            max_packet: 1 << 24,
            collation: 45,
            user: b"app".to_vec(),
            auth_response: vec![9; 20],
            database: Some(b"db1".to_vec()),
            auth_plugin: Some(b"mysql_native_password".to_vec()),
            attributes: vec![(b"_client_name".to_vec(), b"x".to_vec())],
            zstd_level: Some(5),
        };
        let mut out = Vec::new();
        hr.write(&mut out);
        assert_eq!(HandshakeResponse::parse(&out).unwrap(), hr);
        assert!(!is_ssl_request(&out));
        let mut ssl = Vec::new();
        write_ssl_request(&mut ssl, hr.capabilities, 0, hr.max_packet, 45);
        assert!(is_ssl_request(&ssl));
    }

    #[test]
    fn auth_switch_round_trip() {
        let mut out = Vec::new();
        write_auth_switch(&mut out, b"client_ed25519", &[7; 32]);
        let s = AuthSwitch::parse(&out).unwrap();
        assert_eq!((s.plugin, s.data), (&b"client_ed25519"[..], &[7u8; 32][..]));
    }

    #[test]
    fn truncated_response_is_an_error() {
        let hr = HandshakeResponse { capabilities: cap::SLUICE_SUPPORTED, user: b"u".to_vec(), ..Default::default() };
        let mut out = Vec::new();
        hr.write(&mut out);
        for n in 0..36 {
            let _ = HandshakeResponse::parse(&out[..n]);
        }
        assert!(HandshakeResponse::parse(&out[..20]).is_err());
    }
}

/// COM_CHANGE_USER.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeUser {
    pub user: Vec<u8>,
    pub auth_response: Vec<u8>,
    pub database: Vec<u8>,
    pub collation: Option<u16>,
    pub auth_plugin: Option<Vec<u8>>,
    /// The connection-attributes block, kept as sent.
    pub attributes: Option<Vec<u8>>,
}

impl ChangeUser {
    /// Parses a COM_CHANGE_USER payload (including the command byte) sent by a client with
    /// `caps` in force.
    pub fn parse(payload: &[u8], caps: u32) -> Result<ChangeUser, Malformed> {
        let mut r = Reader::new(payload);
        if r.u8("command")? != crate::consts::com::CHANGE_USER {
            return Err(Malformed("not COM_CHANGE_USER"));
        }
        let user = r.nul_str("user")?.to_vec();
        let auth_response = if caps & cap::SECURE_CONNECTION != 0 {
            let n = r.u8("auth length")? as usize;
            r.bytes(n, "auth response")?.to_vec()
        } else {
            r.nul_str("auth response")?.to_vec()
        };
        let database = r.nul_str_or_rest().to_vec();
        let mut cu = ChangeUser { user, auth_response, database, ..Default::default() };
        if r.remaining() >= 2 {
            cu.collation = Some(r.u16("collation")?);
            if caps & cap::PLUGIN_AUTH != 0 && !r.is_empty() {
                cu.auth_plugin = Some(r.nul_str_or_rest().to_vec());
            }
            if caps & cap::CONNECT_ATTRS != 0 && !r.is_empty() {
                cu.attributes = Some(r.rest().to_vec());
            }
        }
        Ok(cu)
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(crate::consts::com::CHANGE_USER);
        put_nul_str(out, &self.user);
        let n = self.auth_response.len().min(255);
        out.push(n as u8);
        out.extend_from_slice(&self.auth_response[..n]);
        put_nul_str(out, &self.database);
        if let Some(c) = self.collation {
            out.extend_from_slice(&c.to_le_bytes());
            if let Some(p) = &self.auth_plugin {
                put_nul_str(out, p);
            }
            if let Some(a) = &self.attributes {
                out.extend_from_slice(a);
            }
        }
    }
}

#[cfg(test)]
mod change_user_tests {
    use super::*;

    #[test]
    fn a_handshake_response_becomes_the_change_user_that_repeats_it() {
        let hr = HandshakeResponse {
            capabilities: cap::PROTOCOL_41 | cap::SECURE_CONNECTION | cap::PLUGIN_AUTH | cap::CONNECT_ATTRS | cap::CONNECT_WITH_DB,
            collation: 45,
            user: b"app".to_vec(),
            database: Some(b"shop".to_vec()),
            attributes: vec![(b"_client_name".to_vec(), b"x".to_vec())],
            ..Default::default()
        };
        let mut out = Vec::new();
        hr.change_user(hr.capabilities, b"p").write(&mut out);
        let back = ChangeUser::parse(&out, hr.capabilities).unwrap();
        assert_eq!(back.user, b"app");
        assert_eq!(back.database, b"shop");
        assert_eq!(back.collation, Some(45));
        assert_eq!(back.auth_plugin.as_deref(), Some(&b"p"[..]));
        assert_eq!(back.attributes.unwrap(), [15, 12, b'_', b'c', b'l', b'i', b'e', b'n', b't', b'_', b'n', b'a', b'm', b'e', 1, b'x']);
        assert!(back.auth_response.is_empty());
    }

    #[test]
    fn change_user_round_trip() {
        let cu = ChangeUser {
            user: b"bob".to_vec(),
            auth_response: vec![1; 20],
            database: b"test".to_vec(),
            collation: Some(45),
            auth_plugin: Some(b"mysql_native_password".to_vec()),
            attributes: Some(vec![0]),
        };
        let mut out = Vec::new();
        cu.write(&mut out);
        let caps = cap::SECURE_CONNECTION | cap::PLUGIN_AUTH | cap::CONNECT_ATTRS;
        assert_eq!(ChangeUser::parse(&out, caps).unwrap(), cu);
        assert!(ChangeUser::parse(&out[..3], caps).is_err());
    }
}
