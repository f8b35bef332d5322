//! What was found for a shape of statement, by the statement's key (`sluice_proto::digest::Key`,
//! taken in the pass that reads it anyway): a direct-mapped table of 1,024 places, a key's place
//! at its top bits. A key takes the place of another of its index, so the table stays bounded
//! however many shapes come. The table of shapes is one (`shapes.rs`).

/// Places in a table (the index of a key: its top bits).
const BITS: u32 = 10;

/// Values by statement key (key 0: an empty place).
pub struct Keyed<V> {
    places: Box<[(u64, V)]>,
}

impl<V: Copy> Keyed<V> {
    /// An empty table; `fill`: what its empty places hold (never returned).
    pub fn new(fill: V) -> Keyed<V> {
        Keyed { places: vec![(0, fill); 1 << BITS].into_boxed_slice() }
    }

    /// What was put for `key`, while no other key took its place.
    #[inline]
    pub fn get(&self, key: u64) -> Option<V> {
        let (k, v) = self.places[place(key)];
        (k == key && key != 0).then_some(v)
    }

    #[inline]
    pub fn put(&mut self, key: u64, v: V) {
        self.places[place(key)] = (key, v);
    }
}

#[inline]
fn place(key: u64) -> usize {
    (key >> (64 - BITS)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gives_back_what_was_put_until_another_takes_its_place() {
        let mut t = Keyed::new(0u32);
        let (a, b) = (0x0123_0000_0000_0001, 0x0123_0000_0000_0002);
        assert_eq!(place(a), place(b));
        assert_eq!(t.get(a), None);
        t.put(a, 7);
        assert_eq!(t.get(a), Some(7));
        t.put(b, 8);
        assert_eq!((t.get(a), t.get(b)), (None, Some(8)));
        // (Key 0 is no key.)
        t.put(0, 9);
        assert_eq!(t.get(0), None);
    }
}
