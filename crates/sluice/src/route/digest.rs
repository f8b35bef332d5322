//! Statistics per statement digest (`sluice_proto::digest`): how often each shape of statement
//! ran, how long it took, how many rows it sent and how often it failed. Each worker keeps its
//! own table behind its own lock (never contended on the per-core runtime), and a reader merges
//! them. A table holds at most `max / workers` digests; when full, the least recently used
//! tenth is evicted (and counted), so an application that sends endless distinct shapes costs
//! bounded memory.
//!
//! A statement's digest and the place of its entry come from the table of shapes (`shapes.rs`),
//! by the statement's key: only a shape not seen there costs the normalizer's pass (and a digest
//! new here the normalized text). An eviction moves entries: it starts a new generation, and
//! the shapes find their entries again.

use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::config::DigestsConfig;

/// Latency buckets: four per power of two of microseconds, up to 2^28 µs (4.5 minutes).
const OCTAVES: usize = 28;
const PER_OCTAVE: usize = 4;
const BUCKETS: usize = OCTAVES * PER_OCTAVE;

/// Where a statement's entry was: its worker's table and its slot there (checked against the
/// digest when the statement is counted: an eviction may have moved it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Mark {
    shard: u32,
    slot: u32,
}

/// How one statement went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// When it ended (`mono_ns()`).
    pub at: u64,
    pub nanos: u64,
    pub rows: u64,
    pub error: bool,
}

struct Entry {
    digest: u64,
    text: Box<str>,
    schema: Option<Box<str>>,
    count: u64,
    errors: u64,
    rows: u64,
    total_ns: u64,
    min_ns: u64,
    max_ns: u64,
    first_ns: u64,
    last_ns: u64,
    /// The table's tick when last used (for eviction).
    used: u64,
    buckets: Box<[u32; BUCKETS]>,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    /// A digest's slot in `entries`.
    slots: FxHashMap<u64, u32>,
    tick: u64,
}

/// The digests of all workers.
pub struct Digests {
    pub enabled: bool,
    /// Counted in passthrough sessions too.
    passthrough: bool,
    shards: Box<[Mutex<Table>]>,
    per_shard: usize,
    text_limit: usize,
    evictions: prometheus_client::metrics::counter::Counter,
    /// Bumped when entries move (an eviction, a reset): marks taken before are stale.
    generation: AtomicU32,
    /// `mono_ns()` and the Unix time in ms at start (for first and last seen).
    epoch: (u64, u64),
}

/// One digest as the admin API shows it (the workers' entries merged).
#[derive(Debug, Clone, Serialize)]
pub struct DigestInfo {
    pub digest: String,
    pub text: String,
    pub schema: Option<String>,
    pub count: u64,
    pub errors: u64,
    pub rows: u64,
    pub total_ms: f64,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub p99_us: f64,
    pub first_seen_unix_ms: u64,
    pub last_seen_unix_ms: u64,
    #[serde(skip)]
    buckets: Vec<u64>,
}

/// The order `/digests` lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    TotalTime,
    Count,
    Errors,
    Rows,
    Max,
    P99,
    LastSeen,
}

impl By {
    pub fn parse(s: &str) -> Option<By> {
        Some(match s {
            "total_time" => By::TotalTime,
            "count" => By::Count,
            "errors" => By::Errors,
            "rows" => By::Rows,
            "max" | "max_time" => By::Max,
            "p99" => By::P99,
            "last_seen" => By::LastSeen,
            _ => return None,
        })
    }
}

fn bucket(nanos: u64) -> usize {
    let us = (nanos / 1000).max(1);
    let octave = 63 - us.leading_zeros() as usize;
    // The two bits after the leading one pick the quarter of the octave.
    let quarter = if octave >= 2 { ((us >> (octave - 2)) & 3) as usize } else { (us << (2 - octave)) as usize & 3 };
    (octave * PER_OCTAVE + quarter).min(BUCKETS - 1)
}

/// The upper bound of a bucket, in µs.
fn bucket_top(i: usize) -> f64 {
    let (octave, quarter) = (i / PER_OCTAVE, i % PER_OCTAVE);
    (1u64 << octave) as f64 * (1.0 + (quarter + 1) as f64 / PER_OCTAVE as f64)
}

impl Digests {
    pub fn new(cfg: &DigestsConfig, shards: usize, evictions: prometheus_client::metrics::counter::Counter) -> Digests {
        let shards = shards.max(1);
        let now_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Digests {
            enabled: cfg.enabled != Some(false),
            passthrough: cfg.enabled == Some(true),
            shards: (0..shards).map(|_| Mutex::new(Table::default())).collect(),
            per_shard: (cfg.max / shards).max(16),
            text_limit: cfg.text_limit.max(16),
            evictions,
            generation: AtomicU32::new(1),
            epoch: (crate::metrics::mono_ns(), now_unix),
        }
    }

    /// Whether a session's statements are counted (`users`: a users-mode session).
    #[inline]
    pub fn counts(&self, users: bool) -> bool {
        self.enabled && (users || self.passthrough)
    }

