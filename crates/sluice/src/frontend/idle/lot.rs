//! The parking lot: the parked sessions of a worker wait together in one task, on an epoll set
//! of their client sockets, which leave tokio's reactor meanwhile. A parked session then holds
//! no task and no reactor registration (about 700 bytes with the allocator's padding), only its
//! boxed state and an entry here.
//!
//! A session leaves the lot when its socket is readable (a command or the client's end), when
//! its handle is woken (KILL, a move, the drain: the waker the handle holds names the session),
//! or when its idle timeout passes; its socket goes back to the reactor and a full task takes
//! it on again.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Poll, Wake, Waker};

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use super::dormant::Dormant;
use crate::frontend::Admission;
use crate::frontend::session::Session;
use crate::net::Stream;
use crate::sys::epoll::Epoll;

/// A client socket out of the reactor.
enum Socket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Socket {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Tcp(s) => s.as_fd(),
            Socket::Unix(s) => s.as_fd(),
        }
    }
}

/// Ready sockets taken per turn of the lot's task.
const BATCH: usize = 64;

struct Parked {
    session: Box<Dormant>,
    admission: Admission,
    socket: Socket,
    deadline: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    parked: HashMap<u64, Parked, rustc_hash::FxBuildHasher>,
    /// Sessions to resume though their socket is quiet (their handle was woken).
    kicked: Vec<u64>,
    /// A session with an idle deadline came: the lot's next wake-up is to be looked at again.
    dirty: bool,
    /// Idle deadlines, earliest first.
    deadlines: BTreeSet<(Instant, u64)>,
    /// The lot's task.
    waker: Option<Waker>,
}

pub(super) struct Lot {
    epoll: AsyncFd<Epoll>,
    inner: Mutex<Inner>,
    /// The next session's token.
    next: AtomicU64,
}

thread_local! {
    /// This worker's lot (made at its first park).
    static LOT: std::cell::RefCell<Option<Arc<Lot>>> = const { std::cell::RefCell::new(None) };
}

/// What a parked session's handle wakes: the lot, naming the session.
struct Kick {
    lot: Weak<Lot>,
    token: u64,
}

