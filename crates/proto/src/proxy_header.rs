//! The PROXY protocol header (HAProxy's, versions 1 and 2) that a load balancer in front of
//! sluice sends first on a connection, to tell the client's real address; and the version 2
//! header sluice sends to a backend that accepts one. No I/O: [`parse`] looks at the bytes
//! received so far.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The first 12 bytes of a version 2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest version 1 header, `\r\n` included.
const V1_MAX: usize = 107;

/// Longest version 2 header sluice accepts (addresses and TLVs).
pub const V2_MAX: usize = 16 + 512;

/// What the bytes received so far are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Not enough yet to tell: read more.
    Incomplete,
    /// A header of `len` bytes; `source` is the client's address (None for v2 LOCAL, v1
    /// UNKNOWN, or an address family other than TCP over IPv4/IPv6: the connection's own peer
    /// stands).
    Header { len: usize, source: Option<SocketAddr> },
    /// Not a PROXY header, or a malformed one.
    Invalid(&'static str),
}

/// Looks at the first bytes of a connection.
pub fn parse(buf: &[u8]) -> Parsed {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] == V2_SIGNATURE[..n] {
        return if n < V2_SIGNATURE.len() { Parsed::Incomplete } else { parse_v2(buf) };
    }
    let n = buf.len().min(6);
    if buf[..n] != b"PROXY "[..n] {
        return Parsed::Invalid("the connection does not start with a PROXY protocol header");
    }
    parse_v1(buf)
}

fn parse_v1(buf: &[u8]) -> Parsed {
    let Some(end) = buf.windows(2).take(V1_MAX - 1).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX { Parsed::Invalid("PROXY v1 header longer than 107 bytes") } else { Parsed::Incomplete };
    };
    let Ok(line) = std::str::from_utf8(&buf[6..end]) else { return Parsed::Invalid("PROXY v1 header is not text") };
    let f: Vec<&str> = line.split(' ').collect();
    let len = end + 2;
    match f.as_slice() {
        ["UNKNOWN", ..] => Parsed::Header { len, source: None },
        [proto @ ("TCP4" | "TCP6"), src, _dst, sport, _dport] => {
            let ip: Option<IpAddr> = src.parse().ok().filter(|ip: &IpAddr| ip.is_ipv4() == (*proto == "TCP4"));
            match (ip, port(sport)) {
                (Some(ip), Some(p)) => Parsed::Header { len, source: Some(SocketAddr::new(ip, p)) },
                _ => Parsed::Invalid("PROXY v1 header with a bad address or port"),
            }
        }
        _ => Parsed::Invalid("PROXY v1 header is malformed"),
    }
}

fn port(s: &str) -> Option<u16> {
    // (No sign, no leading zeros beyond "0", as the specification says.)
    (s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() && (s == "0" || !s.starts_with('0'))).then(|| s.parse().ok()).flatten()
}

fn parse_v2(buf: &[u8]) -> Parsed {
    if buf.len() < 16 {
        return Parsed::Incomplete;
    }
    let (ver_cmd, family) = (buf[12], buf[13]);
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if ver_cmd >> 4 != 2 {
        return Parsed::Invalid("PROXY v2 header with another version");
    }
    if 16 + body > V2_MAX {
        return Parsed::Invalid("PROXY v2 header too long");
    }
    if buf.len() < 16 + body {
        return Parsed::Incomplete;
    }
    let len = 16 + body;
    let a = &buf[16..len];
    match ver_cmd & 0x0f {
        0 => return Parsed::Header { len, source: None },
        1 => {}
        _ => return Parsed::Invalid("PROXY v2 header with an unknown command"),
    }
    let source = match family {
        0x11 if a.len() >= 12 => Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])), u16::from_be_bytes([a[8], a[9]]))),
        0x21 if a.len() >= 36 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&a[..16]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), u16::from_be_bytes([a[32], a[33]])))
        }
        0x11 | 0x21 => return Parsed::Invalid("PROXY v2 header too short for its addresses"),
        // UNSPEC, UDP, Unix sockets: the connection's own peer stands.
        _ => None,
    };
    Parsed::Header { len, source }
}

/// A version 2 PROXY header (command PROXY, TCP) saying that `source` connected to `dest`.
/// Addresses of different families are both written as IPv6 (v4-mapped).
pub fn write_v2(out: &mut Vec<u8>, source: SocketAddr, dest: SocketAddr) {
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21);
    match (source, dest) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
        }
        _ => {
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&as_v6(source.ip()).octets());
            out.extend_from_slice(&as_v6(dest.ip()).octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&dest.port().to_be_bytes());
}

