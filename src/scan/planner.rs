//! Planning: when a query level is "ORDER BY the key LIMIT n" over one
//! latched table, offer a `PgkvxLimitScan` path that wraps the key index
//! scan, and turn it into a CustomScan plan.
//!
//! The shape we take: a SELECT whose only base relation at its level is a
//! latched table, with LIMIT (constant, parameter or expression) and an
//! ORDER BY the key index provides (or that equality quals made moot), and nothing between the scan and the
//! Limit node that changes the row count (no aggregates, grouping, DISTINCT,
//! window functions, set-returning functions or row locks).  Then the Limit
//! applies to exactly the rows we return and "the last key examined" is
//! meaningful.  Everything else keeps its plain Postgres plan.
//!
//! The path is costed below every alternative so the planner always takes
//! it for that shape: it reads exactly what the ordered index scan would,
//! and only this node can keep the promise about rows committed late.

use crate::api::registry;
use crate::guc::{ScanMode, SCAN_MODE};
use pgrx::pg_sys::{self, List, Node};
use pgrx::prelude::*;

pub const NAME: &std::ffi::CStr = c"PgkvxLimitScan";

/// Static method tables Postgres keeps pointers to.
#[repr(transparent)]
pub struct Methods<T>(pub T);
// SAFETY: immutable after construction; only read by this process.
unsafe impl<T> Sync for Methods<T> {}

static PATH_METHODS: Methods<pg_sys::CustomPathMethods> = Methods(pg_sys::CustomPathMethods {
    CustomName: NAME.as_ptr(),
    PlanCustomPath: Some(plan_custom_path),
    ReparameterizeCustomPathByChild: None,
});

static mut PREV_HOOK: pg_sys::set_rel_pathlist_hook_type = None;

/// Indices into `custom_private` (a list of Integer nodes).
pub mod private {
    pub const INDEX_OID: usize = 0;
    pub const FORWARD: usize = 1;
    pub const NQUALS: usize = 2;
    pub const HAS_COUNT: usize = 3;
    pub const HAS_OFFSET: usize = 4;
}

pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe {
        PREV_HOOK = pg_sys::set_rel_pathlist_hook;
        pg_sys::set_rel_pathlist_hook = Some(rel_pathlist_hook);
    }
}

fn list_iter<T>(l: *mut List) -> impl Iterator<Item = *mut T> {
    let n = if l.is_null() {
        0
    } else {
        // SAFETY: a valid List.
        unsafe { (*l).length as usize }
    };
    // SAFETY: i < length.
    (0..n).map(move |i| unsafe { (*(*l).elements.add(i)).ptr_value as *mut T })
}

fn tag(n: *const Node) -> pg_sys::NodeTag {
    // SAFETY: every Node starts with its tag.
    unsafe { (*n).type_ }
}

#[pg_guard]
unsafe extern "C-unwind" fn rel_pathlist_hook(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
    rte: *mut pg_sys::RangeTblEntry,
) {
    // SAFETY: chaining the previous hook with the same arguments.
    unsafe {
        if let Some(prev) = PREV_HOOK {
            prev(root, rel, rti, rte);
        }
    }
    if SCAN_MODE.get() == ScanMode::Off {
        return;
    }
    // SAFETY: planner structures valid for the duration of the hook.
    if let Some(path) = unsafe { limit_scan_path(root, rel, rte) } {
        // SAFETY: add_path takes ownership of a palloc'd path.
        unsafe { pg_sys::add_path(rel, path) };
    }
}

