//! An epoll set that tokio's reactor watches as one descriptor (the parking lot's: thousands of
//! idle sockets cost the reactor one registration).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// An epoll set (close-on-exec).
#[derive(Debug)]
pub struct Epoll(OwnedFd);

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned by nothing else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The set as tokio's reactor watches it (readable when a descriptor in it is ready).
    pub fn register(self) -> io::Result<tokio::io::unix::AsyncFd<Epoll>> {
        // SAFETY: the Epoll owns its descriptor and keeps it open, the same one, for as long as
        // the AsyncFd holds the Epoll (its `as_raw_fd` always returns it).
        unsafe { tokio::io::unix::AsyncFd::register_with_interest(self, tokio::io::Interest::READABLE) }.map_err(|e| e.into_parts().1)
    }

    /// Watches `fd` for input and the peer's end, reported as `token`.
    pub fn add(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, u64: token };
        // SAFETY: both descriptors are open (borrowed for the call); `ev` is a valid event.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
        if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// No longer watches `fd`.
    pub fn delete(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: both descriptors are open; EPOLL_CTL_DEL reads no event.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd.as_raw_fd(), std::ptr::null_mut()) };
        if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// The tokens of up to `N` ready descriptors, without waiting, appended to `ready`; how many.
    pub fn ready<const N: usize>(&self, ready: &mut Vec<u64>) -> usize {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; N];
        // SAFETY: the epoll descriptor is open; `events` has room for N entries.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), N as i32, 0) };
        let n = usize::try_from(n).unwrap_or(0);
        ready.extend(events[..n].iter().map(|e| e.u64));
        n
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
