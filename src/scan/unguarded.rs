//! A statement's plan with its guard node spliced out, for the executions
//! that have no use for the node.
//!
//! What a guard node does while its scan runs — noting how far the scan
//! got — serves two readers only: an optimistic statement that validates
//! after its first run (attempts.rs), and EXPLAIN ANALYZE.  A statement
//! whose protocol is done before its executor starts needs neither:
//! fenced with its bounds known, optimistic with its declared spans clean
//! (it streams), or `pgkvx.scan_mode = off`.  Yet it would pay for the
//! node on every execution: ExecInitCustomScan's two tuple descriptors
//! (a catalog lookup per column each), a slot and an expression context,
//! then a pass per row.  On a partitioned tail that is most of what
//! protection costs.
//!
//! So such an execution runs a second plan: the nodes above the guard
//! copied flat, the lowest of them pointing at the guard's own child.
//! Everything below the guard is the original plan's, and the guard hands
//! its child's rows up as they are (same columns, same slots), so the
//! executor builds and runs exactly what it would have under the guard.
//!
//! An execution that EXPLAIN ANALYZE watches keeps the node, so that it
//! shows what the node saw; so does one auto_explain will analyze.
//!
//! The second plan is made the first time an execution of a plan asks for
//! it, in that plan's own memory, and forgotten when that memory goes (a
//! cached plan released, a one-shot plan's portal dropped).  Only the
//! common shape is spliced: a single guard, below the top, reached from it
//! through nodes with one child (LIMIT, a projection, a sort, DISTINCT, a
//! material, an aggregate), with no init plans of its own.  Any other plan keeps its
//! node, which behaves the same, only dearer.

use super::guards::Guards;
use crate::pg::{list_nth, node_tag};
use pgrx::pg_sys::{self, Node, Plan, PlannedStmt};
use std::cell::RefCell;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

/// auto_explain was loaded before pgkvx: its ExecutorStart hook runs
/// inside ours, so a statement it will analyze is not yet marked
/// instrumented when ours decides.  (Loaded after, or by LOAD, its hook
/// runs first and marks the statement before ours looks.)
static AUTO_EXPLAIN_INSIDE: AtomicBool = AtomicBool::new(false);

/// Notes whether auto_explain was loaded before us; called from
/// `_PG_init`, before our executor hooks go in.
pub fn init() {
    AUTO_EXPLAIN_INSIDE.store(guc("auto_explain.log_analyze").is_some(), Ordering::Relaxed);
}

/// A setting's current value, None when no library defined it.
fn guc(name: &str) -> Option<String> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a lookup by name that returns NULL (missing_ok) rather than
    // raising; the value is copied before anything can change it.
    unsafe {
        let v = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
    }
}

/// Whether an EXPLAIN ANALYZE will watch a statement whose start is
/// deciding now: the statement marked instrumented, or auto_explain set to
/// analyze statements and running inside our hook (which then marks it).
/// The node stays for both, so that they show what it saw.
///
/// # Safety
/// `qd` is the QueryDesc ExecutorStart was called with.
pub unsafe fn watched(qd: *mut pg_sys::QueryDesc) -> bool {
    // SAFETY: the caller's contract: `qd` is the QueryDesc ExecutorStart was called with.
    if unsafe { (*qd).instrument_options } != 0 {
        return true;
    }
    AUTO_EXPLAIN_INSIDE.load(Ordering::Relaxed)
        && guc("auto_explain.log_analyze").as_deref() == Some("on")
        && guc("auto_explain.log_min_duration").and_then(|m| m.parse::<i64>().ok()).is_some_and(|m| m >= 0)
}

/// One plan's second plan, in the plan's memory.
#[repr(C)]
struct Spliced {
    /// Forgets the entry when the plan's memory goes.
    cb: pg_sys::MemoryContextCallback,
    stmt: *mut PlannedStmt,
    /// The plan it was made for: its top node and its guard.
    top: *mut Plan,
    guard: *mut pg_sys::CustomScan,
    /// NULL: the plan's guard cannot be spliced out.
    unguarded: *mut PlannedStmt,
}

type ByAddress = crate::fast_hash::Map<usize, *mut Spliced>;

thread_local! {
    /// Each plan asked about, by address, while its memory lives.
    static SPLICED: RefCell<ByAddress> = RefCell::new(ByAddress::default());
}

/// `stmt` without its guard node, if its shape allows (see the module
/// doc); `guards` are its guards as the statement decoded them.
///
/// # Safety
/// `stmt` is a valid, palloc'd PlannedStmt whose guards are `guards`.
pub unsafe fn plan_without_guard(stmt: *mut PlannedStmt, guards: &Guards) -> Option<*mut PlannedStmt> {
    let known = SPLICED.with(|s| s.borrow().get(&(stmt as usize)).copied());
    let guard = guards.0.first().map_or(std::ptr::null_mut(), |g| g.cs);
    // SAFETY: the caller's contract: `stmt` is a valid, palloc'd PlannedStmt whose guards are `guards`. An
    // entry lives as long as its plan's memory.
    unsafe {
        let e = match known {
            // Plans go with their memory, never one by one; should one
            // ever be freed alone and another made where it was, it is
            // told apart by its nodes.
            Some(e) if (*e).top == (*stmt).planTree && (*e).guard == guard => e,
            _ => remember(stmt, guards, guard),
        };
        let u = (*e).unguarded;
        (!u.is_null()).then_some(u)
    }
}

