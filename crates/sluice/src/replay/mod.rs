//! `sluice replay`: plays a capture against a server (any MySQL-protocol server, sluice
//! included) and compares what each command did there with what it did when captured.
//!
//! Each captured session runs on a connection of its own, as the replay user, started at its
//! captured time (scaled by `--speed`) and brought to its captured state; its commands follow in
//! order, each at its captured time unless the one before ran late, and never before the
//! commands of other sessions the capture says came first ([`Order`], `order.rs`: what one
//! session saw another do, it sees again, and conflicting locks are taken in the capture's
//! order). Commands that cannot be replayed faithfully are skipped and counted by reason:
//! redacted (may carry a password), truncated (over 1 MiB), COM_CHANGE_USER, and with
//! `--read-only` anything that may write. The comparison and the report are in `report.rs`.

mod charts;
pub mod conn;
mod order;
mod overlap;
pub mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::consts::com;
use sluice_proto::rw::{Class, classify};

use crate::backend::Backend;
use crate::capture::files;
use crate::capture::record::{Begin, Record, Summary, flag};
use order::Order;

/// What `sluice replay` is asked to do (its command line).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The capture directory.
    #[arg(long)]
    pub input: PathBuf,
    /// The server to replay against, HOST:PORT or a Unix socket path.
    #[arg(long)]
    pub target: String,
    /// Every session logs in as this user.
    #[arg(long)]
    pub user: String,
    /// Its password (or in the SLUICE_REPLAY_PASSWORD environment variable; never shown).
    #[arg(long, env = "SLUICE_REPLAY_PASSWORD", hide_env_values = true, default_value = "", hide_default_value = true)]
    pub password: String,
    /// Time runs this many times faster than it did when captured (0.001 to 1000).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Replay only commands that change nothing (for a replica).
    #[arg(long)]
    pub read_only: bool,
    /// Write report.md and report.json here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The key file of an encrypted capture.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Keep the captured times only: commands of different sessions may then run in another
    /// order than they did (by default a command waits for every command that had ended when
    /// it began).
    #[arg(long)]
    pub unordered: bool,
}

/// A captured command.
#[derive(Debug, Clone)]
pub struct Command {
    pub number: u64,
    pub at_us: u64,
    pub flags: u8,
    pub payload: Vec<u8>,
    pub captured: Option<Summary>,
}

impl Command {
    /// When it ended in the capture (its start when its result was not captured).
    fn end_us(&self) -> u64 {
        self.at_us + self.captured.map_or(0, |s| s.latency_us)
    }
}

/// A captured session: its state when first seen, and its commands.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub id: u64,
    pub begin: Option<(u64, Box<Begin>)>,
    pub commands: Vec<Command>,
    /// Commands are missing (the capture dropped records).
    pub gap: bool,
}

/// What became of one command in the replay.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub session: u64,
    pub number: u64,
    pub command: u8,
    /// The statement's text (a query's, a prepare's, an execute's prepared statement's).
    pub text: Option<String>,
    pub captured: Option<Summary>,
    /// The replay's summary, or why the command was not replayed.
    pub replayed: Result<Summary, NotReplayed>,
    /// Its result may differ by the order the server gave overlapping commands of other
    /// sessions (`overlap.rs`), or the replay ran it before all that ended before it in the
    /// capture had ended (a wait cut short), or its transaction was rolled back as in the
    /// capture where the replay's server did not choose it as a deadlock's victim.
    pub order_dependent: bool,
    /// When it ran in the replay: start and end, ns from the replay's start.
    pub ran: Option<(u64, u64)>,
    /// It ran again, with its transaction: after the server chose the transaction as a
    /// deadlock's victim where the capture had no deadlock, or after the transaction gave up
    /// its locks for a command of another session that had to run first.
    pub retried: bool,
}

