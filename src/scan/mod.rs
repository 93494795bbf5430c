//! `PgkvxLimitScan`: LIMIT reads in key order over latched tables, kept
//! from skipping rows that commit late.
//!
//! `planner` decides which scans get the node and wraps their paths
//! (`restartable` says whether a statement may run twice);
//! `plan_data` is what the plan carries to the executor; `node` is the
//! executor node (begin/exec/end/rescan, EXPLAIN), which follows how far
//! its scan got; `statement` runs the read protocol (`read/`) once per
//! statement from the executor hooks, over the statement's `guards`
//! (decoded once, and handed to their nodes as the executor starts:
//! `starting`); `tree` puts one node over a partitioned table's
//! MergeAppend instead of one per partition; `unguarded` splices the node
//! out of executions that have no use for it; `attempts` runs an
//! optimistic statement's attempts, and `buffer` holds its rows back until
//! they are valid.

pub mod attempts;
pub mod buffer;
pub mod explain;
pub mod guards;
pub mod hooks;
pub mod node;
pub mod plan_data;
pub mod plan_walk;
pub mod planner;
pub mod position;
pub mod probe;
pub mod report;
pub mod restartable;
pub mod runtime;
pub mod starting;
pub mod statement;
pub mod tree;
pub mod unguarded;

/// Installs the planner and executor hooks and registers the node; called
/// from `_PG_init`.
pub fn init() {
    planner::init();
    statement::init();
    node::register();
}
