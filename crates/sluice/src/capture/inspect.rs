//! `sluice capture inspect DIR`: what a capture holds, and its records written out.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use sluice_proto::consts::com;

use super::files;
use super::record::{Record, flag};

/// The summary of the capture in `dir`, then up to `dump` records (of `session` only, when
/// given), one per line.
pub fn inspect(dir: &Path, key: Option<&files::Key>, dump: usize, session: Option<u64>) -> Result<String, super::CaptureError> {
    let meta = files::read_meta(dir)?;
    let mut out = String::new();
    let sealed = if meta.encrypted { ", encrypted" } else { "" };
    let _ = writeln!(out, "capture {} ({}{sealed}), sluice {}", dir.display(), meta.state, meta.sluice_version);
    if let Some(e) = &meta.error {
        let _ = writeln!(out, "error: {e}");
    }
    let took = meta.ended_at_ms.map(|e| format!("{:.1} s", e.saturating_sub(meta.started_at_ms) as f64 / 1000.0));
    let _ = writeln!(out, "started at {} ms since the epoch, lasted {}", meta.started_at_ms, took.as_deref().unwrap_or("(still running)"));
    for b in &meta.backends {
        let _ = writeln!(out, "backend {} at {}: {}", b.name, b.address, b.version.as_deref().unwrap_or("version unknown"));
    }
    let _ = writeln!(
        out,
        "{} sessions, {} commands, {} records ({} dropped), {} bytes of records in {} bytes of {} files",
        meta.sessions,
        meta.commands,
        meta.records,
        meta.dropped_records,
        meta.bytes_raw,
        meta.bytes_written,
        meta.files.len()
    );
    let mut by_command: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut errors, mut redacted, mut truncated, mut records) = (0u64, 0u64, 0u64, 0u64);
    let mut shown = 0;
    let mut dumped = String::new();
    for path in files::list(dir)? {
        for r in files::read_file(&path, key)? {
            records += 1;
            match &r {
                Record::Command { payload, flags, .. } => {
                    *by_command.entry(payload.first().map_or("(empty)", |c| com::name(*c))).or_default() += 1;
                    redacted += u64::from(flags & flag::REDACTED != 0);
                    truncated += u64::from(flags & flag::TRUNCATED != 0);
                }
                Record::Result { summary, .. } => errors += u64::from(summary.error != 0),
                _ => {}
            }
            if shown < dump && session.is_none_or(|s| s == r.session()) {
                shown += 1;
                dumped.push_str(&line(&r));
                dumped.push('\n');
            }
        }
    }
    let _ = writeln!(out, "{records} records read; {errors} commands answered with an error; {redacted} redacted; {truncated} truncated");
    for (name, n) in &by_command {
        let _ = writeln!(out, "  {name}: {n}");
    }
    out.push_str(&dumped);
    Ok(out)
}

/// One record as a line of text.
pub fn line(r: &Record) -> String {
    match r {
        Record::Begin { session, at_us, begin } => format!(
            "{:>12.6}s session {session} begins: user {} schema {} from {} on {}{}; {} variables, {} prepared, {} user variables",
            *at_us as f64 / 1e6,
            begin.user,
            begin.schema.as_deref().unwrap_or("(none)"),
            begin.client,
            begin.backend,
            if begin.in_transaction { ", in a transaction" } else { "" },
            begin.variables.len(),
            begin.prepared.len() + begin.sql_prepared.len(),
            begin.user_variables.len()
        ),
        Record::Command { session, at_us, number, flags, len, payload } => {
            let name = payload.first().map_or("(empty)", |c| com::name(*c));
            let text = match payload.first() {
                Some(&(com::QUERY | com::STMT_PREPARE | com::INIT_DB)) => format!("{:?}", String::from_utf8_lossy(&payload[1..])),
                _ => format!("{} bytes", len),
            };
            let marks = [(flag::REDACTED, " (redacted)"), (flag::TRUNCATED, " (truncated)"), (flag::CHANGE_USER, " (change user)")];
            let marks: String = marks.iter().filter(|(f, _)| flags & f != 0).map(|(_, m)| *m).collect();
            format!("{:>12.6}s session {session} #{number} {name} {text}{marks}", *at_us as f64 / 1e6)
        }
        Record::Result { session, number, summary: s } => {
            let outcome = if s.error != 0 { format!("error {}", s.error) } else { "ok".into() };
            format!(
                "{:>13} session {session} #{number} -> {outcome}, {} rows (sums {:016x} {:016x}), {} affected, {} us",
                "", s.rows, s.ordered, s.unordered, s.affected, s.latency_us
            )
        }
        Record::End { session, at_us } => format!("{:>12.6}s session {session} ends", *at_us as f64 / 1e6),
    }
}
