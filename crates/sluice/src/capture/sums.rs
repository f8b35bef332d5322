//! Checksums of the rows of a response, as capture records them and replay recomputes them
//! (the same code on both sides, fed by the response tracker's [`sluice_proto::response::Sink`]).
//! Each row's payload is hashed (XXH3, 64 bits); `ordered` folds the row hashes in order,
//! `unordered` adds them, so that rows that came in another order give the same sum.

use std::hash::Hasher;

use twox_hash::XxHash3_64;

const ORDERED: u64 = 0x9e37_79b9_7f4a_7c15;
const UNORDERED: u64 = 0xff51_afd7_ed55_8ccd;
/// ORDERED's inverse modulo 2^64 (Newton's iteration; each step doubles the bits that are right).
const ORDERED_INVERSE: u64 = {
    let mut x = ORDERED;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(ORDERED.wrapping_mul(x)));
        i += 1;
    }
    x
};

/// The unordered sum of a single row, from its ordered sum (a capture stores only the
/// latter for responses of one row).
pub fn unordered_of_one(ordered: u64) -> u64 {
    ordered.rotate_right(29).wrapping_mul(ORDERED_INVERSE).wrapping_mul(UNORDERED)
}

#[derive(Default)]
pub struct RowSums {
    /// A row's payload comes in pieces: it is hashed here as they come (rare: a row longer
    /// than the relay reads at once), kept from row to row.
    pieces: Option<Box<XxHash3_64>>,
    /// `pieces` holds a row not yet folded in.
    in_pieces: bool,
    ordered: u64,
    unordered: u64,
}

impl RowSums {
    /// A row begins: its whole payload, or nothing when the payload follows through
    /// [`RowSums::more`] (the response tracker's two cases).
    #[inline]
    pub fn row(&mut self, payload: &[u8]) {
        if self.in_pieces {
            self.end_pieces();
        }
        if payload.is_empty() {
            self.in_pieces = true;
            *self.pieces.get_or_insert_with(Default::default).as_mut() = XxHash3_64::with_seed(0);
        } else {
            self.fold(XxHash3_64::oneshot(payload));
        }
    }

    /// More of the payload of the row last begun.
    pub fn more(&mut self, bytes: &[u8]) {
        if let Some(h) = self.pieces.as_mut().filter(|_| self.in_pieces) {
            h.write(bytes);
        }
    }

    #[cold]
    fn end_pieces(&mut self) {
        self.in_pieces = false;
        if let Some(h) = self.pieces.as_ref() {
            self.fold(h.finish());
        }
    }

    #[inline]
    fn fold(&mut self, v: u64) {
        self.ordered = (self.ordered ^ v).wrapping_mul(ORDERED).rotate_left(29);
        self.unordered = self.unordered.wrapping_add(v.wrapping_mul(UNORDERED));
    }

    /// The ordered checksum of the rows so far (the sums go on).
    pub fn current(&mut self) -> u64 {
        if self.in_pieces {
            self.end_pieces();
        }
        self.ordered
    }

    /// The checksums of all rows: in order, and in any order; the sums start again from none.
    pub fn finish(&mut self) -> (u64, u64) {
        if self.in_pieces {
            self.end_pieces();
        }
        let sums = (self.ordered, self.unordered);
        (self.ordered, self.unordered) = (0, 0);
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_rows_unordered_sum_follows_from_its_ordered_one() {
        assert_eq!(ORDERED.wrapping_mul(ORDERED_INVERSE), 1);
        for row in [&b"1"[..], b"", b"\x00\x00\x05hello", &[7u8; 300]] {
            let (ordered, unordered) = sums(&[row]);
            assert_eq!(unordered_of_one(ordered), unordered, "{row:?}");
        }
        let (ordered, unordered) = sums(&[b"a", b"b"]);
        assert_ne!(unordered_of_one(ordered), unordered);
    }

    fn sums(rows: &[&[u8]]) -> (u64, u64) {
        let mut s = RowSums::default();
        for r in rows {
            s.row(r);
        }
        s.finish()
    }

    #[test]
    fn order_counts_only_for_the_ordered_sum_and_pieces_do_not() {
        let (o1, u1) = sums(&[b"a", b"bc"]);
        let (o2, u2) = sums(&[b"bc", b"a"]);
        assert_ne!(o1, o2);
        assert_eq!(u1, u2);
        // Row boundaries count: "a","bc" is not "ab","c".
        assert_ne!(sums(&[b"ab", b"c"]).1, u1);
        // A row hashed whole, or in pieces after an empty start: the same.
        let mut s = RowSums::default();
        s.row(b"");
        s.more(b"a");
        s.row(b"");
        s.more(b"b");
        s.more(b"c");
        assert_eq!(s.finish(), (o1, u1));
        assert_eq!(s.finish(), (0, 0), "finish starts again");
        assert_eq!(sums(&[]), (0, 0));
    }
}
