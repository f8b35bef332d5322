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
use crate::route::digest::{Mark, Outcome, Statement};
use crate::route::rules::{RouteTo, Who};

/// What is known of the statement about to run.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Its digest (0: not a statement, or statements are not looked at).
    pub(super) digest: u64,
    /// Where its digest's entry is (when digests are on).
    pub(super) mark: Mark,
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

/// What one reading of a statement's text found.
#[derive(Default)]
struct Read {
    digest: u64,
    key: u64,
    hazards: Option<u16>,
    class: Option<sluice_proto::rw::Class>,
    /// Whether it holds a comment (None: not read).
    commented: Option<bool>,
}

/// What is wanted of a statement's text.
#[derive(Clone, Copy)]
struct Wanted {
    /// Its digest itself (rules without digests' statistics, or a prepare's).
    digest: bool,
    /// Its key, with the process's seed (the digests' table gives its digest, the classes'
    /// its class).
    key: Option<[u64; 2]>,
    hazards: bool,
}

/// Reads a statement once in `mode` for what is wanted of it (one pass of the lexer; the digest
/// of a statement whose key is wanted too, for rules when digests are off, in another).
fn read_once(text: &[u8], mode: sluice_proto::lexer::Mode, w: Wanted) -> Read {
    use sluice_proto::scan::{scan, scan_keyed};
    let s = match (w.key, w.digest) {
        (Some(seed), digest) => {
            let mut s = scan_keyed(text, mode, seed);
            if digest {
                s.digest = sluice_proto::digest::digest_in(text, mode);
            }
            s
        }
        (None, true) => scan::<true>(text, mode),
        (None, false) if w.hazards => scan::<false>(text, mode),
        (None, false) => return Read::default(),
    };
    Read { digest: s.digest, key: s.key, hazards: w.hazards.then_some(s.hazards), class: None, commented: Some(s.commented) }
}

