//! The client leg after login: a read buffer of plain packet bytes, and writes that go through
//! the compressed framing when the client negotiated compression.

use std::io;

use bytes::{Buf, BytesMut};
use sluice_proto::compress::{self, Algorithm, FRAME_HEADER, FrameHeader};
use sluice_proto::packet::frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::net::{BUF_SIZE, PacketConn, Stream};

struct Compression {
    alg: Algorithm,
    /// Compressed bytes read but not yet decoded.
    raw: BytesMut,
    /// Scratch buffer for frames going out and for inflating frames coming in (reused).
    out: Vec<u8>,
    /// Sequence id of the next compressed frame sluice sends.
    seq: u8,
}

pub struct ClientConn {
    pub stream: Stream,
    /// Plain packet bytes from the client, not yet relayed.
    pub rbuf: BytesMut,
    /// Boxed: few sessions compress, and every session's memory counts.
    comp: Option<Box<Compression>>,
    /// How long a write may wait for the client to read (zero: forever).
    pub write_timeout: std::time::Duration,
    /// How long the client may take to send the rest of what it began (zero: forever).
    pub read_timeout: std::time::Duration,
}

/// What a parked session keeps of its client connection: the lot holds the socket, and the
/// read buffer is empty.
pub struct ClientRest {
    comp: Option<Box<Compression>>,
    write_timeout: std::time::Duration,
    read_timeout: std::time::Duration,
}

impl ClientRest {
    pub fn with_stream(self, stream: Stream) -> ClientConn {
        let (write_timeout, read_timeout) = (self.write_timeout, self.read_timeout);
        ClientConn { stream, rbuf: BytesMut::new(), comp: self.comp, write_timeout, read_timeout }
    }
}

impl ClientConn {
    /// Its stream, and the rest (the read buffer, empty, goes).
    pub fn into_rest(self) -> (Stream, ClientRest) {
        let (write_timeout, read_timeout) = (self.write_timeout, self.read_timeout);
        (self.stream, ClientRest { comp: self.comp, write_timeout, read_timeout })
    }

    pub fn new(conn: PacketConn, compression: Option<Algorithm>) -> ClientConn {
        ClientConn {
            stream: conn.stream,
            rbuf: conn.rbuf,
            comp: compression.map(|alg| Box::new(Compression { alg, raw: BytesMut::with_capacity(BUF_SIZE), out: Vec::new(), seq: 0 })),
            write_timeout: std::time::Duration::ZERO,
            read_timeout: std::time::Duration::ZERO,
        }
    }

    /// The compression negotiated at login.
    pub fn compression(&self) -> Option<Algorithm> {
        self.comp.as_ref().map(|c| c.alg)
    }

    /// Whether compressed bytes were read and not decoded yet (part of a frame).
    pub fn holds_raw_bytes(&self) -> bool {
        self.comp.as_ref().is_some_and(|c| !c.raw.is_empty())
    }

    /// Whether the connection can wait for a command without its read buffer (no TLS, no
    /// compression: those hold bytes of their own).
    pub fn can_wait_unbuffered(&self) -> bool {
        self.comp.is_none() && self.stream.can_wait_unbuffered()
    }

    /// Reads more plain bytes into `rbuf`. Returns 0 at end of stream.
    pub async fn fill(&mut self) -> io::Result<usize> {
        if self.rbuf.capacity() - self.rbuf.len() < 1024 {
            self.rbuf.reserve(BUF_SIZE);
        }
        let Some(c) = &mut self.comp else {
            return self.stream.read_into(&mut self.rbuf).await;
        };
        loop {
            if let Some(h) = FrameHeader::parse(&c.raw) {
                if c.raw.len() >= FRAME_HEADER + h.compressed_len {
                    c.out.clear();
                    compress::decompress(c.alg, &h, &c.raw[FRAME_HEADER..FRAME_HEADER + h.compressed_len], &mut c.out)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    self.rbuf.extend_from_slice(&c.out);
                    c.raw.advance(FRAME_HEADER + h.compressed_len);
                    c.seq = h.seq.wrapping_add(1);
                    if !c.out.is_empty() {
                        return Ok(c.out.len());
                    }
                    continue;
                }
                c.raw.reserve(FRAME_HEADER + h.compressed_len - c.raw.len());
            } else if c.raw.capacity() - c.raw.len() < 1024 {
                c.raw.reserve(BUF_SIZE);
            }
            // Part of a frame is the client's command begun: the rest may stall only so long
            // (boxed: the timer stays out of every idle session's task).
            let n = if c.raw.is_empty() {
                self.stream.read_buf(&mut c.raw).await?
            } else {
                Box::pin(crate::net::within(self.read_timeout, self.stream.read_buf(&mut c.raw))).await?
            };
            if n == 0 {
                return Ok(0);
            }
        }
    }

