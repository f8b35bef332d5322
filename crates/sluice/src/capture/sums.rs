//! Checksums of the rows of a response, as capture records them and replay recomputes them
//! (the same code on both sides, fed by the response tracker's [`sluice_proto::response::Sink`]).
//! Each row's payload is hashed (XXH3, 64 bits); `ordered` folds the row hashes in order,
//! `unordered` adds them, so that rows that came in another order give the same sum.

use std::hash::Hasher;

use twox_hash::XxHash3_64;

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
        self.ordered = (self.ordered ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        self.unordered = self.unordered.wrapping_add(v.wrapping_mul(0xff51_afd7_ed55_8ccd));
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
