//! Response timeouts without a timer per response.
//!
//! Nearly every command waits for its backend's answer at least once, so a timer per wait
//! (made, put in tokio's wheel, taken out) would cost every query. Instead a session that has
//! to wait writes the current tick into its handle; one task per process advances the tick and
//! sweeps the sessions, marking as expired the waits that ran past `response_timeout` and waking
//! their tasks. A wait costs two relaxed stores; the timeout fires between the limit and the
//! limit plus two ticks (a tick is an eighth of the limit, at most one second).

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;

use crate::net::Stream;
use crate::session::{ABANDONED, EXPIRED, NOT_WAITING, Registry, SessionHandle};

/// The coarse clock of the sweep: ticks since start, never one of the marks (`NOT_WAITING`,
/// `EXPIRED`, `ABANDONED`).
pub struct Clock {
    ticks: AtomicU32,
    pub tick: Duration,
    /// The response timeout it measures (zero: none).
    pub limit: Duration,
    /// Ticks a wait may last; one more than the limit's, since a wait starts mid-tick.
    max_age: u32,
}

impl Clock {
    pub fn new(limit: Duration) -> Clock {
        let tick = (limit / 8).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let ticks = limit.as_nanos().div_ceil(tick.as_nanos().max(1));
        // (A limit beyond u32 ticks never expires.)
        Clock { ticks: AtomicU32::new(1), tick, limit, max_age: u32::try_from(ticks).unwrap_or(u32::MAX).saturating_add(1) }
    }

    pub fn now(&self) -> u32 {
        self.ticks.load(Ordering::Relaxed)
    }

    fn advance(&self) -> u32 {
        let mut t = self.ticks.load(Ordering::Relaxed).wrapping_add(1);
        if t >= ABANDONED {
            t = 1;
        }
        self.ticks.store(t, Ordering::Relaxed);
        t
    }

    /// Whether a wait that began at tick `since` has lasted past the limit at tick `now`.
    fn expired(&self, since: u32, now: u32) -> bool {
        since != NOT_WAITING && since < ABANDONED && now.wrapping_sub(since) >= self.max_age
    }
}

/// Advances the clock every tick and expires the sessions' waits that ran past its limit.
pub async fn sweep(clock: &Clock, sessions: &Registry) {
    if clock.limit.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(clock.tick).await;
        let now = clock.advance();
        expire(clock, sessions, now);
    }
}

/// Marks the waits that ran past the limit at tick `now`, and wakes their sessions.
fn expire(clock: &Clock, sessions: &Registry, now: u32) {
    sessions.for_each(|h| {
        let since = h.response_wait.load(Ordering::Relaxed);
        // The exchange expires this very wait, not one that began since it was read.
        if clock.expired(since, now) && h.response_wait.compare_exchange(since, EXPIRED, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
            h.wake.wake_task();
        }
    });
}

/// Gives up the response waits of the sessions bound to backend `index`, which failover
/// replaced (a hung server may never answer): each wait ends as a lost connection, and the
/// session's transaction replay takes over. Returns how many it gave up. (A wait that begins
/// after this is given up at the next call: failover calls it each check while the backend
/// stays replaced.)
pub fn abandon(sessions: &Registry, index: usize) -> usize {
    let mut n = 0;
    sessions.for_each(|h| {
        let since = h.response_wait.load(Ordering::Relaxed);
        if h.backend_index.load(Ordering::Relaxed) as usize == index
            && since != NOT_WAITING
            && since < ABANDONED
            && h.response_wait.compare_exchange(since, ABANDONED, Ordering::SeqCst, Ordering::Relaxed).is_ok()
        {
            h.wake.wake_task();
            n += 1;
        }
    });
    n
}

/// What a session's response reads need: its handle, where the sweep marks it, and the waker
/// it last gave the handle.
pub struct Watch<'a> {
    pub clock: &'a Clock,
    pub handle: &'a SessionHandle,
    pub waker: &'a mut Option<Waker>,
}

