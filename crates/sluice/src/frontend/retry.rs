//! Transaction replay (`[routing] transaction_replay`): a users-mode session keeps the statements
//! of its open transaction, each with a checksum of its result (its rows' sum, row count,
//! affected rows, error code), so that when its backend connection is lost before a statement
//! was answered, it can wait for a primary, run the transaction again there, and go on with
//! the statement if every result is the same. Outside a transaction, a lost read (or `BEGIN`,
//! or a change of session state) is run again. A lost `COMMIT` or autocommit write may have
//! run: the client is told its outcome is unknown, never a silent second run, unless the
//! commit table tells (`commit_mark.rs`). A lost `ROLLBACK`, or `COMMIT` of a transaction that
//! changed nothing, is answered on the new connection.
//!
//! Under `READ COMMITTED` (or `READ UNCOMMITTED`), the reads a lost transaction made before
//! its first other statement need not return the same rows again, only end the same way: the
//! client saw what was committed when each ran, and writing later on that is what such a
//! transaction may do. From its first write (or locking read) on, every result must match.
//! Under `REPEATABLE READ` every result must: the client's later reads would come from another
//! snapshot than its earlier ones. (Optimistic transactions compare every result: a replica's
//! read may be older than what was committed.)
//!
//! What is replayed: text statements (COM_QUERY) and prepared statements' executes
//! (`replay_exec.rs`). A transaction with a cursor or long data, a request too large to keep
//! whole, or more than `transaction_replay_max_size` of statements, is not replayable: its
//! client gets the lost connection's error.

use std::time::Duration;

use bytes::BytesMut;
use sluice_proto::consts::{com, err as code};
use sluice_proto::packet::HEADER;
use sluice_proto::response::Expect;
use sluice_proto::rw::Class;
use sluice_proto::sql::TransactionEnd;

use super::response::relay_response;
use super::session::{Flow, Session};
use super::trxlog::{ATTEMPTS, Outcome, outcome_of};
use crate::backend::balance::Want;
use crate::capture::sums::RowSums;
use crate::config::Role;
use crate::error::{Error, Result, Side};
use crate::session::StateSink;

/// A row when the session's isolation level reads committed data.
const READS_COMMITTED: [&[u8]; 2] = [
    b"\x03SELECT 1 FROM DUAL WHERE @@SESSION.tx_isolation IN ('READ-COMMITTED', 'READ-UNCOMMITTED')",
    b"\x03SELECT 1 FROM DUAL WHERE @@SESSION.transaction_isolation IN ('READ-COMMITTED', 'READ-UNCOMMITTED')",
];

/// What can be done for a command whose backend was lost before it was answered.
#[derive(Debug, PartialEq, Eq)]
enum Lost {
    /// Run the transaction again, then the command.
    Replay,
    /// Run the command again (it changed nothing, or only the session's state).
    Again,
    /// A COMMIT whose mark (this sequence number) says whether it committed.
    Resolve(u64),
    /// It may have run: the client is told so.
    Unknown,
    /// Nothing: the transaction cannot be replayed (why).
    No(&'static str),
}

impl Session {
    /// Notes a command about to be relayed (its request whole in the client buffer, `len`
    /// bytes of payload): whether its answer is to be summed for the log.
    pub(super) fn note_for_replay(&mut self, cmd: u8, mut len: usize, stmt_id: Option<u32>) -> bool {
        let in_transaction = self.state.in_transaction();
        let max = self.config.routing.transaction_replay_max_size;
        let execute = match cmd {
            com::QUERY => Ok(false),
            com::STMT_EXECUTE => self.loggable_execute(stmt_id).map(|()| true),
            com::STMT_FETCH | com::STMT_SEND_LONG_DATA | com::STMT_BULK_EXECUTE => {
                Err("a prepared statement ran in it with a cursor or long data")
            }
            // Pings, and what the session's state restores (schema, options, prepares).
            _ => return false,
        };
        let Some(log) = self.route.replay.as_mut() else { return false };
        if !in_transaction {
            log.clear();
        }
        if log.broken.is_some() {
            return false;
        }
        let execute = match execute {
            Ok(execute) => execute,
            Err(why) => {
                log.broken = Some(why);
                return false;
            }
        };
        if execute {
            // (Its parameter types may have been put in after the client sent it.)
            len = sluice_proto::packet::Header::parse(&self.client.rbuf).map_or(0, |h| h.len);
        }
        let whole = self.client.rbuf.len() >= HEADER + len && len < sluice_proto::consts::MAX_PAYLOAD && len > 0;
        if !whole || log.bytes.len() + len > max {
            log.broken = Some("its statements are larger than transaction_replay_max_size");
            return false;
        }
        log.bytes.extend_from_slice(&self.client.rbuf[HEADER..HEADER + len]);
        if let (true, Some(id)) = (execute, stmt_id) {
            // Named by the client's id: the connection it runs again on knows it by another.
            let at = log.bytes.len() - len + 1;
            log.bytes[at..at + 4].copy_from_slice(&id.to_le_bytes());
        }
        log.entries.push((log.bytes.len(), None));
        if log.on_loss {
            self.note_writes(in_transaction, len);
        }
        true
    }