    /// Reads more of something the client began to send (the rest of a request, a file for
    /// LOAD DATA LOCAL, an auth exchange): it may stall at most `read_timeout`, like the
    /// server's `net_read_timeout`. Returns 0 at end of stream.
    pub async fn fill_rest(&mut self) -> io::Result<usize> {
        let limit = self.read_timeout;
        crate::net::within(limit, self.fill()).await
    }

    /// Reads one whole packet of at most `limit` bytes (auth exchanges after login).
    pub async fn read_packet(&mut self, limit: usize) -> io::Result<(u8, Vec<u8>)> {
        use sluice_proto::packet::{HEADER, Header};
        loop {
            if let Some(h) = Header::parse(&self.rbuf) {
                if h.len > limit {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "packet too large here"));
                }
                if self.rbuf.len() >= HEADER + h.len {
                    let p = self.rbuf[HEADER..HEADER + h.len].to_vec();
                    self.rbuf.advance(HEADER + h.len);
                    return Ok((h.seq, p));
                }
            }
            if self.fill_rest().await? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
            }
        }
    }

    /// Writes plain packet bytes to the client.
    pub async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self.write_now(data)? {
            None => Ok(()),
            Some(sent) => self.write_rest(data, sent).await,
        }
    }

    /// Writes what the socket takes at once of plain packet bytes (compressed first, on a
    /// compressed connection), with no future: None when all of it went, else how much did,
    /// for [`ClientConn::write_rest`] to go on from.
    pub fn write_now(&mut self, data: &[u8]) -> io::Result<Option<usize>> {
        let (sent, len) = match &mut self.comp {
            None => (self.stream.write_now(data)?, data.len()),
            Some(c) => {
                c.out.clear();
                c.seq = compress::compress(c.alg, data, c.seq, &mut c.out);
                (self.stream.write_now(&c.out)?, c.out.len())
            }
        };
        Ok((sent < len).then_some(sent))
    }

    /// Writes the rest of what [`ClientConn::write_now`] began with `data` after the `sent`
    /// bytes it wrote, waiting at most `client_write_timeout` for room.
    pub async fn write_rest(&mut self, data: &[u8], sent: usize) -> io::Result<()> {
        let rest = match &self.comp {
            None => &data[sent..],
            Some(c) => &c.out[sent..],
        };
        self.stream.write_rest_within(self.write_timeout, rest).await
    }

    /// Frames and writes one payload.
    pub async fn write_packet(&mut self, payload: &[u8], seq: u8) -> io::Result<()> {
        let mut out = Vec::with_capacity(payload.len() + 4);
        frame(&mut out, payload, seq);
        self.write(&out).await
    }

    /// Sends an ERR packet.
    pub async fn send_err(&mut self, seq: u8, code: u16, state: &[u8; 5], msg: &str) -> io::Result<()> {
        let mut p = Vec::with_capacity(msg.len() + 9);
        sluice_proto::basic::err_payload(&mut p, code, state, msg);
        self.write_packet(&p, seq).await
    }

    /// Ends the connection: TLS sends close_notify; a plain socket needs nothing before its
    /// close, which sends the FIN.
    pub async fn shutdown(&mut self) {
        if self.stream.is_tls() {
            let _ = self.stream.shutdown().await;
        }
    }
}

impl super::verify::AuthIo for ClientConn {
    async fn send(&mut self, payload: &[u8], seq: u8) -> io::Result<()> {
        self.write_packet(payload, seq).await
    }
    async fn recv(&mut self) -> io::Result<(u8, Vec<u8>)> {
        self.read_packet(1 << 16).await
    }
    fn secure(&self) -> bool {
        self.stream.is_tls() || self.stream.is_unix()
    }
}
