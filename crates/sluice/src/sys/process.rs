//! The process and its threads: limits, the clock, the allocator, descriptors inherited across
//! exec, the scheduling class of a background thread, a file's write-back.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Nanoseconds of the monotonic clock (from an arbitrary origin). The relay reads it twice per
/// command; it is one vDSO call and integer arithmetic, where `Instant` adds checked
/// `timespec` conversions on each read and subtraction.
#[inline]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// Raises the soft limit on open files to the hard limit. Returns it.
pub fn raise_open_files_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the struct passed by pointer, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        if l.rlim_cur < l.rlim_max {
            let want = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
    }
    l.rlim_cur
}

/// Gives the allocator's free memory back to the system (glibc's arenas; elsewhere nothing).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim_heap() {
    // SAFETY: malloc_trim only returns free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim_heap() {}

/// Sets or clears the close-on-exec flag of a descriptor this process owns.
pub fn set_cloexec(fd: &impl AsRawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on an open descriptor (borrowed for the call); F_SETFD only changes its
    // close-on-exec flag.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, if on { libc::FD_CLOEXEC } else { 0 }) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Takes the descriptor whose number the environment variable `var` gives (the variable is
/// removed; None when it is not set). Only for a variable that the parent process set to a
/// descriptor it kept open across exec for this process alone, read once, before any thread
/// that reads the environment is started.
pub fn take_inherited_fd(var: &str) -> Option<Result<OwnedFd, io::Error>> {
    let value = std::env::var(var).ok()?;
    // SAFETY: called at start, before the process starts threads that read the environment
    // (see above).
    unsafe { std::env::remove_var(var) };
    let fd: RawFd = match value.parse() {
        Ok(fd) if fd >= 0 => fd,
        _ => return Some(Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{var}: not a descriptor: {value:?}")))),
    };
    // SAFETY: fcntl(F_GETFD) only asks whether the number names an open descriptor.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Some(Err(io::Error::new(io::ErrorKind::NotFound, format!("{var}: descriptor {fd} is not open"))));
    }
    // SAFETY: the descriptor is open, and was left to this process alone by its parent; nothing
    // else in this process knows its number (the variable is gone), so it has one owner.
    Some(Ok(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Makes the calling thread a batch thread (`SCHED_BATCH`): when it wakes it does not preempt
/// whatever runs on its core, it waits for its turn; and its turn is a fair share.
pub fn make_thread_batch() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 names the calling thread; the call only reads `param`.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Starts the disk's writing of `len` bytes of `file` from `from` without waiting for it
/// (`sync_file_range`, Linux's).
pub fn start_write_back(file: &std::fs::File, from: u64, len: u64) -> io::Result<()> {
    // SAFETY: the descriptor is the open file's (borrowed for the call); the call only reads
    // its arguments.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), from as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
    if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
