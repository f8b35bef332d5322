//! What query rules and digests do to a session's statements (`crate::route::rules`,
//! `crate::route::digest`): before a statement runs, its digest is taken and the first rule that
//! matches it is found; a blocked statement is answered here, a rewritten one is replaced in
//! the request, a mirrored one is copied to the shadow backend's queue, a timed one is watched,
//! a cached read is answered from the result cache (or its answer kept once it ran);
//! a rule's route (or a `/* sluice: route=... */` comment) decides where a session that holds
//! no connection runs it. After the response, the digest's statistics are updated.

use bytes::BytesMut;
use sluice_proto::consts::MAX_PAYLOAD;
use sluice_proto::consts::{com, status};
use sluice_proto::packet::{HEADER, Header};

use super::session::{Flow, INSPECT_LIMIT, Session};
use crate::error::{Error, Result, Side};
use crate::route::cache::Key;
use crate::route::digest::{Mark, Outcome};
use crate::route::rules::{RouteTo, Who};
use crate::route::shapes::{Text, Want};

/// A command's plan: what is known of it before it is forwarded (its statement read once:
/// digest, rule, hazards, class), whether a capture records it, and where it should run.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// A capture records it.
    pub(super) recording: bool,
    /// Where it should run (the split's class, a rule's or a comment's route), and why.
    pub(super) aim: Option<(super::split::Target, crate::metrics::Split)>,
    /// Its digest (0: not a statement, or statements are not looked at).
    pub(super) digest: u64,
    /// Where its digest's entry is (when it is counted in the digests' statistics).
    pub(super) mark: Option<Mark>,
    /// The rule it falls under, by index.
    pub(super) rule: Option<usize>,
    /// Where it should run, as a rule or its comment says.
    pub(super) route: Option<RouteTo>,
    /// Its text, when its answer is to be kept by the result cache.
    pub(super) cache: Option<Box<[u8]>>,
    /// The hazards of a query, when the pass that took its digest found them.
    pub(super) hazards: Option<u16>,
    /// The split's class of a query or prepare, when it was read with the rest.
    pub(super) class: Option<sluice_proto::rw::Class>,
}

impl Session {
    /// Whether statements are looked at: for their hazards (users mode), digests, rules or the
    /// split.
    #[inline]
    pub(super) fn looks_at_statements(&self) -> bool {
        self.who.credential.is_some() || self.ctx.digests.counts(false) || !self.ctx.rules.is_empty() || self.route.split
    }

    /// The text of the statement a command runs: a query's or a prepare's own, an execute's
    /// prepared one. None for other commands, and for a statement too long to be read whole.
    fn statement_text(&self, cmd: u8, body_end: usize, len: usize) -> Option<&[u8]> {
        match cmd {
            com::QUERY | com::STMT_PREPARE if len < INSPECT_LIMIT => self.client.rbuf.get(HEADER + 1..body_end),
            com::STMT_EXECUTE => {
                let id = self.client.rbuf.get(HEADER + 1..HEADER + 5)?;
                self.state.prepared.get(&u32::from_le_bytes([id[0], id[1], id[2], id[3]])).map(|p| p.sql.as_bytes())
            }
            _ => None,
        }
    }

