//! `PgkvxLimitScan`: LIMIT reads in key order over latched tables, kept
//! from skipping rows that commit late.
//!
//! The map of a statement's life through these modules, a glossary and
//! where each rule lives: README.md in this folder.
//!
//! - plan time: `planner` (which reads are tails), `cte_bound` (a cursor
//!   joined from a CTE made a bound), `restartable`, `plan_data`, `tree`;
//! - executor start: `statement` (the hooks, the mode), `guards` (decoded
//!   once), `probe` (where a fenced read ends), `cut` (when a read may stop
//!   before a later writer's key),
//!   `starting`, `unguarded`, `hooks`;
//! - the node: `node`, `position`, `runtime`;
//! - validation: `attempts`, `buffer`;
//! - EXPLAIN: `explain`, `report`; walks over plans: `plan_walk`.

pub mod attempts;
pub mod buffer;
pub mod bypass;
pub mod cte_bound;
pub mod cut;
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
