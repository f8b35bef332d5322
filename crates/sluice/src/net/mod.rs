//! Byte streams (TCP, Unix, TLS over either) and packet-level I/O for the connection phase.

pub mod tls;

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use sluice_proto::packet::{HEADER, Header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// A connection to a client or a backend.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<tokio_rustls::TlsStream<Stream>>),
    /// No connection: a multiplexed session between statements. Every operation fails.
    Detached,
}

fn detached() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the session holds no backend connection")
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// Reads what is there without waiting: `WouldBlock` when the socket is not known to be
    /// readable (no system call then). The relay's fast path: no future, no budget, no waker.
    /// A TLS stream always answers `WouldBlock` (its reads go through the async path).
    pub fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => try_recv(|f| s.try_io(Interest::READABLE, f), s.as_raw_fd(), buf),
            Stream::Unix(s) => try_recv(|f| s.try_io(Interest::READABLE, f), s.as_raw_fd(), buf),
            Stream::Tls(_) => Err(io::ErrorKind::WouldBlock.into()),
            Stream::Detached => Err(detached()),
        }
    }

    /// Reads into `buf` (which must have spare capacity), waiting until there is something to
    /// read. Returns 0 at end of stream.
    pub async fn read_into(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_into(cx, buf)).await
    }

    /// Polls for bytes into `buf`'s spare capacity. A plain socket is read at once, and only when
    /// it has nothing is its readiness polled (which registers the waker); a TLS stream goes
    /// through its `AsyncRead`.
    pub fn poll_read_into(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        loop {
            if let Stream::Tls(t) = self {
                return poll_read_tls(t, cx, buf);
            }
            match self.try_read_buf(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
            std::task::ready!(self.poll_read_ready(cx))?;
        }
    }

    /// Writes all of `data`: what the socket takes at once without a future or a timer
    /// ([`Stream::write_now`]), the rest waiting at most `limit` for room (no limit when zero).
    /// Every write of sluice's goes through here or the two halves of it.
    pub async fn write_within(&mut self, limit: std::time::Duration, data: &[u8]) -> io::Result<()> {
        let done = self.write_now(data)?;
        if done == data.len() {
            return Ok(());
        }
        self.write_rest_within(limit, &data[done..]).await
    }

    /// Writes what a plain socket takes of `data` at once: how much it took. Nothing for TLS,
    /// which [`Stream::write_rest_within`] writes.
    pub fn write_now(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < data.len() {
            let r = match self {
                Stream::Tcp(s) => s.try_io(Interest::WRITABLE, || crate::sys::socket::send(s.as_raw_fd(), &data[done..])),
                Stream::Unix(s) => s.try_io(Interest::WRITABLE, || crate::sys::socket::send(s.as_raw_fd(), &data[done..])),
                Stream::Tls(_) => break,
                Stream::Detached => return Err(detached()),
            };
            match r {
                // (A socket that takes nothing is left to write_all, which reports it.)
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Writes all of `data`, waiting at most `limit` for room (no limit when zero). A TLS
    /// stream is flushed, since it may otherwise keep records it could not send yet, and the
    /// peer would wait for them forever.
    pub async fn write_rest_within(&mut self, limit: std::time::Duration, data: &[u8]) -> io::Result<()> {
        let send = async {
            self.write_all(data).await?;
            if self.is_tls() {
                self.flush().await?;
            }
            Ok(())
        };
        within(limit, send).await
    }

    /// The local address of a TCP connection (TLS over TCP too).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok(),
            Stream::Tls(t) => t.get_ref().0.local_addr(),
            Stream::Unix(_) | Stream::Detached => None,
        }
    }

    /// The descriptor of a plain connection (TCP or Unix: not TLS, which holds state of its
    /// own), to hand it to another process.
    pub fn plain_fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            Stream::Tcp(s) => Some(s.as_raw_fd()),
            Stream::Unix(s) => Some(s.as_raw_fd()),
            Stream::Tls(_) | Stream::Detached => None,
        }
    }

    /// A plain connection from a descriptor another process handed over (`unix`: a Unix
    /// socket, else TCP). Within a runtime.
    pub fn from_fd(fd: std::os::fd::OwnedFd, unix: bool) -> io::Result<Stream> {
        if unix {
            let s = std::os::unix::net::UnixStream::from(fd);
            s.set_nonblocking(true)?;
            Ok(Stream::Unix(UnixStream::from_std(s)?))
        } else {
            let s = std::net::TcpStream::from(fd);
            s.set_nonblocking(true)?;
            Ok(Stream::Tcp(TcpStream::from_std(s)?))
        }
    }

    pub fn is_unix(&self) -> bool {
        match self {
            Stream::Unix(_) => true,
            Stream::Tcp(_) | Stream::Detached => false,
            Stream::Tls(t) => t.get_ref().0.is_unix(),
        }
    }

    /// Whether nothing is waiting to be read and the peer has not closed: a connection that sat
    /// unused should have nothing to say (a server that closed it sends an error or an end).
    pub fn is_quiet(&self) -> bool {
        let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        let peek = match self {
            Stream::Tcp(s) => socket2::SockRef::from(s).peek(&mut b),
            Stream::Unix(s) => socket2::SockRef::from(s).peek(&mut b),
            Stream::Tls(t) => return t.get_ref().0.is_quiet(),
            Stream::Detached => return false,
        };
        matches!(peek, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether [`Stream::readable`] can wait for data without a read buffer: a plain socket, or
    /// a TLS stream that holds no decrypted bytes, no close and nothing to send, so that its
    /// socket's readiness announces whatever comes next (a record's rest included).
    #[inline]
    pub fn can_wait_unbuffered(&self) -> bool {
        match self {
            Stream::Tls(t) => tls_is_quiet(t),
            _ => true,
        }
    }

    /// Waits until the socket has data or an end. The waker goes to the socket's reader slot,
    /// as a read's does: no waiter list, no lock. For a TLS stream it is its socket's readiness,
    /// which says nothing of what rustls holds (see [`Stream::can_wait_unbuffered`]).
    pub async fn readable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_read_ready(cx)).await
    }

    /// Whether the socket is known to be readable (for a TLS stream, its socket): a readiness
    /// event that no read has answered with nothing yet. No system call, and the task is not
    /// registered for the next event.
    pub fn is_read_ready(&self) -> bool {
        let probe = || Ok(());
        match self {
            Stream::Tcp(s) => s.try_io(Interest::READABLE, probe).is_ok(),
            Stream::Unix(s) => s.try_io(Interest::READABLE, probe).is_ok(),
            Stream::Tls(t) => t.get_ref().0.is_read_ready(),
            Stream::Detached => false,
        }
    }

    /// Socket readiness for reading (for a TLS stream, its socket's).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
            // (Its socket directly: no recursion, which would keep this from being inlined.)
            Stream::Tls(t) => match t.get_ref().0 {
                Stream::Tcp(s) => s.poll_read_ready(cx),
                Stream::Unix(s) => s.poll_read_ready(cx),
                _ => Poll::Pending,
            },
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    /// Reads what is there without waiting, from a TLS stream too (polled once: what rustls
    /// holds or its socket has); `WouldBlock` when there is nothing. After a readiness, this
    /// tells a command from a false alarm without a task's read buffer.
    #[inline]
    pub fn try_read_now(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Stream::Tls(t) => try_read_tls(t, buf),
            _ => self.try_read_buf(buf),
        }
    }
}

