//! The result cache of query rules (`cache_ttl`): the answer to a read, as the client received
//! it, kept for the rule's TTL and served again to the same user with the same schema,
//! character set and protocol capabilities for the same text, without a backend. Bounded in
//! memory (`routing.cache_size`): the oldest entries go first when a new one needs room.
//! Shared by all workers behind one lock, taken only by statements whose rule caches.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use rustc_hash::{FxHashMap, FxHasher};

/// What an answer depends on besides the text.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    pub user: &'a str,
    pub schema: Option<&'a str>,
    pub collation: u8,
    /// Client capabilities that shape the answer's packets.
    pub caps: u64,
    pub text: &'a [u8],
}

impl Key<'_> {
    fn hash(&self) -> u64 {
        let mut h = FxHasher::default();
        (self.user, self.schema, self.collation, self.caps, self.text).hash(&mut h);
        h.finish()
    }
}

/// A cached answer: its packets and the rows they hold.
pub struct Answer {
    pub packets: Box<[u8]>,
    pub rows: u64,
}

struct Entry {
    user: Box<str>,
    schema: Option<Box<str>>,
    collation: u8,
    caps: u64,
    text: Box<[u8]>,
    answer: Arc<Answer>,
    expires: Instant,
    /// Which insertion this is (an older one in `order` no longer owns the slot).
    serial: u64,
}

impl Entry {
    fn is(&self, k: &Key<'_>) -> bool {
        *self.user == *k.user
            && self.schema.as_deref() == k.schema
            && self.collation == k.collation
            && self.caps == k.caps
            && *self.text == *k.text
    }

    fn size(&self) -> usize {
        self.answer.packets.len() + self.text.len() + self.user.len() + 96
    }
}

#[derive(Default)]
struct Inner {
    map: FxHashMap<u64, Entry>,
    /// Insertion order, for eviction: (hash, serial).
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    serial: u64,
}

pub struct ResultCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
    pub hits: Counter,
    pub misses: Counter,
    pub evictions: Counter,
}

impl ResultCache {
    pub fn new(max_bytes: usize, metrics: &crate::metrics::Metrics) -> ResultCache {
        ResultCache {
            inner: Mutex::default(),
            max_bytes,
            hits: metrics.cache("hit"),
            misses: metrics.cache("miss"),
            evictions: metrics.cache("evicted"),
        }
    }

    /// The largest answer kept (a sixteenth of the cache).
    pub fn largest(&self) -> usize {
        self.max_bytes / 16
    }

    /// The answer kept for `k`, if it has not expired.
    pub fn get(&self, k: &Key<'_>, now: Instant) -> Option<Arc<Answer>> {
        let h = k.hash();
        let inner = self.inner.lock();
        let found = inner.map.get(&h).filter(|e| e.is(k) && e.expires > now).map(|e| e.answer.clone());
        drop(inner);
        match &found {
            Some(_) => self.hits.inc(),
            None => self.misses.inc(),
        };
        found
    }

    /// Keeps an answer for `ttl`, making room by dropping the oldest entries (and expired ones
    /// met on the way).
    pub fn put(&self, k: &Key<'_>, answer: Answer, ttl: Duration, now: Instant) {
        if answer.packets.len() > self.largest() {
            return;
        }
        let h = k.hash();
        let mut inner = self.inner.lock();
        inner.serial += 1;
        let entry = Entry {
            user: k.user.into(),
            schema: k.schema.map(Into::into),
            collation: k.collation,
            caps: k.caps,
            text: k.text.into(),
            answer: Arc::new(answer),
            expires: now + ttl,
            serial: inner.serial,
        };
        let size = entry.size();
        if let Some(old) = inner.map.remove(&h) {
            inner.bytes -= old.size();
        }
        while inner.bytes + size > self.max_bytes {
            let Some((oh, serial)) = inner.order.pop_front() else { break };
            if inner.map.get(&oh).is_some_and(|e| e.serial == serial) {
                let gone = inner.map.remove(&oh).map_or(0, |e| e.size());
                inner.bytes -= gone;
                self.evictions.inc();
            }
        }
        let serial = entry.serial;
        inner.bytes += size;
        inner.map.insert(h, entry);
        inner.order.push_back((h, serial));
        // (Stale order entries of replaced answers are dropped as they reach the front.)
        while inner.order.len() > 2 * inner.map.len() + 16 {
            let Some((oh, serial)) = inner.order.pop_front() else { break };
            if inner.map.get(&oh).is_some_and(|e| e.serial == serial) {
                inner.order.push_back((oh, serial));
            }
        }
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Key<'_> {
        Key { user: "app", schema: Some("shop"), collation: 45, caps: 1, text: text.as_bytes() }
    }

    fn answer(n: usize) -> Answer {
        Answer { packets: vec![7; n].into_boxed_slice(), rows: 1 }
    }

    #[test]
    fn answers_are_served_until_they_expire_and_only_for_their_key() {
        let c = ResultCache::new(1 << 20, &crate::metrics::Metrics::new(&[]));
        let now = Instant::now();
        c.put(&key("select 1"), answer(10), Duration::from_secs(5), now);
        assert_eq!(c.get(&key("select 1"), now).expect("kept").packets.len(), 10);
        assert!(c.get(&Key { user: "other", ..key("select 1") }, now).is_none());
        assert!(c.get(&Key { schema: None, ..key("select 1") }, now).is_none());
        assert!(c.get(&Key { caps: 2, ..key("select 1") }, now).is_none());
        assert!(c.get(&key("select 2"), now).is_none());
        assert!(c.get(&key("select 1"), now + Duration::from_secs(6)).is_none());
        assert_eq!((c.hits.get(), c.misses.get()), (1, 5));
    }

    #[test]
    fn the_oldest_go_first_to_stay_within_the_bound() {
        let c = ResultCache::new(16 * 1000, &crate::metrics::Metrics::new(&[]));
        let now = Instant::now();
        let texts: Vec<String> = (0..100).map(|i| format!("select {i}")).collect();
        for t in &texts {
            c.put(&key(t), answer(900), Duration::from_secs(60), now);
            assert!(c.bytes() <= 16 * 1000);
        }
        assert!(c.get(&key(&texts[99]), now).is_some());
        assert!(c.get(&key(&texts[0]), now).is_none());
        assert!(c.evictions.get() > 80);
        // An answer larger than a sixteenth of the cache is not kept.
        c.put(&key("big"), answer(2000), Duration::from_secs(60), now);
        assert!(c.get(&key("big"), now).is_none());
    }
}
