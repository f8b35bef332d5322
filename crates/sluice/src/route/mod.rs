//! What sluice decides about a statement beyond relaying it: the query rules (block, rewrite,
//! mirror, route, cache, time out), the result cache, the digests' statistics, what was read
//! of each shape of statement (by statement key), and the GTIDs that causal reads wait for.

pub mod cache;
pub mod digest;
pub mod gtid;
pub mod keyed;
pub mod rules;
pub mod shapes;