    /// Whether the transaction wrote, and whether the request just logged is the COMMIT of one
    /// that did (its mark due).
    fn note_writes(&mut self, in_transaction: bool, len: usize) {
        let Some(log) = self.route.replay.as_ref() else { return };
        let sql = self.logged_sql(&log.bytes[log.bytes.len() - len..]);
        let marked = in_transaction && log.wrote && self.config.routing.commit_table.is_some();
        let committing = marked && sluice_proto::sql::commits(sql) && log.marks.on();
        let wrote = super::commit_mark::may_write(sluice_proto::rw::classify_in(sql, self.state.mode_for(sql)));
        if let Some(log) = self.route.replay.as_mut() {
            log.committing = committing;
            log.wrote |= wrote;
        }
    }

    /// The row sums for a logged command's response.
    pub(super) fn replay_sums(&mut self) -> Option<Box<RowSums>> {
        Some(self.route.replay.as_mut()?.sums.take().unwrap_or_default())
    }

    /// The backend connection was lost before the logged command was answered (`lost`;
    /// `forwarded`: the request left the client buffer). Replays what can be and puts the
    /// command back to run again, or tells the client what became of it.
    pub(super) async fn recover(&mut self, lost: Error, forwarded: bool) -> Result<Flow> {
        let what = self.what_was_lost();
        let log = self.route.replay.as_mut().expect("a logged command");
        log.attempts += 1;
        let current = log.request(log.entries.len() - 1).to_vec();
        // The command runs again as if the client had just sent it, and is logged again then.
        log.bytes.truncate(log.entries.len().checked_sub(2).map_or(0, |i| log.entries[i].0));
        log.entries.pop();
        let from = self.backend.guard.name.clone();
        tracing::info!(session = self.handle.id, backend = %from, plan = ?what, error = %lost.message, "a command's backend was lost before it was answered");
        let mut label = if what == Lost::Replay { "replayed" } else { "again" };
        let failed = match what {
            Lost::No(why) => Some((
                code::SERVER_LOST,
                *b"08S01",
                "not_replayable",
                format!("({}) and the transaction cannot be replayed: {why}", lost.message),
            )),
            Lost::Unknown => Some((
                code::ERROR_DURING_COMMIT,
                *b"HY000",
                "unknown",
                format!("while this statement ran ({}); whether it committed is unknown", lost.message),
            )),
            Lost::Again => match Box::pin(self.again_after_loss()).await {
                Ok(()) => None,
                Err(e) => Some((
                    code::SERVER_LOST,
                    *b"08S01",
                    "failed",
                    format!("({}) and no backend took the session again: {}", lost.message, e.message),
                )),
            },
            Lost::Replay => self.resume_transaction(true).await?,
            Lost::Resolve(seq) => {
                let (failed, found) = self.resolve_commit(seq, &lost).await?;
                label = found;
                failed
            }
        };
        if let Some((code, state, result, why)) = failed {
            self.ctx.metrics.replayed(result);
            let msg = format!("sluice: the connection to backend {from} was lost {why}");
            return self.lost_with(code, &state, &msg, forwarded).await;
        }
        self.ctx.metrics.replayed(label);
        if forwarded {
            self.put_back(&current);
        }
        Ok(Flow::Continue)
    }

    /// Whether the session, its connection lost while idle in a transaction, can have the
    /// transaction replayed at its next command.
    pub(super) fn may_replay(&self) -> bool {
        let log = self.route.replay.as_ref();
        log.is_some_and(|l| l.on_loss && l.broken.is_none() && !l.entries.is_empty())
            && self.backend.key.is_some()
            && self.state.in_transaction()
            && self.state.hazards == 0
            && self.state.unread_variables.is_empty()
    }

