//! Capture files on disk: a directory with `meta.json` and one series of files per worker
//! (`w00-00000.cap`, `w00-00001.cap`, ... as they rotate), each [`MAGIC`] and then chunks:
//! `u32` length of the records, `u32` length stored, a codec byte, the stored bytes, and the
//! XXH3 checksum (`u64`) of the chunk's header and stored bytes. Files of the first version
//! ([`MAGIC_V1`]) have no checksums.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::record::{self, MAGIC, MAGIC_V1, Record};
use super::{CaptureError, Status};
use crate::config::CaptureConfig;
use crate::sys::Dir;

/// Codec byte: zstd; with [`SEALED`], then sealed with AES-256-GCM (a 12-byte random nonce
/// before the sealed bytes, the tag after them).
const ZSTD: u8 = 1;
const SEALED: u8 = 0x80;
const NONCE: usize = 12;

/// The key of an encrypted capture.
pub type Key = aws_lc_rs::aead::LessSafeKey;

/// Reads a capture key: a regular file of 32 bytes, or of 64 hexadecimal digits.
pub fn load_key(path: &Path) -> Result<Key, CaptureError> {
    let raw = crate::sys::read_regular(path, 4096).map_err(CaptureError::KeyFile)?;
    let text = String::from_utf8_lossy(&raw);
    let hex = text.trim();
    let bytes: Vec<u8> = if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits")).collect()
    } else {
        raw
    };
    let unbound =
        aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, &bytes).map_err(|_| CaptureError::NotAKey(path.to_path_buf()))?;
    Ok(Key::new(unbound))
}
/// The length of a capture file with no chunk (its magic bytes).
pub const MAGIC_LEN: u64 = MAGIC.len() as u64;
/// Largest chunk a reader accepts (records before compression).
const MAX_CHUNK: usize = 64 << 20;
/// Largest capture file a reader accepts (files rotate at `rotate_mib`, at most [`super::MAX_ROTATE_MIB`]).
const MAX_FILE: u64 = (super::MAX_ROTATE_MIB + 64) << 20;
/// Largest `meta.json` a reader accepts.
const MAX_META: u64 = 16 << 20;

/// Makes the folder of a new capture: `name` under `[capture] dir` (which is made, 0700, if
/// missing), or an absolute path where the configuration allows it. The folder must not exist:
/// sluice makes it, 0700, and reaches it through no symbolic link.
pub fn make_dir(config: &CaptureConfig, name: &str) -> Result<Dir, CaptureError> {
    if name.starts_with('/') {
        if !config.allow_absolute_paths {
            let msg = format!("{name}: a capture is named, not given a path ([capture] allow_absolute_paths is off)");
            return Err(CaptureError::Invalid(msg));
        }
        let path = Path::new(name);
        let (Some(parent), Some(last)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
            return Err(CaptureError::Invalid(format!("{name}: not a folder's path")));
        };
        return Ok(Dir::open_shared(parent, false)?.make_child(last)?);
    }
    check_name(name)?;
    Ok(Dir::open(&config.dir, true)?.make_child(name)?)
}

/// A capture's name: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with a dot.
pub fn check_name(name: &str) -> Result<(), CaptureError> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        return Ok(());
    }
    Err(CaptureError::Invalid(format!("{name:?} is not a capture name: 1 to 64 of A-Z a-z 0-9 . _ -, not starting with a dot")))
}

pub fn file_name(worker: usize, index: u32) -> String {
    format!("w{worker:02}-{index:05}.cap")
}

/// zstd's level for capture chunks: one of its fast levels, as the writer's CPU competes with the
/// relay's. sysbench oltp_read_write's records shrink 2.2 times at this level and 2.9 times at
/// level 1, which takes 1.7 times the instructions.
const LEVEL: i32 = -3;

