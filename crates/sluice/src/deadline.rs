//! Response timeouts without a timer per response.
//!
//! Nearly every command waits for its backend's answer at least once, so a timer per wait
//! (made, put in tokio's wheel, taken out) would cost every query. Instead a session that has
//! to wait writes the current tick into its handle; one task per process advances the tick and
//! sweeps the sessions, marking as expired the waits that ran past `response_timeout` and waking
//! their tasks. A wait costs two relaxed stores; the timeout fires between the limit and the
//! limit plus two ticks (a tick is an eighth of the limit, at most one second).

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use crate::ctx::Ctx;
use crate::net::Stream;
use crate::session::SessionHandle;

/// The coarse clock of the sweep: ticks since start, from 1 (0 stands for "not waiting").
pub struct Clock {
    ticks: AtomicU32,
    pub tick: Duration,
    /// Ticks a wait may last; one more than the limit's, since a wait starts mid-tick.
    max_age: u32,
}

impl Clock {
    pub fn new(limit: Duration) -> Clock {
        let tick = (limit / 8).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let ticks = limit.as_nanos().div_ceil(tick.as_nanos().max(1));
        Clock { ticks: AtomicU32::new(1), tick, max_age: u32::try_from(ticks).unwrap_or(u32::MAX - 1) + 1 }
    }

    pub fn now(&self) -> u32 {
        self.ticks.load(Ordering::Relaxed)
    }

    fn advance(&self) -> u32 {
        let t = self.ticks.load(Ordering::Relaxed).wrapping_add(1).max(1);
        self.ticks.store(t, Ordering::Relaxed);
        t
    }

    /// Whether a wait that began at tick `since` has lasted past the limit at tick `now`.
    fn expired(&self, since: u32, now: u32) -> bool {
        since != 0 && now.wrapping_sub(since) >= self.max_age
    }
}

/// Advances the clock every tick and expires the waits that ran past `response_timeout`.
pub async fn sweep(ctx: std::sync::Arc<Ctx>) {
    if ctx.config.proxy.response_timeout.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(ctx.clock.tick).await;
        let now = ctx.clock.advance();
        ctx.sessions.for_each(|h| {
            if ctx.clock.expired(h.response_wait.load(Ordering::Relaxed), now) && !h.response_expired.swap(true, Ordering::SeqCst) {
                h.wake.wake_task();
            }
        });
    }
}

/// What a session's response reads need: its handle, where the sweep marks it, and the waker
/// it last gave the handle.
pub struct Watch<'a> {
    pub ctx: &'a Ctx,
    pub handle: &'a SessionHandle,
    pub waker: &'a mut Option<Waker>,
}

impl Watch<'_> {
    /// Reads the next bytes of a response: at once when they are there, else waiting until they
    /// come, or until the sweep finds that none came for `response_timeout` (an error of kind
    /// `TimedOut`).
    pub async fn read(&mut self, stream: &mut Stream, buf: &mut BytesMut) -> io::Result<usize> {
        match stream.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let limit = self.ctx.config.proxy.response_timeout;
        if limit.is_zero() {
            return stream.read_buf(buf).await;
        }
        let h = self.handle;
        h.response_expired.store(false, Ordering::SeqCst);
        h.response_wait.store(self.ctx.clock.now(), Ordering::Relaxed);
        let waker = &mut *self.waker;
        let mut read = std::pin::pin!(stream.read_buf(buf));
        let r = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = read.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
            // The sweep wakes whatever waker the handle holds: make sure it is this task's
            // before looking at the mark (the handle's lock orders the two).
            h.wake.register(cx, waker);
            if h.response_expired.load(Ordering::SeqCst) {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, format!("no progress for {limit:?}"))));
            }
            Poll::Pending
        })
        .await;
        h.response_wait.store(0, Ordering::Relaxed);
        r
    }
}

#[cfg(test)]
mod tests {
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
        assert!(!c.expired(0, c.now()), "0 is no wait");
        // A tick is an eighth of the limit, and at most a second.
        assert_eq!(Clock::new(Duration::from_millis(400)).tick, Duration::from_millis(50));
        assert_eq!(Clock::new(Duration::from_secs(3600)).tick, Duration::from_secs(1));
    }

    #[test]
    fn the_clock_never_reads_zero() {
        let c = Clock::new(Duration::from_secs(1));
        c.ticks.store(u32::MAX, Ordering::Relaxed);
        assert_eq!(c.advance(), 1);
        assert!(c.expired(u32::MAX - 20, 1), "waits are measured across the wrap");
    }
}