/// A version 1 PROXY header saying that `source` connected to `dest`. Addresses of different
/// families are both written as IPv6 (v4-mapped).
pub fn write_v1(out: &mut Vec<u8>, source: SocketAddr, dest: SocketAddr) {
    let (s, d) = match (source.ip(), dest.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (IpAddr::V4(s), IpAddr::V4(d)),
        (s, d) => (IpAddr::V6(as_v6(s)), IpAddr::V6(as_v6(d))),
    };
    let family = if s.is_ipv4() { "TCP4" } else { "TCP6" };
    let line = format!("PROXY {family} {s} {d} {} {}\r\n", source.port(), dest.port());
    out.extend_from_slice(line.as_bytes());
}

/// A PROXY header for a connection of the proxy's own, on behalf of no client (a health
/// check): v2 LOCAL, or v1 UNKNOWN. The receiver keeps the connection's own peer address.
pub fn write_local(out: &mut Vec<u8>, v2: bool) {
    if v2 {
        out.extend_from_slice(&V2_SIGNATURE);
        out.extend_from_slice(&[0x20, 0x00, 0, 0]);
    } else {
        out.extend_from_slice(b"PROXY UNKNOWN\r\n");
    }
}

fn as_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn version_1() {
        let h = b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 6033\r\n";
        assert_eq!(parse(h), Parsed::Header { len: h.len(), source: src("192.0.2.7:56324") });
        let h6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 4000 6033\r\nmore";
        assert_eq!(parse(h6), Parsed::Header { len: h6.len() - 4, source: src("[2001:db8::1]:4000") });
        assert_eq!(parse(b"PROXY UNKNOWN\r\n"), Parsed::Header { len: 15, source: None });
        for partial in [&b"PRO"[..], b"PROXY TCP4 192.0.2.7", b""] {
            assert_eq!(parse(partial), Parsed::Incomplete, "{partial:?}");
        }
        for bad in [
            &b"PROXY TCP4 192.0.2.7 10.0.0.1 56324\r\n"[..],
            b"PROXY TCP4 2001:db8::1 10.0.0.1 1 2\r\n",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 065536 1\r\n",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 -1 1\r\n",
            b"GET / HTTP/1.1\r\n",
            &[b'P'; 200],
        ] {
            assert!(matches!(parse(bad), Parsed::Invalid(_)), "{:?}", String::from_utf8_lossy(bad));
        }
        for (s, d) in [("192.0.2.7:56324", "10.0.0.1:6033"), ("[2001:db8::1]:4000", "[2001:db8::2]:6033"), ("192.0.2.7:1", "[::1]:2")] {
            let (s, d): (SocketAddr, SocketAddr) = (s.parse().unwrap(), d.parse().unwrap());
            let mut h = Vec::new();
            write_v1(&mut h, s, d);
            let want = if s.is_ipv4() == d.is_ipv4() { s } else { SocketAddr::new(IpAddr::V6(as_v6(s.ip())), s.port()) };
            assert_eq!(parse(&h), Parsed::Header { len: h.len(), source: Some(want) }, "{}", String::from_utf8_lossy(&h));
        }
        let mut unknown = Vec::new();
        write_local(&mut unknown, false);
        assert_eq!(parse(&unknown), Parsed::Header { len: 15, source: None });
        let long = [&b"PROXY "[..], &[b'x'; 120]].concat();
        assert!(matches!(parse(&long), Parsed::Invalid(_)));
    }

    #[test]
    fn version_2_both_ways() {
        for (s, d) in [("192.0.2.7:56324", "10.0.0.1:6033"), ("[2001:db8::1]:4000", "[2001:db8::2]:6033"), ("192.0.2.7:1", "[::1]:2")] {
            let (s, d): (SocketAddr, SocketAddr) = (s.parse().unwrap(), d.parse().unwrap());
            let mut h = Vec::new();
            write_v2(&mut h, s, d);
            let want =
                if s.is_ipv4() == d.is_ipv4() { s } else { SocketAddr::new(IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped()), 1) };
            assert_eq!(parse(&h), Parsed::Header { len: h.len(), source: Some(want) });
            for cut in 0..h.len() {
                assert_eq!(parse(&h[..cut]), Parsed::Incomplete, "cut at {cut}");
            }
        }
        // LOCAL (a health check of the balancer itself): no address.
        let local = [&V2_SIGNATURE[..], &[0x20, 0x00, 0, 0]].concat();
        let mut written = Vec::new();
        write_local(&mut written, true);
        assert_eq!(written, local);
        assert_eq!(parse(&local), Parsed::Header { len: 16, source: None });
        let mut bad = local.clone();
        bad[12] = 0x11;
        assert!(matches!(parse(&bad), Parsed::Invalid(_)));
        let mut short = [&V2_SIGNATURE[..], &[0x21, 0x11, 0, 4, 1, 2, 3, 4]].concat();
        assert!(matches!(parse(&short), Parsed::Invalid(_)));
        short[15] = 0xff;
        short[14] = 0xff;
        assert!(matches!(parse(&short), Parsed::Invalid(_)), "too long");
    }
}
