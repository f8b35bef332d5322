//! Zero-downtime upgrade: the running process starts the new binary (`POST /upgrade`, `sluice
//! ctl upgrade`, or SIGUSR2) and hands it its listening sockets over a Unix socket pair
//! (SCM_RIGHTS), as HAProxy and Envoy do. Both then hold the same sockets, so no connection
//! waiting in a backlog is lost and none is refused. Once the new process says it accepts,
//! the old one stops accepting and serves its sessions until their clients leave (or until
//! SIGTERM drains it); the new one serves every new connection.
//!
//! The exchange: the old process sends one message, a JSON [`Offer`] naming each listener and
//! how many sockets it has, with all the sockets attached in that order; the new process binds
//! nothing it was given, starts, and answers `ready\n`. A new process that fails (a bad
//! configuration, a crash) closes the pair, and the old one goes on as if nothing happened.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The environment variable that gives a new process the descriptor of its end of the pair.
pub const ENV: &str = "SLUICE_UPGRADE_FD";

/// The listener name of the admin API's socket.
pub const ADMIN: &str = "admin";

/// The listener name of the SQL admin listener's socket.
pub const SQL_ADMIN: &str = "sql-admin";

/// At most this many sockets are handed over (the kernel's limit per message).
const MAX_FDS: usize = 253;

/// How long the old process waits for the new one to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
struct Offer {
    listeners: Vec<Offered>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Offered {
    name: String,
    count: usize,
}

/// The sockets a process listens on, kept (duplicated) so that it can hand them over.
#[derive(Default)]
pub struct Listening {
    entries: Vec<(String, Vec<OwnedFd>)>,
    /// The binary and arguments to start, as this process was started.
    exe: Option<PathBuf>,
    args: Vec<std::ffi::OsString>,
}

impl Listening {
    pub fn new() -> Listening {
        Listening { entries: Vec::new(), exe: std::env::current_exe().ok(), args: std::env::args_os().skip(1).collect() }
    }

    /// Keeps a duplicate of `fd` as a socket of listener `name`.
    pub fn keep(&mut self, name: &str, fd: &impl std::os::fd::AsFd) -> Result<(), String> {
        let dup = fd.as_fd().try_clone_to_owned().map_err(|e| format!("keeping the socket of {name}: {e}"))?;
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some((_, fds)) => fds.push(dup),
            None => self.entries.push((name.to_string(), vec![dup])),
        }
        Ok(())
    }

    /// Starts the new binary (the one this process was started from, as it is on disk now)
    /// with this process's arguments, hands it the sockets and waits until it accepts. Its
    /// process id. Blocks: call it off the event loop.
    pub fn hand_over(&self) -> Result<u32, String> {
        let exe = self.exe.clone().ok_or("cannot tell which binary this process runs")?;
        let exe = strip_deleted(exe);
        let (mine, theirs) = UnixStream::pair().map_err(|e| format!("socket pair: {e}"))?;
        let fd = theirs.as_raw_fd();
        // The child's end outlives exec (the pair is made close-on-exec).
        set_cloexec(fd, false)?;
        let child = std::process::Command::new(&exe)
            .args(&self.args)
            .env(ENV, fd.to_string())
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        drop(theirs);
        let offer = Offer { listeners: self.entries.iter().map(|(n, fds)| Offered { name: n.clone(), count: fds.len() }).collect() };
        let fds: Vec<RawFd> = self.entries.iter().flat_map(|(_, f)| f.iter().map(AsRawFd::as_raw_fd)).collect();
        if fds.len() > MAX_FDS {
            return Err(format!("{} sockets to hand over: at most {MAX_FDS}", fds.len()));
        }
        let text = serde_json::to_vec(&offer).map_err(|e| e.to_string())?;
        send_with_fds(&mine, &text, &fds).map_err(|e| format!("handing the sockets over: {e}"))?;
        mine.set_read_timeout(Some(READY_WITHIN)).map_err(|e| e.to_string())?;
        let mut answer = [0u8; 6];
        match (&mine).read_exact(&mut answer) {
            Ok(()) if &answer == b"ready\n" => Ok(child.id()),
            Ok(()) => Err("the new process answered something else than ready".into()),
            Err(e) => Err(format!("the new process did not start (see its log above): {e}")),
        }
    }
}

