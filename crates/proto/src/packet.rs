//! Packet framing (3-byte length + 1-byte sequence id) and primitive field codecs.
//!
//! Nothing here allocates on the read side: [`Reader`] borrows the payload, and the framing
//! helpers only look at headers so that the relay can forward bytes it never copies.

use crate::consts::MAX_PAYLOAD;

/// Size of the packet header.
pub const HEADER: usize = 4;

/// A decoded packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: usize,
    pub seq: u8,
}

impl Header {
    /// Reads the header at the start of `buf`, if four bytes are there.
    #[inline]
    pub fn parse(buf: &[u8]) -> Option<Header> {
        if buf.len() < HEADER {
            return None;
        }
        Some(Header { len: u32::from_le_bytes([buf[0], buf[1], buf[2], 0]) as usize, seq: buf[3] })
    }

    /// True when the payload continues in the next packet (a payload of exactly 0xffffff bytes).
    #[inline]
    pub fn continues(&self) -> bool {
        self.len == MAX_PAYLOAD
    }
}

/// Writes a header for a payload of `len` bytes (which must be at most 0xffffff).
#[inline]
pub fn write_header(out: &mut Vec<u8>, len: usize, seq: u8) {
    debug_assert!(len <= MAX_PAYLOAD);
    out.extend_from_slice(&[len as u8, (len >> 8) as u8, (len >> 16) as u8, seq]);
}

/// Frames `payload` into one or more packets starting at `seq`; returns the next sequence id.
pub fn frame(out: &mut Vec<u8>, payload: &[u8], mut seq: u8) -> u8 {
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_PAYLOAD);
        write_header(out, n, seq);
        out.extend_from_slice(&rest[..n]);
        seq = seq.wrapping_add(1);
        rest = &rest[n..];
        if n < MAX_PAYLOAD {
            return seq;
        }
    }
}