/// Whether this query level has the shape PgkvxLimitScan serves.
///
/// # Safety
/// `root` is a valid PlannerInfo.
unsafe fn limit_applies_to_scan(root: *mut pg_sys::PlannerInfo) -> bool {
    // SAFETY: per contract.
    unsafe {
        let q = &*(*root).parse;
        q.commandType == pg_sys::CmdType::CMD_SELECT
            && !q.limitCount.is_null()
            && q.limitOption == pg_sys::LimitOption::LIMIT_OPTION_COUNT
            && q.rowMarks.is_null()
            && !q.hasAggs
            && q.groupClause.is_null()
            && q.groupingSets.is_null()
            && !q.hasWindowFuncs
            && q.distinctClause.is_null()
            && !q.hasTargetSRFs
            && q.setOperations.is_null()
            && q.havingQual.is_null()
            // we evaluate LIMIT/OFFSET ourselves too: both must agree
            && !pg_sys::contain_volatile_functions(q.limitCount)
            && !pg_sys::contain_volatile_functions(q.limitOffset)
            // ORDER BY present (its pathkeys may all be redundant, as in
            // `WHERE k = 5 ORDER BY k`)
            && !q.sortClause.is_null()
            && pg_sys::bms_membership((*root).all_baserels) == pg_sys::BMS_Membership::BMS_SINGLETON
    }
}

/// # Safety
/// Planner structures from `set_rel_pathlist_hook`.
unsafe fn limit_scan_path(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    rte: *mut pg_sys::RangeTblEntry,
) -> Option<*mut pg_sys::Path> {
    // SAFETY (whole body): per contract; nodes are checked by tag before
    // being cast.
    unsafe {
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
            || (*rte).relkind as u8 != pg_sys::RELKIND_RELATION
            || (*rte).inh
            || (*rel).reloptkind != pg_sys::RelOptKind::RELOPT_BASEREL
            || !limit_applies_to_scan(root)
        {
            return None;
        }
        let latched = registry::lookup((*rte).relid)?;
        // No query pathkeys left means every ORDER BY column is fixed by an
        // equality: any order of the key index will do.
        let any_order = (*root).query_pathkeys.is_null();
        let cheapest =
            list_iter::<pg_sys::Path>((*rel).pathlist).map(|p| (*p).total_cost).fold(f64::INFINITY, f64::min);
        let mut best = best_key_index_path((*rel).pathlist, root, latched.key.index, any_order);
        if best.is_null() {
            // add_path may have pruned the key index path as too expensive
            // (a tiny table, an order made moot): build the index paths
            // again on their own, keep ours, and put the real list back.
            let (pathlist, partial) = ((*rel).pathlist, (*rel).partial_pathlist);
            (*rel).pathlist = std::ptr::null_mut();
            (*rel).partial_pathlist = std::ptr::null_mut();
            pg_sys::create_index_paths(root, rel);
            best = best_key_index_path((*rel).pathlist, root, latched.key.index, any_order);
            (*rel).pathlist = pathlist;
            (*rel).partial_pathlist = partial;
        }
        if best.is_null() {
            return None;
        }
        // We fetch heap tuples ourselves, so an index-only path becomes a
        // plain index scan (same quals, same order).
        let child = pg_sys::palloc(std::mem::size_of::<pg_sys::IndexPath>()) as *mut pg_sys::IndexPath;
        std::ptr::copy_nonoverlapping(best, child, 1);
        (*child).path.pathtype = pg_sys::NodeTag::T_IndexScan;

        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        let path = &mut (*cp).path;
        path.type_ = pg_sys::NodeTag::T_CustomPath;
        path.pathtype = pg_sys::NodeTag::T_CustomScan;
        path.parent = rel;
        path.pathtarget = (*rel).reltarget;
        path.param_info = std::ptr::null_mut();
        path.parallel_aware = false;
        path.parallel_safe = false;
        path.parallel_workers = 0;
        path.rows = (*best).path.rows;
        path.startup_cost = 0.0;
        path.total_cost = cheapest.min((*best).path.total_cost) * 0.5;
        path.pathkeys = (*best).path.pathkeys;
        (*cp).flags = 0;
        (*cp).custom_paths = pg_sys::lappend(std::ptr::null_mut(), child as *mut std::ffi::c_void);
        (*cp).custom_private = std::ptr::null_mut();
        (*cp).methods = &PATH_METHODS.0;
        Some(cp as *mut pg_sys::Path)
    }
}

