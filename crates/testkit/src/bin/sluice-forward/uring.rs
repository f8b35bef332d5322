//! The io_uring loop: a receive always in flight on each side, the send queued from its
//! completion, and one `io_uring_enter` per turn that submits everything queued and waits.

use std::io::{Error, ErrorKind, Result};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

use io_uring::{IoUring, opcode, squeue, types};

use super::{Pair, Slab, Target};

/// User data of the accept; a pair's is `generation << 32 | slot << 2 | direction << 1 | op`.
const ACCEPT: u64 = u64::MAX;
const RECV: u64 = 0;
const SEND: u64 = 1;

/// A pair with the send each direction has in progress (`sent[d]` = done..len of `buf[d]`), its
/// operations in flight, and whether it is being closed (then it is freed when none is left:
/// the kernel may still write into its buffers until then).
struct Conn {
    pair: Pair,
    sent: [(usize, usize); 2],
    inflight: u32,
    closing: bool,
}

struct Loop {
    ring: IoUring,
    conns: Slab<Conn>,
}

fn key(slot: usize, generation: u32, d: usize, op: u64) -> u64 {
    (generation as u64) << 32 | (slot as u64) << 2 | (d as u64) << 1 | op
}

impl Loop {
    fn push(&mut self, entry: squeue::Entry) -> Result<()> {
        // SAFETY: every buffer an entry points into lives in a boxed `Conn` that is freed only
        // once no operation of it is in flight.
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    fn recv(&mut self, slot: usize, generation: u32, d: usize) -> Result<()> {
        let c = self.conns.get(slot, generation).expect("live conn");
        let fd = c.pair.fd(d);
        let buf = &mut c.pair.buf[d];
        let entry = opcode::Recv::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32).build();
        c.inflight += 1;
        self.push(entry.user_data(key(slot, generation, d, RECV)))
    }

    fn send(&mut self, slot: usize, generation: u32, d: usize) -> Result<()> {
        let c = self.conns.get(slot, generation).expect("live conn");
        let (done, len) = c.sent[d];
        let bytes = &c.pair.buf[d][done..len];
        let entry = opcode::Send::new(types::Fd(c.pair.fd(1 - d)), bytes.as_ptr(), bytes.len() as u32).flags(libc::MSG_NOSIGNAL).build();
        c.inflight += 1;
        self.push(entry.user_data(key(slot, generation, d, SEND)))
    }

    fn accept_op(&mut self, listener: &TcpListener) -> Result<()> {
        let entry = opcode::Accept::new(types::Fd(listener.as_raw_fd()), std::ptr::null_mut(), std::ptr::null_mut());
        self.push(entry.build().user_data(ACCEPT))
    }

    fn accepted(&mut self, res: i32, target: &Target) -> Result<()> {
        if res < 0 {
            eprintln!("accept: {}", Error::from_raw_os_error(-res));
            return Ok(());
        }
        // SAFETY: a successful accept completion's result is a new descriptor that we own.
        let client = unsafe { TcpStream::from_raw_fd(res) };
        let pair = match Pair::open(client, &target.backend, true, target.buf_size) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("backend connect: {e}");
                return Ok(());
            }
        };
        let (slot, generation) = self.conns.insert(Conn { pair, sent: [(0, 0); 2], inflight: 0, closing: false });
        self.recv(slot, generation, 0)?;
        self.recv(slot, generation, 1)
    }

    /// Shuts both sockets, which completes what is in flight on them; the pair is freed with
    /// its last completion.
    fn close(&mut self, slot: usize, generation: u32) {
        let c = self.conns.get(slot, generation).expect("live conn");
        if !c.closing {
            c.closing = true;
            for side in 0..2 {
                // SAFETY: shutdown only reads its arguments; the pair's descriptors are open.
                unsafe { libc::shutdown(c.pair.fd(side), libc::SHUT_RDWR) };
            }
        }
        if c.inflight == 0 {
            self.conns.remove(slot);
        }
    }

    fn completed(&mut self, data: u64, res: i32) -> Result<()> {
        let (slot, generation) = (((data >> 2) & 0x3fff_ffff) as usize, (data >> 32) as u32);
        let (d, op) = (((data >> 1) & 1) as usize, data & 1);
        let Some(c) = self.conns.get(slot, generation) else { return Ok(()) };
        c.inflight -= 1;
        if c.closing || res <= 0 {
            self.close(slot, generation);
            return Ok(());
        }
        if op == RECV {
            c.sent[d] = (0, res as usize);
            return self.send(slot, generation, d);
        }
        let (done, len) = c.sent[d];
        c.sent[d] = (done + res as usize, len);
        if done + (res as usize) < len { self.send(slot, generation, d) } else { self.recv(slot, generation, d) }
    }
}

pub fn run(listener: TcpListener, target: &Target) -> Result<()> {
    let mut lp = Loop { ring: IoUring::new(4096)?, conns: Slab::new() };
    lp.accept_op(&listener)?;
    super::announce(&listener);
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(4096);
    loop {
        match lp.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(lp.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        for &(data, res) in &done {
            if data == ACCEPT {
                lp.accepted(res, target)?;
                lp.accept_op(&listener)?;
            } else {
                lp.completed(data, res)?;
            }
        }
    }
}