/// Written bytes are handed to the disk each time this many more are written, so that they
/// reach it as they come rather than in the kernel's bursts of dirty pages, which stall
/// the database's own writes and syncs when it shares the disk.
const WRITEBACK_EVERY: u64 = 1 << 20;

/// A worker's file being written.
pub struct Out {
    pub name: String,
    file: File,
    pub size: u64,
    /// Bytes handed to the disk so far.
    written_back: u64,
    /// One compression context for all its chunks, and the buffer they are compressed into.
    zstd: zstd::bulk::Compressor<'static>,
    stored: Vec<u8>,
}

impl Out {
    pub fn create(dir: &Dir, name: String) -> std::io::Result<Out> {
        let mut file = dir.create_file(&name)?;
        file.write_all(MAGIC)?;
        let zstd = zstd::bulk::Compressor::new(LEVEL)?;
        Ok(Out { name, file, size: MAGIC.len() as u64, written_back: 0, zstd, stored: Vec::new() })
    }

    /// Compresses `records` into a chunk (sealed with `key`, if given) and appends it; returns
    /// the bytes written.
    pub fn chunk(&mut self, records: &[u8], key: Option<&Key>) -> std::io::Result<u64> {
        let stored = &mut self.stored;
        stored.clear();
        stored.reserve(zstd::zstd_safe::compress_bound(records.len()) + NONCE + 16);
        self.zstd.compress_to_buffer(records, stored)?;
        let mut codec = ZSTD;
        if let Some(key) = key {
            let mut nonce = [0u8; NONCE];
            aws_lc_rs::rand::fill(&mut nonce).map_err(|_| std::io::Error::other("no random bytes for a nonce"))?;
            let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce);
            key.seal_in_place_append_tag(n, aws_lc_rs::aead::Aad::empty(), stored)
                .map_err(|_| std::io::Error::other("sealing a chunk failed"))?;
            stored.splice(0..0, nonce);
            codec |= SEALED;
        }
        let mut head = [0u8; 9];
        head[..4].copy_from_slice(&(records.len() as u32).to_le_bytes());
        head[4..8].copy_from_slice(&(stored.len() as u32).to_le_bytes());
        head[8] = codec;
        let sum = checksum(&head, stored);
        self.file.write_all(&head)?;
        self.file.write_all(stored)?;
        self.file.write_all(&sum.to_le_bytes())?;
        let n = 9 + stored.len() as u64 + 8;
        self.size += n;
        if self.size - self.written_back >= WRITEBACK_EVERY {
            self.write_back();
        }
        Ok(n)
    }

    /// Starts the disk's writing of what was written since the last time (without waiting
    /// for it: `sync_file_range`, Linux's).
    fn write_back(&mut self) {
        let (from, len) = (self.written_back, self.size - self.written_back);
        if let Err(e) = crate::sys::process::start_write_back(&self.file, from, len) {
            tracing::debug!(error = %e, "sync_file_range on a capture file");
        }
        self.written_back = self.size;
    }

    pub fn finish(self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

/// Writes `meta.json` (through a temporary file, so that a reader never sees half of it).
pub fn write_meta(dir: &Dir, status: &Status) -> std::io::Result<()> {
    dir.replace_file("meta.json", &serde_json::to_vec_pretty(status).map_err(std::io::Error::other)?)
}

pub fn read_meta(dir: &Path) -> Result<Status, CaptureError> {
    let path = dir.join("meta.json");
    let text = crate::sys::read_regular(&path, MAX_META)?;
    serde_json::from_slice(&text).map_err(|e| CaptureError::Damaged { path, why: e.to_string() })
}

/// The capture files of `dir`, by worker and then in the order they were written (regular
/// files only: anything else named `*.cap` is an error).
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, CaptureError> {
    let at = crate::sys::PathError::at(dir);
    let rd = std::fs::read_dir(dir).map_err(|e| at(e.into()))?;
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|e| at(e.into()))?;
        let path = e.path();
        if path.extension().is_some_and(|x| x == "cap") {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                return Err(crate::sys::PathError::at(&path)(crate::sys::Problem::NotRegular).into());
            }
            v.push(path);
        }
    }
    v.sort();
    Ok(v)
}