impl Wake for Kick {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(lot) = self.lot.upgrade() {
            let waker = {
                let mut i = lot.inner.lock();
                i.kicked.push(self.token);
                i.waker.clone()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

/// What became of a session given to the lot.
pub(super) enum Outcome {
    Parked,
    /// It could not be parked here (no lot, or the epoll set refused it): park it otherwise.
    Back(Box<Session>, Admission),
    /// Its socket was lost on the way (the session is over).
    Gone,
}

/// Parks `session` in this worker's lot.
pub(super) fn park(mut session: Box<Session>, admission: Admission) -> Outcome {
    let Some(lot) = LOT.with(|l| l.borrow().clone()).or_else(Lot::start) else {
        return Outcome::Back(session, admission);
    };
    if !matches!(session.client.stream, Stream::Tcp(_) | Stream::Unix(_)) {
        return Outcome::Back(session, admission);
    }
    let deadline = session.idle_deadline();
    let (session, stream) = match session.into_dormant() {
        Ok(s) => s,
        Err(session) => return Outcome::Back(session, admission),
    };
    let socket = match stream {
        Stream::Tcp(s) => s.into_std().map(Socket::Tcp),
        Stream::Unix(s) => s.into_std().map(Socket::Unix),
        other => return Outcome::Back(session.wake(other), admission),
    };
    let socket = match socket {
        Ok(s) => s,
        Err(e) => {
            tracing::info!(session = session.handle.id, error = %e, "could not park the session's socket");
            return Outcome::Gone;
        }
    };
    // From here a wake-up of the handle (KILL, a move, the drain) reaches the lot, naming the
    // session; the full task that resumes it registers its own waker again. One that came just
    // before is seen by its flag, once the session is in the lot.
    let token = lot.next.fetch_add(1, Ordering::Relaxed);
    let handle = session.handle.clone();
    handle.wake.hand_to(Waker::from(Arc::new(Kick { lot: Arc::downgrade(&lot), token })));
    let mut i = lot.inner.lock();
    if lot.epoll.get_ref().add(socket.fd(), token).is_err() {
        drop(i);
        return match resume_socket(session, socket) {
            Some(s) => Outcome::Back(s, admission),
            None => Outcome::Gone,
        };
    }
    if let Some(d) = deadline {
        i.deadlines.insert((d, token));
        i.dirty = true;
    }
    i.parked.insert(token, Parked { session, admission, socket, deadline });
    let woken = handle.wake.pending();
    if woken {
        i.kicked.push(token);
    }
    let waker = (woken || deadline.is_some()).then(|| i.waker.clone()).flatten();
    drop(i);
    if let Some(w) = waker {
        w.wake();
    }
    Outcome::Parked
}

/// Wakes the session with its socket, registered with the reactor again (None: it could not
/// be, and the session ends).
fn resume_socket(session: Box<Dormant>, socket: Socket) -> Option<Box<Session>> {
    let stream = match socket {
        Socket::Tcp(s) => tokio::net::TcpStream::from_std(s).map(Stream::Tcp),
        Socket::Unix(s) => tokio::net::UnixStream::from_std(s).map(Stream::Unix),
    };
    match stream {
        Ok(s) => Some(session.wake(s)),
        Err(e) => {
            tracing::info!(session = session.handle.id, error = %e, "could not resume a parked session's socket");
            None
        }
    }
}

impl Lot {
    /// Makes this worker's lot and spawns its task (None: no epoll set could be made).
    fn start() -> Option<Arc<Lot>> {
        let epoll = Epoll::new().and_then(Epoll::register).ok()?;
        let lot = Arc::new(Lot { epoll, inner: Mutex::default(), next: AtomicU64::new(0) });
        LOT.with(|l| *l.borrow_mut() = Some(lot.clone()));
        tokio::spawn(lot.clone().run());
        Some(lot)
    }

    async fn run(self: Arc<Lot>) {
        // Only while a parked session has an idle deadline: a timer in the worker's wheel makes
        // every park of the worker read the clock (`runtime::sweep_pool`).
        let mut sleep: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let mut ready = Vec::new();
        loop {
            std::future::poll_fn(|cx| {
                {
                    let mut i = self.inner.lock();
                    if !i.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        i.waker = Some(cx.waker().clone());
                    }
                    if !i.kicked.is_empty() || std::mem::take(&mut i.dirty) {
                        return Poll::Ready(());
                    }
                }
                if let Poll::Ready(r) = self.epoll.poll_read_ready(cx) {
                    if let Ok(mut guard) = r {
                        // One batch per turn: while a full batch comes, the readiness stays
                        // and the next turn takes the next one (they leave the set meanwhile).
                        if self.ready_batch(&mut ready) < BATCH {
                            guard.clear_ready();
                        }
                    }
                    return Poll::Ready(());
                }
                match &mut sleep {
                    Some(s) => s.as_mut().poll(cx),
                    None => Poll::Pending,
                }
            })
            .await;
            let out = self.leaving(&mut ready);
            let next = self.inner.lock().deadlines.first().map(|(d, _)| *d);
            match (next, &mut sleep) {
                (Some(d), Some(s)) => s.as_mut().reset(d),
                (Some(d), None) => sleep = Some(Box::pin(tokio::time::sleep_until(d))),
                (None, _) => sleep = None,
            }
            for p in out {
                let _ = self.epoll.get_ref().delete(p.socket.fd());
                let Parked { session, admission, socket, .. } = p;
                unparked(&session.handle, &session.ctx);
                if let Some(session) = resume_socket(session, socket) {
                    resume(session, admission);
                }
            }
        }
    }

    /// Adds the tokens of up to `BATCH` ready sockets to `ready`; how many there were.
    fn ready_batch(&self, ready: &mut Vec<u64>) -> usize {
        self.epoll.get_ref().ready::<BATCH>(ready)
    }

    /// Takes out the sessions to resume: the `ready` sockets', woken handles', and those whose
    /// idle deadline passed.
    fn leaving(&self, ready: &mut Vec<u64>) -> Vec<Parked> {
        let mut i = self.inner.lock();
        let mut tokens = std::mem::take(ready);
        tokens.append(&mut i.kicked);
        let now = Instant::now();
        while let Some(&(d, t)) = i.deadlines.first() {
            if d > now {
                break;
            }
            i.deadlines.pop_first();
            tokens.push(t);
        }
        let mut out = Vec::new();
        for t in tokens {
            if let Some(p) = i.parked.remove(&t) {
                if let Some(d) = p.deadline {
                    i.deadlines.remove(&(d, t));
                }
                out.push(p);
            }
        }
        out
    }
}

/// Counts a session out of the parked ones.
pub(super) fn unparked(handle: &crate::session::SessionHandle, ctx: &crate::ctx::Ctx) {
    handle.parking.parked.store(false, Ordering::Relaxed);
    ctx.metrics.parked_sessions.dec();
}

/// Serves a session that was parked again, in a full task of its own.
pub(super) fn resume(mut session: Box<Session>, admission: Admission) {
    session.resumed = true;
    let live: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(crate::frontend::live(session, admission, false));
    tokio::spawn(live);
}