/// Whether rustls holds no decrypted byte, no close and nothing to send.
#[cold]
fn tls_is_quiet(t: &tokio_rustls::TlsStream<Stream>) -> bool {
    let (_, tls) = t.get_ref();
    tls.wants_read() && !tls.wants_write()
}

/// One poll of a TLS stream's read that does not wait (`WouldBlock`: nothing there).
#[cold]
fn try_read_tls(t: &mut tokio_rustls::TlsStream<Stream>, buf: &mut BytesMut) -> io::Result<usize> {
    match poll_read_tls(t, &mut Context::from_waker(std::task::Waker::noop()), buf) {
        Poll::Ready(r) => r,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

/// One read of a plain socket through `try_io` (which reads only when the socket is known to be
/// readable, and forgets that readiness on `WouldBlock`). A short read also drained the socket,
/// so it forgets the readiness too, as tokio's own `poll_read` does: else the next wait would
/// begin with a read that can only answer EAGAIN.
fn try_recv<F>(try_io: F, fd: std::os::fd::RawFd, buf: &mut BytesMut) -> io::Result<usize>
where
    F: FnOnce(&mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>,
{
    let mut short = None;
    let r = try_io(&mut || {
        let room = buf.capacity() - buf.len();
        let n = crate::sys::socket::recv(fd, buf)?;
        if n > 0 && n < room {
            short = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    short.map_or(r, Ok)
}

/// A TLS stream's read into `buf`'s spare capacity (what tokio's `read_buf` does).
fn poll_read_tls(t: &mut tokio_rustls::TlsStream<Stream>, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
    crate::sys::socket::read_into_spare(buf, |rb| Pin::new(t).poll_read(cx, rb))
}

/// Read buffers of idle sessions. A session that idled a while gives its (empty) read buffers
/// back and waits for socket readiness without them, so that thousands of idle connections
/// hold no buffers; its next command takes them again from this per-thread pool, so that a
/// session does not allocate when it wakes.
pub mod buffers {
    use std::cell::RefCell;

    use bytes::BytesMut;

    use super::{BUF_SIZE, LARGE_BUF_SIZE};

    /// Buffers kept per thread (the rest are freed).
    const KEEP: usize = 64;
    /// The largest buffer kept, in the pool or by a session between commands: one a large
    /// response grew (larger ones are freed).
    const LARGEST_KEPT: usize = 2 * LARGE_BUF_SIZE;

    thread_local! {
        static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    }

    /// Takes `b`'s buffer into the pool, leaving it empty with no capacity.
    pub fn park(b: &mut BytesMut) {
        if b.capacity() == 0 {
            return;
        }
        let buf = std::mem::take(b);
        if buf.capacity() <= LARGEST_KEPT {
            FREE.with(|f| {
                let mut f = f.borrow_mut();
                if f.len() < KEEP {
                    f.push(buf);
                }
            });
        }
    }

    /// Readies a kept, empty buffer for a wait: freed if a response grew it past what the pool
    /// keeps (the next command takes a common one), its room restored when its reads have used
    /// it up.
    #[inline]
    pub fn trim(b: &mut BytesMut) {
        let room = b.capacity();
        if room > LARGEST_KEPT {
            *b = BytesMut::new();
        } else if room != 0 && room < 1024 {
            b.reserve(BUF_SIZE);
        }
    }

    /// Gives `b` a buffer again if it was parked.
    pub fn unpark(b: &mut BytesMut) {
        if b.capacity() == 0 {
            *b = FREE.with(|f| f.borrow_mut().pop()).unwrap_or_default();
            b.clear();
            b.reserve(BUF_SIZE);
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Tcp($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::Unix($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::Detached => false,
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

/// Runs an I/O future with a time limit (none when `limit` is zero); running out is an error
/// of kind `TimedOut`. The limit counts from the first time the operation cannot go on: the
/// timer is made only then, so an operation that completes at once (most writes, reads of data
/// already there) costs no clock read and no timer.
pub fn within<F: Future>(limit: std::time::Duration, io: F) -> Within<F> {
    Within { io, timer: None, limit }
}

pin_project_lite::pin_project! {
    /// The future of [`within`]: the operation and, once it has had to wait, its timer. A plain
    /// struct rather than an async fn, so that it holds each of them once (it sits in the
    /// future of every session, idle or not).
    pub struct Within<F> {
        #[pin]
        io: F,
        #[pin]
        timer: Option<tokio::time::Sleep>,
        limit: std::time::Duration,
    }
}

impl<F: Future<Output = io::Result<T>>, T> Future for Within<F> {
    type Output = io::Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let mut this = self.project();
        if let Poll::Ready(r) = this.io.poll(cx) {
            return Poll::Ready(r);
        }
        if this.limit.is_zero() {
            return Poll::Pending;
        }
        if this.timer.is_none() {
            this.timer.set(Some(tokio::time::sleep(*this.limit)));
        }
        match this.timer.as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, format!("no progress for {:?}", this.limit)))),
            _ => Poll::Pending,
        }
    }
}

/// Initial read buffer size of a connection.
pub const BUF_SIZE: usize = 16 * 1024;

/// Read buffer size for a response that outgrows [`BUF_SIZE`]: large results move in 64 KiB
/// reads and writes, which on loopback also means 64 KiB TCP segments. Per byte relayed, that
/// is a quarter of the system calls and segments (the `floor` suite of the benchmarks measures
/// what the buffer size costs).
pub const LARGE_BUF_SIZE: usize = 64 * 1024;

/// A stream with a read buffer, for reading whole packets during the connection phase.
pub struct PacketConn {
    pub stream: Stream,
    pub rbuf: BytesMut,
}

impl PacketConn {
    pub fn new(stream: Stream) -> Self {
        PacketConn { stream, rbuf: BytesMut::with_capacity(BUF_SIZE) }
    }

    /// No connection (a multiplexed session between statements); allocates nothing.
    pub fn detached() -> Self {
        PacketConn { stream: Stream::Detached, rbuf: BytesMut::new() }
    }

    pub fn is_detached(&self) -> bool {
        matches!(self.stream, Stream::Detached)
    }

    /// Reads one physical packet (at most `limit` bytes of payload); returns its sequence id and
    /// payload. Used only outside the relay's hot path.
    pub async fn read_packet(&mut self, limit: usize) -> io::Result<(u8, Vec<u8>)> {
        loop {
            if let Some(h) = Header::parse(&self.rbuf) {
                if h.len > limit {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("packet of {} bytes is too large here", h.len)));
                }
                if self.rbuf.len() >= HEADER + h.len {
                    let payload = self.rbuf[HEADER..HEADER + h.len].to_vec();
                    self.rbuf.advance(HEADER + h.len);
                    return Ok((h.seq, payload));
                }
                self.rbuf.reserve(HEADER + h.len - self.rbuf.len());
            }
            self.fill().await?;
        }
    }

    /// Reads one packet without reading past its end: used for the packet that may be an SSL
    /// request, since the TLS handshake that follows it must get every byte after it.
    pub async fn read_packet_exact(&mut self, limit: usize) -> io::Result<(u8, Vec<u8>)> {
        debug_assert!(self.rbuf.is_empty());
        let mut h = [0u8; HEADER];
        self.stream.read_exact(&mut h).await?;
        let h = Header::parse(&h).ok_or_else(|| io::Error::other("header"))?;
        if h.len > limit {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("packet of {} bytes is too large here", h.len)));
        }
        let mut payload = vec![0u8; h.len];
        self.stream.read_exact(&mut payload).await?;
        Ok((h.seq, payload))
    }

    /// Reads more bytes into the buffer; end of stream is an error.
    pub async fn fill(&mut self) -> io::Result<usize> {
        if self.rbuf.capacity() - self.rbuf.len() < 1024 {
            self.rbuf.reserve(BUF_SIZE);
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        Ok(n)
    }

    /// Frames and writes one payload.
    pub async fn write_packet(&mut self, payload: &[u8], seq: u8) -> io::Result<u8> {
        let mut out = Vec::with_capacity(payload.len() + HEADER);
        let next = sluice_proto::packet::frame(&mut out, payload, seq);
        self.stream.write_within(std::time::Duration::ZERO, &out).await?;
        Ok(next)
    }
}

/// Sets TCP_NODELAY and keepalive on a connected TCP socket, or on a listening one: on Linux,
/// accepted sockets inherit both, which saves four system calls per client connection.
pub fn tune_tcp(sock: socket2::SockRef<'_>) {
    let _ = sock.set_tcp_nodelay(true);
    let ka = socket2::TcpKeepalive::new().with_time(std::time::Duration::from_secs(60)).with_interval(std::time::Duration::from_secs(10));
    let _ = sock.set_tcp_keepalive(&ka);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Polls a future once, with the task's waker.
    async fn poll_once<F: Future + Unpin>(mut f: F) -> Poll<F::Output> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut f).poll(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn within_limits_only_an_operation_that_stalls() {
        let limit = Duration::from_secs(10);
        assert_eq!(within(limit, async { Ok(7) }).await.unwrap(), 7);
        // Pending at first, done before the limit.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            Ok(8)
        };
        assert_eq!(within(limit, slow).await.unwrap(), 8);
        let stalled = within(limit, std::future::pending::<io::Result<()>>());
        assert_eq!(stalled.await.unwrap_err().kind(), io::ErrorKind::TimedOut);
        // No limit: the operation runs to its end.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(9)
        };
        assert_eq!(within(Duration::ZERO, slow).await.unwrap(), 9);
    }

    /// A kept buffer is freed when a response grew it past what the pool keeps, given its room
    /// back when reads used it up, and otherwise left as it is (one a large response grew too:
    /// the next large response reads in large pieces from its start); a buffer given back stays
    /// empty.
    #[test]
    fn a_kept_buffer_is_trimmed_between_commands() {
        let mut huge = BytesMut::with_capacity(2 * LARGE_BUF_SIZE + 1);
        buffers::trim(&mut huge);
        assert_eq!(huge.capacity(), 0);

        let mut large = BytesMut::with_capacity(LARGE_BUF_SIZE + 1);
        let at = large.as_ptr();
        buffers::trim(&mut large);
        assert_eq!((large.capacity(), large.as_ptr()), (LARGE_BUF_SIZE + 1, at));

        let mut used = BytesMut::with_capacity(BUF_SIZE);
        used.resize(BUF_SIZE - 100, 0);
        bytes::Buf::advance(&mut used, BUF_SIZE - 100);
        assert!(used.is_empty() && used.capacity() < 1024);
        buffers::trim(&mut used);
        assert!(used.capacity() >= BUF_SIZE);

        let mut common = BytesMut::with_capacity(BUF_SIZE);
        let at = common.as_ptr();
        buffers::trim(&mut common);
        assert_eq!((common.capacity(), common.as_ptr()), (BUF_SIZE, at));

        let mut given_back = BytesMut::new();
        buffers::trim(&mut given_back);
        assert_eq!(given_back.capacity(), 0);
    }

    /// A read that gets less than it had room for drained the socket: the stream forgets its
    /// readiness, so the next read waits for the next readiness event instead of trying the
    /// socket (which could only answer EAGAIN, one wasted system call per command). A read that
    /// fills the buffer keeps it: more may be there.
    #[tokio::test]
    async fn a_short_read_forgets_readiness_and_a_full_one_keeps_it() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let stream = Stream::Tcp(TcpStream::from_std(ours).unwrap());
        let mut buf = BytesMut::with_capacity(64);

        peer.write_all(&[1; 10]).unwrap();
        stream.readable().await.unwrap();
        assert_eq!(stream.try_read_buf(&mut buf).unwrap(), 10);
        // The bytes are in the socket already, but no readiness event has announced them.
        peer.write_all(&[2; 5]).unwrap();
        assert_eq!(stream.try_read_buf(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        stream.readable().await.unwrap();
        assert_eq!(stream.try_read_buf(&mut buf).unwrap(), 5);

        // A read that fills the buffer: the readiness stays, and the next read gets the rest.
        let mut small = BytesMut::with_capacity(8);
        peer.write_all(&[3; 100]).unwrap();
        stream.readable().await.unwrap();
        let n = stream.try_read_buf(&mut small).unwrap();
        assert_eq!(n, small.capacity());
        small.clear();
        assert!(stream.try_read_buf(&mut small).unwrap() > 0);
    }

    /// rustls takes more plaintext than the socket can send at once; a write that returned
    /// then would leave records behind that nothing sends (the peer waits for them forever).
    #[tokio::test]
    async fn a_tls_write_returns_only_once_its_records_are_sent() {
        use rustls::pki_types::{PrivateKeyDer, ServerName};
        use std::sync::Arc;
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let server_cfg =
            rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(vec![cert.cert.der().clone()], key).unwrap();
        let client_cfg = rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::net::tls::NoVerify))
            .with_no_client_auth();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connect = tokio::spawn(async move {
            // Small socket buffers: far less than rustls buffers.
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_recv_buffer_size(4096).unwrap();
            let tcp = socket.connect(addr).await.unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            tokio_rustls::TlsConnector::from(Arc::new(client_cfg)).connect(name, tcp).await.unwrap()
        });
        let (tcp, _) = listener.accept().await.unwrap();
        socket2::SockRef::from(&tcp).set_send_buffer_size(4096).unwrap();
        let accepted = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg)).accept(Stream::Tcp(tcp)).await.unwrap();
        let mut server = Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(accepted)));
        let mut client = connect.await.unwrap();

        let data: Vec<u8> = (0..48 * 1024).map(|i| i as u8).collect();
        let mut write = std::pin::pin!(server.write_within(Duration::ZERO, &data));
        assert!(poll_once(write.as_mut()).await.is_pending(), "the write returned with records still in rustls");
        let mut got = vec![0; data.len()];
        let (w, r) = tokio::join!(write, client.read_exact(&mut got));
        w.unwrap();
        r.unwrap();
        assert!(got == data, "the client read other bytes than were written");
    }
}

