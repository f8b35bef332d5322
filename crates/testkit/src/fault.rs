//! A TCP fault injector: [`FaultProxy`] sits between a client (sluice under test) and a real
//! server on loopback, forwards bytes both ways with two blocking pump threads per connection,
//! and applies one-shot [`Fault`]s at exact byte offsets. A clean EOF is passed on as a
//! half-close; any I/O error resets (RST) both sides.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often a pump blocked writing to a peer that does not read checks for a reset.
const WRITE_POLL: Duration = Duration::from_millis(50);

/// A direction of traffic through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// From the client to the server.
    ToServer,
    /// From the server to the client.
    ToClient,
}

/// What a fault does to its direction once its point is reached. A direction has at most one
/// active action; a later one replaces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Sleep this long before forwarding each chunk.
    Delay(Duration),
    /// Stop reading and forwarding (TCP backpressure builds); both sockets stay open.
    Stall,
    /// Keep reading but discard the bytes, including a FIN (a black hole); sockets stay open.
    Drop,
    /// Close both sockets with RST.
    Reset,
    /// Close both sockets cleanly (FIN). Inbound data the proxy has not read yet may still turn
    /// the close into an RST (Linux semantics).
    Truncate,
    /// Flip (xor 0xFF) the next N bytes, then forward normally.
    Corrupt(usize),
}

/// When a fault binds to a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// When a connection is accepted (only connections accepted after arming).
    Start,
    /// Once these bytes (non-empty) have been read in that direction, even across reads.
    Pattern(Dir, Vec<u8>),
}

/// A one-shot fault: once `trigger` fires, `after` more bytes of `dir` traffic pass untouched,
/// then `action` applies to `dir`. For a pattern in the same direction as `dir`, counting starts
/// right after the pattern (which is forwarded). Chunks are split exactly at that point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub trigger: Trigger,
    pub dir: Dir,
    pub after: u64,
    pub action: Action,
}

impl Fault {
    pub fn new(trigger: Trigger, dir: Dir, after: u64, action: Action) -> Fault {
        Fault { trigger, dir, after, action }
    }
}

/// A fault-injecting TCP forwarder on `127.0.0.1`; stops and resets its connections on drop.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    server: String,
    stop: AtomicBool,
    refuse: AtomicBool,
    fired: AtomicUsize,
    accepted: AtomicUsize,
    open: AtomicUsize,
    armed: Mutex<Vec<Fault>>,
    conns: Mutex<Vec<Weak<Conn>>>,
}

/// Decrements `open`; the last field of [`Conn`], so it drops after both sockets are closed.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, SeqCst);
    }
}

struct Conn {
    client: TcpStream,
    server: TcpStream,
    state: Mutex<ConnState>,
    /// Wakes stalled and delayed pumps when the connection closes.
    cv: Condvar,
    guard: OpenGuard,
}

#[derive(Default)]
struct ConnState {
    /// Reset or truncated: the pumps stop and the sockets close when the last one exits.
    closed: bool,
    dirs: [DirState; 2],
}

#[derive(Default)]
struct DirState {
    active: Option<Action>,
    /// Bound faults: bytes still to pass untouched, and the action after them.
    pending: Vec<(u64, Action)>,
    /// The last bytes read, for patterns split across reads.
    tail: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn poll_until(timeout: Duration, f: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Makes the close of `s` send RST instead of FIN (SO_LINGER on, zero timeout).
fn set_linger0(s: &TcpStream) {
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: the fd is a live socket owned by `s`; `l` is a valid `linger` of the given size.
    unsafe {
        let len = size_of::<libc::linger>() as libc::socklen_t;
        libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, (&raw const l).cast(), len);
    }
}

/// Removes and returns the armed faults for which `hit` gives an offset.
fn take_armed(armed: &mut Vec<Fault>, hit: impl Fn(&Trigger) -> Option<usize>) -> Vec<(Fault, usize)> {
    let mut hits = Vec::new();
    let mut i = 0;
    while i < armed.len() {
        match hit(&armed[i].trigger) {
            Some(at) => hits.push((armed.remove(i), at)),
            None => i += 1,
        }
    }
    hits
}

/// End offset in `window` of the first match of `p` that ends after `window[..old]`.
fn find_end(window: &[u8], old: usize, p: &[u8]) -> Option<usize> {
    let start = (old + 1).saturating_sub(p.len());
    window[start..].windows(p.len()).position(|w| w == p).map(|i| start + i + p.len())
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards each accepted connection to `server`.
    pub fn start(server: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fault proxy");
        let addr = listener.local_addr().expect("fault proxy address");
        let shared = Arc::new(Shared { server: server.to_string(), ..Shared::default() });
        let s = Arc::clone(&shared);
        let accept =
            thread::Builder::new().name("fault-accept".into()).spawn(move || accept_loop(&s, &listener)).expect("spawn fault proxy");
        FaultProxy { shared, addr, accept: Some(accept) }
    }

    /// The listening address, `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Arms a one-shot fault for the first connection whose trigger fires from now on.
    pub fn arm(&self, f: Fault) {
        if let Trigger::Pattern(_, p) = &f.trigger {
            assert!(!p.is_empty(), "empty fault pattern");
        }
        lock(&self.shared.armed).push(f);
    }

    /// How many faults have started to apply.
    pub fn fired(&self) -> usize {
        self.shared.fired.load(SeqCst)
    }

    /// Polls until `fired() >= n`; false on timeout.
    pub fn wait_fired(&self, n: usize, timeout: Duration) -> bool {
        poll_until(timeout, || self.fired() >= n)
    }

    /// Connections accepted so far, refused ones included.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(SeqCst)
    }

