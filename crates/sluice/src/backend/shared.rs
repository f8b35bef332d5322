//! Backend connections that sessions share (multiplexing), and the cap on how many connections
//! sluice keeps to a backend.
//!
//! A multiplexed session gives its connection back here at every safe point and takes one
//! again at its next statement. A connection given back stays logged in as its user, with the
//! session state it has ([`ConnState`]: schema, variables, statements prepared on it), and goes
//! only to a session of the same user, capabilities and character set ([`Key`]), which brings it
//! to its own state by sending the difference.
//!
//! The cap (`max_backend_connections`) is shared out among the workers, since a connection
//! lives on the worker runtime that opened it: each worker's [`Lane`] counts the connections it
//! opened (in use and spare) and queues, first come first served, the statements that found
//! none free. A connection given back goes to the first waiter of its key; when the head of
//! the queue wants another key, the connection is closed and its place given to that waiter,
//! which opens its own. A waiter that finds only spare connections of other keys closes one
//! and takes its place.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::pool::Fit;
use crate::metrics::BackendMetrics;
use crate::net::PacketConn;
use crate::worker::index as worker;

/// A statement prepared on one backend connection.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OnConn {
    pub id: u32,
    pub params: u16,
    pub columns: u16,
    /// The parameter types this connection was last sent for it (2 bytes per parameter).
    pub types: Vec<u8>,
}

/// Most statements kept prepared on one connection: past it, the connection closes some when
/// it is given back (a session that holds one prepares it again where it runs it next).
pub const MAX_STATEMENTS: usize = 256;

/// The statements that clients of sessions sharing connections hold open (prepared, not
/// closed), counted by their text: a statement no client holds any more is closed on each
/// connection that has it, when that connection is next given back
/// ([`ConnState::sweep_statements`]), so that sluice never keeps a server's statements (and
/// its `max_prepared_stmt_count`) for clients that are done with them.
#[derive(Default)]
pub struct OpenStatements {
    counts: Mutex<rustc_hash::FxHashMap<u64, u32>>,
    /// Counts that fell to zero so far: a connection swept since has nothing new to close.
    released: std::sync::atomic::AtomicU64,
}

fn text_hash(sql: &str) -> u64 {
    twox_hash::XxHash3_64::oneshot(sql.as_bytes())
}

impl OpenStatements {
    /// A client prepared a statement of this text.
    pub fn hold(&self, sql: &str) {
        *self.counts.lock().entry(text_hash(sql)).or_default() += 1;
    }

    /// A client closed a statement of this text; true when no client holds one any more.
    pub fn release(&self, sql: &str) -> bool {
        let mut counts = self.counts.lock();
        let h = text_hash(sql);
        let Some(n) = counts.get_mut(&h) else { return true };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        counts.remove(&h);
        self.released.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true
    }

    fn held(&self, sql: &str) -> bool {
        self.counts.lock().contains_key(&text_hash(sql))
    }
}

/// What a backend connection carries besides its socket (serialized when its session is
/// handed over to a new process).
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ConnState {
    pub schema: Option<std::sync::Arc<str>>,
    /// Session variables changed since its login, as the backend reported them.
    pub variables: crate::session::vars::Vars,
    /// Statements prepared on it, by their text.
    pub stmts: rustc_hash::FxHashMap<String, OnConn>,
    /// Multi-statements are on (the capability, or COM_SET_OPTION).
    pub multi_statements: bool,
    /// Variable changes are reported (`session_track_system_variables='*'` was set).
    pub tracking: bool,
    /// The id `LAST_INSERT_ID()` returns on it.
    pub last_insert_id: u64,
    /// Statements prepared on it with SQL `PREPARE` (as in `SessionState::sql_prepared`).
    pub sql_prepared: crate::session::vars::Vars,
    /// User variables set on it, as in `SessionState::user_variables` (a session that takes it
    /// sets those it does not have to NULL).
    pub user_variables: crate::session::vars::Vars,
    /// The thread id the backend gave it.
    pub thread_id: u32,
    /// The [`Key::attrs`] of the client it was opened for.
    #[serde(default)]
    pub attrs: u64,
    /// Statements to close on it before its next command (no client holds them open).
    #[serde(default)]
    pub to_close: Vec<u32>,
    /// `OpenStatements::released` when it was last swept.
    #[serde(skip)]
    pub swept: u64,
}

