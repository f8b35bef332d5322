//! Passing descriptors between processes (SCM_RIGHTS over a Unix socket pair), for upgrades:
//! the listening sockets go to the new process at its start, then the sockets of the sessions
//! handed over to it, one session per message. The pair is SOCK_SEQPACKET, so each message
//! arrives whole, with its descriptors, or not at all.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

/// At most this many descriptors go in one message (the kernel's limit).
pub const MAX_FDS: usize = 253;

/// The largest message received (a session's state must fit).
pub const MAX_MESSAGE: usize = 1 << 16;

/// A connected pair of SOCK_SEQPACKET Unix sockets (close-on-exec), each as a `UnixStream`:
/// reads and writes move whole messages.
pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
    let (a, b) = socket2::Socket::pair(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None)?;
    Ok((UnixStream::from(OwnedFd::from(a)), UnixStream::from(OwnedFd::from(b))))
}

/// Sends one message with `fds` attached; with `wait` false, `WouldBlock` when the socket's
/// buffer is full (nothing was sent then).
pub fn send(s: &UnixStream, data: &[u8], fds: &[RawFd], wait: bool) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors: at most {MAX_FDS}", fds.len())));
    }
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let flags = libc::MSG_NOSIGNAL | if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: msghdr is plain data; every pointer set below points into live buffers above,
    // with their lengths, and the control buffer has CMSG_SPACE bytes for one SCM_RIGHTS header
    // with `fds`; sendmsg reads them only during the call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
        }
        if libc::sendmsg(s.as_raw_fd(), &msg, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one message and the descriptors attached to it (now owned by this process,
/// close-on-exec). An empty message with no descriptor: the other end closed.
pub fn recv(s: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = vec![0u8; MAX_MESSAGE];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut fds = Vec::new();
    // SAFETY: as in `send`, the pointers point into the live buffers above with their lengths;
    // the headers walked are those recvmsg wrote into `control` (bounded by msg_controllen),
    // and each descriptor read from an SCM_RIGHTS header is a new one this process now owns.
    let (n, truncated) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        (n as usize, msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0)
    };
    if truncated {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a message larger than expected"));
    }
    data.truncate(n);
    Ok((data, fds))
}

/// Where an old process sends the sessions it hands over: the socket to the new process, once
/// an upgrade succeeded. Sessions send on it concurrently (each message is whole).
#[derive(Default)]
pub struct Outbox(OnceLock<UnixStream>);

impl Outbox {
    /// Sessions may be handed over from now on.
    pub fn open(&self, s: UnixStream) {
        let _ = self.0.set(s);
    }

    pub fn is_open(&self) -> bool {
        self.0.get().is_some()
    }

    /// Sends one session without waiting: `WouldBlock` when the new process is behind (the
    /// session tries again later).
    pub fn send(&self, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        match self.0.get() {
            Some(s) => send(s, data, fds, false),
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "no upgrade under way")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_pass_between_the_ends_of_a_pair() {
        let (a, b) = pair().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        send(&a, b"{}", &[l.as_raw_fd()], true).unwrap();
        send(&a, b"second", &[], true).unwrap();
        let (text, fds) = recv(&b).unwrap();
        assert_eq!(text, b"{}");
        assert_eq!(fds.len(), 1);
        // Messages keep their bounds.
        assert_eq!(recv(&b).unwrap().0, b"second");
        drop(l);
        // The socket received is the same one: it still listens once the sender's is closed.
        let got = std::net::TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(got.local_addr().unwrap(), addr);
        let _c = std::net::TcpStream::connect(addr).unwrap();
        assert!(got.accept().is_ok());
        drop(a);
        let (end, fds) = recv(&b).unwrap();
        assert!(end.is_empty() && fds.is_empty());
    }

    #[test]
    fn a_full_outbox_says_so_rather_than_wait() {
        let (a, _b) = pair().unwrap();
        let out = Outbox::default();
        assert_eq!(out.send(b"x", &[]).unwrap_err().kind(), io::ErrorKind::NotConnected);
        out.open(a);
        let big = vec![7u8; 32 * 1024];
        let err = (0..10_000).find_map(|_| out.send(&big, &[]).err()).unwrap();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }
}