/// Error for a payload that ends before a field does, or a field that is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed packet: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// A cursor over a borrowed payload.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub fn peek(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.buf.len() < n {
            return Err(Malformed(what));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, Malformed> {
        Ok(self.bytes(1, what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, Malformed> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u24(&mut self, what: &'static str) -> Result<u32, Malformed> {
        let b = self.bytes(3, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], 0]))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, Malformed> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, Malformed> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length-encoded integer. `0xfb` (NULL) is reported as an error here; use
    /// [`Reader::lenenc_or_null`] where NULL is allowed.
    pub fn lenenc(&mut self, what: &'static str) -> Result<u64, Malformed> {
        self.lenenc_or_null(what)?.ok_or(Malformed(what))
    }

    pub fn lenenc_or_null(&mut self, what: &'static str) -> Result<Option<u64>, Malformed> {
        let first = self.u8(what)?;
        Ok(Some(match first {
            0xfb => return Ok(None),
            0xfc => self.u16(what)? as u64,
            0xfd => self.u24(what)? as u64,
            0xfe => self.u64(what)?,
            0xff => return Err(Malformed(what)),
            n => n as u64,
        }))
    }

    pub fn lenenc_bytes(&mut self, what: &'static str) -> Result<&'a [u8], Malformed> {
        let n = self.lenenc(what)?;
        if n > self.buf.len() as u64 {
            return Err(Malformed(what));
        }
        self.bytes(n as usize, what)
    }

    /// Bytes up to (not including) the next NUL, consuming the NUL.
    pub fn nul_str(&mut self, what: &'static str) -> Result<&'a [u8], Malformed> {
        let pos = self.buf.iter().position(|&b| b == 0).ok_or(Malformed(what))?;
        let s = &self.buf[..pos];
        self.buf = &self.buf[pos + 1..];
        Ok(s)
    }

    /// Bytes up to the next NUL, or to the end when there is none (lenient fields).
    pub fn nul_str_or_rest(&mut self) -> &'a [u8] {
        match self.buf.iter().position(|&b| b == 0) {
            Some(pos) => {
                let s = &self.buf[..pos];
                self.buf = &self.buf[pos + 1..];
                s
            }
            None => self.rest(),
        }
    }
}

/// Appends a length-encoded integer.
pub fn put_lenenc(out: &mut Vec<u8>, n: u64) {
    if n < 0xfb {
        out.push(n as u8);
    } else if n <= 0xffff {
        out.push(0xfc);
        out.extend_from_slice(&(n as u16).to_le_bytes());
    } else if n <= 0xff_ffff {
        out.push(0xfd);
        out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
    } else {
        out.push(0xfe);
        out.extend_from_slice(&n.to_le_bytes());
    }
}

/// Appends a length-encoded string.
pub fn put_lenenc_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_lenenc(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends a NUL-terminated string.
pub fn put_nul_str(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(b);
    out.push(0);
}

/// Delimits the packets a client sends: one logical request (a packet and its 0xffffff
/// continuations), or a LOCAL INFILE upload (packets up to an empty one). Like the response
/// tracker it reports how many bytes belong to the message, so they can be forwarded as they
/// arrive, whatever their size.
#[derive(Debug, Clone, Default)]
pub struct RequestWalker {
    skip: usize,
    continued: bool,
    until_empty: bool,
    last: bool,
    /// The message is complete.
    pub done: bool,
    /// Payload bytes announced so far.
    pub total: u64,
    /// Sequence id of the last packet header seen.
    pub last_seq: u8,
}

impl RequestWalker {
    pub fn request() -> Self {
        RequestWalker::default()
    }

    pub fn until_empty() -> Self {
        RequestWalker { until_empty: true, ..Self::default() }
    }

    /// Returns how many bytes of `buf` belong to the message; sets `done` at its end.
    pub fn scan(&mut self, buf: &[u8]) -> usize {
        let mut pos = 0;
        loop {
            if self.skip > 0 {
                let n = self.skip.min(buf.len() - pos);
                pos += n;
                self.skip -= n;
                if self.skip > 0 {
                    return pos;
                }
            }
            if self.last {
                self.done = true;
                return pos;
            }
            let Some(h) = Header::parse(&buf[pos..]) else { return pos };
            pos += HEADER;
            self.skip = h.len;
            self.last_seq = h.seq;
            self.total += h.len as u64;
            let was_continued = self.continued;
            self.continued = h.continues();
            self.last = if self.until_empty { h.len == 0 && !was_continued } else { !self.continued };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenenc_round_trip() {
        for n in [0u64, 1, 250, 251, 0xffff, 0x10000, 0xff_ffff, 0x100_0000, u64::MAX] {
            let mut v = Vec::new();
            put_lenenc(&mut v, n);
            let mut r = Reader::new(&v);
            assert_eq!(r.lenenc("n").unwrap(), n);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn frame_splits_at_max_payload() {
        let payload = vec![7u8; MAX_PAYLOAD + 10];
        let mut out = Vec::new();
        let next = frame(&mut out, &payload, 3);
        assert_eq!(next, 5);
        let h1 = Header::parse(&out).unwrap();
        assert_eq!((h1.len, h1.seq), (MAX_PAYLOAD, 3));
        let h2 = Header::parse(&out[HEADER + MAX_PAYLOAD..]).unwrap();
        assert_eq!((h2.len, h2.seq), (10, 4));
    }

    #[test]
    fn exact_multiple_gets_empty_trailer() {
        let payload = vec![1u8; MAX_PAYLOAD];
        let mut out = Vec::new();
        assert_eq!(frame(&mut out, &payload, 0), 2);
        let h2 = Header::parse(&out[HEADER + MAX_PAYLOAD..]).unwrap();
        assert_eq!(h2.len, 0);
    }

    #[test]
    fn request_walker_follows_continuations_and_infile() {
        let mut big = Vec::new();
        frame(&mut big, &vec![3u8; MAX_PAYLOAD + 7], 0);
        let mut w = RequestWalker::request();
        let mut fed = 0;
        for chunk in big.chunks(100_000) {
            fed += w.scan(&big[fed..fed + chunk.len()]);
        }
        assert!(w.done);
        assert_eq!((fed, w.total, w.last_seq), (big.len(), (MAX_PAYLOAD + 7) as u64, 1));
        let mut upload = Vec::new();
        let seq = frame(&mut upload, b"a,b\n", 2);
        frame(&mut upload, b"", seq);
        upload.extend_from_slice(b"next");
        let mut w = RequestWalker::until_empty();
        assert_eq!(w.scan(&upload), upload.len() - 4);
        assert!(w.done);
    }

    #[test]
    fn truncated_fields_are_errors() {
        let mut r = Reader::new(&[0xfc, 1]);
        assert!(r.lenenc("x").is_err());
        let mut r = Reader::new(b"abc");
        assert!(r.nul_str("x").is_err());
        let mut r = Reader::new(&[5, b'a']);
        assert!(r.lenenc_bytes("x").is_err());
    }
}
