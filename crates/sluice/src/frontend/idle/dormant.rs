//! A parked session as the lot keeps it (`lot.rs`): without what an idle multiplexed session
//! that holds no backend connection does not use — its client stream (the lot holds the
//! socket), its empty read buffer, the detached backend connection, a waker, a lost
//! connection's reason, a response tracker between responses (made again from the
//! capabilities) — and without its state, which waits in the copy its handle publishes
//! (moved there when it parks, cloned back when it wakes): about 410 bytes less for each of the
//! thousands of sessions that may wait there. Everything else travels as it is and comes back
//! whole.

use std::sync::Arc;

use crate::backend::BackendGuard;
use crate::backend::pool::Fit;
use crate::backend::shared::{ConnState, Key, Slot};
use crate::ctx::Ctx;
use crate::frontend::client::ClientRest;
use crate::frontend::session::{BackendSide, Identity, Routing, Session, tracker};
use crate::net::{PacketConn, Stream};
use crate::session::SessionHandle;

pub(super) struct Dormant {
    pub(super) ctx: Arc<Ctx>,
    pub(super) handle: Arc<SessionHandle>,
    config: Arc<crate::config::Config>,
    client: ClientRest,
    client_caps: u32,
    client_ip: Option<std::net::IpAddr>,
    who: Identity,
    /// The backend side but for its connection (a dormant session holds none) and tracker.
    guard: BackendGuard,
    backend_caps: u32,
    mariadb: bool,
    carries: Option<Box<ConnState>>,
    key: Option<Box<Key>>,
    slot: Option<Slot>,
    taken: u32,
    touched: bool,
    fit: Fit,
    route: Routing,
    capture: Option<Box<crate::frontend::session::Mark>>,
    idle_since: Option<tokio::time::Instant>,
    resumed: bool,
}

impl Session {
    /// The session put to sleep, and its client stream; Err (the session as it was) when it
    /// holds what a dormant session cannot: a backend connection, a buffered byte, a lost
    /// connection's reason.
    pub(super) fn into_dormant(self: Box<Session>) -> Result<(Box<Dormant>, Stream), Box<Session>> {
        if !self.backend.conn.is_detached()
            || !self.backend.conn.rbuf.is_empty()
            || !self.client.rbuf.is_empty()
            || self.backend.lost.is_some()
        {
            return Err(self);
        }
        // (What is not moved out goes with `s`: the detached backend connection, the waker.)
        let s = *self;
        // The published copy becomes the state itself (the admin API shows the same).
        s.handle.info.lock().state = s.state;
        let (stream, client) = s.client.into_rest();
        let b = s.backend;
        let dormant = Dormant {
            ctx: s.ctx,
            handle: s.handle,
            config: s.config,
            client,
            client_caps: s.client_caps,
            client_ip: s.client_ip,
            who: s.who,
            guard: b.guard,
            backend_caps: b.caps,
            mariadb: b.mariadb,
            carries: b.carries,
            key: b.key,
            slot: b.slot,
            taken: b.taken,
            touched: b.touched,
            fit: b.fit,
            route: s.route,
            capture: s.capture,
            idle_since: s.idle_since,
            resumed: s.resumed,
        };
        Ok((Box::new(dormant), stream))
    }
}

impl Dormant {
    /// The session again, with its client `stream`.
    pub(super) fn wake(self: Box<Dormant>, stream: Stream) -> Box<Session> {
        let d = *self;
        let state = d.handle.info.lock().state.clone();
        let tracker = tracker(d.client_caps, d.backend_caps, d.mariadb, state.tracked.as_deref());
        Box::new(Session {
            ctx: d.ctx,
            handle: d.handle,
            config: d.config,
            client: d.client.with_stream(stream),
            client_caps: d.client_caps,
            client_ip: d.client_ip,
            state,
            who: d.who,
            backend: BackendSide {
                conn: PacketConn::detached(),
                guard: d.guard,
                tracker,
                caps: d.backend_caps,
                mariadb: d.mariadb,
                carries: d.carries,
                key: d.key,
                slot: d.slot,
                taken: d.taken,
                touched: d.touched,
                lost: None,
                fit: d.fit,
                unreported: None,
            },
            route: d.route,
            capture: d.capture,
            waker: None,
            idle_since: d.idle_since,
            resumed: d.resumed,
        })
    }
}