    /// Reads the statement's shape (its hazards, class and digest: one pass for its key, and
    /// the table of shapes), finds its rule and route, and opens its digest's entry (a
    /// prepare's digest is its executes').
    pub(super) fn see(&self, cmd: u8, body_end: usize, len: usize) -> Plan {
        let Some(text) = self.statement_text(cmd, body_end, len) else { return Plan::default() };
        let (rules, digests) = (&self.ctx.rules, &self.ctx.digests);
        let counted = digests.counts(self.who.credential.is_some());
        let want = Want {
            // The split's class of a query or prepare (an execute's is its prepare's).
            class: self.route.split && cmd != com::STMT_EXECUTE,
            digest: counted || !rules.is_empty(),
            // Counted in the digests' statistics: a query's or an execute's.
            entry: counted && cmd != com::STMT_PREPARE,
        };
        // The hazards of a query (`note_query`).
        let hazards = cmd == com::QUERY && self.who.credential.is_some();
        if !(hazards || want.class || want.digest) {
            return Plan::default();
        }
        let schema = self.state.schema.as_deref();
        // (`commented`: None where the shape's hazards and class are not the statement's.)
        let (mode, shape, commented) = match self.state.readings(text) {
            // One reading: the shape's hazards and class hold.
            crate::session::Readings(mode, None) => {
                let scan = sluice_proto::scan::scan_keyed(text, mode, self.ctx.key_seed);
                let shape = self.ctx.shapes.of(&Text { key: scan.key, text, mode, schema }, want, digests);
                (mode, shape, Some(scan.commented))
            }
            // Two readings: the digest of the default's (the hazards and the class are read
            // apart in each, by `note_query` and `wants`; a digest's text holds no secret in
            // either, `route::digest`).
            crate::session::Readings(mode, Some(_)) => {
                let key = sluice_proto::scan::scan_keyed(text, mode, self.ctx.key_seed).key;
                let want = Want { class: false, ..want };
                (mode, self.ctx.shapes.of(&Text { key, text, mode, schema }, want, digests), None)
            }
        };
        let digest = if want.digest { shape.digest } else { 0 };
        let rule = match rules.is_empty() {
            true => None,
            false => rules.find(&Who { user: &self.state.user, schema, client: self.client_ip, mode }, digest, text),
        };
        // (A route means something only to a session that takes a connection per statement;
        // it is a comment's, and a text read already may be known to hold none.)
        let hinted = match self.route.multiplex && commented != Some(false) {
            true => crate::route::rules::hint(text).and_then(|t| rules.route_to(std::str::from_utf8(t).ok()?)),
            false => None,
        };
        let route = hinted.or_else(|| rule.and_then(|i| rules.list[i].action.route));
        Plan {
            recording: false,
            aim: None,
            digest: if cmd == com::STMT_PREPARE { 0 } else { digest },
            mark: want.entry.then_some(shape.mark),
            rule,
            route,
            cache: None,
            hazards: shape.hazards.filter(|_| hazards && commented.is_some()),
            class: shape.class.filter(|_| want.class && commented.is_some()),
        }
    }

    /// Acts on the statement's rule before it is forwarded: a blocked statement is answered
    /// (Some), a rewritten one replaces the request (`h` follows), a mirrored one is queued, a
    /// read whose answer the cache holds is answered from it (Some).
    pub(super) async fn rule_before(&mut self, plan: &mut Plan, cmd: u8, h: &mut Header) -> Result<Option<Flow>> {
        let Some(i) = plan.rule else { return Ok(None) };
        let ctx = self.ctx.clone();
        let rule = &ctx.rules.list[i];
        let a = &rule.action;
        if let Some((code, msg)) = &a.block {
            self.skip_request().await?;
            self.client_error(1, *code, b"42000", msg).await;
            self.note_outcome(plan, Outcome { error: true, ..Default::default() });
            return Ok(Some(Flow::Continue));
        }
        if cmd != com::QUERY || h.len >= INSPECT_LIMIT {
            return Ok(None);
        }
        if let Some((re, with)) = &a.rewrite {
            // (The statement that runs is another: its hazards and class are looked for in it.)
            (plan.hazards, plan.class) = (None, None);
            let text = &self.client.rbuf[HEADER + 1..HEADER + h.len];
            let new = re.replace_all(text, with.as_bytes());
            if let std::borrow::Cow::Owned(new) = new
                && new.len() < MAX_PAYLOAD
            {
                replace_request(&mut self.client.rbuf, h.len, &new);
                *h = Header { len: new.len() + 1, seq: 0 };
            }
        }
        if let Some(to) = a.mirror {
            let text = &self.client.rbuf[HEADER + 1..HEADER + h.len];
            self.ctx.mirrors.send(to, &self.state, self.who.credential.as_ref(), text);
        }
        if a.cache_ttl.is_some() && self.cacheable(h.len) {
            let started = crate::metrics::mono_ns();
            let text = &self.client.rbuf[HEADER + 1..HEADER + h.len];
            let Some(answer) = self.ctx.cache.get(&self.cache_key(text), std::time::Instant::now()) else {
                plan.cache = Some(text.into());
                return Ok(None);
            };
            self.skip_request().await?;
            self.client.write(&answer.packets).await.map_err(|e| Error::io(Side::Client, "writing a cached answer", e))?;
            let at = crate::metrics::mono_ns();
            self.note_outcome(plan, Outcome { at, nanos: at.saturating_sub(started), rows: answer.rows, error: false });
            return Ok(Some(Flow::Continue));
        }
        Ok(None)
    }

