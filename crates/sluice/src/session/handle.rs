//! The shared face of a session ([`SessionHandle`]: what other tasks see of it and may ask of
//! it), how it is woken ([`Wake`]), and the [`Registry`] of the sessions alive.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;
use serde::Serialize;
use sluice_proto::consts::status;

use super::{Pin, SessionState};
use crate::metrics::MoveReason;

/// What the admin API shows of a session: what it published ([`Published`]) and its counters.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub id: u32,
    #[serde(flatten)]
    pub published: Published,
    pub backend_thread_id: Option<u32>,
    pub pins: Vec<Pin>,
    pub safe_point: bool,
    /// A move asked and not made yet, and why.
    pub move_asked: Option<&'static str>,
    pub queries: u64,
    pub busy: bool,
    /// Idle and parked: waiting for its client in the parking lot (`frontend/idle/lot.rs`).
    pub parked: bool,
}

/// What a session publishes of itself, kept in its handle (every idle session holds one: what
/// the handle's atomics tell is not repeated here).
#[derive(Debug, Clone, Serialize)]
pub struct Published {
    pub client: Box<str>,
    /// The listener's name (one string for all its sessions).
    pub listener: Arc<str>,
    /// The address of sluice the client reached (TCP).
    pub local: Option<std::net::SocketAddr>,
    /// The client's connection to sluice is TLS.
    pub tls: bool,
    /// Sluice's connection to the backend is TLS.
    pub backend_tls: bool,
    pub compressed: bool,
    pub connected_at_unix: u64,
    pub backend: Option<String>,
    pub state: SessionState,
}

/// What [`SessionHandle::response_wait`] holds when the session is not waiting for a backend.
pub const NOT_WAITING: u32 = 0;
/// What it holds once the response-timeout sweep (`deadline`) found the wait past the limit.
pub const EXPIRED: u32 = u32::MAX;
/// What it holds once failover gave up the wait: the backend was replaced and may never
/// answer (a hung server), so the read ends as a lost connection would.
pub const ABANDONED: u32 = u32::MAX - 1;

/// The shared face of a session: what other tasks may see or ask of it.
///
/// Laid out as declared, from a cache line of its own: the fields up to `wake`'s flag are the
/// ones every command reads or writes, and they share that first line (a session's data is
/// cold when its next command comes, so each line it touches is a wait for memory).
#[repr(C, align(64))]
pub struct SessionHandle {
    pub queries: AtomicU64,
    /// Whether it may park while idle, and was asked to.
    pub parking: crate::session::parking::Parking,
    /// The tick (`ctx.clock`) at which the session began to wait for its backend's response,
    /// [`NOT_WAITING`] when it is not waiting, [`EXPIRED`] once the sweep
    /// found that wait past `response_timeout`, or [`ABANDONED`].
    pub response_wait: AtomicU32,
    /// A move asked of the session: [`NO_MOVE`], [`MOVE_ANYWHERE`], or the target backend's
    /// index + 1; and why (a [`MoveReason`] index).
    move_to: AtomicU32,
    /// Server status flags after the last command (changes every transaction: kept apart from
    /// `info` so that publishing it costs one store).
    pub status: AtomicU16,
    pub busy: AtomicBool,
    /// Set by KILL CONNECTION or a forced shutdown.
    pub killed: AtomicBool,
    /// A KILL CONNECTION for this session is under way.
    pub kill_pending: AtomicBool,
    move_why: AtomicU8,
    /// Sluice could move the session at its next safe point: it holds the credentials (users
    /// mode) and nothing it cannot recreate is open (as last published).
    pub can_move: AtomicBool,
    /// It waits at the gate of a consistent capture start.
    pub gated: AtomicBool,
    /// Woken to make an idle session look at `killed` and the drain flag.
    pub wake: Wake,
    pub id: u32,
    pub backend_index: AtomicU32,
    pub backend_thread_id: AtomicU32,
    /// Its statements are routed one by one (read/write split): the backend it is bound to
    /// changes with them, and the rebalancer leaves it alone.
    pub split: AtomicBool,
    pub started: Instant,
    /// When it last moved (milliseconds of `metrics::mono_ns`; 0: never).
    pub moved_at_ms: AtomicU64,
    pub info: Mutex<Published>,
    /// Told when the session leaves the registry (its client's connection closed).
    pub ended: tokio::sync::Notify,
}

pub const NO_MOVE: u32 = 0;
pub const MOVE_ANYWHERE: u32 = u32::MAX;