    /// Connections whose sockets are not both closed yet.
    pub fn open(&self) -> usize {
        self.shared.open.load(SeqCst)
    }

    /// Polls until `open() == n`; false on timeout.
    pub fn wait_open(&self, n: usize, timeout: Duration) -> bool {
        poll_until(timeout, || self.open() == n)
    }

    /// Resets (RST) every open connection now, as if the server host died.
    pub fn reset_all(&self) {
        let conns: Vec<_> = lock(&self.shared.conns).iter().filter_map(Weak::upgrade).collect();
        conns.iter().for_each(|c| c.fail());
    }

    /// While true, new connections are accepted and immediately reset.
    pub fn set_refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        let woken = TcpStream::connect(self.addr).is_ok();
        if let (Some(h), true) = (self.accept.take(), woken) {
            let _ = h.join();
        }
        self.reset_all();
        self.wait_open(0, Duration::from_secs(1));
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    for client in listener.incoming() {
        if shared.stop.load(SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        shared.accepted.fetch_add(1, SeqCst);
        let server = if shared.refuse.load(SeqCst) { None } else { TcpStream::connect(&shared.server).ok() };
        match server {
            Some(server) => start_conn(shared, client, server),
            None => set_linger0(&client), // dropping it now sends RST
        }
    }
}

fn start_conn(shared: &Arc<Shared>, client: TcpStream, server: TcpStream) {
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        let _ = s.set_write_timeout(Some(WRITE_POLL));
    }
    shared.open.fetch_add(1, SeqCst);
    let guard = OpenGuard(Arc::clone(shared));
    let conn = Arc::new(Conn { client, server, state: Mutex::default(), cv: Condvar::new(), guard });
    let mut conns = lock(&shared.conns);
    conns.retain(|c| c.strong_count() > 0);
    conns.push(Arc::downgrade(&conn));
    drop(conns);
    let mut armed = lock(&shared.armed);
    let mut st = conn.lock();
    for (f, _) in take_armed(&mut armed, |t| (*t == Trigger::Start).then_some(0)) {
        conn.bind(&mut st, f.dir, f.after, f.action);
    }
    drop((st, armed));
    for dir in [Dir::ToServer, Dir::ToClient] {
        let c = Arc::clone(&conn);
        let spawned = thread::Builder::new().name(format!("fault-{dir:?}")).spawn(move || pump(&c, dir));
        if spawned.is_err() {
            conn.fail();
        }
    }
}

