//! Traffic capture: every command of the sessions a capture takes, with a summary of its
//! response (`record.rs`), in files that a replay plays against another server.
//!
//! While no capture runs, the relay pays one relaxed load per command ([`Capture::generation`]).
//! While one runs, a session writes its records into its worker's buffer (a [`Shard`], whose
//! lock no other worker takes but the writer, now and then); a full buffer goes to the writer
//! thread over a bounded queue, and when the queue is full its records are dropped and counted:
//! the relay never waits for compression or the disk. The writer (`writer.rs`) compresses each
//! buffer into a chunk of its worker's file, rotates files by size, and writes `meta.json`.

pub mod files;
pub mod inspect;
pub mod record;
pub mod sums;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

/// Set in [`Capture::generation`] while a consistent start holds sessions at the gate.
pub const GATE: u64 = 1 << 63;

/// How long a consistent start waits for sessions to be quiet, unless told otherwise.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a consistent start may hold sessions' statements at its gate.
pub const MAX_GATE_TIMEOUT: Duration = Duration::from_secs(60);

/// A buffer this large goes to the writer. Small, and the writer gives the buffers back
/// (`Shard::spare`): the relay writes records into memory it wrote a moment ago, not into
/// lines no cache holds, and the capture keeps few lines of the caches from the database's.
const CHUNK: usize = 64 << 10;
/// Buffers a worker keeps for reuse.
const SPARE: usize = 4;
/// Full buffers waiting for the writer, per capture (16 MiB of records: about 15 seconds of
/// sysbench's oltp_read_write at 30,000 queries a second, for a disk that stalls the writer
/// while the database flushes); past it records are dropped.
const QUEUE: usize = 256;

/// The largest `rotate_mib`.
pub const MAX_ROTATE_MIB: u64 = 4096;

/// What went wrong with a capture, or with reading one back: the caller's fault (`Invalid`,
/// `State`, `KeyFile`, `NotAKey`, `Damaged`) or the host's (`Path`, `Io`).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The request's options are out of bounds, or its name is not a name.
    #[error("{0}")]
    Invalid(String),
    /// A capture runs already, none waits at its gate, or it ended meanwhile.
    #[error("{0}")]
    State(&'static str),
    /// A file or folder it was given, or makes, cannot be used.
    #[error(transparent)]
    Path(#[from] crate::sys::PathError),
    /// The key file cannot be read.
    #[error("reading the key file {0}")]
    KeyFile(crate::sys::PathError),
    /// The key file holds no key.
    #[error("{}: a key is 32 bytes, or 64 hexadecimal digits", .0.display())]
    NotAKey(PathBuf),
    /// Writing failed, or the writer could not start.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// A file of the capture does not read as one (damaged, cut short, or not a capture).
    #[error("{}: {why}", path.display())]
    Damaged { path: PathBuf, why: String },
}

/// What a capture takes and where it goes (`POST /capture/start`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// The capture's folder, made by sluice under `[capture] dir`: a name (1 to 64 of
    /// `A-Z a-z 0-9 . _ -`), or an absolute path if `[capture] allow_absolute_paths` is on.
    /// It must not exist.
    pub name: String,
    /// The capture stops by itself after this long ("30s", "5m"); none: until stopped.
    #[serde(default, deserialize_with = "crate::config::optional_duration", serialize_with = "crate::config::show_optional_duration")]
    pub duration: Option<Duration>,
    /// Only sessions of these users (all when empty).
    #[serde(default)]
    pub users: Vec<String>,
    /// Only sessions whose schema is one of these when the capture first sees them.
    #[serde(default)]
    pub schemas: Vec<String>,
    /// The share of sessions taken (whole sessions, so that each can be replayed), 0 to 1.
    #[serde(default = "all")]
    pub sample: f64,
    /// A worker's file is closed and the next one begun past this size (MiB).
    #[serde(default = "rotate_mib")]
    pub rotate_mib: u64,
    /// Encrypt the files (AES-256-GCM) with the key in this file (32 bytes, or 64 hexadecimal
    /// digits); reading them then needs it.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Start at a consistent point: sessions wait before their next command (those in a
    /// transaction once it ends) until none runs anything; the start answers then, with
    /// state "gated", so that a copy of the data can be taken that the capture starts from;
    /// `POST /capture/open` (or `gate_timeout`) lets them go and starts recording.
    #[serde(default)]
    pub consistent: bool,
    /// How long sessions may be held at the gate, at most (the start fails when they are not
    /// all quiet by then; the gate opens by itself once this long passed after that).
    #[serde(default, deserialize_with = "crate::config::optional_duration", serialize_with = "crate::config::show_optional_duration")]
    pub gate_timeout: Option<Duration>,
    /// Testing: the writer pauses this long before each chunk (to see drops).
    #[serde(default, deserialize_with = "crate::config::optional_duration", serialize_with = "crate::config::show_optional_duration")]
    pub writer_delay: Option<Duration>,
}

