//! A TCP byte forwarder that does no work of its own, for the benchmarks' `floor` suite: what
//! relaying a query costs a proxy that neither parses nor allocates, over two kinds of event
//! loop on one thread.
//!
//! - `epoll`: level-triggered epoll; one read per readiness event, the bytes written on at once
//!   (no EAGAIN read to drain a socket: a short read ends the turn, epoll reports the rest).
//! - `uring`: io_uring; a receive is always in flight on each side, the send is queued from its
//!   completion, and one `io_uring_enter` per loop turn submits everything and waits.
//!
//! - `tokio`: a current-thread tokio runtime (I/O and timers on, as each of sluice's workers
//!   runs it), one task per connection copying both directions: the runtime's own cost.
//!
//! Each client connection gets its own backend connection, opened (blocking) when it is
//! accepted. Not a proxy: no limits, no timeouts, no health checks. It exists to measure.
//!
//! Usage: sluice-forward epoll|uring|tokio BACKEND_ADDR [BUFFER_KIB]   (prints the bound 127.0.0.1
//! address). The buffer per direction is 64 KiB unless given: the size sluice reads large
//! results with (HAProxy's default is 16 KiB).

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

mod epoll;
mod tokio_loop;
mod uring;

/// Bytes buffered per direction unless told otherwise.
const DEFAULT_BUF_KIB: usize = 64;

/// Where each client's bytes go, and the buffer size per direction.
struct Target {
    backend: String,
    buf_size: usize,
}

/// A client connection and its backend connection: side 0 is the client, side 1 the backend.
/// Direction `d` moves bytes from side `d` to side `1 - d` through `buf[d]`.
struct Pair {
    socks: [TcpStream; 2],
    buf: [Box<[u8]>; 2],
}

impl Pair {
    fn open(client: TcpStream, backend: &str, nonblocking: bool, size: usize) -> std::io::Result<Pair> {
        let server = TcpStream::connect(backend)?;
        for s in [&client, &server] {
            s.set_nodelay(true)?;
            s.set_nonblocking(nonblocking)?;
        }
        Ok(Pair { socks: [client, server], buf: [vec![0; size].into(), vec![0; size].into()] })
    }

    fn fd(&self, side: usize) -> RawFd {
        self.socks[side].as_raw_fd()
    }
}

/// Slots of pairs, each with a generation so that an event for a closed pair is told apart from
/// one for the pair that took its slot.
/// Boxed, so that the buffers the kernel writes into do not move when the slab grows.
struct Slab<T> {
    items: Vec<Option<Box<T>>>,
    gens: Vec<u32>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    fn new() -> Slab<T> {
        Slab { items: Vec::new(), gens: Vec::new(), free: Vec::new() }
    }

    fn insert(&mut self, item: T) -> (usize, u32) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.items.push(None);
            self.gens.push(0);
            self.items.len() - 1
        });
        self.gens[slot] = self.gens[slot].wrapping_add(1);
        self.items[slot] = Some(Box::new(item));
        (slot, self.gens[slot])
    }

    fn get(&mut self, slot: usize, generation: u32) -> Option<&mut T> {
        if self.gens.get(slot) != Some(&generation) {
            return None;
        }
        self.items[slot].as_deref_mut()
    }

    fn remove(&mut self, slot: usize) {
        if self.items[slot].take().is_some() {
            self.free.push(slot);
        }
    }
}

/// Prints the address clients connect to, once the loop is set up: a mode the kernel refuses
/// (io_uring can be disabled, or blocked by a seccomp profile) exits without printing it.
fn announce(listener: &TcpListener) {
    announce_addr(listener.local_addr().expect("local address"));
}

fn announce_addr(addr: std::net::SocketAddr) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{addr}");
    let _ = out.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(backend)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: sluice-forward epoll|uring|tokio BACKEND_ADDR");
        std::process::exit(2);
    };
    let kib = args.get(3).map_or(Some(DEFAULT_BUF_KIB), |a| a.parse().ok()).filter(|k| (1..=1024).contains(k));
    let Some(kib) = kib else {
        eprintln!("BUFFER_KIB: a number of KiB from 1 to 1024");
        std::process::exit(2);
    };
    let target = Target { backend: backend.clone(), buf_size: kib * 1024 };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let result = match mode.as_str() {
        "epoll" => epoll::run(listener, &target),
        "uring" => uring::run(listener, &target),
        "tokio" => tokio_loop::run(listener, &target),
        _ => {
            eprintln!("unknown mode {mode}: epoll, uring or tokio");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("sluice-forward: {e}");
        std::process::exit(1);
    }
}
