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
use crate::backend::conn::Credential;
use crate::backend::pool::Fit;
use crate::backend::shared::{ConnState, Key, Slot};
use crate::ctx::Ctx;
use crate::frontend::client::ClientRest;
use crate::frontend::session::{Session, tracker};
use crate::net::{PacketConn, Stream};
use crate::session::SessionHandle;

pub(super) struct Dormant {
    pub(super) ctx: Arc<Ctx>,
    pub(super) handle: Arc<SessionHandle>,
    client: ClientRest,
    guard: BackendGuard,
    client_caps: u32,
    backend_caps: u32,
    mariadb: bool,
    credential: Option<Credential>,
    scramble: [u8; 20],
    user_slot: Option<crate::auth::UserSlot>,
    profile: Option<crate::frontend::session::Profile>,
    fit: Fit,
    touched: bool,
    multiplex: bool,
    split: bool,
    causal: Option<Box<crate::frontend::session::Causal>>,
    conn: Option<Box<ConnState>>,
    key: Option<Box<Key>>,
    slot: Option<Slot>,
    conn_gen: u32,
    pinned: u32,
    client_ip: Option<std::net::IpAddr>,
    idle_since: Option<tokio::time::Instant>,
    resumed: bool,
    capture: Option<Box<crate::frontend::session::Mark>>,
    config: Arc<crate::config::Config>,
}

impl Session {
    /// The session put to sleep, and its client stream; Err (the session as it was) when it
    /// holds what a dormant session cannot: a backend connection, a buffered byte, a lost
    /// connection's reason.
    pub(super) fn into_dormant(self: Box<Session>) -> Result<(Box<Dormant>, Stream), Box<Session>> {
        if !self.backend.is_detached() || !self.backend.rbuf.is_empty() || !self.client.rbuf.is_empty() || self.lost.is_some() {
            return Err(self);
        }
        // (What is not moved out goes with `s`: the detached backend connection, the waker.)
        let s = *self;
        // The published copy becomes the state itself (the admin API shows the same).
        s.handle.info.lock().state = s.state;
        let (stream, client) = s.client.into_rest();
        let dormant = Dormant {
            ctx: s.ctx,
            handle: s.handle,
            client,
            guard: s.guard,
            client_caps: s.client_caps,
            backend_caps: s.backend_caps,
            mariadb: s.mariadb,
            credential: s.credential,
            scramble: s.scramble,
            user_slot: s.user_slot,
            profile: s.profile,
            fit: s.fit,
            touched: s.touched,
            multiplex: s.multiplex,
            split: s.split,
            causal: s.causal,
            conn: s.conn,
            key: s.key,
            slot: s.slot,
            conn_gen: s.conn_gen,
            pinned: s.pinned,
            client_ip: s.client_ip,
            idle_since: s.idle_since,
            resumed: s.resumed,
            capture: s.capture,
            config: s.config,
        };
        Ok((Box::new(dormant), stream))
    }
}

impl Dormant {
    /// The session again, with its client `stream`.
    pub(super) fn wake(self: Box<Dormant>, stream: Stream) -> Box<Session> {
        let d = *self;
        let state = d.handle.info.lock().state.clone();
        Box::new(Session {
            ctx: d.ctx,
            handle: d.handle,
            client: d.client.with_stream(stream),
            backend: PacketConn::detached(),
            guard: d.guard,
            tracker: tracker(d.client_caps, d.backend_caps, d.mariadb, state.tracked.as_deref()),
            state,
            client_caps: d.client_caps,
            backend_caps: d.backend_caps,
            mariadb: d.mariadb,
            credential: d.credential,
            scramble: d.scramble,
            user_slot: d.user_slot,
            profile: d.profile,
            lost: None,
            fit: d.fit,
            waker: None,
            touched: d.touched,
            multiplex: d.multiplex,
            split: d.split,
            causal: d.causal,
            conn: d.conn,
            key: d.key,
            slot: d.slot,
            conn_gen: d.conn_gen,
            pinned: d.pinned,
            client_ip: d.client_ip,
            idle_since: d.idle_since,
            resumed: d.resumed,
            capture: d.capture,
            config: d.config,
        })
    }
}