impl Options {
    /// The options' own bounds (the folder and the key file are checked when the capture starts).
    pub fn check(&self) -> Result<(), CaptureError> {
        if !(self.sample > 0.0 && self.sample <= 1.0) {
            return Err(CaptureError::Invalid(format!("sample must be above 0 and at most 1, not {}", self.sample)));
        }
        if self.rotate_mib == 0 || self.rotate_mib > MAX_ROTATE_MIB {
            return Err(CaptureError::Invalid(format!("rotate_mib must be at least 1 and at most {MAX_ROTATE_MIB}")));
        }
        if !self.name.starts_with('/') {
            files::check_name(&self.name)?;
        }
        if self.gate_timeout.is_some_and(|t| t > MAX_GATE_TIMEOUT) {
            let secs = MAX_GATE_TIMEOUT.as_secs();
            return Err(CaptureError::Invalid(format!("gate_timeout must be at most {secs} s: sessions' statements wait at the gate")));
        }
        Ok(())
    }
}

fn all() -> f64 {
    1.0
}

fn rotate_mib() -> u64 {
    256
}

/// A backend as the capture's meta file names it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendInfo {
    pub name: String,
    pub address: String,
    pub version: Option<String>,
}

/// Where a capture stands (`GET /capture`, and `meta.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    /// "idle" (none ever ran), "running", "done" or "failed".
    pub state: String,
    pub dir: Option<PathBuf>,
    pub started_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    pub sessions: u64,
    pub commands: u64,
    pub records: u64,
    pub dropped_records: u64,
    /// Record bytes before compression, and file bytes written.
    pub bytes_raw: u64,
    pub bytes_written: u64,
    pub files: Vec<String>,
    pub error: Option<String>,
    /// What ended it: "stop" (asked), "duration", "upgrade" (the process handed its sessions
    /// to a new one, which does not go on with it), "shutdown", "error".
    #[serde(default)]
    pub ended_by: Option<String>,
    /// The files are sealed with a key.
    pub encrypted: bool,
    pub options: Option<Options>,
    pub backends: Vec<BackendInfo>,
    pub sluice_version: String,
}

/// What [`Capture::append`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A session's state when first seen.
    Begin,
    /// A command and its result: two records.
    Command,
    /// Any other record.
    Other,
}

/// A full buffer on its way to the writer.
struct Chunk {
    worker: usize,
    bytes: Vec<u8>,
}

/// One worker's buffer, and its counts (kept under its lock, which only its worker takes on
/// the relay's path: no counter is shared between workers).
#[derive(Default)]
struct Shard {
    /// The capture the buffer is for (0: none runs).
    generation: u64,
    buf: Vec<u8>,
    /// Records in `buf`.
    records: u64,
    tx: Option<SyncSender<Chunk>>,
    counts: Counts,
    /// Buffers the writer is done with, to fill next.
    spare: Vec<Vec<u8>>,
}

