//! Mirroring (a query rule's `mirror`): statements copied to a shadow backend, fire and forget.
//! Each shadow backend has a bounded queue and one task that runs the copies in order, as the
//! session's user with its schema, over connections it keeps (one per user), and discards the
//! answers. A full queue drops the copy (counted); the session never waits for a shadow.

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use rustc_hash::FxHashMap;
use sluice_proto::consts::com;
use sluice_proto::response::Expect;
use tokio::sync::mpsc;

use super::conn::{As, Credential, login_as};
use super::{Backends, restore};
use crate::error::{Error, Result, Side};
use crate::net::PacketConn;
use crate::session::SessionState;

/// A statement to run on a shadow backend.
pub struct Job {
    user: String,
    collation: u8,
    schema: Option<String>,
    cred: Credential,
    sql: Vec<u8>,
}

/// Counts, for `/metrics`.
pub struct MirrorCounts {
    pub sent: Counter,
    pub dropped: Counter,
    pub failed: Counter,
}

pub struct Mirrors {
    /// By backend index: the queue of that shadow backend.
    queues: FxHashMap<usize, mpsc::Sender<Job>>,
    /// Taken by [`Mirrors::spawn`].
    receivers: Mutex<Vec<(usize, mpsc::Receiver<Job>)>>,
    pub counts: MirrorCounts,
}

impl Mirrors {
    /// Queues of `depth` statements for each backend index in `targets`.
    pub fn new(targets: impl IntoIterator<Item = usize>, depth: usize, metrics: &crate::metrics::Metrics) -> Mirrors {
        let mut queues = FxHashMap::default();
        let mut receivers = Vec::new();
        for t in targets {
            if let std::collections::hash_map::Entry::Vacant(v) = queues.entry(t) {
                let (tx, rx) = mpsc::channel(depth.max(1));
                v.insert(tx);
                receivers.push((t, rx));
            }
        }
        let counts =
            MirrorCounts { sent: metrics.mirrored("sent"), dropped: metrics.mirrored("dropped"), failed: metrics.mirrored("failed") };
        Mirrors { queues, receivers: Mutex::new(receivers), counts }
    }

    /// Queues a copy of a statement of a session (users mode: sluice logs in as its user); a
    /// full queue, or a session whose password sluice does not hold, drops it.
    pub fn send(&self, to: usize, state: &SessionState, cred: Option<&Credential>, sql: &[u8]) {
        let (Some(q), Some(cred)) = (self.queues.get(&to), cred) else {
            self.counts.dropped.inc();
            return;
        };
        let job = Job {
            user: state.user.to_string(),
            collation: state.collation,
            schema: state.schema.as_deref().map(String::from),
            cred: cred.clone(),
            sql: sql.to_vec(),
        };
        match q.try_send(job) {
            Ok(()) => self.counts.sent.inc(),
            Err(_) => self.counts.dropped.inc(),
        };
    }

    /// The queues' receiving ends, for [`run`] (once).
    pub fn take_receivers(&self) -> Vec<(usize, mpsc::Receiver<Job>)> {
        std::mem::take(&mut *self.receivers.lock())
    }
}

/// A shadow backend's connection for one user, and the schema it is in.
struct Shadow {
    conn: PacketConn,
    caps: u32,
    schema: Option<String>,
}

/// Runs the copies queued for shadow backend `index` until the queue closes.
pub async fn run(backends: &Backends, index: usize, mut rx: mpsc::Receiver<Job>, counts: &MirrorCounts) {
    let mut conns: FxHashMap<String, Shadow> = FxHashMap::default();
    while let Some(job) = rx.recv().await {
        let Some(b) = backends.get(index) else { continue };
        let limit = b.connect_timeout.max(std::time::Duration::from_secs(30));
        let r = super::conn::bounded(limit, "a mirrored statement", one(&b, &mut conns, &job)).await;
        if let Err(e) = r {
            counts.failed.inc();
            tracing::debug!(backend = %b.name, error = %crate::session::shown_text(e.message.as_bytes()), "mirrored statement failed");
            conns.remove(&job.user);
        }
    }
}

async fn one(b: &super::Backend, conns: &mut FxHashMap<String, Shadow>, job: &Job) -> Result<()> {
    if !conns.contains_key(&job.user) {
        if conns.len() >= 16 {
            conns.clear();
        }
        let who = As { user: &job.user, collation: job.collation, cred: &job.cred, client_tls: false };
        let (conn, caps) = login_as(b, &who).await?;
        conns.insert(job.user.clone(), Shadow { conn, caps, schema: None });
    }
    let s = conns.get_mut(&job.user).ok_or_else(|| Error::backend("mirror connection lost"))?;
    let io = |e| Error::io(Side::Backend, "mirroring", e);
    if let Some(db) = job.schema.as_ref().filter(|db| s.schema.as_ref() != Some(*db)) {
        let mut p = vec![com::INIT_DB];
        p.extend_from_slice(db.as_bytes());
        s.conn.write_packet(&p, 0).await.map_err(io)?;
        restore::discard_response(&mut s.conn, s.caps, Expect::Reply).await?;
        s.schema = Some(db.clone());
    }
    let mut p = Vec::with_capacity(job.sql.len() + 1);
    p.push(com::QUERY);
    p.extend_from_slice(&job.sql);
    s.conn.write_packet(&p, 0).await.map_err(io)?;
    restore::discard_response(&mut s.conn, s.caps, Expect::Results).await
}
