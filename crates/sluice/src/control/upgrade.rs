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
//!
//! Then the old process hands over its sessions too, each at its next safe point, on the same
//! pair (`frontend/handoff.rs`): one message per session, its state with its client socket
//! and backend socket attached. The new process carries each on where it was.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::error::UpgradeError;

/// An I/O error on the way, named.
fn io(what: String) -> impl FnOnce(std::io::Error) -> UpgradeError {
    move |source| UpgradeError::Io { what, source }
}
/// The environment variable that gives a new process the descriptor of its end of the pair.
pub const ENV: &str = "SLUICE_UPGRADE_FD";

/// The listener name of the admin API's socket.
pub const ADMIN: &str = "admin";

/// The listener name of the SQL admin listener's socket.
pub const SQL_ADMIN: &str = "sql-admin";

/// How long the old process waits for the new one to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
struct Offer {
    listeners: Vec<Offered>,
    /// The new process numbers its sessions from here: ids the old one gave (which handed-over
    /// sessions keep) stay below.
    #[serde(default)]
    next_session_id: u32,
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
    pub fn keep(&mut self, name: &str, fd: &impl std::os::fd::AsFd) -> Result<(), UpgradeError> {
        let dup = fd.as_fd().try_clone_to_owned().map_err(io(format!("keeping the socket of {name}")))?;
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some((_, fds)) => fds.push(dup),
            None => self.entries.push((name.to_string(), vec![dup])),
        }
        Ok(())
    }

    /// Starts the new binary (the one this process was started from, as it is on disk now)
    /// with this process's arguments, hands it the sockets and waits until it accepts. Its
    /// process id, and the channel on which sessions go to it. `next_session_id`: where the new
    /// process numbers its sessions from. Blocks: call it off the event loop.
    pub fn hand_over(&self, next_session_id: u32) -> Result<(u32, UnixStream), UpgradeError> {
        let exe = self.exe.clone().ok_or(UpgradeError::Refused("cannot tell which binary this process runs".into()))?;
        let exe = strip_deleted(exe);
        let (mine, theirs) = crate::sys::fdpass::pair().map_err(io("socket pair".into()))?;
        let fd = theirs.as_raw_fd();
        // The child's end outlives exec (the pair is made close-on-exec).
        crate::sys::process::set_cloexec(&theirs, false).map_err(io("fcntl".into()))?;
        let child = std::process::Command::new(&exe)
            .args(&self.args)
            .env(ENV, fd.to_string())
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(io(format!("starting {}", exe.display())))?;
        drop(theirs);
        let listeners = self.entries.iter().map(|(n, fds)| Offered { name: n.clone(), count: fds.len() }).collect();
        let offer = Offer { listeners, next_session_id };
        let fds: Vec<RawFd> = self.entries.iter().flat_map(|(_, f)| f.iter().map(AsRawFd::as_raw_fd)).collect();
        let text = serde_json::to_vec(&offer).map_err(|e| io("the offer".into())(e.into()))?;
        crate::sys::fdpass::send(&mine, &text, &fds, true).map_err(io("handing the sockets over".into()))?;
        mine.set_read_timeout(Some(READY_WITHIN)).map_err(io("the channel's timeout".into()))?;
        let mut answer = [0u8; 6];
        match (&mine).read_exact(&mut answer) {
            Ok(()) if &answer == b"ready\n" => Ok((child.id(), mine)),
            Ok(()) => Err(UpgradeError::Refused("the new process answered something else than ready".into())),
            Err(e) => Err(UpgradeError::Refused(format!("the new process did not start (see its log above): {e}"))),
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
    next_session_id: u32,
}

impl Inherited {
    /// The sockets handed over to this process, when it was started by an upgrade.
    pub fn from_env() -> Result<Option<Inherited>, UpgradeError> {
        // The variable's only writer is `hand_over`, which gives the child the number of a
        // descriptor it keeps open across exec for this process alone.
        let Some(fd) = crate::sys::process::take_inherited_fd(ENV) else { return Ok(None) };
        let fd = fd.map_err(io("the inherited channel".into()))?;
        crate::sys::process::set_cloexec(&fd, true).map_err(io("fcntl".into()))?;
        let channel = UnixStream::from(fd);
        let (text, mut fds) = crate::sys::fdpass::recv(&channel).map_err(io("receiving the sockets".into()))?;
        let offer: Offer = serde_json::from_slice(&text).map_err(|e| UpgradeError::Refused(format!("the old process's offer: {e}")))?;
        let mut sockets = HashMap::new();
        for o in offer.listeners {
            if o.count > fds.len() {
                return Err(UpgradeError::Refused("the old process sent fewer sockets than it named".into()));
            }
            sockets.insert(o.name, fds.drain(..o.count).collect());
        }
        Ok(Some(Inherited { sockets, channel, next_session_id: offer.next_session_id }))
    }

    /// Where this process numbers its sessions from.
    pub fn next_session_id(&self) -> u32 {
        self.next_session_id
    }

    /// The sockets of listener `name` (none when the old process had no such listener).
    pub fn take(&mut self, name: &str) -> Vec<OwnedFd> {
        self.sockets.remove(name).unwrap_or_default()
    }

    /// Tells the old process that this one accepts: it stops accepting, and hands its sessions
    /// over on the channel returned. Sockets not taken are closed (the listener is gone from
    /// the configuration).
    pub fn ready(mut self) -> UnixStream {
        if let Err(e) = self.channel.write_all(b"ready\n") {
            tracing::warn!(error = %e, "cannot tell the old process that this one is ready");
        }
        for (name, fds) in self.sockets.drain() {
            tracing::info!(listener = %name, sockets = fds.len(), "closing handed-over sockets of a listener no longer configured");
        }
        self.channel
    }
}

/// Receives the sessions the old process hands over on `channel`, each given to `adopt` with
/// its sockets, until the old process closes it (it ended). Blocks: run it on a thread.
pub fn receive_sessions(channel: UnixStream, mut adopt: impl FnMut(Vec<u8>, Vec<OwnedFd>)) {
    loop {
        match crate::sys::fdpass::recv(&channel) {
            Ok((text, fds)) if text.is_empty() && fds.is_empty() => {
                return tracing::info!("upgrade: the old process closed the hand-over channel");
            }
            Ok((text, fds)) => adopt(text, fds),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return tracing::warn!(error = %e, "upgrade: receiving sessions from the old process failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_binary_is_found_at_its_path() {
        assert_eq!(strip_deleted(PathBuf::from("/usr/bin/sluice (deleted)")), PathBuf::from("/usr/bin/sluice"));
        assert_eq!(strip_deleted(PathBuf::from("/usr/bin/sluice")), PathBuf::from("/usr/bin/sluice"));
    }
}