impl Shard {
    /// An empty buffer to fill next: a spare one if there is.
    fn fresh(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_else(|| Vec::with_capacity(CHUNK + CHUNK / 4))
    }
}

/// A worker's shard, on cache lines of its own (workers never write to the same line).
#[derive(Default)]
#[repr(align(128))]
struct Padded(Mutex<Shard>);

impl std::ops::Deref for Padded {
    type Target = Mutex<Shard>;
    fn deref(&self) -> &Mutex<Shard> {
        &self.0
    }
}

/// Counts of the capture running.
#[derive(Default, Clone, Copy)]
struct Counts {
    sessions: u64,
    commands: u64,
    records: u64,
    dropped: u64,
    bytes_raw: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.sessions += o.sessions;
        self.commands += o.commands;
        self.records += o.records;
        self.dropped += o.dropped;
        self.bytes_raw += o.bytes_raw;
    }

    fn show(&self, st: &mut Status) {
        st.sessions = self.sessions;
        st.commands = self.commands;
        st.records = self.records;
        st.dropped_records = self.dropped;
        st.bytes_raw = self.bytes_raw;
    }
}

struct Inner {
    generation: AtomicU64,
    /// `metrics::mono_ns` when the running capture started (its gate opened).
    t0_ns: AtomicU64,
    /// Sessions held at the gate wait on this.
    gate: tokio::sync::Notify,
    shards: Box<[Padded]>,
    filters: Mutex<Arc<Options>>,
    /// The running capture's status as its writer last published it.
    status: Mutex<Status>,
    stop: AtomicBool,
    /// Why it was told to stop ("stop", "upgrade", "shutdown").
    stopped_by: Mutex<Option<&'static str>>,
    records_total: Counter,
    dropped_total: Counter,
}

/// A running capture: its writer thread and what it will report.
struct Running {
    thread: std::thread::JoinHandle<Status>,
}

pub struct Capture {
    inner: Arc<Inner>,
    running: Mutex<Option<Running>>,
    last: Mutex<Option<Status>>,
    next_generation: AtomicU64,
}

impl Capture {
    /// `shards` buffers (one per worker, and one for the shared runtime); the counters are the
    /// metrics' `sluice_capture_records_total` and `sluice_capture_dropped_records_total`.
    pub fn new(shards: usize, records_total: Counter, dropped_total: Counter) -> Capture {
        let inner = Inner {
            generation: AtomicU64::new(0),
            t0_ns: AtomicU64::new(0),
            gate: tokio::sync::Notify::new(),
            shards: (0..shards.max(1)).map(|_| Padded::default()).collect(),
            filters: Mutex::new(Arc::new(Options {
                name: String::new(),
                duration: None,
                users: Vec::new(),
                schemas: Vec::new(),
                sample: 1.0,
                rotate_mib: rotate_mib(),
                key_file: None,
                consistent: false,
                gate_timeout: None,
                writer_delay: None,
            })),
            status: Mutex::new(Status::default()),
            stop: AtomicBool::new(false),
            stopped_by: Mutex::new(None),
            records_total,
            dropped_total,
        };
        Capture { inner: Arc::new(inner), running: Mutex::new(None), last: Mutex::new(None), next_generation: AtomicU64::new(1) }
    }