/// Why a replay could not run, or could not write its report: the caller's fault (`Arguments`,
/// `NotWhole`, most of `Capture`) or the host's (`Path`, `Io`).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The command line asks for something out of bounds.
    #[error("{0}")]
    Arguments(String),
    /// The capture does not read: its files, its key, its meta.json.
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
    /// The capture is not whole: not ended, files missing, empty or unlisted, records past its end.
    #[error("{0}")]
    NotWhole(String),
    /// A file or folder of the capture or of the report cannot be used.
    #[error(transparent)]
    Path(#[from] crate::sys::PathError),
    /// Writing the report, or starting the replay, failed.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

/// The captured sessions of `dir`, by id. A record's time or latency past `limit_us` (from the
/// capture's start) is damage: replaying it would wait for ever.
pub fn load(dir: &std::path::Path, key: Option<&files::Key>, limit_us: u64) -> Result<BTreeMap<u64, Captured>, ReplayError> {
    let mut sessions: BTreeMap<u64, Captured> = BTreeMap::new();
    let late = |what: &str, us: u64| {
        ReplayError::NotWhole(format!("a record's {what} ({us} µs) is past the capture's end: the capture is damaged"))
    };
    for path in files::list(dir)? {
        for r in files::read_file(&path, key)? {
            let id = r.session();
            let s = sessions.entry(id).or_insert_with(|| Captured { id, ..Captured::default() });
            match r {
                Record::Begin { at_us, .. } | Record::Command { at_us, .. } | Record::End { at_us, .. } if at_us > limit_us => {
                    return Err(late("time", at_us));
                }
                Record::Result { summary, .. } if summary.latency_us > limit_us => return Err(late("latency", summary.latency_us)),
                Record::Begin { at_us, begin, .. } => s.begin = Some((at_us, begin)),
                Record::Command { at_us, number, flags, payload, .. } => {
                    s.gap |= number != s.commands.last().map_or(1, |c| c.number + 1);
                    s.commands.push(Command { number, at_us, flags, payload, captured: None });
                }
                Record::Result { number, summary, .. } => {
                    if let Some(c) = s.commands.iter_mut().rev().find(|c| c.number == number) {
                        c.captured = Some(summary);
                    }
                }
                Record::End { .. } => {}
            }
        }
    }
    Ok(sessions)
}

/// The slowest and the fastest `--speed`.
pub const SPEEDS: (f64, f64) = (1e-3, 1e3);

/// A capture's records may be this much later than its end says (clocks of the writer and of
/// the sessions are read apart).
const END_SLACK_US: u64 = 60_000_000;

/// Checks the arguments before anything is read.
fn check_args(args: &Args) -> Result<(), ReplayError> {
    if !(args.speed >= SPEEDS.0 && args.speed <= SPEEDS.1) {
        return Err(ReplayError::Arguments(format!("--speed must be from {} to {}, not {}", SPEEDS.0, SPEEDS.1, args.speed)));
    }
    if args.target.trim().is_empty() || args.user.is_empty() {
        return Err(ReplayError::Arguments("--target and --user must not be empty".into()));
    }
    Ok(())
}

/// Checks that the capture in `dir` is whole: it ended, and its folder holds every file its
/// `meta.json` lists, none empty, and no other. The latest time a record may have (µs).
pub fn check_whole(dir: &std::path::Path, meta: &crate::capture::Status) -> Result<u64, ReplayError> {
    let Some(ended) = meta.ended_at_ms.filter(|_| meta.state == "done") else {
        let why = meta.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(ReplayError::NotWhole(format!("the capture is {} and not whole{why}", meta.state)));
    };
    let found: Vec<String> = files::list(dir)?.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    let mut listed = meta.files.clone();
    listed.sort();
    if found != listed {
        let missing: Vec<&String> = listed.iter().filter(|f| !found.contains(f)).collect();
        let extra: Vec<&String> = found.iter().filter(|f| !listed.contains(f)).collect();
        return Err(ReplayError::NotWhole(format!(
            "the capture's files are not those meta.json lists: missing {missing:?}, not listed {extra:?}"
        )));
    }
    for name in &found {
        let path = dir.join(name);
        let len = std::fs::symlink_metadata(&path).map_err(|e| crate::sys::PathError::at(&path)(e.into()))?.len();
        if len <= files::MAGIC_LEN {
            return Err(ReplayError::NotWhole(format!("{name} is empty: the capture is not whole")));
        }
    }
    Ok(ended.saturating_sub(meta.started_at_ms).saturating_mul(1000).saturating_add(END_SLACK_US))
}

/// Replays the capture in `args.input` and writes the report (when asked); the report.
pub fn run(args: &Args) -> Result<report::Report, ReplayError> {
    check_args(args)?;
    let key = args.key_file.as_deref().map(files::load_key).transpose()?;
    let meta = files::read_meta(&args.input)?;
    let limit_us = check_whole(&args.input, &meta)?;
    let sessions = load(&args.input, key.as_ref(), limit_us)?;
    let config = crate::config::Config::parse(&format!("[[backends]]\naddress = {:?}\n", args.target))
        .map_err(|e| ReplayError::Arguments(format!("--target: {e}")))?;
    let metrics = crate::metrics::Metrics::new(std::slice::from_ref(&args.target));
    let b = Backend::from_config(0, &config.backends[0], metrics.backends[0].clone(), &config.proxy, 1)
        .map_err(|e| ReplayError::Arguments(format!("--target: {e}")))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| ReplayError::Io { what: "starting the replay runtime".into(), source })?;
    let started = Instant::now();
    let plan = overlap::Plan::new(&sessions);
    let (mut outcomes, cut) = rt.block_on(replay_all(Arc::new(b), sessions, args));
    let ran = outcomes.iter().filter_map(|o| Some(((o.session, o.number), o.ran?))).collect();
    let dependent = plan.dependent(&ran);
    for o in &mut outcomes {
        o.order_dependent |= dependent.contains(&(o.session, o.number));
    }
    let mut report = report::build(&meta, args, &outcomes, started.elapsed());
    report.order_waits_cut = cut;
    if let Some(dir) = &args.report {
        let charts = [("totals.png", charts::totals(&report)?), ("latency.png", charts::latency(&report)?)];
        report::write(dir, &report, &charts)?;
    }
    Ok(report)
}