/// Accepts that failed in a row on one listener, and the wait before the next try.
#[derive(Default)]
pub struct AcceptBackoff {
    in_a_row: u32,
}

impl AcceptBackoff {
    /// An accept that failed: counted and logged (sluice's own fault: most often it is out of
    /// descriptors), then the listener waits before it tries again, longer each time in a row
    /// (10 ms doubling up to 1 s), so that a process out of descriptors does not spin.
    pub async fn failed(&mut self, e: &io::Error, errors: &prometheus_client::metrics::counter::Counter) {
        errors.inc();
        let wait = std::time::Duration::from_millis(10u64 << self.in_a_row.min(7)).min(std::time::Duration::from_secs(1));
        self.in_a_row += 1;
        tracing::warn!(side = "sluice", error = %e, in_a_row = self.in_a_row, wait_ms = wait.as_millis() as u64, "accept failed");
        tokio::time::sleep(wait).await;
    }

    pub fn succeeded(&mut self) {
        self.in_a_row = 0;
    }
}

/// Sluice's own addresses, to know a backend or a login that is sluice itself (a backend
/// configured at sluice's own listener, directly or under another name, which would make every
/// login open another connection to sluice, without end).
#[derive(Default)]
pub struct Own {
    /// The TCP addresses and socket paths sluice listens on (set once they are bound).
    listening: parking_lot::Mutex<(Vec<std::net::SocketAddr>, Vec<std::path::PathBuf>)>,
    /// Its recent connections to backends (local and remote address), with when they were made
    /// (and those in the order they were made, to forget the old ones).
    recent: parking_lot::Mutex<(std::collections::HashMap<Pair, std::time::Instant>, std::collections::VecDeque<Pair>)>,
}