impl ConnState {
    /// Notes for closing ([`ConnState::to_close`]) the statements prepared on it that no client
    /// holds open, and past [`MAX_STATEMENTS`] some more. Cheap when no client closed a
    /// statement since the last sweep.
    #[inline]
    pub fn sweep_statements(&mut self, open: &OpenStatements) {
        let released = open.released.load(std::sync::atomic::Ordering::Relaxed);
        if released != self.swept || self.stmts.len() > MAX_STATEMENTS {
            self.sweep(open, released);
        }
    }

    #[cold]
    fn sweep(&mut self, open: &OpenStatements, released: u64) {
        self.swept = released;
        let to_close = &mut self.to_close;
        self.stmts.retain(|sql, on| {
            let keep = open.held(sql);
            if !keep {
                to_close.push(on.id);
            }
            keep
        });
        while self.stmts.len() > MAX_STATEMENTS {
            let Some(sql) = self.stmts.keys().next().cloned() else { break };
            if let Some(on) = self.stmts.remove(&sql) {
                self.to_close.push(on.id);
            }
        }
    }

    /// Records that the connection is in the session's state now (after bringing it there, or
    /// when the session gives it back). A session without a schema leaves the connection's.
    pub fn take_on(&mut self, s: &crate::session::SessionState) {
        if s.schema.is_some() && self.schema != s.schema {
            self.schema.clone_from(&s.schema);
        }
        if self.variables != s.variables {
            self.variables.clone_from(&s.variables);
        }
        self.multi_statements = s.multi_statements;
        self.last_insert_id = s.last_insert_id;
        if self.sql_prepared != s.sql_prepared {
            self.sql_prepared.clone_from(&s.sql_prepared);
        }
        if self.user_variables != s.user_variables {
            self.user_variables.clone_from(&s.user_variables);
        }
    }
}

/// Which sessions may take a connection: its user, the capabilities it was logged in with
/// (TLS to the backend included) and its character set. The connection attributes (`attrs`, a
/// hash of those of the client it was opened for) are preferred, not required: a session takes
/// a spare connection opened with its own attributes, else opens one while under the cap, and
/// only then shares one opened for another client (equality leaves them out).
#[derive(Debug, Clone)]
pub struct Key {
    pub user: Arc<str>,
    pub fit: Fit,
    pub collation: u8,
    pub attrs: u64,
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        self.user == o.user && self.fit == o.fit && self.collation == o.collation
    }
}

impl Eq for Key {}

/// The [`Key::attrs`] of a client's connection attributes.
pub fn attrs_hash(attributes: &[(Vec<u8>, Vec<u8>)]) -> u64 {
    let mut h = twox_hash::XxHash3_64::default();
    for (name, value) in attributes {
        for part in [name, value] {
            std::hash::Hasher::write(&mut h, &(part.len() as u64).to_le_bytes());
            std::hash::Hasher::write(&mut h, part);
        }
    }
    std::hash::Hasher::finish(&h)
}

/// A logged-in connection that no session holds.
pub struct Spare {
    pub conn: PacketConn,
    pub key: Key,
    pub state: Box<ConnState>,
    /// Capabilities in force between sluice and the backend.
    pub backend_caps: u32,
    pub mariadb: bool,
    since: Instant,
}

/// A spare connection given back this recently is taken without asking its socket whether the
/// server closed it (a system call per statement otherwise); the statement's own error tells.
const FRESH: Duration = Duration::from_millis(200);

impl Spare {
    pub fn new(conn: PacketConn, key: Key, state: Box<ConnState>, backend_caps: u32, mariadb: bool) -> Spare {
        Spare { conn, key, state, backend_caps, mariadb, since: Instant::now() }
    }

    /// Whether the server may have closed it: it was spare long enough for that to be worth a
    /// look, and its socket has something to say.
    pub fn closed_by_server(&self) -> bool {
        self.since.elapsed() >= FRESH && !self.conn.stream.is_quiet()
    }
}

/// The right to one connection under the cap, given back when dropped.
pub struct Slot {
    lanes: Arc<Lanes>,
    worker: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.lanes.free(self.worker);
    }
}

/// What a waiter is given.
enum Grant {
    /// A spare connection of its key, with the slot it holds.
    Conn(Spare, Slot),
    /// A place under the cap: open a connection.
    Open(Slot),
}

/// What a session gets from [`Lanes::take`].
pub enum Taken {
    /// A spare connection of the session's key.
    Conn(Spare, Option<Slot>),
    /// Nothing spare: open a connection (under the cap when there is one).
    Open(Option<Slot>),
}

struct Waiter {
    /// None: the waiter wants only a place (a passthrough login).
    key: Option<Key>,
    tx: oneshot::Sender<Grant>,
}