/// Works out `stmt`'s second plan and keeps it with the plan, marked with
/// its first guard `guard`.
///
/// # Safety
/// As [`plan_without_guard`]'s.
unsafe fn remember(stmt: *mut PlannedStmt, guards: &Guards, guard: *mut pg_sys::CustomScan) -> *mut Spliced {
    // SAFETY: the caller's contract: `stmt` is a valid, palloc'd PlannedStmt whose guards are `guards`. 's.
    // The plan's memory outlives every execution of
    // it, and the callback drops the entry before that memory goes.
    unsafe {
        let cxt = pg_sys::GetMemoryChunkContext(stmt as *mut c_void);
        let unguarded = splice(stmt, guards, cxt);
        let e = pg_sys::MemoryContextAllocZero(cxt, std::mem::size_of::<Spliced>()) as *mut Spliced;
        (*e).stmt = stmt;
        (*e).top = (*stmt).planTree;
        (*e).guard = guard;
        (*e).unguarded = unguarded;
        crate::pg::memcx::on_reset_with(cxt, &raw mut (*e).cb, forget, e as *mut c_void);
        SPLICED.with(|s| s.borrow_mut().insert(stmt as usize, e));
        e
    }
}

/// The plan's memory is going: so is its entry.  Cannot fail.
unsafe extern "C-unwind" fn forget(arg: *mut c_void) {
    let e = arg as *mut Spliced;
    // SAFETY: the entry remember() registered, still allocated while its
    // context's callbacks run.
    let stmt = unsafe { (*e).stmt } as usize;
    // At backend exit the map may be gone before the last contexts.
    let _ = SPLICED.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.get(&stmt) == Some(&e) {
                s.remove(&stmt);
            }
        }
    });
}

/// The size of a plan node that may sit above a spliced guard: one child,
/// on the left; None for every other kind.
fn flat_size(tag: pg_sys::NodeTag) -> Option<usize> {
    use std::mem::size_of;
    Some(match tag {
        pg_sys::NodeTag::T_Limit => size_of::<pg_sys::Limit>(),
        pg_sys::NodeTag::T_Result => size_of::<pg_sys::Result>(),
        pg_sys::NodeTag::T_Sort => size_of::<pg_sys::Sort>(),
        pg_sys::NodeTag::T_IncrementalSort => size_of::<pg_sys::IncrementalSort>(),
        pg_sys::NodeTag::T_Unique => size_of::<pg_sys::Unique>(),
        pg_sys::NodeTag::T_Material => size_of::<pg_sys::Material>(),
        // An aggregate over a batch (`count(*) FROM (… LIMIT n)`): its
        // grouping-set chain and its expressions stay the original's.
        pg_sys::NodeTag::T_Agg => size_of::<pg_sys::Agg>(),
        _ => return None,
    })
}

/// `stmt` with its one guard spliced out, allocated in `cxt`; NULL when
/// its shape does not allow.
///
/// # Safety
/// As [`plan_without_guard`]'s; `cxt` is the plan's memory.
unsafe fn splice(stmt: *mut PlannedStmt, guards: &Guards, cxt: pg_sys::MemoryContext) -> *mut PlannedStmt {
    let [guard] = guards.0.as_slice() else { return std::ptr::null_mut() };
    let target = guard.cs as *mut Plan;
    // SAFETY: the caller's contract: `stmt` is a valid, palloc'd PlannedStmt whose guards are `guards`. 's;
    // `cxt` is the plan's memory. Nodes of `stmt`'s plan, cast after their tags
    // are checked; the copies are plain structs whose pointers keep
    // pointing into the original plan, which outlives them.
    unsafe {
        let Some(child) = list_nth::<Plan>((*guard.cs).custom_plans, 0) else { return std::ptr::null_mut() };
        // The guard's init plans would be lost with it.
        if !(*target).initPlan.is_null() {
            return std::ptr::null_mut();
        }
        let mut above: Vec<(*mut Plan, usize)> = Vec::new();
        let mut p = (*stmt).planTree;
        while p != target {
            if p.is_null() || !(*p).righttree.is_null() {
                return std::ptr::null_mut();
            }
            let Some(size) = flat_size(node_tag(p as *const Node)) else { return std::ptr::null_mut() };
            above.push((p, size));
            p = (*p).lefttree;
        }
        // The top node's target list names the result's columns and marks
        // its junk ones (the planner labels only the top): a guard at the
        // top keeps its place.
        if above.is_empty() {
            return std::ptr::null_mut();
        }
        let mut below = child;
        for &(p, size) in above.iter().rev() {
            let c = pg_sys::MemoryContextAlloc(cxt, size) as *mut Plan;
            std::ptr::copy_nonoverlapping(p as *const u8, c as *mut u8, size);
            (*c).lefttree = below;
            below = c;
        }
        let s = pg_sys::MemoryContextAlloc(cxt, std::mem::size_of::<PlannedStmt>()) as *mut PlannedStmt;
        std::ptr::copy_nonoverlapping(stmt, s, 1);
        (*s).planTree = below;
        s
    }
}
