//! What the latency-aware policy (`balance = "least-latency"`) weighs: each backend's response
//! time (an exponentially weighted moving average of its health probes' round trips) and, for a
//! TiDB server with a status address, its CPU and memory use (read from its `/metrics`). They
//! give each backend a factor (per mille) that scales its weight: the slowest backends, and
//! those with less CPU to spare or short of memory, get fewer sessions.
//!
//! Against flapping (TiProxy's guard): a factor changes only when the new one differs from it by
//! more than a fifth, so readings that wander a little move no session; the rebalancer then
//! moves sessions only while a backend is more than one session from its share.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Unknown (no reading yet, or not a TiDB server).
const UNKNOWN: u32 = u32::MAX;

/// How often a TiDB server's `/metrics` is read at most (as often as TiProxy reads it): the text
/// is large (760 KB from an idle tidb-server), and the server spends its CPU writing it.
pub const METRICS_EVERY: Duration = Duration::from_secs(5);

/// Whether `/metrics` is to be read now, given when it was `last` asked for (once per
/// [`METRICS_EVERY`]); true counts as asked.
pub fn metrics_due(last: &mut Option<Instant>, now: Instant) -> bool {
    if last.is_some_and(|at| now.duration_since(at) < METRICS_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// A backend's readings and the factor they give.
pub struct Readings {
    /// Response time, microseconds (EWMA; 0: no probe timed yet).
    rtt_us: AtomicU64,
    /// CPU in use of what the server may use, per mille (TiDB).
    cpu: AtomicU32,
    /// Memory in use of its quota, per mille (TiDB).
    memory: AtomicU32,
    /// The factor in force, per mille of the weight.
    factor: AtomicU32,
    /// The last CPU counter read: when, and the process's CPU seconds then.
    last_cpu: Mutex<Option<(Instant, f64)>>,
}

impl Default for Readings {
    fn default() -> Readings {
        Readings {
            rtt_us: AtomicU64::new(0),
            cpu: AtomicU32::new(UNKNOWN),
            memory: AtomicU32::new(UNKNOWN),
            factor: AtomicU32::new(1000),
            last_cpu: Mutex::new(None),
        }
    }
}

/// What `/backends` shows of them.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct View {
    pub latency_ms: Option<f64>,
    pub cpu: Option<f64>,
    pub memory: Option<f64>,
    /// The factor of the weight the latency-aware policy uses.
    pub factor: f64,
}

impl Readings {
    /// A probe's round trip: the average moves a third of the way to it.
    pub fn add_rtt(&self, d: Duration) {
        let sample = d.as_micros().min(u64::MAX as u128) as u64;
        let old = self.rtt_us.load(Ordering::Relaxed);
        let new = if old == 0 { sample.max(1) } else { (old * 2 + sample) / 3 };
        self.rtt_us.store(new.max(1), Ordering::Relaxed);
    }

    pub fn rtt_us(&self) -> Option<u64> {
        Some(self.rtt_us.load(Ordering::Relaxed)).filter(|&v| v > 0)
    }

    /// A TiDB server's `/metrics` text: its CPU use since the last reading (over the CPUs it
    /// may use) and its memory use (over its quota, when it has one).
    pub fn add_metrics(&self, text: &str, now: Instant) {
        let m = Metrics::parse(text);
        if let (Some(cpu_s), Some(procs)) = (m.cpu_seconds, m.maxprocs.filter(|p| *p > 0.0)) {
            let mut last = self.last_cpu.lock();
            if let Some((at, before)) = *last {
                let wall = now.duration_since(at).as_secs_f64();
                if wall > 0.0 && cpu_s >= before {
                    let used = ((cpu_s - before) / wall / procs).clamp(0.0, 1.0);
                    self.cpu.store((used * 1000.0) as u32, Ordering::Relaxed);
                }
            }
            *last = Some((now, cpu_s));
        }
        if let (Some(rss), Some(quota)) = (m.rss, m.memory_quota.filter(|q| *q > 0.0)) {
            self.memory.store(((rss / quota).clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
        }
    }

    pub fn factor(&self) -> u32 {
        self.factor.load(Ordering::Relaxed)
    }

    /// Sets the factor from the readings, given the fastest response time among the backends
    /// (`fastest_us`); returns whether it changed.
    pub fn refresh(&self, fastest_us: Option<u64>) -> bool {
        let latency = match (fastest_us, self.rtt_us()) {
            (Some(f), Some(mine)) => f as f64 / mine as f64,
            _ => 1.0,
        };
        let per_mille = |v: &AtomicU32| Some(v.load(Ordering::Relaxed)).filter(|&v| v != UNKNOWN).map(|v| v as f64 / 1000.0);
        // The CPU left (a busy server gets less), and a tenth for one short of memory.
        let cpu = per_mille(&self.cpu).map_or(1.0, |c| (1.0 - c).max(0.05));
        let memory = if per_mille(&self.memory).is_some_and(|m| m > 0.75) { 0.1 } else { 1.0 };
        let new = ((latency * cpu * memory * 1000.0).round() as u32).clamp(10, 1000);
        let old = self.factor();
        let apart = new.max(old) as f64 / new.min(old).max(1) as f64;
        if apart > 1.2 {
            self.factor.store(new, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub fn view(&self) -> View {
        let per_mille = |v: &AtomicU32| Some(v.load(Ordering::Relaxed)).filter(|&v| v != UNKNOWN).map(|v| v as f64 / 1000.0);
        View {
            latency_ms: self.rtt_us().map(|us| us as f64 / 1000.0),
            cpu: per_mille(&self.cpu),
            memory: per_mille(&self.memory),
            factor: self.factor() as f64 / 1000.0,
        }
    }
}

/// The series of TiDB's `/metrics` the readings use.
#[derive(Debug, Default, PartialEq)]
struct Metrics {
    cpu_seconds: Option<f64>,
    maxprocs: Option<f64>,
    rss: Option<f64>,
    memory_quota: Option<f64>,
}

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else { continue };
            let Ok(v) = value.trim().parse::<f64>() else { continue };
            match name.trim() {
                "process_cpu_seconds_total" => m.cpu_seconds = Some(v),
                "tidb_server_maxprocs" => m.maxprocs = Some(v),
                "process_resident_memory_bytes" => m.rss = Some(v),
                "tidb_server_memory_quota_bytes" => m.memory_quota = Some(v),
                _ => {}
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidb_metrics_give_cpu_and_memory_use() {
        let r = Readings::default();
        let t0 = Instant::now();
        let text = |cpu: f64| {
            format!(
                "# HELP x\nprocess_cpu_seconds_total {cpu}\ntidb_server_maxprocs 2\nprocess_resident_memory_bytes 800\n\
                 tidb_server_memory_quota_bytes 1000\nother{{a=\"b\"}} 5\n"
            )
        };
        r.add_metrics(&text(10.0), t0);
        assert_eq!(r.view().cpu, None, "one reading gives no rate");
        r.add_metrics(&text(12.0), t0 + Duration::from_secs(2));
        // 2 CPU seconds in 2 s over 2 CPUs: half.
        assert_eq!(r.view().cpu, Some(0.5));
        assert_eq!(r.view().memory, Some(0.8));
    }

    #[test]
    fn a_slower_or_busier_backend_gets_a_smaller_factor_but_small_changes_none() {
        let r = Readings::default();
        r.add_rtt(Duration::from_micros(400));
        assert!(r.refresh(Some(100)), "four times slower than the fastest");
        assert_eq!(r.factor(), 250);
        r.add_rtt(Duration::from_micros(460));
        assert!(!r.refresh(Some(100)), "within a fifth: no change");
        assert_eq!(r.factor(), 250);
        r.add_rtt(Duration::from_micros(100));
        r.add_rtt(Duration::from_micros(100));
        r.add_rtt(Duration::from_micros(100));
        assert!(r.refresh(Some(100)));
        assert!(r.factor() > 500, "{}", r.factor());
        let busy = Readings::default();
        busy.cpu.store(900, Ordering::Relaxed);
        busy.refresh(None);
        assert_eq!(busy.factor(), 100);
        busy.memory.store(800, Ordering::Relaxed);
        busy.refresh(None);
        assert_eq!(busy.factor(), 10);
    }

    #[test]
    fn metrics_are_read_once_per_interval() {
        let mut last = None;
        let t = Instant::now();
        assert!(metrics_due(&mut last, t), "the first check reads them");
        assert!(!metrics_due(&mut last, t + Duration::from_secs(2)));
        assert!(!metrics_due(&mut last, t + METRICS_EVERY - Duration::from_millis(1)));
        assert!(metrics_due(&mut last, t + METRICS_EVERY));
        assert!(!metrics_due(&mut last, t + METRICS_EVERY + Duration::from_secs(1)));
    }
}