    /// The connection of a session in a transaction was lost while it was idle: the
    /// transaction is replayed on the primary before the next command; the error for that
    /// command when it cannot be.
    pub(super) async fn replay_after_idle_loss(&mut self, reason: &str) -> Result<std::result::Result<(), Error>> {
        let from = self.backend.guard.name.clone();
        let failed = self.resume_transaction(true).await?;
        let Some((code, state, result, why)) = failed else {
            self.ctx.metrics.replayed("replayed");
            return Ok(Ok(()));
        };
        self.ctx.metrics.replayed(result);
        if let Some(log) = self.route.replay.as_mut() {
            log.clear();
        }
        self.state.end_transaction();
        self.backend.lost = Some(format!("{reason}; replay: {why}").into());
        let msg = format!("sluice: the connection to backend {from} was lost ({reason}) in a transaction, {why}");
        Ok(Err(Error::new(Side::Backend, code, msg).state(&state)))
    }

    /// A new connection on the primary (waiting for one, a failover may be promoting it), and
    /// the logged statements run again there (`after_loss`: the transaction's connection was
    /// lost, else it moves from a replica). None when every result was the same; else what to
    /// tell the client (code, SQL state, metric result, why).
    pub(super) async fn resume_transaction(&mut self, after_loss: bool) -> Result<Option<(u16, [u8; 5], &'static str, String)>> {
        // (The transaction ended with its connection.)
        self.state.end_transaction();
        match self.replay_on_primary(false, after_loss).await? {
            Err(e) => Ok(Some((code::SERVER_LOST, *b"08S01", "failed", format!("and no primary took the session again: {}", e.message)))),
            Ok(diverged) => Ok(diverged.map(|diverged| {
                let why = format!("and the transaction replayed on {}, where {diverged}: it was rolled back", self.backend.guard.name);
                (code::LOCK_DEADLOCK, *b"40001", "diverged", why)
            })),
        }
    }

    /// A new connection for a command to run again on (the transaction, if any, ended with
    /// the connection lost).
    async fn again_after_loss(&mut self) -> Result<()> {
        self.state.end_transaction();
        self.move_after_loss().await
    }