impl Watch<'_> {
    /// Reads the next bytes of a response: at once when they are there, else waiting until they
    /// come, or until the sweep finds that none came for `response_timeout` (an error of kind
    /// `TimedOut`). (One poll function, not an async fn: its future holds its three references
    /// and a flag, in the line of the response's own future.)
    pub fn read<'s>(&'s mut self, stream: &'s mut Stream, buf: &'s mut BytesMut) -> impl Future<Output = io::Result<usize>> + 's {
        let mut waiting = false;
        std::future::poll_fn(move |cx| {
            let r = match stream.poll_read_into(cx, buf) {
                Poll::Ready(r) => r,
                Poll::Pending => match self.nothing_came(cx, &mut waiting) {
                    Some(e) => Err(e),
                    None => return Poll::Pending,
                },
            };
            if !self.clock.limit.is_zero() {
                self.handle.response_wait.store(NOT_WAITING, Ordering::Relaxed);
            }
            Poll::Ready(r)
        })
    }

    /// A read found nothing: the wait begins (at the first), for the sweep to time. Some: the
    /// sweep ended it (the response timed out, or a failover replaced the backend).
    fn nothing_came(&mut self, cx: &mut Context<'_>, waiting: &mut bool) -> Option<io::Error> {
        let (h, clock) = (self.handle, self.clock);
        let limit = clock.limit;
        if limit.is_zero() {
            return None;
        }
        if !std::mem::replace(waiting, true) {
            h.response_wait.store(clock.now(), Ordering::Relaxed);
        }
        // The sweep wakes whatever waker the handle holds: make sure it is this task's before
        // looking at the mark (the handle's lock orders the two).
        h.wake.register(cx, self.waker);
        match h.response_wait.load(Ordering::SeqCst) {
            EXPIRED => Some(io::Error::new(io::ErrorKind::TimedOut, format!("no progress for {limit:?}"))),
            ABANDONED => Some(io::Error::new(io::ErrorKind::ConnectionAborted, "the backend was replaced by a failover")),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_wait_expires_only_after_the_whole_limit() {
        let c = Clock::new(Duration::from_secs(8));
        assert_eq!(c.tick, Duration::from_secs(1));
        let since = c.now();
        // A wait that began just before the next tick has lasted a little over 8 s only at
        // the 9th tick after its own.
        for _ in 0..8 {
            let now = c.advance();
            assert!(!c.expired(since, now));
        }
        assert!(c.expired(since, c.advance()));
        assert!(!c.expired(NOT_WAITING, c.now()));
        assert!(!c.expired(EXPIRED, c.now()), "an expired wait is not expired again");
        // A tick is an eighth of the limit, and at most a second.
        assert_eq!(Clock::new(Duration::from_millis(400)).tick, Duration::from_millis(50));
        assert_eq!(Clock::new(Duration::from_secs(3600)).tick, Duration::from_secs(1));
    }

    #[test]
    fn the_sweep_expires_the_waits_past_the_limit_and_wakes_them() {
        struct Count(AtomicU32);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let c = Clock::new(Duration::from_secs(8));
        let sessions = Registry::default();
        let handles: Vec<Arc<SessionHandle>> =
            (1..=3).map(|id| Arc::new(SessionHandle::new(id, "client".into(), "listener".into()))).collect();
        let woken: Vec<Arc<Count>> = handles.iter().map(|_| Arc::new(Count(AtomicU32::new(0)))).collect();
        for (h, w) in handles.iter().zip(&woken) {
            let waker = Waker::from(w.clone());
            h.wake.register(&std::task::Context::from_waker(&waker), &mut None);
            sessions.insert(h.clone());
        }
        // Waiting since tick 1 (9 ticks at tick 10), since tick 5, and not waiting.
        handles[0].response_wait.store(1, Ordering::Relaxed);
        handles[1].response_wait.store(5, Ordering::Relaxed);
        expire(&c, &sessions, 10);
        let waits: Vec<u32> = handles.iter().map(|h| h.response_wait.load(Ordering::Relaxed)).collect();
        assert_eq!(waits, [EXPIRED, 5, NOT_WAITING]);
        let wakes: Vec<u32> = woken.iter().map(|w| w.0.load(Ordering::Relaxed)).collect();
        assert_eq!(wakes, [1, 0, 0]);
        // An expired wait is woken once.
        expire(&c, &sessions, 11);
        assert_eq!(woken[0].0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_waits_on_a_replaced_backend_are_given_up() {
        let sessions = Registry::default();
        let handles: Vec<Arc<SessionHandle>> =
            (1..=3).map(|id| Arc::new(SessionHandle::new(id, "client".into(), "listener".into()))).collect();
        for (i, h) in handles.iter().enumerate() {
            h.bind_backend(i % 2, "b", 0);
            sessions.insert(h.clone());
        }
        // Sessions 1 and 3 are on backend 0; session 3 is not waiting. Session 2 waits on 1.
        handles[0].response_wait.store(4, Ordering::Relaxed);
        handles[1].response_wait.store(4, Ordering::Relaxed);
        assert_eq!(abandon(&sessions, 0), 1);
        let waits: Vec<u32> = handles.iter().map(|h| h.response_wait.load(Ordering::Relaxed)).collect();
        assert_eq!(waits, [ABANDONED, 4, NOT_WAITING]);
        assert_eq!(abandon(&sessions, 0), 0, "a wait is given up once");
        let c = Clock::new(Duration::from_secs(1));
        assert!(!c.expired(ABANDONED, 1_000), "a wait given up does not expire");
    }

    #[test]
    fn the_clock_skips_the_marks() {
        let c = Clock::new(Duration::from_secs(1));
        c.ticks.store(u32::MAX - 2, Ordering::Relaxed);
        assert_eq!(c.advance(), 1);
        assert!(c.expired(u32::MAX - 20, 1), "waits are measured across the wrap");
    }
}