    /// The capture running (0: none; with [`GATE`]: held at its gate). A session compares it
    /// with the one it last decided on.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Relaxed)
    }

    /// Waits while the gate of a consistent start is closed.
    pub async fn wait_gate(&self) {
        loop {
            let opened = self.inner.gate.notified();
            if self.generation() & GATE == 0 {
                return;
            }
            // (Bounded, in case the wake-up came between the check and the wait.)
            let _ = tokio::time::timeout(Duration::from_millis(100), opened).await;
        }
    }

    /// Opens the gate of a consistent start: recording begins now. Err: no capture is gated.
    pub fn open(&self) -> Result<(), CaptureError> {
        self.inner.open()
    }

    /// Microseconds from the capture's start to `now_ns` (`metrics::mono_ns`).
    pub fn at_us(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.inner.t0_ns.load(Ordering::Relaxed)) / 1000
    }

    /// Whether capture `generation` takes session `id` of `user`, in `schema` now: its filters
    /// and its sample (a hash of the id, so that the same share is taken at any rate).
    pub fn admits(&self, id: u64, user: &str, schema: Option<&str>) -> bool {
        let f = self.inner.filters.lock().clone();
        if !f.users.is_empty() && !f.users.iter().any(|u| u == user) {
            return false;
        }
        if !f.schemas.is_empty() && !schema.is_some_and(|s| f.schemas.iter().any(|x| x == s)) {
            return false;
        }
        if f.sample >= 1.0 {
            return true;
        }
        let h = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11;
        (h as f64 / (1u64 << 53) as f64) < f.sample
    }

    /// Writes one record into `worker`'s buffer with `write`, if capture `generation` still
    /// runs; false when it ended (the record is not written).
    pub fn append(&self, worker: usize, generation: u64, kind: Kind, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        let inner = &self.inner;
        let w = worker % inner.shards.len();
        let mut shard = inner.shards[w].lock();
        if shard.generation != generation || generation & GATE != 0 {
            return false;
        }
        let before = shard.buf.len();
        write(&mut shard.buf);
        let written = (shard.buf.len() - before) as u64;
        let records = if kind == Kind::Command { 2 } else { 1 };
        shard.records += records;
        let c = &mut shard.counts;
        c.records += records;
        c.bytes_raw += written;
        match kind {
            Kind::Begin => c.sessions += 1,
            Kind::Command => c.commands += 1,
            Kind::Other => {}
        }
        if shard.buf.len() >= CHUNK {
            let fresh = shard.fresh();
            let bytes = std::mem::replace(&mut shard.buf, fresh);
            let records = std::mem::take(&mut shard.records);
            let sent = shard.tx.as_ref().map(|tx| tx.try_send(Chunk { worker: w, bytes }));
            match sent {
                Some(Err(TrySendError::Full(back) | TrySendError::Disconnected(back))) => {
                    // The writer cannot keep up: these records are lost, and counted.
                    shard.counts.dropped += records;
                    inner.dropped_total.inc_by(records);
                    let fresh = std::mem::replace(&mut shard.buf, back.bytes);
                    shard.buf.clear();
                    shard.spare.push(fresh);
                }
                _ => {
                    inner.records_total.inc_by(records);
                }
            }
        }
        true
    }

    /// Starts a capture in a new folder under `config`'s. Err: one runs already, or the
    /// folder or the key file cannot be used.
    pub fn start(&self, opts: Options, config: &crate::config::CaptureConfig, backends: Vec<BackendInfo>) -> Result<Status, CaptureError> {
        opts.check()?;
        // Read before any lock is taken: reading a key file cannot hold up `status`.
        let key = opts.key_file.as_deref().map(files::load_key).transpose()?;
        let mut running = self.running.lock();
        if running.as_ref().is_some_and(|r| !r.thread.is_finished()) {
            return Err(CaptureError::State("a capture is running: stop it first"));
        }
        if let Some(r) = running.take() {
            *self.last.lock() = Some(r.thread.join().unwrap_or_else(|_| failed("the capture writer panicked")));
        }
        let dir = files::make_dir(config, &opts.name)?;
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let inner = &self.inner;
        inner.stop.store(false, Ordering::Relaxed);
        *inner.stopped_by.lock() = None;
        *inner.filters.lock() = Arc::new(opts.clone());
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let status = Status {
            state: "running".into(),
            dir: Some(dir.path().to_path_buf()),
            started_at_ms: unix_ms(),
            encrypted: key.is_some(),
            options: Some(opts.clone()),
            backends,
            sluice_version: env!("CARGO_PKG_VERSION").into(),
            ..Status::default()
        };
        let writer = writer::Writer::new(opts, dir, key, status.clone(), generation, Arc::clone(inner))?;
        inner.t0_ns.store(crate::metrics::mono_ns(), Ordering::Relaxed);
        for s in inner.shards.iter() {
            let mut s = s.lock();
            s.generation = generation;
            s.buf.clear();
            s.records = 0;
            s.counts = Counts::default();
            s.tx = Some(tx.clone());
        }
        drop(tx);
        inner
            .generation
            .store(if status.options.as_ref().is_some_and(|o| o.consistent) { generation | GATE } else { generation }, Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name("sluice-capture".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| CaptureError::Io { what: "starting the capture writer".into(), source })?;
        *running = Some(Running { thread });
        tracing::info!(dir = %status.dir.as_ref().map(|d| d.display().to_string()).unwrap_or_default(), "capture started");
        Ok(status)
    }

    /// Stops the running capture and waits for its writer to finish the files; its final
    /// status (None when none ran). Blocks: call it off the event loop.
    pub fn stop(&self) -> Option<Status> {
        self.end("stop")
    }

    /// Ends the running capture as [`Capture::stop`] does, saying why in its `ended_by`
    /// ("upgrade": the process handed its sessions to a new one; "shutdown").
    pub fn end(&self, why: &'static str) -> Option<Status> {
        if self.running.lock().as_ref().is_some_and(|r| !r.thread.is_finished()) {
            *self.inner.stopped_by.lock() = Some(why);
        }
        self.inner.stop.store(true, Ordering::Relaxed);
        let r = self.running.lock().take();
        if let Some(r) = r {
            let st = r.thread.join().unwrap_or_else(|_| failed("the capture writer panicked"));
            *self.last.lock() = Some(st);
        }
        self.last.lock().clone()
    }

    /// The running capture's status, else the last one's.
    pub fn status(&self) -> Status {
        let finished = {
            let running = self.running.lock();
            match running.as_ref() {
                Some(r) if !r.thread.is_finished() => {
                    let mut st = self.inner.status.lock().clone();
                    self.inner.counts().show(&mut st);
                    return st;
                }
                Some(_) => true,
                None => false,
            }
        };
        // A capture that ended by itself (its duration, a disk error): its final status.
        if finished {
            return self.stop().unwrap_or_default();
        }
        self.last.lock().clone().unwrap_or_else(|| Status { state: "idle".into(), ..Status::default() })
    }
}

