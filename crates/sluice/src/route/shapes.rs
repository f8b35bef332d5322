//! What sluice reads of each shape of statement a worker saw, by the statement's key
//! (`sluice_proto::digest::Key`, the one thing the pass over every statement takes): its hazards,
//! the split's class, its digest and where the digest's entry is. Texts of one key lex into the
//! same tokens but for the values of their literals, which the hazard scan, the classifier and
//! the normalizer never read (but for a literal run as SQL, whose hazards are then read from each
//! text: `sluice_proto::sql::shape_hazards`). A statement of a shape seen before therefore costs
//! one probe instead of their looks at its tokens. Each worker has its own table behind its own
//! lock (`keyed.rs`), never contended on the per-core runtime.

use parking_lot::Mutex;
use sluice_proto::lexer::Mode;
use sluice_proto::rw::Class;

use super::digest::{Digests, Mark};
use super::keyed::Keyed;

/// What is known of one shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    /// Its hazards (`sluice_proto::sql::hazard`); None: they depend on a literal's value.
    pub hazards: Option<u16>,
    /// The split's class (None: not read yet).
    pub class: Option<Class>,
    /// Its digest (0: not taken yet).
    pub digest: u64,
    /// Its digest's entry, and the digests' generation it was found in (0: none).
    pub mark: Mark,
    generation: u32,
}

/// What a session wants of a statement beyond its hazards.
#[derive(Debug, Clone, Copy)]
pub struct Want {
    pub class: bool,
    pub digest: bool,
    /// Its digest's entry (to be counted in the digests' statistics).
    pub entry: bool,
}

/// A statement as a session sent it.
pub struct Text<'a> {
    pub key: u64,
    pub text: &'a [u8],
    pub mode: Mode,
    pub schema: Option<&'a str>,
}

impl Shape {
    /// Whether it has all that is wanted.
    #[inline]
    fn has(&self, want: Want, digests: &Digests) -> bool {
        (!want.class || self.class.is_some())
            && (!want.digest || self.digest != 0)
            && (!want.entry || self.generation == digests.generation())
    }
}

/// Shapes by key, per worker.
pub struct Shapes {
    shards: Box<[Mutex<Keyed<Shape>>]>,
}

impl Shapes {
    pub fn new(shards: usize) -> Shapes {
        Shapes { shards: (0..shards.max(1)).map(|_| Mutex::new(Keyed::new(Shape::default()))).collect() }
    }

    /// The shape of `s`, with what is wanted of it: from the table when it has it, else read
    /// (and kept).
    #[inline]
    pub fn of(&self, s: &Text<'_>, want: Want, digests: &Digests) -> Shape {
        let shard = &self.shards[crate::worker::shard() % self.shards.len()];
        let found = shard.lock().get(s.key);
        match found {
            Some(shape) if shape.has(want, digests) => shape,
            _ => self.read(shard, found, s, want, digests),
        }
    }

    /// Reads what is missing of a shape, and keeps it.
    #[cold]
    fn read(&self, shard: &Mutex<Keyed<Shape>>, found: Option<Shape>, s: &Text<'_>, want: Want, digests: &Digests) -> Shape {
        let mut shape = found.unwrap_or_else(|| {
            let (hazards, by_shape) = sluice_proto::sql::shape_hazards(s.text, s.mode);
            Shape { hazards: by_shape.then_some(hazards), ..Shape::default() }
        });
        if want.class && shape.class.is_none() {
            shape.class = Some(sluice_proto::rw::classify_in(s.text, s.mode));
        }
        if (want.digest || want.entry) && shape.digest == 0 {
            shape.digest = sluice_proto::digest::digest_in(s.text, s.mode);
        }
        if want.entry && shape.generation != digests.generation() {
            // (Read before the entry is made: an eviction meanwhile makes it stale at once.)
            shape.generation = digests.generation();
            shape.mark = digests.begin(shape.digest, s.text, s.schema, s.mode);
        }
        shard.lock().put(s.key, shape);
        shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::scan::scan_keyed;

    #[test]
    fn a_shape_seen_before_has_what_the_readers_find() {
        let shapes = Shapes::new(1);
        let cfg = crate::config::DigestsConfig::default();
        let digests = Digests::new(&cfg, 1, Default::default());
        let seed = [7, 11];
        let mode = Mode::DEFAULT;
        let texts = [
            "SELECT c FROM t WHERE id = 1",
            "SELECT c FROM t WHERE id = 2",
            "SELECT c FROM t WHERE id = 3 FOR UPDATE",
            "INSERT INTO t VALUES (1)",
            "SELECT LAST_INSERT_ID()",
            "SET @a = 1",
            "SET autocommit = 0",
            "SHOW WARNINGS",
            "SELECT 1; SELECT 2",
            "select c from t where id = 9",
            "EXECUTE IMMEDIATE 'SELECT 1'",
            "EXECUTE IMMEDIATE 'SET @a = 1'",
        ];
        let want = Want { class: true, digest: true, entry: true };
        // Twice: the second time from the table.
        for _ in 0..2 {
            for t in texts {
                let sql = t.as_bytes();
                let text = Text { key: scan_keyed(sql, mode, seed).key, text: sql, mode, schema: None };
                let shape = shapes.of(&text, want, &digests);
                assert_eq!(shape.class, Some(sluice_proto::rw::classify_in(sql, mode)), "{t}");
                assert_eq!(shape.digest, sluice_proto::digest::digest_in(sql, mode), "{t}");
                let hazards = sluice_proto::sql::hazards_in(sql, mode);
                assert!(shape.hazards.is_none_or(|h| h == hazards), "{t}");
                assert_eq!(shape.hazards.is_none(), t.starts_with("EXECUTE"), "{t}");
            }
        }
        // Every statement was counted in its digest's entry; after a reset, again.
        let o = crate::route::digest::Outcome::default();
        for round in 1..=2 {
            for t in texts {
                let sql = t.as_bytes();
                let text = Text { key: scan_keyed(sql, mode, seed).key, text: sql, mode, schema: None };
                let shape = shapes.of(&text, want, &digests);
                digests.finish(shape.digest, shape.mark, o);
            }
            let counted: u64 = digests.top(100, crate::route::digest::By::Count).iter().map(|d| d.count).sum();
            assert_eq!(counted, texts.len() as u64, "round {round}");
            digests.reset();
        }
    }
}