/// A connection's two ends: (local, remote).
type Pair = (std::net::SocketAddr, std::net::SocketAddr);

/// How many of sluice's recent backend connections are remembered, and how long.
const OWN_RECENT: usize = 4096;
const OWN_RECENT_FOR: std::time::Duration = std::time::Duration::from_secs(5);

impl Own {
    pub fn set_listening(&self, tcp: Vec<std::net::SocketAddr>, unix: Vec<std::path::PathBuf>) {
        *self.listening.lock() = (tcp, unix);
    }

    /// Whether a backend at `a` would be sluice's own listener: the same socket path, the same
    /// port on the same address, or on a loopback address where sluice listens on every
    /// address or a loopback one.
    pub fn is_listener(&self, a: &crate::config::Address) -> bool {
        let l = self.listening.lock();
        match a {
            crate::config::Address::Unix(p) => {
                let real = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                l.1.iter().any(|q| q == p || real(q) == real(p))
            }
            crate::config::Address::Tcp(a) => l.0.iter().any(|l| {
                l.port() == a.port() && (l.ip() == a.ip() || ((l.ip().is_unspecified() || l.ip().is_loopback()) && a.ip().is_loopback()))
            }),
        }
    }

    /// Notes the ends of a connection sluice just made to a backend.
    pub fn note(&self, local: std::net::SocketAddr, remote: std::net::SocketAddr) {
        let pair = (local, remote);
        let now = std::time::Instant::now();
        let mut guard = self.recent.lock();
        let (at, order) = &mut *guard;
        while let Some(old) = order.front().copied() {
            let stale = at.get(&old).is_none_or(|t| now.duration_since(*t) > OWN_RECENT_FOR);
            if !stale && order.len() < OWN_RECENT {
                break;
            }
            order.pop_front();
            at.remove(&old);
        }
        if at.insert(pair, now).is_none() {
            order.push_back(pair);
        }
    }