    /// The generation of the entries' places (never 0).
    #[inline]
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Where the entry of `digest` is, made when the digest is new here (its `text`, read in
    /// `mode`, normalized), so that [`Digests::finish`] can count it once it ran.
    pub fn begin(&self, digest: u64, text: &[u8], schema: Option<&str>, mode: sluice_proto::lexer::Mode) -> Mark {
        let shard = crate::worker::shard() % self.shards.len();
        let mut t = self.shards[shard].lock();
        let slot = match t.slots.get(&digest) {
            Some(&slot) => slot,
            None => self.insert(&mut t, digest, text, schema, mode),
        };
        Mark { shard: shard as u32, slot }
    }

    /// Makes the entry of a digest new here; returns its slot.
    #[cold]
    fn insert(&self, t: &mut Table, digest: u64, text: &[u8], schema: Option<&str>, mode: sluice_proto::lexer::Mode) -> u32 {
        if t.entries.len() >= self.per_shard {
            self.evict(t);
        }
        let mut normal = Vec::with_capacity(text.len().min(self.text_limit) + 4);
        // (Normalizing takes literals out in one reading; a text that may carry a secret is
        // taken out of in every reading first.)
        match sluice_proto::secret::may_carry(text) {
            true => sluice_proto::digest::normalize(&sluice_proto::secret::redacted(text), &mut normal, self.text_limit),
            false => sluice_proto::digest::normalize_in(text, mode, &mut normal, self.text_limit),
        }
        let now = crate::metrics::mono_ns();
        t.entries.push(Entry {
            digest,
            text: String::from_utf8_lossy(&normal).into(),
            schema: schema.map(Box::from),
            count: 0,
            errors: 0,
            rows: 0,
            total_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            first_ns: now,
            last_ns: now,
            used: t.tick,
            buckets: Box::new([0; BUCKETS]),
        });
        let slot = (t.entries.len() - 1) as u32;
        t.slots.insert(digest, slot);
        slot
    }

    /// Counts a statement that ran, its entry where [`Digests::begin`] found it (one evicted
    /// meanwhile is not counted).
    #[inline]
    pub fn finish(&self, digest: u64, mark: Mark, o: Outcome) {
        let mut t = self.shards[mark.shard as usize % self.shards.len()].lock();
        t.tick += 1;
        let tick = t.tick;
        let slot = match t.entries.get(mark.slot as usize) {
            Some(e) if e.digest == digest => mark.slot,
            _ => match t.slots.get(&digest) {
                Some(&slot) => slot,
                None => return,
            },
        };
        let e = &mut t.entries[slot as usize];
        e.count += 1;
        e.errors += u64::from(o.error);
        e.rows += o.rows;
        e.total_ns += o.nanos;
        e.min_ns = e.min_ns.min(o.nanos);
        e.max_ns = e.max_ns.max(o.nanos);
        e.last_ns = o.at;
        e.used = tick;
        e.buckets[bucket(o.nanos)] += 1;
    }

    /// Drops the least recently used tenth of a full table (a new generation: slots moved).
    fn evict(&self, t: &mut Table) {
        let mut ticks: Vec<u64> = t.entries.iter().map(|e| e.used).collect();
        let k = (ticks.len() / 10).max(1);
        let (_, &mut cut, _) = ticks.select_nth_unstable(k - 1);
        let before = t.entries.len();
        t.entries.retain(|e| e.used > cut);
        t.slots = t.entries.iter().enumerate().map(|(i, e)| (e.digest, i as u32)).collect();
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.evictions.inc_by((before - t.entries.len()) as u64);
    }

    pub fn evictions(&self) -> u64 {
        self.evictions.get()
    }

    /// Digests kept now, over all workers (one digest kept by two workers counts twice).
    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().entries.len()).sum()
    }

    /// Forgets every digest.
    pub fn reset(&self) {
        for s in self.shards.iter() {
            *s.lock() = Table::default();
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The workers' entries merged, the `top` first by `by`.
    pub fn top(&self, top: usize, by: By) -> Vec<DigestInfo> {
        let mut merged: FxHashMap<u64, DigestInfo> = FxHashMap::default();
        for s in self.shards.iter() {
            let t = s.lock();
            for e in &t.entries {
                let m = merged.entry(e.digest).or_insert_with(|| self.info(e.digest, e));
                merge(m, e, self.epoch);
            }
        }
        let mut list: Vec<DigestInfo> = merged.into_values().map(finish).collect();
        let key = |d: &DigestInfo| -> f64 {
            match by {
                By::TotalTime => d.total_ms,
                By::Count => d.count as f64,
                By::Errors => d.errors as f64,
                By::Rows => d.rows as f64,
                By::Max => d.max_us,
                By::P99 => d.p99_us,
                By::LastSeen => d.last_seen_unix_ms as f64,
            }
        };
        list.sort_by(|a, b| key(b).total_cmp(&key(a)));
        list.truncate(top);
        list
    }

    fn info(&self, d: u64, e: &Entry) -> DigestInfo {
        DigestInfo {
            digest: sluice_proto::digest::hex(d),
            text: e.text.to_string(),
            schema: e.schema.as_deref().map(str::to_string),
            count: 0,
            errors: 0,
            rows: 0,
            total_ms: 0.0,
            avg_us: 0.0,
            min_us: f64::MAX,
            max_us: 0.0,
            p99_us: 0.0,
            first_seen_unix_ms: u64::MAX,
            last_seen_unix_ms: 0,
            buckets: vec![0; BUCKETS],
        }
    }
}

fn unix_ms(epoch: (u64, u64), mono: u64) -> u64 {
    epoch.1 + mono.saturating_sub(epoch.0) / 1_000_000
}

fn merge(m: &mut DigestInfo, e: &Entry, epoch: (u64, u64)) {
    m.count += e.count;
    m.errors += e.errors;
    m.rows += e.rows;
    m.total_ms += e.total_ns as f64 / 1e6;
    m.min_us = m.min_us.min(e.min_ns as f64 / 1e3);
    m.max_us = m.max_us.max(e.max_ns as f64 / 1e3);
    m.first_seen_unix_ms = m.first_seen_unix_ms.min(unix_ms(epoch, e.first_ns));
    m.last_seen_unix_ms = m.last_seen_unix_ms.max(unix_ms(epoch, e.last_ns));
    for (a, &b) in m.buckets.iter_mut().zip(e.buckets.iter()) {
        *a += u64::from(b);
    }
}

/// Derives the averages and the p99 of merged entries.
fn finish(mut m: DigestInfo) -> DigestInfo {
    if m.count == 0 {
        m.min_us = 0.0;
        return m;
    }
    m.avg_us = m.total_ms * 1e3 / m.count as f64;
    let rank = m.count - m.count / 100;
    let mut seen = 0;
    for (i, &n) in m.buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            m.p99_us = bucket_top(i).min(m.max_us).max(m.min_us);
            break;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digests(max: usize) -> Digests {
        Digests::new(&DigestsConfig { max, text_limit: 64, ..DigestsConfig::default() }, 1, Default::default())
    }

    /// Counts a statement as a session does: its shape, its entry, its outcome.
    fn run(d: &Digests, sql: &str, us: u64, at: u64) {
        use crate::route::shapes::{Shapes, Text, Want};
        thread_local!(static SHAPES: Shapes = Shapes::new(1));
        let mode = sluice_proto::lexer::Mode::DEFAULT;
        let key = sluice_proto::scan::scan_keyed(sql.as_bytes(), mode, [3, 5]).key;
        let text = Text { key, text: sql.as_bytes(), schema: Some("app"), mode };
        let shape = SHAPES.with(|s| s.of(&text, Want { class: false, digest: true, entry: true }, d));
        let (digest, mark) = (shape.digest, shape.mark);
        assert_eq!(digest, sluice_proto::digest::digest(sql.as_bytes()), "{sql}");
        // (`at`: seconds after the table began.)
        let at = d.epoch.0 + at * 1_000_000_000;
        d.finish(digest, mark, Outcome { at, nanos: us * 1000, rows: 1, error: us > 1000 });
    }

    #[test]
    fn statements_of_one_shape_are_counted_together() {
        let d = digests(100);
        for i in 0..100 {
            run(&d, &format!("SELECT c FROM t WHERE id = {i}"), 10 + i, 1);
        }
        run(&d, "SELECT c FROM t WHERE id = 5000", 5000, 2);
        run(&d, "UPDATE t SET c = 1", 50, 3);
        let top = d.top(10, By::TotalTime);
        assert_eq!(top.len(), 2);
        let s = &top[0];
        assert_eq!(s.text, "select c from t where id = ?");
        assert_eq!((s.count, s.errors, s.rows), (101, 1, 101));
        assert_eq!((s.min_us, s.max_us), (10.0, 5000.0));
        // 99 of 101 took at most 109 µs: the p99 is in their bucket, not the outlier's.
        assert!(s.p99_us >= 109.0 && s.p99_us < 140.0, "{}", s.p99_us);
        assert_eq!(d.top(1, By::LastSeen)[0].text, "update t set c = ?");
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_used() {
        let d = digests(20);
        for i in 0..20 {
            run(&d, &format!("SELECT c{i} FROM t"), 10, 1);
        }
        run(&d, "SELECT c0 FROM t", 10, 2);
        run(&d, "SELECT new FROM t", 10, 3);
        assert_eq!(d.evictions(), 2);
        let texts: Vec<String> = d.top(100, By::Count).into_iter().map(|i| i.text).collect();
        assert!(texts.contains(&"select c0 from t".to_string()) && !texts.contains(&"select c1 from t".to_string()), "{texts:?}");
        assert!(texts.contains(&"select new from t".to_string()));
    }

    #[test]
    fn buckets_grow_with_latency() {
        let mut last = 0;
        for us in [1, 2, 3, 5, 8, 100, 1000, 1_000_000] {
            let b = bucket(us * 1000);
            assert!(b > last || us == 1, "{us}");
            assert!(bucket_top(b) >= us as f64, "{us}");
            last = b;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }
}
