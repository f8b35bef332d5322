//! A passthrough session on TiDB moved with its own states (`backend::tidb`): sluice never saw
//! its password, so it cannot log in again as users mode does; TiDB hands the session over
//! instead. The safe points are a users-mode session's (no transaction, no open cursor, no
//! long data pending, between commands); whatever else TiDB cannot carry (a temporary table,
//! a lock) it refuses in `SHOW SESSION_STATES`, and the session stays where it is.

use std::sync::Arc;

use super::session::Session;
use crate::backend::Backend;
use crate::backend::tidb::{self, Resume};
use crate::error::{Error, Result};

impl Session {
    /// Whether the session moves by TiDB's session states: it holds a connection to a TiDB
    /// server, and the login to repeat is kept (users mode, and passthrough on TiDB). Users-mode
    /// sessions move so too: the states are exact, where sluice's own tracking depends on what
    /// the server reports (TiDB reports no session state changes).
    pub(super) fn moves_by_states(&self) -> bool {
        self.state.handed_over && self.who.profile.is_some() && !self.backend.conn.is_detached()
    }

    /// The states read, a connection to `target` logged in with the token and given them, and
    /// made the session's; the old connection is returned. A failure after the states were read
    /// leaves the old connection as it was (reading them changes nothing).
    pub(super) async fn transfer_to(&mut self, target: &Arc<Backend>) -> Result<crate::net::PacketConn> {
        let profile = self.who.profile.as_ref().ok_or_else(|| Error::connect("the session's login is not known"))?;
        let login = profile.get();
        let caps = self.backend_caps();
        let states = tidb::read_states(&mut self.backend.conn, caps, target.connect_timeout).await?;
        let slot = target.shared.place().await.map_err(|waited| super::multiplex::queue_error(&self.ctx, target, waited))?;
        let who = Resume {
            login: &login,
            client_caps: self.client_caps(),
            client_tls: self.client.stream.is_tls(),
            backend_caps: caps,
            origin: super::origin(&self.handle),
        };
        let (conn, thread_id) = tidb::resume(target, &who, states).await?;
        let old = std::mem::replace(&mut self.backend.conn, conn);
        self.backend.slot = slot;
        self.backend.touched = true;
        self.backend.guard = target.bind();
        self.handle.bind_backend(target.index, &target.name, thread_id);
        // (Users mode: the connection carries what the old one did, statements under the
        // same ids.)
        if let Some(c) = self.backend.carries.as_mut() {
            c.thread_id = thread_id;
        }
        self.backend.fit.backend_tls = target.tls.wanted(who.client_tls);
        self.handle.info.lock().backend_tls = self.backend.conn.stream.is_tls();
        Ok(old)
    }
}
