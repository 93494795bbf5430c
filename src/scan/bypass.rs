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
        #[cfg(feature = "pg_test")]
        TAKEN.with(|t| t.set(t.get() + 1));
        true
    }
}

#[cfg(feature = "pg_test")]
thread_local! {
    /// How many executors this backend took a node out of the row path of.
    static TAKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// How many executors `sql` took a node out of the row path of, read
    /// as if its declared span had just met writers (read/run.rs): a small
    /// optimistic read then runs its buffered first run, where the bypass
    /// applies, instead of checking D and streaming.
    fn bypassed_by(sql: &str) -> u64 {
        crate::read::run::note_declared_check(false);
        let before = super::TAKEN.with(|t| t.get());
        Spi::run(sql).expect(sql);
        super::TAKEN.with(|t| t.get()) - before
    }

    #[pg_test]
    fn an_optimistic_batch_over_a_plain_index_scan_leaves_its_rows_to_the_parent() {
        for sql in [
            "CREATE TABLE bp (k int PRIMARY KEY, v text)",
            "SELECT pgkvx.enable('bp')",
            "INSERT INTO bp SELECT g, 'x' FROM generate_series(1, 1000) g",
            "ANALYZE bp",
            "SET LOCAL pgkvx.scan_mode = optimistic",
        ] {
            Spi::run(sql).expect(sql);
        }
        assert_eq!(bypassed_by("SELECT k, v FROM bp WHERE k > 10 ORDER BY k LIMIT 5"), 1);
        assert_eq!(bypassed_by("SELECT count(v) FROM (SELECT v FROM bp WHERE k > 10 ORDER BY k LIMIT 5) s"), 1);
        assert_eq!(bypassed_by("SELECT k, v FROM bp WHERE k > 990 ORDER BY k LIMIT 50"), 1, "a batch that runs out");
        // Its last row is the filter's, not the last visible one.
        assert_eq!(bypassed_by("SELECT k, v FROM bp WHERE k > 10 AND v <> 'y' ORDER BY k LIMIT 5"), 0);
        // EXPLAIN ANALYZE shows what the node saw.
        assert_eq!(bypassed_by("EXPLAIN ANALYZE SELECT k, v FROM bp WHERE k > 10 ORDER BY k LIMIT 5"), 0);
        // With D clean and checked, it streams without the node at all.
        crate::read::run::note_declared_check(true);
        let before = super::TAKEN.with(|t| t.get());
        Spi::run("SELECT k, v FROM bp WHERE k > 10 ORDER BY k LIMIT 5").expect("streamed");
        assert_eq!(super::TAKEN.with(|t| t.get()), before);
        // Off and fenced reads run without the node at all.
        Spi::run("SET LOCAL pgkvx.scan_mode = fenced").expect("fenced");
        assert_eq!(bypassed_by("SELECT k, v FROM bp WHERE k > 10 ORDER BY k LIMIT 5"), 0);
    }
}
