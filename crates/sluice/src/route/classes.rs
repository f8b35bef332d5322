//! The split's class of each shape of statement a worker saw, by the statement's key
//! (`sluice_proto::digest::Key`, taken in the pass that reads the statement anyway). Texts of one
//! key lex into the same tokens but for the values of their literals, which the classifier never
//! reads (`sluice_proto::rw` looks at words, variables and punctuation only), so they have one
//! class: a statement seen before is classified by one probe instead of the classifier's look
//! at each of its tokens. Each worker has its own table behind its own lock (`keyed.rs`).

use parking_lot::Mutex;
use sluice_proto::lexer::Mode;
use sluice_proto::rw::Class;

use super::keyed::Keyed;

/// Classes by key, per worker.
pub struct Classes {
    shards: Box<[Mutex<Keyed<Class>>]>,
}

impl Classes {
    pub fn new(shards: usize) -> Classes {
        Classes { shards: (0..shards.max(1)).map(|_| Mutex::new(Keyed::new(Class::Read))).collect() }
    }

    /// The class of `text` (read in `mode`), whose key is `key`: `rw::classify_in`'s, from the
    /// table when the key is there.
    #[inline]
    pub fn class_of(&self, key: u64, text: &[u8], mode: Mode) -> Class {
        let shard = &self.shards[crate::worker::shard() % self.shards.len()];
        if let Some(class) = shard.lock().get(key) {
            return class;
        }
        let class = sluice_proto::rw::classify_in(text, mode);
        shard.lock().put(key, class);
        class
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::scan::scan_keyed;

    #[test]
    fn a_shape_seen_before_has_the_classifiers_class() {
        let classes = Classes::new(1);
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
        ];
        // Twice: the second time from the table.
        for _ in 0..2 {
            for t in texts {
                let key = scan_keyed(t.as_bytes(), mode, seed).key;
                assert_eq!(classes.class_of(key, t.as_bytes(), mode), sluice_proto::rw::classify_in(t.as_bytes(), mode), "{t}");
            }
        }
    }
}