impl SessionHandle {
    pub fn new(id: u32, client: String, listener: Arc<str>) -> SessionHandle {
        let connected_at_unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        SessionHandle {
            id,
            started: Instant::now(),
            queries: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            kill_pending: AtomicBool::new(false),
            wake: Wake::default(),
            backend_index: AtomicU32::new(u32::MAX),
            backend_thread_id: AtomicU32::new(0),
            status: AtomicU16::new(status::AUTOCOMMIT),
            response_wait: AtomicU32::new(NOT_WAITING),
            move_to: AtomicU32::new(NO_MOVE),
            move_why: AtomicU8::new(0),
            can_move: AtomicBool::new(false),
            gated: AtomicBool::new(false),
            split: AtomicBool::new(false),
            moved_at_ms: AtomicU64::new(0),
            parking: Default::default(),
            ended: tokio::sync::Notify::new(),
            info: Mutex::new(Published {
                client: client.into(),
                listener,
                local: None,
                tls: false,
                backend_tls: false,
                compressed: false,
                connected_at_unix,
                backend: None,
                state: SessionState::default(),
            }),
        }
    }

    /// Records the backend connection the session is bound to (before the client is told it is
    /// logged in, so that a KILL naming this session can always find it).
    pub fn bind_backend(&self, index: usize, name: &str, thread_id: u32) {
        self.backend_index.store(index as u32, Ordering::Relaxed);
        self.backend_thread_id.store(thread_id, Ordering::Relaxed);
        let mut i = self.info.lock();
        // (Reusing the string: a split session changes backend at many statements.)
        match &mut i.backend {
            Some(b) => {
                b.clear();
                b.push_str(name);
            }
            None => i.backend = Some(name.to_string()),
        }
    }

    /// Publishes the session's state for the admin API (after changes other than status).
    pub fn publish(&self, state: &SessionState) {
        self.can_move.store((!state.passthrough || state.handed_over) && state.hazards == 0, Ordering::Relaxed);
        self.info.lock().state = state.clone();
        self.publish_status(state.status);
    }