/// The longest a command waits for the order ([`Order`]) before it runs anyway.
const ORDER_WAIT: Duration = Duration::from_secs(1);

/// The longest it waits while its transaction holds locks: a command waited for may be
/// waiting for one of them (a lock the capture did not have), and the transaction gives them
/// up (see [`run_in_order`]).
const HOLDING_WAIT: Duration = Duration::from_millis(20);

/// Sessions log in this long (of replay time) before their first command is due.
const LEAD: Duration = Duration::from_secs(1);

/// The outcomes, and how many order waits were cut short.
async fn replay_all(b: Arc<Backend>, sessions: BTreeMap<u64, Captured>, args: &Args) -> (Vec<Outcome>, u64) {
    let t0 = tokio::time::Instant::now() + LEAD;
    let roles: BTreeMap<u64, Vec<overlap::Role>> = sessions.values().map(|s| (s.id, overlap::roles(s))).collect();
    let order = Arc::new(Order::new(&sessions, &roles));
    let tasks: Vec<_> = sessions
        .into_values()
        .map(|s| {
            let (b, args, order, roles) = (b.clone(), args.clone(), order.clone(), roles[&s.id].clone());
            tokio::spawn(async move {
                let spans: Vec<(u64, u64)> = s.commands.iter().map(|c| (c.at_us, c.end_us())).collect();
                let (out, marked) = replay_session(b, s, t0, &args, Ordered { order: &order, roles: &roles }).await;
                // Every command of the session is done, whatever became of it.
                for (span, role) in spans.iter().zip(&roles).skip(marked) {
                    order.done(*span, *role);
                }
                out
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(v) = t.await {
            out.extend(v);
        }
    }
    (out, order.cut())
}

/// Why a command was not replayed, or did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReplayed {
    /// Skipped on purpose ([`skip_reason`]).
    #[error("{0}")]
    Skipped(&'static str),
    #[error("the session's state was not captured")]
    NoState,
    /// Its session could not log in or be brought to its captured state (the target's answer).
    #[error("connecting: {0}")]
    Connecting(String),
    /// An earlier command of its session lost the connection.
    #[error("the connection was lost")]
    ConnectionLost,
    /// The connection failed while it ran.
    #[error("{0}")]
    Failed(String),
    /// It names a statement this replay did not prepare (the connection goes on).
    #[error("statement {0} was not prepared in this replay")]
    NotPrepared(u32),
}

/// Why a command is not replayed, if it is not.
fn skip_reason(c: &Command, read_only: bool) -> Option<&'static str> {
    // (A capture file may be damaged: an empty command is not sent.)
    let Some(&cmd) = c.payload.first() else { return Some("an empty command (a damaged capture)") };
    if c.flags & flag::REDACTED != 0 {
        return Some("redacted (may carry a password)");
    }
    if c.flags & flag::TRUNCATED != 0 {
        return Some("longer than capture keeps");
    }
    if c.flags & flag::CHANGE_USER != 0 || cmd == com::CHANGE_USER {
        return Some("COM_CHANGE_USER");
    }
    if read_only && !reads_only(cmd, &c.payload[1..]) {
        return Some("may write (--read-only)");
    }
    None
}

/// Whether a command changes nothing (for `--read-only`): reads and session settings.
fn reads_only(cmd: u8, body: &[u8]) -> bool {
    match cmd {
        com::QUERY | com::STMT_PREPARE => matches!(classify(body), Class::Read | Class::Session),
        com::STMT_EXECUTE | com::STMT_FETCH | com::STMT_CLOSE | com::STMT_RESET | com::STMT_SEND_LONG_DATA => true,
        com::PING | com::INIT_DB | com::FIELD_LIST | com::STATISTICS | com::SET_OPTION | com::RESET_CONNECTION | com::QUIT => true,
        _ => false,
    }
}

/// The order a session's commands keep with the others', and their roles in it.
#[derive(Clone, Copy)]
struct Ordered<'a> {
    order: &'a Order,
    roles: &'a [overlap::Role],
}

/// A session's open transaction: where it began (its BEGIN), to run it again; and how many
/// times it rolled back to give up its locks.
#[derive(Default)]
struct Transaction {
    from: Option<usize>,
    released: usize,
}

/// The outcomes of a session's commands, and how many of them (from the first) it marked done
/// in the order.
async fn replay_session(b: Arc<Backend>, s: Captured, t0: tokio::time::Instant, args: &Args, ord: Ordered<'_>) -> (Vec<Outcome>, usize) {
    // (Times are bounded by the capture's length and the speed by SPEEDS: no overflow.)
    let at = |us: u64| t0 + Duration::from_secs_f64((us as f64 / 1e6 / args.speed).min(1e9));
    let mut texts: BTreeMap<u32, String> = BTreeMap::new();
    let mut out = Vec::new();
    let outcome = |c: &Command, texts: &BTreeMap<u32, String>, replayed| Outcome {
        session: s.id,
        number: c.number,
        command: c.payload.first().copied().unwrap_or(0),
        text: text_of(&c.payload, texts),
        captured: c.captured,
        replayed,
        order_dependent: false,
        ran: None,
        retried: false,
    };
    // (Commands not replayed are done at once: the others do not wait for them.)
    let Some((begin_at, begin)) = &s.begin else {
        out.extend(s.commands.iter().map(|c| outcome(c, &texts, Err(NotReplayed::NoState))));
        return (out, 0);
    };
    for (id, sql, _) in &begin.prepared {
        texts.insert(*id, String::from_utf8_lossy(sql).into_owned());
    }
    tokio::time::sleep_until(at(*begin_at) - LEAD).await;
    let timeout = Duration::from_secs(10);
    let mut conn = match conn::Conn::open(&b, &args.user, &args.password, begin, timeout).await {
        Ok(c) => Some(c),
        Err(e) => {
            let why = NotReplayed::Connecting(e.message);
            out.extend(s.commands.iter().map(|c| outcome(c, &texts, Err(why.clone()))));
            return (out, 0);
        }
    };
    let mut transaction = Transaction::default();
    // (A COMMIT ends its transaction once it ran: until then, it holds the locks.)
    let mut ended = false;
    for (i, c) in s.commands.iter().enumerate() {
        if std::mem::take(&mut ended) {
            transaction.from = None;
        }
        match statement_run(&c.payload, |id| texts.get(&id).map(|t| t.as_bytes())).map(overlap::effect) {
            Some(overlap::Effect::Begin) => transaction = Transaction { from: Some(i), released: 0 },
            Some(overlap::Effect::Commit | overlap::Effect::Rollback) => ended = true,
            _ => {}
        }
        if let (Some(&com::STMT_PREPARE), Some(sum)) = (c.payload.first(), c.captured) {
            texts.insert(sum.stmt_id, String::from_utf8_lossy(&c.payload[1..]).into_owned());
        }
        if c.payload.first() == Some(&com::QUIT) {
            break;
        }
        let not_run =
            skip_reason(c, args.read_only).map(NotReplayed::Skipped).or_else(|| conn.is_none().then_some(NotReplayed::ConnectionLost));
        let (Some(open), None) = (conn.as_mut(), &not_run) else {
            out.push(outcome(c, &texts, Err(not_run.unwrap_or(NotReplayed::ConnectionLost))));
            ord.order.done((c.at_us, c.end_us()), ord.roles[i]);
            continue;
        };
        tokio::time::sleep_until(at(c.at_us)).await;
        let (r, ran, out_of_order, retried) = run_in_order(open, &s.commands, i, &mut transaction, &mut out, args, ord, t0).await;
        ord.order.done((c.at_us, c.end_us()), ord.roles[i]);
        if r.as_ref().is_err_and(|e| !matches!(e, NotReplayed::NotPrepared(_))) {
            conn = None;
        }
        out.push(Outcome { order_dependent: out_of_order || retried, ran: Some(ran), retried, ..outcome(c, &texts, r) });
    }
    if let Some(c) = conn {
        c.quit().await;
    }
    let marked = out.len();
    (out, marked)
}

/// Runs command `i` of a session once the order lets it ([`Order`]).
/// - When its transaction holds locks and the wait takes over [`HOLDING_WAIT`], a command
///   waited for may be waiting for one of them: the transaction rolls back, and once the order
///   lets it, runs again from its BEGIN.
/// - After a deadlock the capture did not have, the transaction runs again too.
/// - Where the capture had a deadlock here and the replay has none, the transaction is rolled
///   back as the capture's server did.
///
/// Its result, when it ran (ns from `t0`), whether it ran out of the capture's order, and
/// whether it ran again with its transaction.
#[allow(clippy::too_many_arguments)]
async fn run_in_order(
    open: &mut conn::Conn,
    commands: &[Command],
    i: usize,
    transaction: &mut Transaction,
    out: &mut [Outcome],
    args: &Args,
    ord: Ordered<'_>,
    t0: tokio::time::Instant,
) -> (Result<Summary, NotReplayed>, (u64, u64), bool, bool) {
    let c = &commands[i];
    let role = ord.roles[i];
    // (Commands skipped took no locks.)
    let took = |f: usize| out[f..i].iter().zip(&ord.roles[f..i]).any(|(o, r)| r.takes && o.replayed.is_ok());
    let holding = transaction.from.filter(|&f| transaction.released < RETRIES && took(f));
    let mut cut = !args.unordered && !ord.order.before(c, role, if holding.is_some() { HOLDING_WAIT } else { ORDER_WAIT }).await;
    let mut rerun = None;
    if let Some(from) = holding.filter(|_| cut) {
        transaction.released += 1;
        if open.run(ROLLBACK, 0).await.is_ok_and(|s| s.error == 0) {
            cut = !ord.order.before(c, role, ORDER_WAIT).await;
            rerun = Some(from);
        }
    }
    if cut {
        ord.order.count_cut();
    }
    let began = ns_since(t0);
    let mut r = match rerun {
        Some(from) => retry(open, (&commands[from..=i], &ord.roles[from..=i]), &mut out[from..], args, ord.order).await,
        None => open.run(&c.payload, c.captured.map_or(0, |s| s.stmt_id)).await,
    };
    // (Otherwise the transaction would stay open, and the session's next BEGIN would commit
    // changes the capture's server had rolled back.)
    let mut out_of_order = cut;
    if c.captured.is_some_and(|s| s.error == DEADLOCK) && r.as_ref().is_ok_and(|s| s.error != DEADLOCK) {
        let _ = open.run(ROLLBACK, 0).await;
        out_of_order = true;
    }
    let mut retried = rerun.is_some();
    if deadlocked(c, &r) {
        retried = true;
        let from = transaction.from.unwrap_or(i);
        r = retry(open, (&commands[from..=i], &ord.roles[from..=i]), &mut out[from..], args, ord.order).await;
    }
    (r, (began, ns_since(t0)), out_of_order, retried)
}

/// Nanoseconds from `t0` to now (0 before it).
fn ns_since(t0: tokio::time::Instant) -> u64 {
    tokio::time::Instant::now().saturating_duration_since(t0).as_nanos() as u64
}

/// MariaDB's error for a deadlock's victim (its transaction is rolled back).
const DEADLOCK: u16 = 1213;
/// A COM_QUERY that rolls the open transaction back.
const ROLLBACK: &[u8] = b"\x03ROLLBACK";
/// Times a transaction runs again after deadlocks the capture did not have.
const RETRIES: usize = 3;

/// The server chose this command's transaction as a deadlock's victim, and the capture had no
/// deadlock there.
fn deadlocked(c: &Command, r: &Result<Summary, NotReplayed>) -> bool {
    r.as_ref().is_ok_and(|s| s.error == DEADLOCK) && c.captured.is_some_and(|s| s.error != DEADLOCK)
}

/// Runs a transaction again, from its first command through the one that was a deadlock's
/// victim (`commands`), as an application would: otherwise its changes would be missing from
/// the rest of the replay, and every later read of its rows would differ from the capture. The
/// outcomes of its earlier commands (`earlier`) take the new results; the last command's is
/// returned. Commands run again are order-dependent: they ran later than in the capture. Each
/// still waits for the order (`roles`: theirs in it).
async fn retry(
    open: &mut conn::Conn,
    (commands, roles): (&[Command], &[overlap::Role]),
    earlier: &mut [Outcome],
    args: &Args,
    order: &Order,
) -> Result<Summary, NotReplayed> {
    let mut last = Ok(Summary { error: DEADLOCK, ..Summary::default() });
    for _ in 0..RETRIES {
        let (mut results, mut holding) = (Vec::with_capacity(commands.len()), false);
        for (c, &role) in commands.iter().zip(roles) {
            if skip_reason(c, args.read_only).is_some() {
                results.push(None);
                continue;
            }
            if !args.unordered && !order.before(c, role, if holding { HOLDING_WAIT } else { ORDER_WAIT }).await {
                order.count_cut();
            }
            holding |= role.takes;
            let r = open.run(&c.payload, c.captured.map_or(0, |s| s.stmt_id)).await;
            let again = deadlocked(c, &r);
            results.push(Some(r));
            if again {
                break;
            }
        }
        last = results.pop().flatten().unwrap_or(last);
        if results.len() + 1 == commands.len() && !last.as_ref().is_ok_and(|s| s.error == DEADLOCK) {
            for (o, r) in earlier.iter_mut().zip(results) {
                if let Some(r) = r {
                    (o.replayed, o.order_dependent, o.retried) = (r, true, true);
                }
            }
            return last;
        }
    }
    last
}

/// The statement a command runs: a query's text, or an execute's prepared statement's
/// (`prepared` finds it by id); None for other commands (a prepare runs nothing yet).
fn statement_run<'a>(payload: &'a [u8], prepared: impl Fn(u32) -> Option<&'a [u8]>) -> Option<&'a [u8]> {
    match *payload.first()? {
        com::QUERY => Some(&payload[1..]),
        com::STMT_EXECUTE => prepared(u32::from_le_bytes(payload.get(1..5)?.try_into().ok()?)),
        _ => None,
    }
}

/// The statement a command runs, or prepares, as text.
fn text_of(payload: &[u8], texts: &BTreeMap<u32, String>) -> Option<String> {
    let sql = match *payload.first()? {
        com::STMT_PREPARE => &payload[1..],
        _ => statement_run(payload, |id| texts.get(&id).map(|t| t.as_bytes()))?,
    };
    Some(String::from_utf8_lossy(sql).into_owned())
}
