//! Idle backend connections kept for reuse. A session that ends cleanly leaves its backend
//! connection here instead of closing it (reset first if the session ran anything); the next
//! login to that backend from a client with the same capabilities, the same character set and the
//! same need for TLS to the backend takes it and changes its user with COM_CHANGE_USER, which resets every session
//! state on the server (transactions, variables, temporary tables, locks, statements).
//! That saves the TCP connection, the greeting and the server's connection set-up. A full
//! pool closes the connection idle longest to keep the newcomer, so that it follows the clients
//! of the moment (a pool full of connections no current client fits would be useless until
//! they idled out).
//!
//! A connection lives on the worker runtime that opened it, so each entry records its worker
//! and only that worker takes it back. Entries older than the idle timeout, and every entry of a
//! backend that is down, are closed by each worker's sweeper.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::net::PacketConn;

use crate::worker::index as worker;

/// What a pooled connection was logged in with; a login reuses it only if these match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fit {
    /// Capabilities in force between the client and sluice, without the client-leg transport
    /// bits (TLS, compression), which do not reach the backend.
    pub client_caps: u32,
    /// MariaDB extended capabilities in force with the backend.
    pub mariadb_caps: u32,
    /// The session wanted TLS to the backend ([`super::BackendTls::wanted`]): a TLS client's
    /// connection does not go to a plain client, nor the reverse.
    pub backend_tls: bool,
    /// The client address its PROXY protocol header gave the server (set when a backend is
    /// sent one): the connection serves clients of that address only.
    pub source: Option<std::net::IpAddr>,
    /// The character set and collation of the login that opened the connection: TiDB keeps a
    /// connection's first one through COM_CHANGE_USER (it skips the field), so a connection
    /// serves logins of the same one only (on every server: clients rarely differ in it).
    #[serde(default)]
    pub collation: u8,
}

/// A backend connection that is logged in and idle.
pub struct Idle {
    pub conn: PacketConn,
    pub fit: Fit,
    /// Capabilities in force between sluice and the backend.
    pub backend_caps: u32,
    pub thread_id: u32,
    pub mariadb: bool,
    worker: usize,
    since: Instant,
}

impl Idle {
    pub fn new(conn: PacketConn, fit: Fit, backend_caps: u32, thread_id: u32, mariadb: bool) -> Idle {
        Idle { conn, fit, backend_caps, thread_id, mariadb, worker: worker(), since: Instant::now() }
    }
}

/// The idle connections of one backend.
pub struct Pool {
    idle: Mutex<Vec<Idle>>,
    /// Most idle connections kept per worker; 0 disables pooling.
    max: usize,
    timeout: Duration,
}

impl Pool {
    pub fn new(max: usize, timeout: Duration) -> Pool {
        Pool { idle: Mutex::new(Vec::new()), max, timeout }
    }

    pub fn enabled(&self) -> bool {
        self.max > 0 && !self.timeout.is_zero()
    }

    /// Keeps `c` and returns the connection for the caller to close, if any: `c` itself when
    /// pooling is off, or, when this worker already keeps as many as allowed, its connection
    /// idle longest, which makes room (clients whose capabilities no pooled connection fits
    /// would otherwise find the pool full of connections they can never take until those idle
    /// out). Either way it belongs to the caller's worker.
    pub fn put(&self, c: Idle) -> Option<Idle> {
        if !self.enabled() {
            return Some(c);
        }
        let mut idle = self.idle.lock();
        let mine = idle.iter().enumerate().filter(|(_, i)| i.worker == c.worker);
        let full = mine.clone().count() >= self.max;
        let oldest = if full { mine.min_by_key(|(_, i)| i.since).map(|(at, _)| at) } else { None };
        let evicted = oldest.map(|at| idle.swap_remove(at));
        idle.push(c);
        evicted
    }

    /// The most recently parked connection of the calling worker that fits (the warmest).
    pub fn take(&self, fit: Fit) -> Option<Idle> {
        let w = worker();
        let mut idle = self.idle.lock();
        let fresh = |c: &&Idle| c.worker == w && c.fit == fit && c.since.elapsed() < self.timeout;
        let (i, _) = idle.iter().enumerate().filter(|(_, c)| fresh(c)).max_by_key(|(_, c)| c.since)?;
        Some(idle.swap_remove(i))
    }

    /// Removes the calling worker's connections that idled out (all of them with `all`).
    pub fn expired(&self, all: bool) -> Vec<Idle> {
        let w = worker();
        self.idle.lock().extract_if(.., |c| c.worker == w && (all || c.since.elapsed() >= self.timeout)).collect()
    }

    /// Removes every worker's connections (the server is at its connection limit: see
    /// [`super::Backend::release_idle`]).
    pub fn take_all(&self) -> Vec<Idle> {
        std::mem::take(&mut *self.idle.lock())
    }

    pub fn count(&self) -> usize {
        self.idle.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(fit: Fit) -> Idle {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _g = rt.enter();
        let s = tokio::net::UnixStream::from_std(a).unwrap();
        Idle::new(PacketConn::new(crate::net::Stream::Unix(s)), fit, 0, 1, true)
    }

    #[test]
    fn keeps_at_most_max_per_worker_and_takes_only_a_fitting_connection() {
        let a = Fit { client_caps: 1, mariadb_caps: 0, backend_tls: false, source: None, collation: 45 };
        let b = Fit { client_caps: 2, mariadb_caps: 0, backend_tls: false, source: None, collation: 45 };
        let c = Fit { client_caps: 3, mariadb_caps: 0, backend_tls: false, source: None, collation: 45 };
        let p = Pool::new(2, Duration::from_secs(60));
        let mut oldest = idle(c);
        oldest.since -= Duration::from_secs(1);
        assert!(p.put(oldest).is_none());
        assert!(p.put(idle(a)).is_none());
        // A third connection exceeds max: the one idle longest makes room.
        assert_eq!(p.put(idle(b)).map(|e| e.fit), Some(c));
        assert_eq!(p.count(), 2);
        assert!(p.take(c).is_none());
        assert!(p.take(Fit { backend_tls: true, ..a }).is_none(), "a plain client's connection is not a TLS client's");
        assert_eq!(p.take(a).map(|c| c.fit), Some(a));
        assert!(p.take(a).is_none(), "the other one has other capabilities");
        crate::worker::enter(7);
        assert!(p.take(b).is_none(), "another worker's connection is not taken");
        crate::worker::enter(0);
        assert_eq!(p.take(b).map(|c| c.fit), Some(b));
        assert_eq!(p.count(), 0);
    }

    #[test]
    fn idled_out_connections_are_not_taken_and_are_swept() {
        let a = Fit { client_caps: 1, mariadb_caps: 0, backend_tls: false, source: None, collation: 45 };
        let p = Pool::new(4, Duration::from_secs(60));
        let mut old = idle(a);
        old.since -= Duration::from_secs(61);
        assert!(p.put(old).is_none());
        assert!(p.take(a).is_none());
        assert_eq!(p.expired(false).len(), 1);
        assert_eq!(p.count(), 0);
        let off = Pool::new(0, Duration::from_secs(60));
        assert_eq!(off.put(idle(a)).map(|c| c.fit), Some(a), "max 0 disables pooling");
    }
}