/// The checksum of a chunk: its header and stored bytes.
fn checksum(head: &[u8; 9], stored: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = twox_hash::XxHash3_64::default();
    h.write(head);
    h.write(stored);
    h.finish()
}

/// The records of one file, chunk by chunk (`key`: the capture's, if it is encrypted).
pub fn read_file(path: &Path, key: Option<&Key>) -> Result<Vec<Record>, CaptureError> {
    let at = |why: String| CaptureError::Damaged { path: path.to_path_buf(), why };
    let bytes = crate::sys::read_regular(path, MAX_FILE)?;
    let (mut rest, summed) = match bytes.split_first_chunk::<8>() {
        Some((m, rest)) if m == MAGIC => (rest, true),
        Some((m, rest)) if m == MAGIC_V1 => (rest, false),
        _ => return Err(at("not a sluice capture file".into())),
    };
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (records, after) = chunk(rest, summed, key).map_err(|e| at(format!("chunk {}: {e}", out.len())))?;
        out.extend(record::decode(&records).map_err(|e| at(e.to_string()))?);
        rest = after;
    }
    Ok(out)
}

/// Why a chunk does not read.
#[derive(Debug, thiserror::Error)]
enum ChunkError {
    #[error("its header is cut short")]
    CutShort,
    #[error("it does not make sense (codec {codec}, {raw} bytes, {stored} stored): the file is damaged")]
    Nonsense { codec: u8, raw: usize, stored: usize },
    #[error("its checksum does not match: the file is damaged")]
    Checksum,
    #[error("the capture is encrypted: give its key file")]
    Encrypted,
    #[error("a sealed chunk cut short")]
    SealedCutShort,
    #[error("the key does not open this capture")]
    WrongKey,
    #[error("decompressing: {0}")]
    Decompress(std::io::Error),
    #[error("{got} bytes decompressed where its header says {raw}: the file is damaged")]
    Length { got: usize, raw: usize },
}

/// The records of the chunk `bytes` begin with, and the bytes after it.
fn chunk<'a>(bytes: &'a [u8], summed: bool, key: Option<&Key>) -> Result<(Vec<u8>, &'a [u8]), ChunkError> {
    let Some((head, body)) = bytes.split_first_chunk::<9>() else { return Err(ChunkError::CutShort) };
    let raw = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let sum_len = if summed { 8 } else { 0 };
    if head[8] & !SEALED != ZSTD || raw > MAX_CHUNK || stored + sum_len > body.len() {
        return Err(ChunkError::Nonsense { codec: head[8], raw, stored });
    }
    let (data, rest) = body.split_at(stored);
    let rest = if summed {
        let (sum, rest) = rest.split_first_chunk::<8>().expect("length checked above");
        if u64::from_le_bytes(*sum) != checksum(head, data) {
            return Err(ChunkError::Checksum);
        }
        rest
    } else {
        rest
    };
    let mut opened = Vec::new();
    let compressed = if head[8] & SEALED == 0 {
        data
    } else {
        let Some(key) = key else { return Err(ChunkError::Encrypted) };
        let (nonce, sealed) = data.split_first_chunk::<NONCE>().ok_or(ChunkError::SealedCutShort)?;
        opened.extend_from_slice(sealed);
        let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(*nonce);
        let plain = key.open_in_place(n, aws_lc_rs::aead::Aad::empty(), &mut opened).map_err(|_| ChunkError::WrongKey)?;
        &plain[..]
    };
    let records = zstd::bulk::decompress(compressed, raw).map_err(ChunkError::Decompress)?;
    if records.len() != raw {
        return Err(ChunkError::Length { got: records.len(), raw });
    }
    Ok((records, rest))
}