impl Session {
    /// Whether statements are looked at beyond the split's classification.
    #[inline]
    pub(super) fn looks_at_statements(&self) -> bool {
        self.ctx.digests.enabled || !self.ctx.rules.is_empty() || self.split
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

    /// Takes the statement's digest and finds its rule and route; opens its digest entry (a
    /// prepare's digest is its executes').
    pub(super) fn see(&self, cmd: u8, body_end: usize, len: usize) -> Seen {
        let Some(text) = self.statement_text(cmd, body_end, len) else { return Seen::default() };
        let (rules, digests) = (&self.ctx.rules, &self.ctx.digests);
        // Counted in the digests' statistics: a query's or an execute's (its key read with
        // the rest, the digest from the digests' table).
        let counted = digests.enabled && cmd != com::STMT_PREPARE;
        // The split's class of a query or prepare (an execute's is its prepare's).
        let classed = self.split && cmd != com::STMT_EXECUTE;
        let wanted = Wanted {
            digest: !counted && (digests.enabled || !rules.is_empty()),
            key: (counted || classed).then_some(self.ctx.key_seed),
            // The hazards of a query (`note_query`).
            hazards: cmd == com::QUERY && self.credential.is_some(),
        };
        let (mode, mut read) = match self.state.readings(text) {
            // One reading: one lexing for every reader.
            crate::session::Readings(m, None) => {
                let mut read = read_once(text, m, wanted);
                if classed {
                    read.class = Some(self.ctx.classes.class_of(read.key, text, m));
                }
                (m, read)
            }
            // Two readings: the key and the digest of the one shown (the hazards and the class
            // are read apart in each, by `note_query` and `wants`).
            _ => {
                let mode = self.state.reading_shown(text);
                let key = wanted.key.map_or(0, |seed| sluice_proto::scan::scan_keyed(text, mode, seed).key);
                let digest = if wanted.digest { sluice_proto::digest::digest_in(text, mode) } else { 0 };
                (mode, Read { digest, key, ..Read::default() })
            }
        };
        let schema = self.state.schema.as_deref();
        let mut mark = Mark::default();
        if counted {
            (read.digest, mark) = digests.begin(&Statement { key: read.key, text, schema, mode });
        }
        let Read { digest, hazards, class, commented, .. } = read;
        let rule = match rules.is_empty() {
            true => None,
            false => rules.find(&Who { user: &self.state.user, schema, client: self.client_ip, mode }, digest, text),
        };
        // (A route means something only to a session that takes a connection per statement;
        // it is a comment's, and a text read already may be known to hold none.)
        let hinted = match self.multiplex && commented != Some(false) {
            true => crate::route::rules::hint(text).and_then(|t| rules.route_to(std::str::from_utf8(t).ok()?)),
            false => None,
        };
        let route = hinted.or_else(|| rule.and_then(|i| rules.list[i].action.route));
        Seen { digest: if cmd == com::STMT_PREPARE { 0 } else { digest }, mark, rule, route, cache: None, hazards, class }
    }

    /// Acts on the statement's rule before it is forwarded: a blocked statement is answered
    /// (Some), a rewritten one replaces the request (`h` follows), a mirrored one is queued, a
    /// read whose answer the cache holds is answered from it (Some).
    pub(super) async fn rule_before(&mut self, seen: &mut Seen, cmd: u8, h: &mut Header) -> Result<Option<Flow>> {
        let Some(i) = seen.rule else { return Ok(None) };
        let ctx = self.ctx.clone();
        let rule = &ctx.rules.list[i];
        let a = &rule.action;
        if let Some((code, msg)) = &a.block {
            self.skip_request().await?;
            self.client_error(1, *code, b"42000", msg).await;
            self.note_outcome(seen, Outcome { error: true, ..Default::default() });
            return Ok(Some(Flow::Continue));
        }
        if cmd != com::QUERY || h.len >= INSPECT_LIMIT {
            return Ok(None);
        }
        if let Some((re, with)) = &a.rewrite {
            // (The statement that runs is another: its hazards and class are looked for in it.)
            (seen.hazards, seen.class) = (None, None);
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
            self.ctx.mirrors.send(to, &self.state, self.credential.as_ref(), text);
        }
        if a.cache_ttl.is_some() && self.cacheable(h.len) {
            let started = crate::metrics::mono_ns();
            let text = &self.client.rbuf[HEADER + 1..HEADER + h.len];
            let Some(answer) = self.ctx.cache.get(&self.cache_key(text), std::time::Instant::now()) else {
                seen.cache = Some(text.into());
                return Ok(None);
            };
            self.skip_request().await?;
            self.client.write(&answer.packets).await.map_err(|e| Error::io(Side::Client, "writing a cached answer", e))?;
            let at = crate::metrics::mono_ns();
            self.note_outcome(seen, Outcome { at, nanos: at.saturating_sub(started), rows: answer.rows, error: false });
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
            caps: u64::from(self.fit.client_caps) | u64::from(self.fit.mariadb_caps) << 32,
            text,
        }
    }

    /// Keeps the answer of a statement its rule caches (it succeeded, changed no session state).
    pub(super) fn keep_answer(&self, seen: &Seen, packets: Vec<u8>, rows: u64) {
        let (Some(text), Some(ttl)) = (&seen.cache, seen.rule.and_then(|i| self.ctx.rules.list[i].action.cache_ttl)) else { return };
        let answer = crate::route::cache::Answer { packets: packets.into_boxed_slice(), rows };
        self.ctx.cache.put(&self.cache_key(text), answer, ttl, std::time::Instant::now());
    }

    /// Watches a statement its rule gives a timeout: when it runs over, it is killed on its
    /// backend (KILL QUERY over a connection of its own), and the client gets the backend's
    /// "interrupted" error. The returned handle stops the watch.
    pub(super) fn watch_timeout(&self, seen: &Seen) -> Option<tokio::task::JoinHandle<()>> {
        let limit = self.ctx.rules.list[seen.rule?].action.timeout?;
        let cred = self.credential.clone()?;
        let b = self.guard.0.clone();
        let tid = self.handle.backend_thread_id.load(std::sync::atomic::Ordering::Relaxed);
        let (user, collation, client_tls) = (self.state.user.clone(), self.state.collation, self.client.stream.is_tls());
        let count = self.ctx.rules.list[seen.rule?].timeouts.clone();
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
    pub(super) fn note_outcome(&self, seen: &Seen, o: Outcome) {
        if seen.digest != 0 && self.ctx.digests.enabled {
            self.ctx.digests.finish(seen.digest, seen.mark, o);
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