/// `/proc/self/exe` of a binary replaced on disk ends with " (deleted)": the new one is at the
/// path without it.
fn strip_deleted(p: PathBuf) -> PathBuf {
    match p.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(s) => PathBuf::from(s),
        None => p,
    }
}

/// Sockets a new process received from the one it replaces, by listener name.
pub struct Inherited {
    sockets: HashMap<String, Vec<OwnedFd>>,
    channel: UnixStream,
}

impl Inherited {
    /// The sockets handed over to this process, when it was started by an upgrade.
    pub fn from_env() -> Result<Option<Inherited>, String> {
        let Ok(v) = std::env::var(ENV) else { return Ok(None) };
        // SAFETY: the variable's only writer is `hand_over`, which gives the child the number
        // of a descriptor it keeps open across exec for this process alone; nothing else in this
        // process knows of or closes it.
        unsafe { std::env::remove_var(ENV) };
        let fd: RawFd = v.parse().map_err(|_| format!("{ENV}: not a descriptor: {v:?}"))?;
        set_cloexec(fd, true)?;
        // SAFETY: see above: the descriptor is open and owned by nobody else here.
        let channel = unsafe { UnixStream::from_raw_fd(fd) };
        let (text, mut fds) = recv_with_fds(&channel).map_err(|e| format!("receiving the sockets: {e}"))?;
        let offer: Offer = serde_json::from_slice(&text).map_err(|e| format!("the old process's offer: {e}"))?;
        let mut sockets = HashMap::new();
        for o in offer.listeners {
            if o.count > fds.len() {
                return Err("the old process sent fewer sockets than it named".into());
            }
            sockets.insert(o.name, fds.drain(..o.count).collect());
        }
        Ok(Some(Inherited { sockets, channel }))
    }

    /// The sockets of listener `name` (none when the old process had no such listener).
    pub fn take(&mut self, name: &str) -> Vec<OwnedFd> {
        self.sockets.remove(name).unwrap_or_default()
    }

    /// Tells the old process that this one accepts: it stops accepting. Sockets not taken are
    /// closed (the listener is gone from the configuration).
    pub fn ready(mut self) {
        if let Err(e) = self.channel.write_all(b"ready\n") {
            tracing::warn!(error = %e, "cannot tell the old process that this one is ready");
        }
        for (name, fds) in self.sockets.drain() {
            tracing::info!(listener = %name, sockets = fds.len(), "closing handed-over sockets of a listener no longer configured");
        }
    }
}

fn set_cloexec(fd: RawFd, on: bool) -> Result<(), String> {
    // SAFETY: fcntl on a descriptor this process owns; F_SETFD only changes its close-on-exec flag.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, if on { libc::FD_CLOEXEC } else { 0 }) };
    if r < 0 { Err(format!("fcntl: {}", std::io::Error::last_os_error())) } else { Ok(()) }
}

fn send_with_fds(s: &UnixStream, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
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
        if libc::sendmsg(s.as_raw_fd(), &msg, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn recv_with_fds(s: &UnixStream) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = vec![0u8; 1 << 16];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut fds = Vec::new();
    // SAFETY: as in `send_with_fds`, the pointers point into the live buffers above with their
    // lengths; the headers walked are those recvmsg wrote into `control` (bounded by
    // msg_controllen), and each descriptor read from an SCM_RIGHTS header is a new one this
    // process now owns (MSG_CMSG_CLOEXEC: not inherited by later children).
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
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
        n as usize
    };
    data.truncate(n);
    Ok((data, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_pass_between_the_ends_of_a_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        send_with_fds(&a, b"{}", &[l.as_raw_fd()]).unwrap();
        let (text, fds) = recv_with_fds(&b).unwrap();
        assert_eq!(text, b"{}");
        assert_eq!(fds.len(), 1);
        drop(l);
        // The socket received is the same one: it still listens once the sender's is closed.
        let got = std::net::TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(got.local_addr().unwrap(), addr);
        let _c = std::net::TcpStream::connect(addr).unwrap();
        assert!(got.accept().is_ok());
        assert_eq!(strip_deleted(PathBuf::from("/usr/bin/sluice (deleted)")), PathBuf::from("/usr/bin/sluice"));
    }
}
