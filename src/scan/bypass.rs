//! An optimistic statement's first run with its guard node out of the row
//! path.
//!
//! The node over an optimistic read's scan exists to learn, once the run
//! is over, how far the scan got (T, `runtime.rs`).  For a plain index
//! scan in key order it learns that without seeing a single row: a scan
//! its LIMIT stopped still holds its last row in its scan slot, and a scan
//! that ran out finds its last row by stepping its own index scan back one
//! row (`position::key_one_back`) -- the last visible row its index quals
//! match, which, with no filter, is the last row it returned.  Yet passing
//! every row through the node costs each row a call and, on a LIMIT 1000
//! read, more in the instruction cache than in instructions: the node's
//! code runs between the scan's and its parent's at every row.
//!
//! So where the plan has the shape `unguarded.rs` splices (one guard,
//! reached from the top through nodes with one child, which fetch their
//! child's rows through their plan state's `lefttree` at every call), the
//! guard's parent is pointed at the guard's child once the executor has
//! started: rows go straight from the scan to the parent.  The node stays
//! the statement's (`GuardedStatement::nodes`), with its runtime, for
//! validation, cuts and the report; it is no longer in the plan state tree,
//! so its parent ends and shuts down its child itself, and nothing walks
//! to it from the top.  Only the first run of the statement's own executor
//! goes this way: it runs once, to the end, into the buffer, and is never
//! rescanned.  Second executors and EXPLAIN ANALYZE keep the node.

use super::guards::Guards;
use super::runtime::with_runtime;
use pgrx::pg_sys::{self, QueryDesc};

/// Takes the guard node of a just-started optimistic statement out of its
/// row path where it allows (see the module doc).  Returns whether it did.
///
/// # Safety
/// `qd` was started by us, optimistic, and has not run; `nodes` are its
/// guard nodes, begun, decoded from `guards`.
pub(super) unsafe fn leave_rows_to_parent(
    qd: *mut QueryDesc,
    guards: &Guards,
    nodes: &[*mut pg_sys::CustomScanState],
) -> bool {
    let [node] = nodes else { return false };
    // SAFETY: the caller's contract: a started executor whose plan state
    // tree mirrors its plan, and its one begun guard node.
    unsafe {
        if super::unguarded::watched(qd) || super::unguarded::plan_without_guard((*qd).plannedstmt, guards).is_none() {
            return false;
        }
        let target = *node as *mut pg_sys::PlanState;
        let mut parent = (*qd).planstate;
        while !parent.is_null() && (*parent).lefttree != target {
            parent = (*parent).lefttree;
        }
        if parent.is_null() {
            return false;
        }
        let Some(child) = with_runtime(*node, |rt| rt.leave_rows_to_parent()) else { return false };
        (*parent).lefttree = child;
        true
    }
}