    /// Whether a query's answer may come from the cache, or go to it: a read (as the split
    /// classifies it), outside a transaction, with autocommit on.
    fn cacheable(&self, len: usize) -> bool {
        let st = self.state.status;
        st & status::IN_TRANS == 0 && st & status::AUTOCOMMIT != 0 && len < self.ctx.cache.largest() && {
            let text = &self.client.rbuf[HEADER + 1..HEADER + len];
            sluice_proto::rw::classify_in(text, self.state.mode_for(text)) == sluice_proto::rw::Class::Read
        }
    }

    fn cache_key<'k>(&'k self, text: &'k [u8]) -> Key<'k> {
        Key {
            user: &self.state.user,
            schema: self.state.schema.as_deref(),
            collation: self.state.collation,
            caps: u64::from(self.backend.fit.client_caps) | u64::from(self.backend.fit.mariadb_caps) << 32,
            text,
        }
    }

    /// Keeps the answer of a statement its rule caches (it succeeded, changed no session state).
    pub(super) fn keep_answer(&self, plan: &Plan, packets: Vec<u8>, rows: u64) {
        let (Some(text), Some(ttl)) = (&plan.cache, plan.rule.and_then(|i| self.ctx.rules.list[i].action.cache_ttl)) else { return };
        let answer = crate::route::cache::Answer { packets: packets.into_boxed_slice(), rows };
        self.ctx.cache.put(&self.cache_key(text), answer, ttl, std::time::Instant::now());
    }

    /// Watches a statement its rule gives a timeout: when it runs over, it is killed on its
    /// backend (KILL QUERY over a connection of its own), and the client gets the backend's
    /// "interrupted" error. The returned handle stops the watch.
    pub(super) fn watch_timeout(&self, plan: &Plan) -> Option<tokio::task::JoinHandle<()>> {
        let limit = self.ctx.rules.list[plan.rule?].action.timeout?;
        let cred = self.who.credential.clone()?;
        let b = self.backend.guard.0.clone();
        let tid = self.handle.backend_thread_id.load(std::sync::atomic::Ordering::Relaxed);
        let (user, collation, client_tls) = (self.state.user.clone(), self.state.collation, self.client.stream.is_tls());
        let count = self.ctx.rules.list[plan.rule?].timeouts.clone();
        Some(tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            let who = crate::backend::conn::As { user: &user, collation, cred: &cred, client_tls };
            let kill = format!("\u{3}KILL QUERY {tid}");
            count.inc();
            if let Err(e) = crate::backend::conn::run_once(&b, &who, kill.as_bytes()).await {
                tracing::warn!(backend = %b.name, thread = tid, error = %e.message, "a rule's timeout could not kill its statement");
            }
        }))
    }

    /// Counts a statement in its digest's statistics.
    pub(super) fn note_outcome(&self, plan: &Plan, o: Outcome) {
        if let Some(mark) = plan.mark {
            self.ctx.digests.finish(plan.digest, mark, o);
        }
    }
}

/// Replaces the request at the start of `rbuf` (a payload of `len` bytes) with a COM_QUERY of
/// `text`, leaving what follows it in place.
fn replace_request(rbuf: &mut BytesMut, len: usize, text: &[u8]) {
    let rest = rbuf.split_off(HEADER + len);
    rbuf.clear();
    let n = text.len() + 1;
    rbuf.extend_from_slice(&[n as u8, (n >> 8) as u8, (n >> 16) as u8, 0, com::QUERY]);
    rbuf.extend_from_slice(text);
    rbuf.unsplit(rest);
}