/// One worker's share of a backend's connections.
#[derive(Default)]
struct Lane {
    /// Connections opened under the cap (in use and spare).
    open: usize,
    max: usize,
    spare: Vec<Spare>,
    waiters: VecDeque<Waiter>,
}

/// The shared connections of one backend, a lane per worker.
pub struct Lanes {
    lanes: Box<[Mutex<Lane>]>,
    /// Whether `max_backend_connections` applies.
    capped: bool,
    pub queue_timeout: Duration,
    /// A spare connection unused this long is closed by the sweeper.
    idle_timeout: Duration,
    metrics: BackendMetrics,
}

impl Lanes {
    /// `max` connections shared out among `workers` (0: no cap).
    pub fn new(max: usize, workers: usize, queue_timeout: Duration, idle_timeout: Duration, metrics: BackendMetrics) -> Arc<Lanes> {
        let workers = workers.max(1);
        let lanes =
            (0..workers).map(|i| Mutex::new(Lane { max: max / workers + usize::from(i < max % workers), ..Lane::default() })).collect();
        Arc::new(Lanes { lanes, capped: max > 0, queue_timeout, idle_timeout, metrics })
    }

    fn lane(&self, w: usize) -> &Mutex<Lane> {
        &self.lanes[w % self.lanes.len()]
    }

    /// A place under the cap for a connection no session of a key will share (a passthrough
    /// login), waiting in the queue when the cap is reached. None when there is no cap.
    pub async fn place(self: &Arc<Self>) -> Result<Option<Slot>, Duration> {
        match self.take_for(None).await? {
            Taken::Conn(..) => unreachable!("no spare connection has no key"),
            Taken::Open(slot) => Ok(slot),
        }
    }

    /// A spare connection of `key` on this worker (when `reuse`), else a place to open one,
    /// waiting at most `queue_timeout` behind the statements queued before. Err: the time waited.
    pub async fn take(self: &Arc<Self>, key: &Key, reuse: bool) -> Result<Taken, Duration> {
        if !reuse {
            return self.take_for(None).await;
        }
        self.take_for(Some(key)).await
    }

    /// A place under the cap for a connection that is open already (a session handed over by
    /// another process brings its own), taken even past the cap. None when there is no cap.
    pub fn hold(self: &Arc<Self>) -> Option<Slot> {
        let w = worker();
        self.capped.then(|| {
            self.lane(w).lock().open += 1;
            Slot { lanes: self.clone(), worker: w }
        })
    }

    /// A spare connection of `key` on this worker, if one is there (no wait).
    /// (Only one opened with the session's own connection attributes.)
    pub fn try_take(self: &Arc<Self>, key: &Key) -> Option<(Spare, Option<Slot>)> {
        let w = worker();
        let mut lane = self.lane(w).lock();
        let at = lane.spare.iter().rposition(|s| s.key == *key && s.key.attrs == key.attrs)?;
        let spare = lane.spare.swap_remove(at);
        self.metrics.shared_spare.dec();
        Some((spare, self.capped.then(|| Slot { lanes: self.clone(), worker: w })))
    }

    async fn take_for(self: &Arc<Self>, key: Option<&Key>) -> Result<Taken, Duration> {
        let w = worker();
        let rx = {
            let mut lane = self.lane(w).lock();
            // One opened with the same attributes; else a new one while under the cap; else
            // one opened for another client.
            let own = key.and_then(|key| lane.spare.iter().rposition(|s| s.key == *key && s.key.attrs == key.attrs));
            let under_cap = !self.capped || lane.open < lane.max;
            let any = || key.and_then(|key| lane.spare.iter().rposition(|s| s.key == *key));
            if let Some(at) = own.or_else(|| if under_cap { None } else { any() }) {
                let spare = lane.spare.swap_remove(at);
                self.metrics.shared_spare.dec();
                return Ok(Taken::Conn(spare, self.capped.then(|| Slot { lanes: self.clone(), worker: w })));
            }
            if !self.capped {
                return Ok(Taken::Open(None));
            }
            if lane.open < lane.max {
                lane.open += 1;
                return Ok(Taken::Open(Some(Slot { lanes: self.clone(), worker: w })));
            }
            // A spare connection of another key gives its place.
            if !lane.spare.is_empty() {
                let oldest = lane.spare.iter().enumerate().min_by_key(|(_, s)| s.since).map(|(i, _)| i).unwrap_or(0);
                let closing = lane.spare.swap_remove(oldest);
                self.metrics.shared_spare.dec();
                drop(lane);
                drop(closing);
                return Ok(Taken::Open(Some(Slot { lanes: self.clone(), worker: w })));
            }
            let (tx, rx) = oneshot::channel();
            lane.waiters.push_back(Waiter { key: key.cloned(), tx });
            rx
        };
        self.metrics.queue_waiting.inc();
        let started = Instant::now();
        let got = tokio::time::timeout(self.queue_timeout, rx).await;
        let waited = started.elapsed();
        self.metrics.queue_waiting.dec();
        self.metrics.queue_wait.observe_nanos(waited.as_nanos() as u64);
        match got {
            Ok(Ok(Grant::Conn(spare, slot))) => Ok(Taken::Conn(spare, Some(slot))),
            Ok(Ok(Grant::Open(slot))) => Ok(Taken::Open(Some(slot))),
            // (The sender is dropped only with the lane's backend: count it as a timeout.)
            _ => {
                self.metrics.queue_timeouts.inc();
                Err(waited)
            }
        }
    }