    /// A lost COMMIT whose mark `seq` was written: looked up on the primary. Committed, the
    /// COMMIT runs again there (answered as a COMMIT with nothing to commit is); not
    /// committed, the transaction is replayed first. None, or what to tell the client.
    /// (With the metric's result when it succeeds: "committed", or "replayed".)
    async fn resolve_commit(&mut self, seq: u64, lost: &Error) -> Result<(Option<(u16, [u8; 5], &'static str, String)>, &'static str)> {
        self.state.end_transaction();
        let mut tries = 0;
        let found = loop {
            match self.look_up_commit(seq).await {
                // (The new connection was lost too: looked up again, on another.)
                Err(e) if e.side == Side::Backend && tries < ATTEMPTS => tries += 1,
                r => break r?,
            }
        };
        if let Some(log) = self.route.replay.as_mut() {
            log.mark = None;
        }
        match found {
            super::commit_mark::Found::Committed => {
                tracing::info!(session = self.handle.id, "a lost COMMIT had committed: its client is answered");
                if let Some(log) = self.route.replay.as_mut() {
                    log.clear();
                }
                Ok((None, "committed"))
            }
            super::commit_mark::Found::NotCommitted => {
                let diverged = match self.replay_on_primary(true, true).await? {
                    Ok(diverged) => diverged,
                    Err(e) => {
                        let why = format!("and no primary took the session again: {}", e.message);
                        return Ok((Some((code::SERVER_LOST, *b"08S01", "failed", why)), "failed"));
                    }
                };
                let failed = diverged.map(|diverged| {
                    let why = format!(
                        "and the transaction, not committed, replayed on {}, where {diverged}: it was rolled back",
                        self.backend.guard.name
                    );
                    (code::LOCK_DEADLOCK, *b"40001", "diverged", why)
                });
                Ok((failed, "replayed"))
            }
            super::commit_mark::Found::Unknown(why) => {
                let why = format!("while this statement ran ({}); whether it committed is unknown ({why})", lost.message);
                Ok((Some((code::ERROR_DURING_COMMIT, *b"HY000", "unknown", why)), "unknown"))
            }
        }
    }

    /// What can be done for the command logged last.
    fn what_was_lost(&self) -> Lost {
        let Some(log) = self.route.replay.as_ref().filter(|l| l.on_loss) else { return Lost::No("transaction replay is off") };
        if let Some(why) = log.broken {
            return Lost::No(why);
        }
        if log.attempts >= ATTEMPTS {
            return Lost::No("its connection was lost on every attempt");
        }
        if self.state.hazards != 0 || !self.state.unread_variables.is_empty() {
            return Lost::No("the session holds state sluice cannot recreate");
        }
        let sql = self.logged_sql(log.request(log.entries.len() - 1));
        let within = log.entries.len() > 1 || self.state.in_transaction();
        if within {
            return match sluice_proto::sql::transaction_end(sql) {
                TransactionEnd::Ends => match log.mark {
                    Some(seq) => Lost::Resolve(seq),
                    // A ROLLBACK, or the COMMIT of a transaction that changed nothing.
                    None if !log.wrote || !sluice_proto::sql::commits(sql) => Lost::Again,
                    None => Lost::Unknown,
                },
                _ => Lost::Replay,
            };
        }
        match sluice_proto::rw::classify_in(sql, self.state.mode_for(sql)) {
            Class::Read | Class::Begin { .. } | Class::Session => Lost::Again,
            _ => Lost::Unknown,
        }
    }

    /// A new connection for the session on the primary, waiting up to
    /// `transaction_replay_timeout` for one to be usable (a failover may be promoting one).
    pub(super) async fn reconnect_for_replay(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.config.routing.transaction_replay_timeout;
        let mut last = Error::backend("no primary is usable");
        loop {
            let backends = &self.ctx.backends;
            let chosen = backends.balancer.pick(backends, &[], Want::Primary).filter(|b| b.serves_as() == Role::Primary);
            if let Some(b) = chosen.filter(|_| !backends.topology.is_held()) {
                match Box::pin(self.reconnect_on(&b)).await {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(last);
            }
            // While a failover promotes a primary, every replay starts the moment it is done.
            let topology = &self.ctx.backends.topology;
            match topology.is_held() {
                true => topology.wait(deadline - now).await,
                false => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Runs the logged statements on the new connection; None when every result is the same,
    /// else what differed (the transaction is rolled back).
    async fn replay_log(&mut self, after_loss: bool) -> Result<Option<String>> {
        let log = self.route.replay.take().expect("a log");
        let diverged = self.replay_entries(&log, after_loss).await;
        // (Kept on an error too: a lost connection is replayed on another.)
        self.route.replay = Some(log);
        let diverged = diverged?;
        if diverged.is_some() {
            self.run_again(b"\x03ROLLBACK").await?;
            if let Some(log) = self.route.replay.as_mut() {
                log.clear();
            }
        }
        Ok(diverged)
    }

    /// Runs each logged request again; what differed first, if anything did. Under READ
    /// COMMITTED, the reads before the transaction's first other statement need only end as
    /// they did (an error or none): each saw what was committed when it ran, and the client
    /// acted on that; what the transaction does from its first write on must be the same.
    async fn replay_entries(&mut self, log: &super::trxlog::TrxLog, after_loss: bool) -> Result<Option<String>> {
        let class = |s: &Session, i: usize| {
            let logged = s.logged_sql(log.request(i));
            sluice_proto::rw::classify_in(logged, s.state.mode_for(logged))
        };
        // (The level is asked only when the transaction read before its first write.)
        let early_reads = (0..log.entries.len()).map(|i| class(self, i)).find(|c| !matches!(c, Class::Begin { .. })) == Some(Class::Read);
        let mut loose = after_loss && early_reads && self.reads_committed().await?;
        let mut newer = 0;
        for i in 0..log.entries.len() {
            loose = loose && matches!(class(self, i), Class::Read | Class::Begin { .. });
            let Some(request) = self.request_again(log.request(i)).await? else {
                return Ok(Some(format!("statement {} (an execute) names a statement closed since", i + 1)));
            };
            let seen = self.run_again(&request).await?;
            let before = log.entries[i].1;
            if loose && before.is_some_and(|b| b.error == seen.error) {
                newer += usize::from(before != Some(seen));
            } else if Some(seen) != before {
                let sql = crate::session::shown_text(self.logged_sql(log.request(i))).chars().take(80).collect::<String>();
                return Ok(Some(format!("statement {} ({sql}) had another result ({seen:?}, before {before:?})", i + 1)));
            }
        }
        if newer > 0 {
            tracing::info!(
                session = self.handle.id,
                reads = newer,
                "a transaction replayed under READ COMMITTED: reads before its first write saw newer data"
            );
        }
        Ok(None)
    }

    /// Whether the session's transactions read committed data (`READ COMMITTED` or `READ
    /// UNCOMMITTED`), as the new connection says (MySQL 8 knows the variable by its newer name).
    async fn reads_committed(&mut self) -> Result<bool> {
        let mut seen = self.run_again(READS_COMMITTED[0]).await?;
        if seen.error.is_some() {
            seen = self.run_again(READS_COMMITTED[1]).await?;
        }
        Ok(seen.error.is_none() && seen.rows == 1)
    }

    /// The log replayed on the primary, on a new connection (`connected`: taken already),
    /// and again on another when that one is lost too. What differed, if anything did; Err
    /// inside when no primary took the session.
    async fn replay_on_primary(&mut self, mut connected: bool, after_loss: bool) -> Result<std::result::Result<Option<String>, Error>> {
        let mut lost = 0;
        loop {
            if !connected && let Err(e) = self.reconnect_for_replay().await {
                return Ok(Err(e));
            }
            match self.replay_log(after_loss).await {
                Err(e) if e.side == Side::Backend && lost < ATTEMPTS => {
                    tracing::info!(session = self.handle.id, error = %e.message, "the connection a transaction was replayed on was lost: replayed on another");
                    lost += 1;
                    connected = false;
                }
                r => return r.map(Ok),
            }
        }
    }

    /// Sends one request (a payload) on the session's connection and reads its answer, which
    /// the client does not see, into the session's state.
    pub(super) async fn run_again(&mut self, payload: &[u8]) -> Result<Outcome> {
        let mut packet = Vec::with_capacity(payload.len() + HEADER);
        sluice_proto::packet::frame(&mut packet, payload, 0);
        let limit = self.config.proxy.response_timeout;
        self.backend.conn.stream.write_within(limit, &packet).await.map_err(|e| Error::io(Side::Backend, "replaying a statement", e))?;
        let mut sink = StateSink::new(&mut self.state);
        sink.sums = Some(Box::default());
        sink.conn_gen = self.backend.taken;
        let watch = crate::session::deadline::Watch { clock: &self.ctx.clock, handle: &self.handle, waker: &mut self.waker };
        self.backend.tracker.start(Expect::Results, 0);
        relay_response(&mut self.backend.tracker, &mut self.backend.conn, None, &mut sink, &self.ctx, watch, false).await?;
        let outcome = outcome_of(&mut sink);
        if sink.changed {
            self.handle.publish(&self.state);
        }
        Ok(outcome)
    }

    /// The client gets `msg` for its command; the session goes on without a connection (the
    /// next command takes one) and out of any transaction.
    async fn lost_with(&mut self, code: u16, state: &[u8; 5], msg: &str, forwarded: bool) -> Result<Flow> {
        self.backend.lost = Some(msg.into());
        self.fail_transaction(code, state, msg, forwarded).await
    }

    /// The client gets `msg` for its command (`forwarded`: the request left the client
    /// buffer already), and the session is out of any transaction, its log emptied.
    pub(super) async fn fail_transaction(&mut self, code: u16, state: &[u8; 5], msg: &str, forwarded: bool) -> Result<Flow> {
        if !forwarded {
            self.skip_request().await?;
        }
        if let Some(log) = self.route.replay.as_mut() {
            log.clear();
            log.attempts = 0;
        }
        self.state.end_transaction();
        self.client_error(1, code, state, msg).await;
        Ok(Flow::Continue)
    }

    /// Puts a request back at the front of the client buffer, as if the client had just sent it.
    fn put_back(&mut self, payload: &[u8]) {
        let mut b = BytesMut::with_capacity(HEADER + payload.len() + self.client.rbuf.len());
        let mut head = Vec::with_capacity(HEADER + payload.len());
        sluice_proto::packet::frame(&mut head, payload, 0);
        b.extend_from_slice(&head);
        b.extend_from_slice(&self.client.rbuf);
        self.client.rbuf = b;
    }
}
