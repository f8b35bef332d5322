//! Between commands: the wait for the next one (here), and parked sessions. An idle session,
//! asked by the sweep (`crate::session::parking`), gives its read buffers back; a multiplexed one
//! also leaves its task, which is sized for a command in flight: it waits for its client in the
//! worker's parking lot (`lot.rs`), in the small form a session takes there (`dormant.rs`); its
//! next command, a kill, a move or the drain starts a full task again.

mod dormant;
mod lot;

use std::future::Future;

use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use sluice_proto::consts::err as code;
use sluice_proto::packet::{HEADER, Header};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::Admission;
use super::client::ClientConn;
use super::session::{BackendSide, INSPECT_LIMIT, Session};
use crate::error::{Error, Result};
use crate::net::{BUF_SIZE, PacketConn, buffers};
use crate::session::Registry;

/// What [`Session::wait_command`] saw.
pub(super) enum Wait {
    Command(Header),
    End,
    Park,
    /// Handed over to the new process an upgrade started (`handoff.rs`).
    HandedOff,
}

/// How often the sweep looks at the sessions: one idle for a whole interval parks.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Up to this many client connections, a session keeps its two read buffers (32 KiB) between
/// commands until it idles a sweep interval (2 MiB at most, as much as a worker's pool keeps):
/// giving them back to the pool at every wait and taking them again costs about 280
/// instructions per command. Beyond it (a crowd of mostly idle connections), every wait gives
/// them back, so that idle connections hold none.
const KEEP_BUFFERS_UP_TO: usize = 64;

/// Asks the sessions that stayed idle over a whole interval to park.
pub async fn sweep(sessions: &Registry) {
    loop {
        tokio::time::sleep(INTERVAL).await;
        sessions.for_each(|h| {
            if h.parking.observe(h.queries.load(Ordering::Relaxed), h.busy.load(Ordering::Relaxed)) {
                h.wake.notify();
            }
        });
    }
}

impl Session {
    /// Waits until a command's first packet (or its first megabyte) is buffered. `End` when the
    /// session should end: the client left, it was killed, it idled out, or sluice is draining
    /// and the session is between transactions; `Park` when it was asked to and can.
    pub(super) async fn wait_command(&mut self) -> Result<Wait> {
        let idle_deadline = self.idle_deadline();
        // Whether to wait without read buffers (until the first readiness).
        let mut may_park = self.unbuffered();
        loop {
            if self.handle.move_asked() && self.client.rbuf.is_empty() && self.settle().await? {
                return Ok(Wait::End);
            }
            if let Some(h) = Header::parse(&self.client.rbuf) {
                let want = HEADER + h.len.min(INSPECT_LIMIT);
                if self.client.rbuf.len() >= want {
                    self.idle_since = None;
                    self.resumed = false;
                    return Ok(Wait::Command(h));
                }
                self.client.rbuf.reserve(want - self.client.rbuf.len());
            }
            if let Some(w) = self.leaving() {
                return Ok(w);
            }
            let park = may_park && self.holds_no_bytes();
            self.buffers_for_wait(park);
            let watch_backend = self.backend.lost.is_none() && !self.backend.conn.is_detached();
            let Session { client, backend: BackendSide { conn: backend, .. }, handle, waker, .. } = self;
            let event = if park && idle_deadline.is_none() {
                // The common wait, on readiness alone, without a select's futures.
                let backend = watch_backend.then_some(&backend.stream);
                std::future::poll_fn(|cx| poll_ready_event(backend, &client.stream, handle, waker, cx)).await
            } else {
                let deadline = if client.rbuf.is_empty() { idle_deadline } else { rest_deadline(client, idle_deadline) };
                tokio::select! {
                    biased;
                    // The backend first: when it left and a command arrived at once, the session
                    // must know before forwarding the command.
                    r = backend_event(backend, park), if watch_backend => Event::Backend(r),
                    r = client_event(client, park) => Event::Client(r),
                    _ = std::future::poll_fn(|cx| handle.wake.poll_woken(cx, waker)) => Event::Woken,
                    _ = sleep_until(deadline) => Event::IdledOut,
                }
            };
            let left = match event {
                Event::Backend(r) => self.backend_spoke(r, park, &mut may_park).await,
                Event::Client(r) => self.client_spoke(r, park, &mut may_park)?,
                Event::Woken => None,
                Event::IdledOut if !self.client.rbuf.is_empty() && !self.client.read_timeout.is_zero() => {
                    let stalled = std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped in the middle of a command");
                    return Err(Error::client_read("reading command", stalled));
                }
                Event::IdledOut => {
                    tracing::info!(session = self.handle.id, "closing idle session");
                    Some(Wait::End)
                }
            };
            if let Some(w) = left {
                return Ok(w);
            }
        }
    }