    /// Whether a client at `peer`, connected to sluice's `local`, is one of sluice's own recent
    /// backend connections (the same two ends: a port alone may serve connections to several
    /// places at once).
    pub fn is_own_connection(&self, peer: std::net::SocketAddr, local: std::net::SocketAddr) -> bool {
        self.recent.lock().0.get(&(peer, local)).is_some_and(|t| t.elapsed() <= OWN_RECENT_FOR)
    }
}

#[cfg(test)]
mod own_tests {
    use super::Own;

    #[test]
    fn own_listeners_and_recent_connections_are_known() {
        let own = Own::default();
        let any: std::net::SocketAddr = "0.0.0.0:6033".parse().unwrap();
        own.set_listening(vec![any], vec!["/run/sluice.sock".into()]);
        let tcp = |s: &str| crate::config::Address::Tcp(s.parse().unwrap());
        assert!(own.is_listener(&tcp("127.0.0.1:6033")) && own.is_listener(&tcp("0.0.0.0:6033")));
        assert!(!own.is_listener(&tcp("127.0.0.1:3306")) && !own.is_listener(&tcp("10.0.0.9:6033")));
        assert!(own.is_listener(&crate::config::Address::Unix("/run/sluice.sock".into())));
        let (a, to): (std::net::SocketAddr, std::net::SocketAddr) = ("10.1.2.3:40000".parse().unwrap(), "10.1.2.3:6033".parse().unwrap());
        assert!(!own.is_own_connection(a, to));
        own.note(a, to);
        assert!(own.is_own_connection(a, to));
        assert!(!own.is_own_connection(a, "10.1.2.3:6034".parse().unwrap()), "the same port to another place");
        for p in 0..super::OWN_RECENT as u16 {
            own.note(std::net::SocketAddr::from(([127, 0, 0, 1], 1000 + p)), to);
        }
        assert!(!own.is_own_connection(a, to), "the oldest is forgotten past the bound");
        assert_eq!(own.recent.lock().0.len(), super::OWN_RECENT);
    }
}