    /// Gives a connection back (made into a [`Spare`] just now, which dates it): to the first
    /// waiter of its key, else kept spare (or, when the first waiter wants another key, closed
    /// so that its place goes to that waiter). `slot` is the connection's place under the cap.
    pub fn give_back(self: &Arc<Self>, spare: Spare, slot: Option<Slot>) {
        let Some(slot) = slot else {
            self.lane(worker()).lock().spare.push(spare);
            self.metrics.shared_spare.inc();
            return;
        };
        let w = slot.worker;
        let mut lane = self.lane(w).lock();
        let mut grant = Grant::Conn(spare, slot);
        while let Some(at) = lane.waiters.iter().position(|x| matches!(&grant, Grant::Conn(s, _) if x.key.as_ref() == Some(&s.key))) {
            let waiter = lane.waiters.remove(at).expect("position is in range");
            match waiter.tx.send(grant) {
                Ok(()) => return,
                Err(back) => grant = back,
            }
        }
        let Grant::Conn(spare, slot) = grant else { unreachable!() };
        if lane.waiters.is_empty() {
            lane.spare.push(spare);
            self.metrics.shared_spare.inc();
            // The place stays taken by the spare connection.
            std::mem::forget(slot);
            return;
        }
        // The queue wants other keys: close this one; dropping the slot passes its place on.
        drop(lane);
        drop(spare);
        drop(slot);
    }

    /// A place freed (a connection closed): the first live waiter gets it.
    fn free(self: &Arc<Self>, w: usize) {
        let mut lane = self.lane(w).lock();
        while let Some(waiter) = lane.waiters.pop_front() {
            let slot = Slot { lanes: self.clone(), worker: w };
            match waiter.tx.send(Grant::Open(slot)) {
                Ok(()) => return,
                // The waiter gave up; the slot it did not take was dropped (and came back
                // here): forget it, since this loop still holds the place.
                Err(Grant::Open(slot)) | Err(Grant::Conn(_, slot)) => std::mem::forget(slot),
            }
        }
        lane.open = lane.open.saturating_sub(1);
    }

    /// This worker's spare connections to close: those unused for the idle timeout (all of
    /// them with `all`). Their places under the cap are freed.
    pub fn expired(self: &Arc<Self>, all: bool) -> Vec<Spare> {
        let w = worker();
        let out: Vec<Spare> = {
            let mut lane = self.lane(w).lock();
            let timeout = self.idle_timeout;
            lane.spare.extract_if(.., |s| all || s.since.elapsed() >= timeout).collect()
        };
        self.metrics.shared_spare.dec_by(out.len() as i64);
        if self.capped {
            for _ in &out {
                self.free(w);
            }
        }
        out
    }

    /// Every worker's spare connections, to close (the server is at its connection limit);
    /// their places under the cap are freed.
    pub fn take_all(self: &Arc<Self>) -> Vec<Spare> {
        let mut out = Vec::new();
        for w in 0..self.lanes.len() {
            let taken = std::mem::take(&mut self.lane(w).lock().spare);
            self.metrics.shared_spare.dec_by(taken.len() as i64);
            if self.capped {
                for _ in &taken {
                    self.free(w);
                }
            }
            out.extend(taken);
        }
        out
    }

    /// Spare connections now, in use under the cap now (all workers).
    pub fn counts(&self) -> (usize, usize) {
        self.lanes.iter().fold((0, 0), |(s, o), l| {
            let l = l.lock();
            (s + l.spare.len(), o + l.open)
        })
    }
}