    #[inline]
    pub fn publish_status(&self, st: u16) {
        if self.status.load(Ordering::Relaxed) != st {
            self.status.store(st, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> SessionInfo {
        let mut published = self.info.lock().clone();
        published.state.status = self.status.load(Ordering::Relaxed);
        let state = &published.state;
        // A multiplexed session between statements holds no connection.
        let tid = self.backend_thread_id.load(Ordering::Relaxed);
        SessionInfo {
            id: self.id,
            pins: state.pins(),
            safe_point: state.at_safe_point(),
            move_asked: self.move_reason().map(MoveReason::as_str),
            backend_thread_id: (tid != 0).then_some(tid),
            queries: self.queries.load(Ordering::Relaxed),
            busy: self.busy.load(Ordering::Relaxed),
            parked: self.parking.parked.load(Ordering::Relaxed),
            published,
        }
    }

    /// Asks the session to move to backend `to` (any other one when None) at its next safe
    /// point, and wakes it if it is idle.
    pub fn ask_move(&self, to: Option<usize>, why: MoveReason) {
        self.move_why.store(why as u8, Ordering::Relaxed);
        self.move_to.store(to.map_or(MOVE_ANYWHERE, |i| i as u32 + 1), Ordering::SeqCst);
        self.wake.notify();
    }

    #[inline]
    pub fn move_asked(&self) -> bool {
        self.move_to.load(Ordering::Relaxed) != NO_MOVE
    }

    /// The backend a move asked goes to (None: none asked, or any other backend).
    pub fn move_target(&self) -> Option<usize> {
        match self.move_to.load(Ordering::Relaxed) {
            NO_MOVE | MOVE_ANYWHERE => None,
            i => Some(i as usize - 1),
        }
    }

    /// Why a move was asked, if one was.
    pub fn move_reason(&self) -> Option<MoveReason> {
        self.move_asked().then(|| MoveReason::ALL[usize::from(self.move_why.load(Ordering::Relaxed)) % MoveReason::ALL.len()])
    }

    /// Takes the move asked: its target (None: any other backend) and reason.
    pub fn take_move(&self) -> Option<(Option<usize>, MoveReason)> {
        let why = self.move_reason()?;
        match self.move_to.swap(NO_MOVE, Ordering::SeqCst) {
            NO_MOVE => None,
            MOVE_ANYWHERE => Some((None, why)),
            i => Some((Some(i as usize - 1), why)),
        }
    }

    /// Calls off a move asked for `why` that was not made yet.
    pub fn cancel_move(&self, why: MoveReason) {
        if self.move_reason() == Some(why) {
            self.move_to.store(NO_MOVE, Ordering::SeqCst);
        }
    }

    pub fn kill(&self) {
        self.killed.store(true, Ordering::Relaxed);
        self.wake.notify();
    }
}

/// Wakes a session that waits for its next command (to look at a kill or the drain flag).
/// Waiting costs an atomic swap and a pointer comparison: the task's waker is stored only when
/// it changed, not registered and removed at every command as a `tokio::sync::Notify` would.
#[derive(Default)]
#[repr(C)] // (the flag first: it falls in the handle's first line)
pub struct Wake {
    flag: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Wake {
    /// Makes the next (or current) wait return.
    pub fn notify(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.wake_task();
    }

    /// Wakes the task that waits here, without making its wait return.
    pub fn wake_task(&self) {
        if let Some(w) = self.waker.lock().as_ref() {
            w.wake_by_ref();
        }
    }

    /// Makes sure the task of `cx` is the one woken, leaving the flag alone. `known` is the
    /// waker the caller last stored here; true when it had to be stored again.
    pub fn register(&self, cx: &Context<'_>, known: &mut Option<Waker>) -> bool {
        if known.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return false;
        }
        *known = Some(cx.waker().clone());
        *self.waker.lock() = Some(cx.waker().clone());
        true
    }

    /// Whether `notify` was called since a wait last returned.
    pub fn pending(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Makes `w` the waker that `notify` wakes (a parked session's, in the parking lot).
    pub fn hand_to(&self, w: Waker) {
        *self.waker.lock() = Some(w);
    }

    /// Ready once `notify` was called since it last returned Ready. `known` is the waker the
    /// caller last stored here.
    pub fn poll_woken(&self, cx: &mut Context<'_>, known: &mut Option<Waker>) -> Poll<()> {
        if self.flag.swap(false, Ordering::SeqCst) {
            return Poll::Ready(());
        }
        // A notify that ran before the waker was stored left only the flag.
        if self.register(cx, known) && self.flag.swap(false, Ordering::SeqCst) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// All live sessions by sluice connection id.
#[derive(Default)]
pub struct Registry {
    map: Mutex<HashMap<u32, Arc<SessionHandle>>>,
    next_id: AtomicU32,
}

impl Registry {
    pub fn next_id(&self) -> u32 {
        // Ids start at 1 and skip 0 on wrap-around.
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if id != 0 {
                return id;
            }
        }
    }

    pub fn insert(&self, h: Arc<SessionHandle>) {
        self.map.lock().insert(h.id, h);
    }

    /// Registers a session handed over by another process under the id it had there; false
    /// when a session here has it already.
    pub fn insert_new(&self, h: Arc<SessionHandle>) -> bool {
        match self.map.lock().entry(h.id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(h);
                true
            }
        }
    }

    /// The id the next session would get.
    pub fn peek_next_id(&self) -> u32 {
        self.next_id.load(Ordering::Relaxed).wrapping_add(1)
    }

    /// Numbers the sessions from `first` on (a process started by an upgrade: the ids below
    /// are the old process's, which its sessions keep when handed over).
    pub fn start_ids_at(&self, first: u32) {
        self.next_id.store(first.wrapping_sub(1), Ordering::Relaxed);
    }

    /// Runs `f` on every live session (under the registry's lock: keep it short).
    pub fn for_each(&self, mut f: impl FnMut(&SessionHandle)) {
        for h in self.map.lock().values() {
            f(h);
        }
    }

    pub fn remove(&self, id: u32) {
        let removed = self.map.lock().remove(&id);
        if let Some(h) = removed {
            h.ended.notify_waiters();
        }
    }

    pub fn get(&self, id: u32) -> Option<Arc<SessionHandle>> {
        self.map.lock().get(&id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<SessionHandle>> {
        let mut v: Vec<_> = self.map.lock().values().cloned().collect();
        v.sort_by_key(|h| h.id);
        v
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wake_reaches_a_waiting_session_and_one_that_was_busy() {
        let wake = Arc::new(Wake::default());
        let mut known = None;
        // A notify while nobody waits is kept for the next wait.
        wake.notify();
        std::future::poll_fn(|cx| wake.poll_woken(cx, &mut known)).await;
        // A notify from another thread wakes the waiting task.
        let w = wake.clone();
        let waiter = tokio::spawn(async move {
            let mut known = None;
            std::future::poll_fn(|cx| w.poll_woken(cx, &mut known)).await;
        });
        tokio::task::yield_now().await;
        std::thread::spawn(move || wake.notify()).join().unwrap();
        waiter.await.unwrap();
    }
}

#[cfg(test)]
mod layout {
    use std::mem::offset_of;

    use super::{SessionHandle, Wake};

    /// What every command touches of its handle is in one cache line.
    #[test]
    fn what_a_command_touches_shares_the_first_line() {
        assert_eq!(std::mem::align_of::<SessionHandle>(), 64);
        for end in [
            offset_of!(SessionHandle, queries) + 8,
            offset_of!(SessionHandle, parking) + std::mem::size_of::<crate::session::parking::Parking>(),
            offset_of!(SessionHandle, response_wait) + 4,
            offset_of!(SessionHandle, move_to) + 4,
            offset_of!(SessionHandle, status) + 2,
            offset_of!(SessionHandle, busy) + 1,
            offset_of!(SessionHandle, killed) + 1,
            offset_of!(SessionHandle, kill_pending) + 1,
            offset_of!(SessionHandle, wake) + offset_of!(Wake, flag) + 1,
        ] {
            assert!(end <= 64, "a hot field ends at byte {end}");
        }
    }
}
