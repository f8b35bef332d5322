//! The replay's report: for every replayed command, what it did against what it did when
//! captured (error and code, affected rows, rows, row checksum, latency), with totals, the
//! statements whose results differ grouped by digest (both results shown), latency by digest
//! (p50/p99 captured and replayed, regressions first) and the errors. Written as `report.json`
//! and `report.md`.
//!
//! Rows are compared by their checksum in order when the statement has ORDER BY, else in any
//! order (a server may return unordered rows in another order). Differences in commands whose
//! result depends on how the server ordered overlapping commands of other sessions
//! (`overlap.rs`) are counted and shown apart: a faithful copy gives none of the others.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use sluice_proto::consts::com;

use super::{Args, Outcome};
use crate::capture::Status;
use crate::capture::record::Summary;

/// Samples of differing results kept per digest.
const SAMPLES: usize = 3;
/// Digest rows shown in the Markdown tables.
const SHOWN: usize = 50;

/// Digests in the latency chart, at most.
pub const LATENCY_BARS: usize = 20;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub input: String,
    pub target: String,
    pub speed: f64,
    pub read_only: bool,
    pub captured_at_ms: u64,
    /// Records the capture dropped (its writer could not keep up): sessions with gaps.
    pub capture_dropped_records: u64,
    pub replay_seconds: f64,
    pub sessions: usize,
    pub commands: usize,
    pub replayed: usize,
    /// Commands not replayed, by reason.
    pub skipped: BTreeMap<String, usize>,
    pub same: usize,
    /// Results that differ, but not because of how concurrent commands were ordered.
    pub differing: usize,
    /// Results that differ in commands whose result depends on the order the server gave
    /// overlapping commands of other sessions (`order_differences`).
    pub order_dependent: usize,
    /// Replayed, but with no captured result to compare with (in flight when the capture ended).
    pub not_compared: usize,
    /// Commands that stopped waiting for the commands that had ended before they began (a
    /// cycle with a lock wait; see `Order`): where results may differ by the replay's order.
    pub order_waits_cut: u64,
    /// Replayed commands answered with an error (whether the capture had it too or not).
    pub replay_errors: usize,
    /// Commands run again with their transaction after the server chose it as a deadlock's
    /// victim where the capture had no deadlock (as an application would).
    pub retried: usize,
    pub differences: Vec<DiffGroup>,
    pub order_differences: Vec<DiffGroup>,
    pub latency: Vec<LatencyRow>,
    pub errors: Vec<ErrorRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiffGroup {
    pub digest: String,
    pub count: usize,
    pub samples: Vec<DiffSample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiffSample {
    pub session: u64,
    pub number: u64,
    pub text: String,
    pub what: String,
    pub captured: Summary,
    pub replayed: Summary,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub digest: String,
    pub count: usize,
    pub captured_p50_us: u64,
    pub captured_p99_us: u64,
    pub replayed_p50_us: u64,
    pub replayed_p99_us: u64,
    /// Replayed p99 over captured p99.
    pub p99_ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ErrorRow {
    pub code: u16,
    pub captured_code: u16,
    pub digest: String,
    pub count: usize,
}

/// The digest text a command is grouped by.
fn digest_of(o: &Outcome) -> String {
    match &o.text {
        Some(t) => {
            let mut out = Vec::new();
            sluice_proto::digest::normalize(t.as_bytes(), &mut out, 300);
            String::from_utf8_lossy(&out).into_owned()
        }
        None => com::name(o.command).to_string(),
    }
}

fn has_order_by(text: Option<&str>) -> bool {
    let Some(t) = text else { return false };
    let words: Vec<&[u8]> = sluice_proto::digest::parts(t.as_bytes())
        .filter_map(|p| if let sluice_proto::digest::Part::Word(w) = p { Some(w) } else { None })
        .collect();
    words.windows(2).any(|w| w[0].eq_ignore_ascii_case(b"order") && w[1].eq_ignore_ascii_case(b"by"))
}

/// How a replayed result differs from the captured one (None: the same).
pub fn difference(captured: &Summary, replayed: &Summary, ordered: bool) -> Option<String> {
    if captured.error != replayed.error {
        return Some(format!("error {} captured, {} replayed", captured.error, replayed.error));
    }
    if captured.affected != replayed.affected {
        return Some(format!("{} rows affected captured, {} replayed", captured.affected, replayed.affected));
    }
    if captured.rows != replayed.rows {
        return Some(format!("{} rows captured, {} replayed", captured.rows, replayed.rows));
    }
    let (a, b) = if ordered { (captured.ordered, replayed.ordered) } else { (captured.unordered, replayed.unordered) };
    (a != b).then(|| format!("other row values ({} rows{})", captured.rows, if ordered { ", in order" } else { "" }))
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub fn build(meta: &Status, args: &Args, outcomes: &[Outcome], took: Duration) -> Report {
    let mut r = Report {
        input: args.input.display().to_string(),
        target: args.target.clone(),
        speed: args.speed,
        read_only: args.read_only,
        captured_at_ms: meta.started_at_ms,
        capture_dropped_records: meta.dropped_records,
        replay_seconds: took.as_secs_f64(),
        sessions: outcomes.iter().map(|o| o.session).collect::<std::collections::BTreeSet<_>>().len(),
        commands: outcomes.len(),
        replayed: 0,
        skipped: BTreeMap::new(),
        same: 0,
        differing: 0,
        order_dependent: 0,
        not_compared: 0,
        order_waits_cut: 0,
        replay_errors: 0,
        retried: 0,
        differences: Vec::new(),
        order_differences: Vec::new(),
        latency: Vec::new(),
        errors: Vec::new(),
    };
    let mut tally = Tally::default();
    for o in outcomes {
        tally.add(&mut r, o);
    }
    tally.finish(&mut r);
    r
}

/// What the report gathers by digest while it counts the outcomes.
#[derive(Default)]
struct Tally {
    /// Differences, and those of order-dependent commands.
    diffs: [BTreeMap<String, DiffGroup>; 2],
    /// Latencies, captured and replayed.
    latency: BTreeMap<String, (Vec<u64>, Vec<u64>)>,
    /// Errors: replayed code, captured code, digest.
    errors: BTreeMap<(u16, u16, String), usize>,
}

impl Tally {
    /// Counts one command's outcome.
    fn add(&mut self, r: &mut Report, o: &Outcome) {
        let replayed = match &o.replayed {
            Ok(s) => s,
            Err(why) => {
                *r.skipped.entry(why.to_string()).or_default() += 1;
                return;
            }
        };
        r.replayed += 1;
        r.retried += usize::from(o.retried);
        let Some(captured) = o.captured else {
            r.not_compared += 1;
            return;
        };
        let digest = digest_of(o);
        if replayed.error != 0 {
            r.replay_errors += 1;
            *self.errors.entry((replayed.error, captured.error, digest.clone())).or_default() += 1;
        }
        let l = self.latency.entry(digest.clone()).or_default();
        l.0.push(captured.latency_us);
        l.1.push(replayed.latency_us);
        let Some(what) = difference(&captured, replayed, has_order_by(o.text.as_deref())) else {
            r.same += 1;
            return;
        };
        *(if o.order_dependent { &mut r.order_dependent } else { &mut r.differing }) += 1;
        let g = self.diffs[usize::from(o.order_dependent)].entry(digest.clone()).or_insert_with(|| DiffGroup {
            digest,
            count: 0,
            samples: Vec::new(),
        });
        g.count += 1;
        if g.samples.len() < SAMPLES {
            let text = o.text.clone().unwrap_or_else(|| com::name(o.command).to_string());
            g.samples.push(DiffSample { session: o.session, number: o.number, text, what, captured, replayed: *replayed });
        }
    }

    /// The report's tables, in the order they are shown.
    fn finish(self, r: &mut Report) {
        let [differences, order_differences] = self.diffs.map(|d| {
            let mut v: Vec<DiffGroup> = d.into_values().collect();
            v.sort_by(|a, b| b.count.cmp(&a.count).then(a.digest.cmp(&b.digest)));
            v
        });
        (r.differences, r.order_differences) = (differences, order_differences);
        r.latency = self
            .latency
            .into_iter()
            .map(|(digest, (mut c, mut p))| {
                let (c50, c99, p50, p99) =
                    (percentile(&mut c, 0.5), percentile(&mut c, 0.99), percentile(&mut p, 0.5), percentile(&mut p, 0.99));
                LatencyRow {
                    digest,
                    count: c.len(),
                    captured_p50_us: c50,
                    captured_p99_us: c99,
                    replayed_p50_us: p50,
                    replayed_p99_us: p99,
                    p99_ratio: p99 as f64 / c99.max(1) as f64,
                }
            })
            .collect();
        r.latency.sort_by(|a, b| b.p99_ratio.total_cmp(&a.p99_ratio));
        r.errors =
            self.errors.into_iter().map(|((code, captured_code, digest), count)| ErrorRow { code, captured_code, digest, count }).collect();
        r.errors.sort_by_key(|e| std::cmp::Reverse(e.count));
    }
}

/// Writes `report.json`, `report.md` and the charts into `dir`: made (0700) if missing, else
/// this user's and writable by no other; its files are made 0600 (replacing those of an earlier
/// report), and no symbolic link is followed.
/// `charts`: the PNG files named as the markdown links them (`totals.png`, `latency.png`).
pub fn write(dir: &Path, r: &Report, charts: &[(&str, Vec<u8>)]) -> Result<(), super::ReplayError> {
    let dir = crate::sys::Dir::open(dir, true)?;
    let json = serde_json::to_vec_pretty(r).map_err(|e| super::ReplayError::Io { what: "report.json".into(), source: e.into() })?;
    let put = |name: &str, bytes: &[u8]| {
        dir.replace_file(name, bytes).map_err(|source| super::ReplayError::Io { what: format!("writing {name}"), source })
    };
    put("report.json", &json)?;
    for (name, png) in charts {
        put(name, png)?;
    }
    put("report.md", markdown(r).as_bytes())
}

fn cell(s: &str) -> String {
    let one_line: String = s.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
    one_line.replace('|', "\\|")
}

fn result(s: &Summary) -> String {
    if s.error != 0 {
        return format!("error {}", s.error);
    }
    format!("{} rows, {} affected, sum {:016x}/{:016x}", s.rows, s.affected, s.ordered, s.unordered)
}

/// The groups of differing results, with their samples.
fn diff_groups(m: &mut String, groups: &[DiffGroup]) {
    for g in groups.iter().take(SHOWN) {
        let _ = writeln!(m, "### `{}` ({} commands)\n", cell(&g.digest), g.count);
        let _ = writeln!(m, "| session #command | statement | difference | captured | replayed |\n|---|---|---|---|---|");
        for s in &g.samples {
            let _ = writeln!(
                m,
                "| {} #{} | `{}` | {} | {} | {} |",
                s.session,
                s.number,
                cell(&s.text),
                cell(&s.what),
                result(&s.captured),
                result(&s.replayed)
            );
        }
        m.push('\n');
    }
}

pub fn markdown(r: &Report) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# Replay of {} against {}\n", r.input, r.target);
    let mode = if r.read_only { ", read-only" } else { "" };
    let _ = writeln!(m, "Speed {}x{mode}; replayed in {:.1} s.\n", r.speed, r.replay_seconds);
    let _ = writeln!(m, "| | commands |\n|---|---|");
    let _ = writeln!(m, "| captured | {} (in {} sessions) |", r.commands, r.sessions);
    let _ = writeln!(m, "| replayed | {} |", r.replayed);
    let _ = writeln!(m, "| same result | {} |", r.same);
    let _ = writeln!(m, "| **different result** | **{}** |", r.differing);
    if r.order_dependent > 0 {
        let _ = writeln!(m, "| different result, where the order of concurrent commands decides (see below) | {} |", r.order_dependent);
    }
    if r.order_waits_cut > 0 {
        let _ = writeln!(m, "| run without waiting for all that ended before them (a lock wait) | {} |", r.order_waits_cut);
    }
    if r.retried > 0 {
        let _ = writeln!(
            m,
            "| run again with their transaction (after a deadlock the capture did not have, or to give up locks another session's command waited for) | {} |",
            r.retried
        );
    }
    if r.not_compared > 0 {
        let _ = writeln!(m, "| no captured result to compare (in flight at the end) | {} |", r.not_compared);
    }
    let _ = writeln!(m, "| errors in the replay | {} |", r.replay_errors);
    for (why, n) in &r.skipped {
        let _ = writeln!(m, "| not replayed: {} | {n} |", cell(why));
    }
    let _ = writeln!(
        m,
        "\n![Same results (green), different (red), different where the order of concurrent commands decides (orange), not replayed (grey); log scale](totals.png)"
    );
    let _ = writeln!(m, "\n## Statements whose results differ\n");
    if r.differences.is_empty() {
        let _ = writeln!(m, "None.\n");
    }
    diff_groups(&mut m, &r.differences);
    if !r.order_differences.is_empty() {
        let _ = writeln!(m, "## Results that depend on the order of concurrent commands\n");
        let _ = writeln!(
            m,
            "These commands, or the first read of their transaction, overlapped in the capture a commit (or a write \
             outside a transaction) of another session: the server ordered the two, and the capture cannot say how. \
             The replay may order them otherwise, so their results may differ on a faithful copy too.\n"
        );
        diff_groups(&mut m, &r.order_differences);
    }
    let _ = writeln!(m, "## Latency by digest (regressions first)\n");
    let n = r.latency.len().min(LATENCY_BARS);
    let _ = writeln!(m, "![p99 latency of the first {n} digests below, captured (blue) and replayed (orange)](latency.png)\n");
    let _ = writeln!(
        m,
        "| digest | commands | captured p50 / p99 (us) | replayed p50 / p99 (us) | p99 replayed / captured |\n|---|---|---|---|---|"
    );
    for l in r.latency.iter().take(SHOWN) {
        let _ = writeln!(
            m,
            "| `{}` | {} | {} / {} | {} / {} | {:.2} |",
            cell(&l.digest),
            l.count,
            l.captured_p50_us,
            l.captured_p99_us,
            l.replayed_p50_us,
            l.replayed_p99_us,
            l.p99_ratio
        );
    }
    let _ = writeln!(m, "\n## Errors in the replay\n");
    if r.errors.is_empty() {
        let _ = writeln!(m, "None.");
    } else {
        let _ = writeln!(m, "| error | captured | digest | commands |\n|---|---|---|---|");
        for e in r.errors.iter().take(SHOWN) {
            let _ = writeln!(m, "| {} | {} | `{}` | {} |", e.code, e.captured_code, cell(&e.digest), e.count);
        }
    }
    m
}