    /// Whether neither read buffer holds a byte (the session can then wait without them).
    fn holds_no_bytes(&self) -> bool {
        self.client.rbuf.is_empty() && self.backend.conn.rbuf.is_empty()
    }

    /// Why the session stops waiting before it waits again, if it does: killed, handed over to
    /// an upgrade's new process, drained between transactions, or parked.
    fn leaving(&mut self) -> Option<Wait> {
        if self.handle.killed.load(Ordering::Relaxed) {
            return Some(Wait::End);
        }
        if self.ctx.handoff.is_open() && self.hand_off() {
            return Some(Wait::HandedOff);
        }
        if self.ctx.is_draining() && !self.state.in_transaction() && self.client.rbuf.is_empty() {
            return Some(Wait::End);
        }
        if self.handle.parking.asked() && !std::mem::take(&mut self.resumed) && self.park() {
            return Some(Wait::Park);
        }
        None
    }

    /// The read buffers for a wait: for one without them (`park`), given back to the worker's
    /// pool when sluice holds many connections, else kept unless a response grew them past
    /// what the pool keeps (a session gives them back once it idled a sweep interval:
    /// [`Session::park`]); for a wait with them, taken again, with room for the backend's next
    /// bytes.
    fn buffers_for_wait(&mut self, park: bool) {
        if park && self.ctx.connections.load(Ordering::Relaxed) > KEEP_BUFFERS_UP_TO {
            buffers::park(&mut self.client.rbuf);
            buffers::park(&mut self.backend.conn.rbuf);
        } else if park {
            buffers::trim(&mut self.client.rbuf);
            buffers::trim(&mut self.backend.conn.rbuf);
        } else {
            buffers::unpark(&mut self.client.rbuf);
            buffers::unpark(&mut self.backend.conn.rbuf);
            if self.backend.conn.rbuf.capacity() - self.backend.conn.rbuf.len() < 1024 {
                self.backend.conn.rbuf.reserve(BUF_SIZE);
            }
        }
    }

