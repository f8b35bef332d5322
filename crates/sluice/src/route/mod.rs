//! What sluice decides about a statement beyond relaying it: the query rules (block, rewrite,
//! mirror, route, cache, time out), the result cache, the digests' statistics, the split's
//! classes by statement key, and the GTIDs that causal reads wait for.

pub mod cache;
pub mod classes;
pub mod digest;
pub mod gtid;
pub mod keyed;
pub mod rules;
