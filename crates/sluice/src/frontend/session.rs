//! A client session's parts, owned by the session and shared by the phases that work on it
//! (`relay.rs` runs the command loop over them; the files beside it add the session's other
//! methods): the session itself, what a command's handling returns, and the state its capture,
//! causal reads and logins on its behalf keep. The files of the phases import this one; it
//! imports none of them.

use std::sync::Arc;

use sluice_proto::response::ResponseTracker;

use super::client::ClientConn;
use crate::backend::BackendGuard;
use crate::backend::conn::Credential;
use crate::backend::shared::{ConnState, Key, Slot};
use crate::capture::record::Summary;
use crate::capture::sums::RowSums;
use crate::ctx::Ctx;
use crate::net::PacketConn;
use crate::session::{SessionHandle, SessionState};

/// Commands up to this size are read whole before being forwarded; larger ones are streamed.
pub(super) const INSPECT_LIMIT: usize = 1 << 20;

pub struct Session {
    pub(super) ctx: Arc<Ctx>,
    pub(super) handle: Arc<SessionHandle>,
    /// The configuration in force when the session began (it keeps it across reloads).
    pub(super) config: Arc<crate::config::Config>,
    pub(super) client: ClientConn,
    pub(super) client_caps: u32,
    /// The client's address (for query rules).
    pub(super) client_ip: Option<std::net::IpAddr>,
    /// The one owner of the session's state.
    pub(super) state: SessionState,
    /// Who it is logged in as.
    pub(super) who: Identity,
    /// The backend connection it holds, and what goes with it.
    pub(super) backend: BackendSide,
    /// How its statements are routed.
    pub(super) route: Routing,
    /// Its side of traffic capture (once a capture has seen it).
    pub(super) capture: Option<Box<Mark>>,
    /// The waker last stored in the handle's `Wake`.
    pub(super) waker: Option<std::task::Waker>,
    /// When the session began to wait for its next command (for `idle_timeout`, which a park
    /// does not restart).
    pub(super) idle_since: Option<tokio::time::Instant>,
    /// It just came back from a park: its first wait looks at the client before parking again.
    pub(super) resumed: bool,
}

/// Who a session is logged in as (`login.rs`; COM_CHANGE_USER changes it, `commands.rs`).
pub(super) struct Identity {
    /// The credentials sluice logs in with on the session's behalf (users mode).
    pub(super) credential: Option<Credential>,
    /// The scramble of sluice's greeting (COM_CHANGE_USER replies are computed over it).
    pub(super) scramble: [u8; 20],
    /// The connection counted against its user's limit (given back when the session ends).
    pub(super) user_slot: Option<crate::auth::UserSlot>,
    /// What a new backend login on the session's behalf repeats (users mode).
    pub(super) profile: Option<Profile>,
}

/// The backend side of a session: the connection it holds (a detached one while a multiplexed
/// session is between statements) and what goes with it. Taking and giving back connections
/// (`multiplex.rs`, through `backend::checkout`) changes it; the relay reads it.
pub(super) struct BackendSide {
    pub(super) conn: PacketConn,
    pub(super) guard: BackendGuard,
    pub(super) tracker: ResponseTracker,
    /// Capabilities in force between sluice and the backend.
    pub(super) caps: u32,
    pub(super) mariadb: bool,
    /// What the connection carries (users mode); None while the session holds none.
    pub(super) carries: Option<Box<ConnState>>,
    /// Which spare connections the session may take (users mode: sluice holds credentials).
    pub(super) key: Option<Box<Key>>,
    /// The connection's place under `max_backend_connections`.
    pub(super) slot: Option<Slot>,
    /// Connections taken so far (prepared statements made on an earlier one are prepared
    /// again on their first use).
    pub(super) taken: u32,
    /// The connection ran something for this session after its login (a command other than
    /// COM_PING, a move's restore): it must be reset before another session may have it.
    pub(super) touched: bool,
    /// Why the connection was lost while the session was idle; the session moves to a new one
    /// at its next command.
    pub(super) lost: Option<Box<str>>,
    /// Which clients may reuse the connection once this session ends.
    pub(super) fit: crate::backend::pool::Fit,
    /// The session variables the `SET` being relayed assigns (none for a `USE`), on a server
    /// that reports no session state: read back once it is answered (`statement.rs`).
    pub(super) unreported: Option<Vec<String>>,
}