/// Forwards `dir` traffic of `conn` until EOF, an error, a stall or the connection closing.
fn pump(conn: &Conn, dir: Dir) {
    let (mut src, _) = conn.ends(dir);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let stalled = {
            let mut st = conn.lock();
            conn.fire_due(&mut st, dir);
            if st.closed {
                return;
            }
            st.dirs[dir as usize].active == Some(Action::Stall)
        };
        if stalled {
            conn.sleep(None);
            return;
        }
        match src.read(&mut buf) {
            Ok(0) => {
                conn.eof(dir);
                return;
            }
            Ok(n) => {
                conn.match_patterns(dir, &buf[..n]);
                if !conn.forward(dir, &mut buf[..n]) {
                    conn.fail();
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                conn.fail();
                return;
            }
        }
    }
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, ConnState> {
        lock(&self.state)
    }

    /// (source, destination) of `dir`.
    fn ends(&self, dir: Dir) -> (&TcpStream, &TcpStream) {
        match dir {
            Dir::ToServer => (&self.client, &self.server),
            Dir::ToClient => (&self.server, &self.client),
        }
    }

    /// Closes both sockets, with RST if `reset`; wakes every pump.
    fn close_locked(&self, st: &mut ConnState, reset: bool) {
        if std::mem::replace(&mut st.closed, true) {
            return;
        }
        for s in [&self.client, &self.server] {
            if reset {
                // Shutting down the read half wakes blocked readers without sending a FIN.
                set_linger0(s);
                let _ = s.shutdown(Shutdown::Read);
            } else {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.cv.notify_all();
    }

    /// Ends the connection with RST (unless it is already closed).
    fn fail(&self) {
        self.close_locked(&mut self.lock(), true);
    }

    /// The source of `dir` sent FIN: pass it on, unless the direction is a black hole.
    fn eof(&self, dir: Dir) {
        let st = self.lock();
        if !st.closed && st.dirs[dir as usize].active != Some(Action::Drop) {
            let _ = self.ends(dir).1.shutdown(Shutdown::Write);
        }
    }

    fn bind(&self, st: &mut ConnState, dir: Dir, after: u64, action: Action) {
        match after {
            0 => self.activate(st, dir, action),
            _ => st.dirs[dir as usize].pending.push((after, action)),
        }
    }

    fn activate(&self, st: &mut ConnState, dir: Dir, action: Action) {
        if st.closed {
            return;
        }
        match action {
            Action::Reset => self.close_locked(st, true),
            Action::Truncate => self.close_locked(st, false),
            Action::Corrupt(0) => st.dirs[dir as usize].active = None,
            a => st.dirs[dir as usize].active = Some(a),
        }
        self.guard.0.fired.fetch_add(1, SeqCst);
        self.cv.notify_all();
    }

    /// Activates the bound faults of `dir` whose point has been reached.
    fn fire_due(&self, st: &mut ConnState, dir: Dir) {
        while !st.closed {
            let Some(i) = st.dirs[dir as usize].pending.iter().position(|p| p.0 == 0) else {
                return;
            };
            let (_, action) = st.dirs[dir as usize].pending.remove(i);
            self.activate(st, dir, action);
        }
    }

    /// Binds the armed faults whose pattern in `dir` ends inside `chunk`, just read.
    fn match_patterns(&self, dir: Dir, chunk: &[u8]) {
        let mut armed = lock(&self.guard.0.armed);
        let mut st = self.lock();
        let mut window = std::mem::take(&mut st.dirs[dir as usize].tail);
        if armed.is_empty() {
            return; // and forget the tail: the next chunk may not follow it
        }
        let old = window.len();
        window.extend_from_slice(chunk);
        let hits = take_armed(&mut armed, |t| match t {
            Trigger::Pattern(d, p) if *d == dir => find_end(&window, old, p),
            _ => None,
        });
        for (f, end) in hits {
            let skip = if f.dir == dir { end - old } else { 0 };
            self.bind(&mut st, f.dir, f.after + skip as u64, f.action);
        }
        let keep = armed.iter().map(|f| match &f.trigger {
            Trigger::Pattern(_, p) => p.len() - 1,
            Trigger::Start => 0,
        });
        window.drain(..window.len().saturating_sub(keep.max().unwrap_or(0)));
        st.dirs[dir as usize].tail = window;
    }

    /// Forwards `chunk` of `dir`, split at fault points; false if the pump must stop.
    fn forward(&self, dir: Dir, chunk: &mut [u8]) -> bool {
        let dst = self.ends(dir).1;
        let mut pos = 0;
        while pos < chunk.len() {
            let (action, len) = {
                let mut st = self.lock();
                self.fire_due(&mut st, dir);
                if st.closed {
                    return false;
                }
                let ds = &mut st.dirs[dir as usize];
                let action = ds.active.clone();
                let mut len = chunk.len() - pos;
                for (left, _) in &ds.pending {
                    len = len.min(usize::try_from(*left).unwrap_or(usize::MAX));
                }
                if let Some(Action::Corrupt(k)) = ds.active {
                    len = len.min(k);
                    ds.active = (k > len).then_some(Action::Corrupt(k - len));
                }
                ds.pending.iter_mut().for_each(|p| p.0 -= len as u64);
                (action, len)
            };
            let seg = &mut chunk[pos..pos + len];
            pos += len;
            let ok = match action {
                None => self.send(dst, seg),
                Some(Action::Delay(d)) => self.sleep(Some(d)) && self.send(dst, seg),
                Some(Action::Drop) => true,
                Some(Action::Corrupt(_)) => {
                    seg.iter_mut().for_each(|b| *b ^= 0xFF);
                    self.send(dst, seg)
                }
                Some(_) => self.sleep(None), // Stall: until the connection closes
            };
            if !ok {
                return false;
            }
        }
        true
    }

    /// Writes all of `buf`; false on error or when the connection closes meanwhile.
    fn send(&self, mut dst: &TcpStream, mut buf: &[u8]) -> bool {
        while !buf.is_empty() {
            match dst.write(buf) {
                Ok(0) => return false,
                Ok(n) => buf = &buf[n..],
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if self.lock().closed {
                        return false;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Waits for `d` (forever if `None`) or until the connection closes; false if it closed.
    fn sleep(&self, d: Option<Duration>) -> bool {
        let deadline = d.map(|d| Instant::now() + d);
        let mut st = self.lock();
        while !st.closed {
            st = match deadline {
                None => self.cv.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(t) => {
                    let Some(left) = t.checked_duration_since(Instant::now()) else {
                        return true;
                    };
                    self.cv.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{self, Receiver};

    const T: Duration = Duration::from_secs(10);

    /// A proxy in front of a fake server whose accepted sockets are handed to the test.
    fn setup(faults: Vec<Fault>) -> (FaultProxy, Receiver<TcpStream>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = FaultProxy::start(&l.local_addr().unwrap().to_string());
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || l.incoming().flatten().try_for_each(|s| tx.send(s)));
        faults.into_iter().for_each(|f| p.arm(f));
        (p, rx)
    }

    /// A client connected through `p` and the server's end of it.
    fn pair(p: &FaultProxy, rx: &Receiver<TcpStream>) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(p.addr()).unwrap();
        let s = rx.recv_timeout(T).unwrap();
        for x in [&c, &s] {
            x.set_read_timeout(Some(T)).unwrap();
        }
        (c, s)
    }

    fn read_n(mut s: &TcpStream, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        s.read_exact(&mut v).unwrap();
        v
    }

    fn read_all(mut s: &TcpStream) -> Vec<u8> {
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v
    }

    fn start(dir: Dir, after: u64, action: Action) -> Fault {
        Fault::new(Trigger::Start, dir, after, action)
    }

    fn pattern(on: &[u8], dir: Dir, after: u64, action: Action) -> Fault {
        let trigger = Trigger::Pattern(Dir::ToServer, on.to_vec());
        Fault::new(trigger, dir, after, action)
    }

    #[test]
    fn forwards_both_ways_and_half_closes() {
        let (p, rx) = setup(vec![]);
        let (c, mut s) = pair(&p, &rx);
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (mut c2, big2) = (c.try_clone().unwrap(), big.clone());
        let writer = thread::spawn(move || c2.write_all(&big2));
        assert_eq!(read_n(&s, big.len()), big);
        writer.join().unwrap().unwrap();
        s.write_all(b"pong").unwrap();
        assert_eq!(read_n(&c, 4), b"pong");
        c.shutdown(Shutdown::Write).unwrap();
        assert!(read_all(&s).is_empty());
        drop(s);
        assert!(read_all(&c).is_empty());
        assert!(p.wait_open(0, T));
        assert_eq!((p.accepted(), p.fired()), (1, 0));
    }

    #[test]
    fn truncate_at_exact_offset() {
        let (p, rx) = setup(vec![start(Dir::ToClient, 1000, Action::Truncate)]);
        let (c, mut s) = pair(&p, &rx);
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        s.write_all(&data).unwrap();
        assert_eq!(read_all(&c), &data[..1000]);
        assert!(p.wait_fired(1, T));
    }

    #[test]
    fn corrupt_flips_exactly_the_chosen_bytes() {
        let (p, rx) = setup(vec![start(Dir::ToServer, 3, Action::Corrupt(2))]);
        let (mut c, s) = pair(&p, &rx);
        c.write_all(b"abcdefgh").unwrap();
        assert_eq!(read_n(&s, 8), [b'a', b'b', b'c', !b'd', !b'e', b'f', b'g', b'h']);
        c.write_all(b"ij").unwrap();
        assert_eq!(read_n(&s, 2), b"ij");
    }

    #[test]
    fn pattern_split_across_reads() {
        let (p, rx) = setup(vec![pattern(b"SELECT", Dir::ToServer, 1, Action::Truncate)]);
        let (mut c, s) = pair(&p, &rx);
        c.write_all(b"xxSEL").unwrap();
        assert_eq!(read_n(&s, 5), b"xxSEL");
        assert_eq!(p.fired(), 0);
        c.write_all(b"ECTyz").unwrap();
        assert_eq!(read_all(&s), b"ECTy");
        assert!(p.wait_fired(1, T));
    }

    #[test]
    fn reset_sends_rst_both_ways() {
        let (p, rx) = setup(vec![pattern(b"boom", Dir::ToClient, 0, Action::Reset)]);
        let (mut c, s) = pair(&p, &rx);
        c.write_all(b"hi").unwrap();
        assert_eq!(read_n(&s, 2), b"hi");
        c.write_all(b"boom").unwrap();
        assert!((&c).read(&mut [0; 8]).is_err());
        assert!((&s).read(&mut [0; 8]).is_err());
        assert!(p.wait_fired(1, T) && p.wait_open(0, T));
    }

    #[test]
    fn stall_stops_one_direction_only() {
        let (p, rx) = setup(vec![start(Dir::ToServer, 4, Action::Stall)]);
        let (mut c, mut s) = pair(&p, &rx);
        c.write_all(b"abcdEFGH").unwrap();
        assert_eq!(read_n(&s, 4), b"abcd");
        assert!(p.wait_fired(1, T));
        s.write_all(b"pong").unwrap();
        assert_eq!(read_n(&c, 4), b"pong");
        s.set_nonblocking(true).unwrap();
        let err = (&s).read(&mut [0; 8]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::WouldBlock);
        assert_eq!(p.open(), 1);
    }

    #[test]
    fn delay_holds_each_chunk() {
        let delay = Duration::from_millis(50);
        let (p, rx) = setup(vec![start(Dir::ToClient, 0, Action::Delay(delay))]);
        let (c, mut s) = pair(&p, &rx);
        let t0 = Instant::now();
        s.write_all(b"x").unwrap();
        assert_eq!(read_n(&c, 1), b"x");
        assert!(t0.elapsed() >= delay);
        assert_eq!(p.fired(), 1);
    }

    #[test]
    fn drop_discards_but_keeps_reading() {
        let (p, rx) = setup(vec![start(Dir::ToServer, 2, Action::Drop)]);
        let (mut c, s) = pair(&p, &rx);
        c.write_all(b"abcdef").unwrap();
        assert_eq!(read_n(&s, 2), b"ab");
        // The dropped bytes are still read: a pattern in them fires a second fault.
        p.arm(pattern(b"zz", Dir::ToServer, 0, Action::Truncate));
        c.write_all(b"zz").unwrap();
        assert!(read_all(&s).is_empty());
        assert!(p.wait_fired(2, T));
    }

    #[test]
    fn reset_all_resets_open_connections() {
        let (p, rx) = setup(vec![]);
        let (mut c, s) = pair(&p, &rx);
        c.write_all(b"hi").unwrap();
        assert_eq!(read_n(&s, 2), b"hi");
        assert_eq!(p.open(), 1);
        p.reset_all();
        assert!((&c).read(&mut [0; 8]).is_err());
        assert!((&s).read(&mut [0; 8]).is_err());
        assert!(p.wait_open(0, T));
    }

    #[test]
    fn refuse_resets_new_connections() {
        let (p, rx) = setup(vec![]);
        p.set_refuse(true);
        let c = TcpStream::connect(p.addr()).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        assert!((&c).read(&mut [0; 8]).is_err());
        assert!(rx.try_recv().is_err());
        p.set_refuse(false);
        let (mut c, s) = pair(&p, &rx);
        c.write_all(b"ok").unwrap();
        assert_eq!(read_n(&s, 2), b"ok");
        assert_eq!((p.accepted(), p.open()), (2, 1));
    }
}