impl Inner {
    /// Gives a buffer the writer is done with back to `worker`, while capture `generation` runs.
    fn recycle(&self, worker: usize, generation: u64, mut bytes: Vec<u8>) {
        let mut s = self.shards[worker].lock();
        if s.generation == generation && s.spare.len() < SPARE && bytes.capacity() <= 4 * CHUNK {
            bytes.clear();
            s.spare.push(bytes);
        }
    }

    /// The counts of every worker.
    fn counts(&self) -> Counts {
        let mut all = Counts::default();
        for s in self.shards.iter() {
            all.add(&s.lock().counts);
        }
        all
    }

    fn open(&self) -> Result<(), CaptureError> {
        let now = self.generation.load(Ordering::Relaxed);
        if now & GATE == 0 {
            return Err(CaptureError::State("no capture waits at its gate"));
        }
        self.t0_ns.store(crate::metrics::mono_ns(), Ordering::Relaxed);
        if self.generation.compare_exchange(now, now & !GATE, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return Err(CaptureError::State("the capture ended"));
        }
        self.gate.notify_waiters();
        tracing::info!("capture gate opened: recording");
        Ok(())
    }
}

fn failed(msg: &str) -> Status {
    Status { state: "failed".into(), error: Some(msg.into()), ..Status::default() }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