    /// The backend spoke or left unasked while the session was idle (wait_timeout, a kill, a
    /// shutdown). None: wait again (a false readiness, or the session moves at its next command).
    async fn backend_spoke(&mut self, r: std::io::Result<usize>, park: bool, may_park: &mut bool) -> Option<Wait> {
        let r = if park {
            // Readiness only: read what is there (a TLS connection's readiness may be left from
            // its last response, and mean nothing).
            buffers::unpark(&mut self.backend.conn.rbuf);
            match self.backend.conn.stream.try_read_now(&mut self.backend.conn.rbuf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    *may_park = self.unbuffered();
                    return None;
                }
                r => r,
            }
        } else {
            r
        };
        let (reason, code) = match r {
            Ok(n) if n > 0 => lost_reason(&self.backend.conn.rbuf),
            _ => ("the backend closed the connection".to_string(), None),
        };
        let handle = &*self.handle;
        let killed = handle.killed.load(Ordering::Relaxed) || handle.kill_pending.load(Ordering::Relaxed);
        // A connection killed on purpose is not revived.
        if (self.may_move() || self.may_replay()) && !killed && code != Some(code::CONNECTION_KILLED) {
            tracing::info!(session = handle.id, backend = %self.backend.guard.name, reason = %reason, "backend connection lost while idle; the session moves at its next command");
            self.backend.conn.rbuf.clear();
            self.backend.lost = Some(reason.into());
            return None;
        }
        // The client gets what the backend sent, as it would directly, and the connection is
        // closed, so that its driver sees a dead connection rather than a failing one.
        tracing::info!(session = handle.id, backend = %self.backend.guard.name, reason = %reason, pins = ?self.state.pins(), "backend connection lost while idle; closing the client connection");
        if !self.backend.conn.rbuf.is_empty() {
            let _ = Box::pin(self.client.write(&self.backend.conn.rbuf)).await;
        }
        self.backend.lost = Some(reason.into());
        Some(Wait::End)
    }

    /// The client spoke (or left). None: read on.
    fn client_spoke(&mut self, r: std::io::Result<usize>, park: bool, may_park: &mut bool) -> Result<Option<Wait>> {
        if !park {
            return match r {
                Ok(0) => Ok(Some(Wait::End)),
                Ok(_) => Ok(None),
                Err(e) => Err(Error::client_read("reading command", e)),
            };
        }
        // Readiness: read at once rather than wait again. A false one (for TLS, a readiness
        // left from the last command, or a record's first part) goes back to waiting without
        // buffers.
        buffers::unpark(&mut self.client.rbuf);
        buffers::unpark(&mut self.backend.conn.rbuf);
        match self.client.stream.try_read_now(&mut self.client.rbuf) {
            Ok(0) => return Ok(Some(Wait::End)),
            Ok(_) => *may_park = false,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => *may_park = self.unbuffered(),
            Err(e) => return Err(Error::client_read("reading command", e)),
        }
        Ok(None)
    }

    /// Whether both connections can wait for their next bytes without read buffers.
    fn unbuffered(&self) -> bool {
        self.client.can_wait_unbuffered() && self.backend.conn.stream.can_wait_unbuffered()
    }

    /// Answers a request to park, made once the session idled a sweep interval: true when it
    /// can leave its task (a multiplexed session between commands that holds no backend
    /// connection, no buffered byte and no move to make). Its read buffers are given back then,
    /// and also when it stays but can wait without them.
    pub(super) fn park(&mut self) -> bool {
        self.handle.parking.answered();
        let can = self.route.multiplex
            && self.backend.conn.is_detached()
            && self.backend.lost.is_none()
            && self.client.rbuf.is_empty()
            && self.client.can_wait_unbuffered()
            && !self.handle.move_asked();
        if can || (self.holds_no_bytes() && self.unbuffered()) {
            buffers::park(&mut self.client.rbuf);
            buffers::park(&mut self.backend.conn.rbuf);
        }
        can
    }

    /// When an idle session times out (None: never); the idle time counts from the end of its
    /// last command, across parks.
    pub(super) fn idle_deadline(&mut self) -> Option<Instant> {
        let idle = self.config.proxy.idle_timeout;
        if idle.is_zero() {
            return None;
        }
        Some(*self.idle_since.get_or_insert_with(Instant::now) + idle)
    }

    /// Waits, parked, until the client sent something or left, the handle was woken (a kill, a
    /// move, the drain), or the idle timeout passed.
    async fn wait_parked(&mut self) {
        let mut idle = self.idle_deadline().map(|d| Box::pin(tokio::time::sleep_until(d)));
        let Session { client, handle, waker, .. } = self;
        std::future::poll_fn(|cx| {
            if client.stream.poll_read_ready(cx).is_ready() || handle.wake.poll_woken(cx, waker).is_ready() {
                return Poll::Ready(());
            }
            match &mut idle {
                Some(s) => s.as_mut().poll(cx),
                None => Poll::Pending,
            }
        })
        .await;
        // What a wake announced (a kill, a move, the drain) is looked at again by the full
        // task before it waits.
    }
}

