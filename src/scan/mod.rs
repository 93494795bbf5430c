//! `PgkvxLimitScan`: the custom scan that gives LIMIT queries over latched
//! tables their fenced or optimistic guarantee.
//!
//! `planner` offers the path and builds the plan; `exec` is the node
//! (begin/exec/end/rescan, EXPLAIN); `span` derives the declared and touched
//! spans from scan keys; `snapshot` builds the snapshots the node reads at
//! and waits for writers; `guard` runs the protocol for a scan (this node
//! and `pgkvx.arrow_scan`).  The decisions themselves live in the pure-Rust
//! protocol (`latch::protocol`).

pub mod exec;
pub mod guard;
pub mod planner;
pub mod snapshot;
pub mod span;

/// Installs the planner hook and registers the node; called from `_PG_init`.
pub fn init() {
    planner::init();
    snapshot::init();
    exec::register();
}
