//! The relay's reads and writes of plain sockets, as system calls by number. glibc's `recv` and
//! `send` are thread-cancellation points: each call switches cancellation on and off around the
//! system call, two atomic updates that sluice (which never cancels a thread) does not need.
//! Elsewhere than Linux, the standard library's calls.

use std::io;
use std::os::fd::RawFd;
use std::task::Poll;

use bytes::{BufMut, BytesMut};
use tokio::io::ReadBuf;

/// Reads into `buf`'s spare capacity (none: reads nothing).
#[inline]
pub fn recv(fd: RawFd, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.chunk_mut();
    let n = raw_recv(fd, spare.as_mut_ptr(), spare.len())?;
    // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

#[cfg(target_os = "linux")]
#[inline]
fn raw_recv(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<usize> {
    // SAFETY: `ptr..ptr + len` is writable memory that outlives the call.
    let n = unsafe { libc::syscall(libc::SYS_recvfrom, fd, ptr, len, 0, 0usize, 0usize) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

#[cfg(not(target_os = "linux"))]
fn raw_recv(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<usize> {
    // SAFETY: as above.
    let n = unsafe { libc::recv(fd, ptr.cast(), len, 0) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// Writes what the socket takes of `data` (never raising SIGPIPE).
#[cfg(target_os = "linux")]
#[inline]
pub fn send(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is readable memory that outlives the call.
    let n = unsafe { libc::syscall(libc::SYS_sendto, fd, data.as_ptr(), data.len(), libc::MSG_NOSIGNAL, 0usize, 0usize) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

#[cfg(not(target_os = "linux"))]
pub fn send(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: as above.
    let n = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), 0) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// Lets `read` fill `buf`'s spare capacity through a [`ReadBuf`] (what tokio's `read_buf`
/// does, for a stream polled by hand); how many bytes it added.
#[inline]
pub fn read_into_spare(buf: &mut BytesMut, read: impl FnOnce(&mut ReadBuf<'_>) -> Poll<io::Result<()>>) -> Poll<io::Result<usize>> {
    let spare = buf.chunk_mut();
    // SAFETY: ReadBuf only writes initialised bytes into the slice and reports how many.
    let mut rb = ReadBuf::uninit(unsafe { spare.as_uninit_slice_mut() });
    std::task::ready!(read(&mut rb))?;
    let n = rb.filled().len();
    // SAFETY: the first `n` bytes of the spare capacity were filled.
    unsafe { buf.advance_mut(n) };
    Poll::Ready(Ok(n))
}