/// How a session's statements are routed (`split.rs`, `multiplex.rs`).
pub(super) struct Routing {
    /// Users-mode sessions of a multiplexing listener give their connection back at every safe
    /// point (`multiplex.rs`).
    pub(super) multiplex: bool,
    /// Statements are routed one by one: reads to replicas, the rest to the primary
    /// (`split.rs`; users mode; such a session multiplexes).
    pub(super) split: bool,
    /// Causal reads: the session's last write and where it is known applied (split only).
    pub(super) causal: Option<Box<Causal>>,
    /// The pins last counted (bits by `Pin::ALL` index), so that each is counted as it begins.
    pub(super) pinned: u32,
    /// The open transaction's statements, kept to replay it (`retry.rs`; None: neither
    /// replay nor optimistic transactions are on).
    pub(super) replay: Option<Box<super::trxlog::TrxLog>>,
    /// Optimistic transactions are on (`optimistic.rs`; split sessions).
    pub(super) optimistic: bool,
}

/// How [`Session::resume`] returned.
pub(super) enum Ended {
    /// The session is over.
    Done,
    /// The session is idle and parked (`idle/`): it resumes in a task of its own.
    Parked,
    /// It went to the new process of an upgrade (`handoff.rs`), with its connections.
    HandedOff,
}

/// What to do after a command.
pub(crate) enum Flow {
    Continue,
    Close,
}

/// The tracker of a session's responses: what it follows depends on the capabilities the
/// client and the backend agreed to, and whether the backend is MariaDB.
/// `tracked`: what the client's own session tracks, when sluice tracks more.
pub(super) fn tracker(
    client_caps: u32,
    backend_caps: u32,
    mariadb: bool,
    tracked: Option<&sluice_proto::basic::Tracked>,
) -> ResponseTracker {
    use sluice_proto::consts::cap;
    let deprecate_eof = backend_caps & cap::DEPRECATE_EOF != 0;
    let session_track = backend_caps & cap::SESSION_TRACK != 0;
    let client_track = client_caps & cap::SESSION_TRACK != 0;
    let mut t = ResponseTracker::new(deprecate_eof, session_track).strip_session_track(!client_track, mariadb);
    t.filter_session_track(tracked.cloned());
    t
}

/// The session's side of the capture running.
#[derive(Default)]
pub(super) struct Mark {
    /// The capture this was decided for.
    pub(super) generation: u64,
    /// The capture takes this session.
    pub(super) on: bool,
    /// Commands recorded (the next one's number is this + 1).
    pub(super) number: u64,
    /// A command is recorded and its result is not yet.
    pub(super) pending: bool,
    /// The recorded command: its flags, its whole length and its payload as recorded. Its
    /// record is written with its result's, once it is through (one lock of the worker's
    /// buffer per command, and the relay's clock readings: none of its own).
    pub(super) flags: u8,
    pub(super) len: u64,
    pub(super) payload: Vec<u8>,
    /// When the relay forwarded it (`mono_ns`); 0 when sluice answered it itself.
    pub(super) started_ns: u64,
    pub(super) summary: Summary,
    /// The row sums, lent to each recorded command's response (one allocation per session).
    pub(super) sums: Option<Box<RowSums>>,
}

/// Causal reads (`causal_reads = "session"`): the session's last write, and the replicas known
/// to have applied it.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Causal {
    /// The GTID waited for.
    pub(super) gtid: String,
    /// Replicas that have applied it (bits by backend index, modulo 64).
    pub(super) seen: u64,
    /// The statement about to run must wait on its replica first.
    pub(super) due: bool,
}

/// What a new backend login on a session's behalf repeats (users mode): the client's handshake
/// response without its auth response, kept encoded (an idle session's memory counts) and
/// decoded when such a login needs it. The sessions of one application log in alike (the same
/// user, schema and connection attributes): they share one copy.
pub struct Profile(pub(super) Arc<[u8]>);