/// Parks `session`: in the worker's lot (`lot.rs`), or else in a small task of its own; either
/// serves it again in a full task once its client speaks or its handle is woken.
pub(super) fn spawn(session: Box<Session>, admission: Admission) {
    let metrics = &session.ctx.metrics;
    metrics.session_parks.inc();
    metrics.parked_sessions.inc();
    let (handle, ctx) = (session.handle.clone(), session.ctx.clone());
    handle.parking.parked.store(true, Ordering::Relaxed);
    match lot::park(session, admission) {
        lot::Outcome::Parked => {}
        lot::Outcome::Back(session, admission) => {
            tokio::spawn(parked(session, admission));
        }
        lot::Outcome::Gone => {
            handle.parking.parked.store(false, Ordering::Relaxed);
            ctx.metrics.parked_sessions.dec();
        }
    }
}

/// The task of a parked session.
pub(super) async fn parked(mut session: Box<Session>, admission: Admission) {
    session.wait_parked().await;
    lot::unparked(&session.handle, &session.ctx);
    lot::resume(session, admission);
}

/// Reads what a backend sent unasked (a shutdown or kill notice) to explain a lost connection.
fn lost_reason(buf: &[u8]) -> (String, Option<u16>) {
    let payload = buf.get(HEADER..).unwrap_or_default();
    match sluice_proto::basic::Err::parse(payload) {
        Ok(e) => (format!("{} {}", e.code, String::from_utf8_lossy(e.message)), Some(e.code)),
        Err(_) => ("the backend sent data while the session was idle".into(), None),
    }
}

/// What ended a wait between commands: the backend or the client spoke (readiness alone, or
/// what was read), the handle was woken, or the idle timeout passed.
enum Event {
    Backend(std::io::Result<usize>),
    Client(std::io::Result<usize>),
    Woken,
    IdledOut,
}

/// The wait on readiness alone: the backend connection (`backend`, when there is one to watch)
/// readable, else the client, else the handle woken. The backend is looked at first, as in the
/// select: a command that came as the backend left must not be forwarded. Its readiness is
/// looked at without registering the task (the wake that the client's command causes leaves
/// it registered there); only a poll that finds nothing registers the task with both sockets.
fn poll_ready_event(
    backend: Option<&crate::net::Stream>,
    client: &crate::net::Stream,
    handle: &crate::session::SessionHandle,
    waker: &mut Option<std::task::Waker>,
    cx: &mut std::task::Context<'_>,
) -> Poll<Event> {
    if backend.is_some_and(|b| b.is_read_ready()) {
        return Poll::Ready(Event::Backend(Ok(1)));
    }
    if let Poll::Ready(r) = client.poll_read_ready(cx) {
        return Poll::Ready(Event::Client(r.map(|()| 1)));
    }
    if let Some(b) = backend
        && let Poll::Ready(r) = b.poll_read_ready(cx)
    {
        return Poll::Ready(Event::Backend(r.map(|()| 1)));
    }
    handle.wake.poll_woken(cx, waker).map(|()| Event::Woken)
}

/// The backend connection has data or an end: readiness alone when parked, else what was read.
async fn backend_event(backend: &mut PacketConn, parked: bool) -> std::io::Result<usize> {
    if parked { backend.stream.readable().await.map(|_| 1) } else { backend.stream.read_buf(&mut backend.rbuf).await }
}

/// The client sent something: readiness alone when parked, else the bytes read.
async fn client_event(client: &mut ClientConn, parked: bool) -> std::io::Result<usize> {
    if parked { client.stream.readable().await.map(|_| 1) } else { client.fill().await }
}

/// When a wait for the rest of a command the client began ends: `client_read_timeout` after the
/// client's last bytes (or the session's last event: the wait starts over after any), or when
/// the session idles out, whichever comes first. (Never on the common wait, which holds no
/// byte.)
#[cold]
fn rest_deadline(client: &ClientConn, idle: Option<Instant>) -> Option<Instant> {
    let limit = client.read_timeout;
    if limit.is_zero() {
        return idle;
    }
    let rest = Instant::now() + limit;
    Some(idle.map_or(rest, |i| i.min(rest)))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
