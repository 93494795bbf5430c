//! The read protocol against Postgres: snapshots (the statement's, fresh
//! ones, and either with waited-for writers folded in), declared and
//! touched spans from quals and scan positions, and the runner that checks,
//! waits and decides, and `admit`, the rule of whether and how a read is
//! protected.  Both readers of latched tables use it: statements
//! with `PgkvxLimitScan` nodes (`scan/`) and `pgkvx.arrow_scan` (`arrow/`).

pub mod admit;
pub mod run;
pub mod snapshot;
pub mod span;
