//! The epoll loop: level-triggered, one read per readiness event.
//!
//! A socket is watched for reading while the direction it feeds has nothing pending, and for
//! writing while the direction into it has bytes a short write left behind.

use std::io::{Error, ErrorKind, Result};
use std::net::TcpListener;
use std::os::fd::AsRawFd;

use super::{Pair, Slab, Target};

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;

/// Event data of the listening socket; a pair's is `generation << 32 | slot << 1 | side`.
const LISTENER: u64 = u64::MAX;

fn check(r: libc::c_int) -> Result<libc::c_int> {
    if r < 0 { Err(Error::last_os_error()) } else { Ok(r) }
}

/// A pair with the bytes each direction still has to write (`pending[d]` = start..end of `buf[d]`)
/// and the interest each socket is registered with.
struct Relay {
    pair: Pair,
    pending: [(usize, usize); 2],
    interest: [u32; 2],
}

struct Loop {
    ep: libc::c_int,
    relays: Slab<Relay>,
}

impl Loop {
    fn ctl(&self, op: libc::c_int, fd: libc::c_int, events: u32, data: u64) -> Result<()> {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: `ev` is a valid event; an invalid descriptor is an error the call returns.
        check(unsafe { libc::epoll_ctl(self.ep, op, fd, &mut ev) }).map(drop)
    }

    fn accept(&mut self, listener: &TcpListener, target: &Target) -> Result<()> {
        let (client, _) = listener.accept()?;
        let pair = match Pair::open(client, &target.backend, true, target.buf_size) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("backend connect: {e}");
                return Ok(());
            }
        };
        let fds = [pair.fd(0), pair.fd(1)];
        let (slot, generation) = self.relays.insert(Relay { pair, pending: [(0, 0); 2], interest: [IN; 2] });
        for (side, fd) in fds.into_iter().enumerate() {
            self.ctl(libc::EPOLL_CTL_ADD, fd, IN, key(slot, generation, side))?;
        }
        Ok(())
    }

    fn event(&mut self, data: u64, events: u32) {
        let (slot, generation, side) = (((data >> 1) & 0x7fff_ffff) as usize, (data >> 32) as u32, (data & 1) as usize);
        let Some(relay) = self.relays.get(slot, generation) else { return };
        let mut ok = true;
        if events & OUT != 0 {
            ok = flush(relay, 1 - side);
        }
        if ok && events & IN != 0 && relay.pending[side].1 == 0 {
            ok = forward(relay, side);
        }
        // Both directions shut, or an error: nothing more can move.
        if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
            ok = false;
        }
        // Dropping the sockets closes them, which takes them out of the epoll set.
        if !ok || self.reregister(slot, generation).is_err() {
            self.relays.remove(slot);
        }
    }

    /// Brings each socket's interest in line with what is pending.
    fn reregister(&mut self, slot: usize, generation: u32) -> Result<()> {
        let ep = self.ep;
        let relay = self.relays.get(slot, generation).expect("live relay");
        for side in 0..2 {
            let mut want = 0;
            if relay.pending[side].1 == 0 {
                want |= IN;
            }
            if relay.pending[1 - side].1 != 0 {
                want |= OUT;
            }
            if want != relay.interest[side] {
                let mut ev = libc::epoll_event { events: want, u64: key(slot, generation, side) };
                // SAFETY: `ev` is a valid event; the relay's descriptor is open while it is kept.
                check(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, relay.pair.fd(side), &mut ev) })?;
                relay.interest[side] = want;
            }
        }
        Ok(())
    }
}

fn key(slot: usize, generation: u32, side: usize) -> u64 {
    (generation as u64) << 32 | (slot as u64) << 1 | side as u64
}

/// One read from side `d` and the write of what it got to the other side. False when the pair
/// is done (end of stream or an error).
fn forward(relay: &mut Relay, d: usize) -> bool {
    let (src, buf) = (relay.pair.fd(d), &mut relay.pair.buf[d]);
    // SAFETY: `buf` is writable memory of `buf.len()` bytes that outlives the call.
    let n = unsafe { libc::recv(src, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Error::last_os_error().kind() == ErrorKind::WouldBlock;
    }
    if n == 0 {
        return false;
    }
    relay.pending[d] = (0, n as usize);
    flush(relay, d)
}

/// Writes what direction `d` has pending to side `1 - d`.
fn flush(relay: &mut Relay, d: usize) -> bool {
    let (start, end) = relay.pending[d];
    if start == end {
        return true;
    }
    let dst = relay.pair.fd(1 - d);
    let buf = &relay.pair.buf[d][start..end];
    // SAFETY: `buf` is readable memory of `buf.len()` bytes that outlives the call.
    let n = unsafe { libc::send(dst, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Error::last_os_error().kind() == ErrorKind::WouldBlock;
    }
    let start = start + n as usize;
    relay.pending[d] = if start == end { (0, 0) } else { (start, end) };
    true
}

pub fn run(listener: TcpListener, target: &Target) -> Result<()> {
    // SAFETY: epoll_create1 only returns a new descriptor or -1.
    let ep = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    let mut lp = Loop { ep, relays: Slab::new() };
    lp.ctl(libc::EPOLL_CTL_ADD, listener.as_raw_fd(), IN, LISTENER)?;
    super::announce(&listener);
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        // SAFETY: `events` has room for `events.len()` entries, which the call writes at most.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, -1) };
        if n < 0 {
            let e = Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for ev in &events[..n as usize] {
            let (data, flags) = (ev.u64, ev.events);
            if data == LISTENER {
                lp.accept(&listener, target)?;
            } else {
                lp.event(data, flags);
            }
        }
    }
}
