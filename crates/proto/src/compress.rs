//! The compressed protocol: 7-byte frame headers (compressed length, compressed sequence id,
//! uncompressed length) around zlib or zstd data carrying ordinary packets as a byte stream.

use std::io::{Read, Write};

use crate::packet::Malformed;

pub const FRAME_HEADER: usize = 7;
/// Payloads shorter than this are sent uncompressed (as the MySQL server does).
pub const MIN_COMPRESS: usize = 50;
/// Largest compressed or uncompressed length a frame can state.
pub const MAX_FRAME: usize = 0xff_ffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Zlib,
    Zstd { level: i32 },
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub compressed_len: usize,
    pub seq: u8,
    /// Zero when the frame's payload is not compressed.
    pub uncompressed_len: usize,
}

impl FrameHeader {
    pub fn parse(buf: &[u8]) -> Option<FrameHeader> {
        if buf.len() < FRAME_HEADER {
            return None;
        }
        Some(FrameHeader {
            compressed_len: u32::from_le_bytes([buf[0], buf[1], buf[2], 0]) as usize,
            seq: buf[3],
            uncompressed_len: u32::from_le_bytes([buf[4], buf[5], buf[6], 0]) as usize,
        })
    }
}

/// Appends the uncompressed content of one frame's payload to `out`. The output is bounded by
/// the length the header states, so a frame cannot inflate beyond 16 MiB.
pub fn decompress(alg: Algorithm, h: &FrameHeader, payload: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    if h.uncompressed_len == 0 {
        out.extend_from_slice(payload);
        return Ok(());
    }
    let start = out.len();
    out.reserve(h.uncompressed_len);
    let limit = h.uncompressed_len as u64 + 1;
    let res = match alg {
        Algorithm::Zlib => flate2::read::ZlibDecoder::new(payload).take(limit).read_to_end(out),
        Algorithm::Zstd { .. } => match zstd::stream::read::Decoder::with_buffer(payload) {
            Ok(d) => d.take(limit).read_to_end(out),
            Err(e) => Err(e),
        },
    };
    match res {
        Ok(n) if n == h.uncompressed_len => Ok(()),
        Ok(_) => {
            out.truncate(start);
            Err(Malformed("compressed frame length does not match its header"))
        }
        Err(_) => {
            out.truncate(start);
            Err(Malformed("corrupt compressed frame"))
        }
    }
}

/// Appends `data` as one or more frames starting at sequence id `seq`; returns the next id.
pub fn compress(alg: Algorithm, data: &[u8], mut seq: u8, out: &mut Vec<u8>) -> u8 {
    for chunk in data.chunks(MAX_FRAME).chain(if data.is_empty() { Some(&[][..]) } else { None }) {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_HEADER]);
        let mut uncompressed_len = 0;
        if chunk.len() >= MIN_COMPRESS {
            let ok = match alg {
                Algorithm::Zlib => {
                    let mut e = flate2::write::ZlibEncoder::new(&mut *out, flate2::Compression::default());
                    e.write_all(chunk).is_ok() && e.finish().is_ok()
                }
                Algorithm::Zstd { level } => zstd::stream::copy_encode(chunk, &mut *out, level).is_ok(),
            };
            let clen = out.len() - start - FRAME_HEADER;
            if ok && clen < chunk.len() && clen <= MAX_FRAME {
                uncompressed_len = chunk.len();
            } else {
                out.truncate(start + FRAME_HEADER);
            }
        }
        if uncompressed_len == 0 {
            out.extend_from_slice(chunk);
        }
        let clen = out.len() - start - FRAME_HEADER;
        let h = &mut out[start..start + FRAME_HEADER];
        h[..3].copy_from_slice(&(clen as u32).to_le_bytes()[..3]);
        h[3] = seq;
        h[4..7].copy_from_slice(&(uncompressed_len as u32).to_le_bytes()[..3]);
        seq = seq.wrapping_add(1);
    }
    seq
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(alg: Algorithm, data: &[u8]) {
        let mut framed = Vec::new();
        compress(alg, data, 0, &mut framed);
        let mut out = Vec::new();
        let mut rest = &framed[..];
        while let Some(h) = FrameHeader::parse(rest) {
            decompress(alg, &h, &rest[FRAME_HEADER..FRAME_HEADER + h.compressed_len], &mut out).unwrap();
            rest = &rest[FRAME_HEADER + h.compressed_len..];
        }
        assert_eq!(out, data);
    }

    #[test]
    fn zlib_and_zstd_round_trip() {
        for alg in [Algorithm::Zlib, Algorithm::Zstd { level: 3 }] {
            round_trip(alg, b"short");
            round_trip(alg, &vec![b'a'; 100_000]);
            round_trip(alg, &(0..200_000u32).map(|i| (i * 7919 % 251) as u8).collect::<Vec<_>>());
        }
    }

    #[test]
    fn lying_length_is_rejected() {
        let mut framed = Vec::new();
        compress(Algorithm::Zlib, &vec![b'a'; 1000], 0, &mut framed);
        let mut h = FrameHeader::parse(&framed).unwrap();
        h.uncompressed_len = 10;
        let mut out = Vec::new();
        assert!(decompress(Algorithm::Zlib, &h, &framed[FRAME_HEADER..], &mut out).is_err());
        assert!(out.is_empty());
        let h = FrameHeader { compressed_len: 4, seq: 0, uncompressed_len: 100 };
        assert!(decompress(Algorithm::Zlib, &h, b"junk", &mut out).is_err());
    }
}