/// The cheapest unparameterized path on the key index whose order serves
/// the query.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn best_key_index_path(
    paths: *mut List,
    root: *mut pg_sys::PlannerInfo,
    index: pg_sys::Oid,
    any_order: bool,
) -> *mut pg_sys::IndexPath {
    let mut best: *mut pg_sys::IndexPath = std::ptr::null_mut();
    // SAFETY: per contract; paths are checked by tag before the cast.
    unsafe {
        for p in list_iter::<pg_sys::Path>(paths) {
            if tag(p as *const Node) != pg_sys::NodeTag::T_IndexPath {
                continue;
            }
            let ip = p as *mut pg_sys::IndexPath;
            if (*(*ip).indexinfo).indexoid != index
                || !(*p).param_info.is_null()
                || !(any_order || pg_sys::pathkeys_contained_in((*root).query_pathkeys, (*p).pathkeys))
            {
                continue;
            }
            if best.is_null() || (*p).total_cost < (*best).path.total_cost {
                best = ip;
            }
        }
    }
    best
}

fn integer(v: i32) -> *mut std::ffi::c_void {
    // SAFETY: makeInteger pallocs a node.
    unsafe { pg_sys::makeInteger(v) as *mut std::ffi::c_void }
}

#[pg_guard]
unsafe extern "C-unwind" fn plan_custom_path(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut List,
    _clauses: *mut List,
    custom_plans: *mut List,
) -> *mut pg_sys::Plan {
    // SAFETY (whole body): the planner hands us the plan of our one child
    // path, an IndexScan built by create_indexscan_plan; we copy what we
    // need from it into a CustomScan.
    unsafe {
        let mut child = list_iter::<pg_sys::IndexScan>(custom_plans).next().expect("one child plan");
        // Pseudoconstant quals (`k = 1 AND k = 2`) put a gating Result over
        // the index scan; our own plan gets the same gate from the planner,
        // so look through it.
        if tag(child as *const Node) == pg_sys::NodeTag::T_Result {
            child = (*(child as *mut pg_sys::Result)).plan.lefttree as *mut pg_sys::IndexScan;
        }
        assert_eq!(tag(child as *const Node), pg_sys::NodeTag::T_IndexScan, "PgkvxLimitScan wraps an index scan");
        let cs = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()) as *mut pg_sys::CustomScan;
        (*cs).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        (*cs).scan.plan.targetlist = tlist;
        // The index scan's filter: quals the index does not enforce.
        (*cs).scan.plan.qual = (*child).scan.plan.qual;
        (*cs).scan.scanrelid = (*rel).relid;
        (*cs).flags = (*best_path).flags;

        // custom_exprs: indexqual (index-column form, for scan keys), then
        // indexqualorig (table-column form, for EXPLAIN), then the LIMIT
        // and OFFSET expressions of this query level.  setrefs fixes them
        // all up, and copyObject keeps them in the plan cache.
        let parse = (*root).parse;
        let nquals = if (*child).indexqual.is_null() { 0 } else { (*(*child).indexqual).length };
        let mut exprs = pg_sys::list_concat_copy((*child).indexqual, (*child).indexqualorig);
        let has_count = !(*parse).limitCount.is_null();
        let has_offset = !(*parse).limitOffset.is_null();
        if has_count {
            exprs = pg_sys::lappend(exprs, pg_sys::copyObjectImpl((*parse).limitCount as *const _));
        }
        if has_offset {
            exprs = pg_sys::lappend(exprs, pg_sys::copyObjectImpl((*parse).limitOffset as *const _));
        }
        (*cs).custom_exprs = exprs;
        let forward = (*child).indexorderdir != pg_sys::ScanDirection::BackwardScanDirection;
        let mut private = std::ptr::null_mut();
        for v in
            [(*child).indexid.to_u32() as i32, i32::from(forward), nquals, i32::from(has_count), i32::from(has_offset)]
        {
            private = pg_sys::lappend(private, integer(v));
        }
        (*cs).custom_private = private;
        (*cs).methods = &super::exec::SCAN_METHODS.0;
        cs as *mut pg_sys::Plan
    }
}
