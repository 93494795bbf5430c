//! The statement guard: executor hooks that run the read protocol once per
//! statement over every `PgkvxLimitScan` in its plan.
//!
//! Every expression a statement evaluates — the guarded scans, filters and
//! their subqueries, joins to other tables, init plans, target lists,
//! functions that read tables — must see one snapshot consistent with the
//! rows returned.  So the protocol decides the snapshot before anything
//! runs, and a retry runs the whole statement again:
//!
//! - fenced: at executor start, before any node is initialised, wait for
//!   the writers in flight in the declared spans, fold them into the
//!   statement's snapshot, and start the executor at that snapshot.  Rows
//!   then stream.  Statements that cannot run twice (side effects, row
//!   locks, volatile functions, scrollable or holdable cursors) and results
//!   too large to hold back always read fenced.
//! - optimistic: start at the statement's snapshot; on the first run, run
//!   the plan to the end into a buffer, then validate the spans the guarded
//!   scans touched.  Clean: hand the rows on.  A conflict: wait for the
//!   holders, run the statement again (a second executor for the same plan)
//!   at the snapshot with them folded in, validate again; after
//!   `pgkvx.optimistic_retries` such attempts, or if the result outgrows
//!   the buffer, fall back to fenced, again in a second executor.
//!   Before buffering many rows, an optimistic read first checks its
//!   declared spans: when they are clean it streams at once.
//! - off: nothing; the nodes only pass rows on.

use super::buffer::{BufferDest, HeldRows};
use super::node::{self, ReadPath, StatementReport};
use super::plan_data::GuardPlan;
use crate::errors::{self, raw};
use crate::guc;
use crate::latch::protocol::ReadMode;
use crate::latch::{Footprint, Xid};
use crate::pg::{list_iter, node_tag};
use crate::read::admit;
use crate::read::run::{self, ReadDecision, ReadStrategy, Reader};
use crate::read::snapshot::{self, BaseSnapshot};
use crate::read::span::{self, KeyQual};
use crate::registry;
use crate::shmem::{backend, table};
use pgrx::pg_sys::{self, Node, QueryDesc};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::rc::Rc;

/// Where a statement's rows come from when it runs.
enum RowSource {
    /// Its own executor, as usual (fenced, off, or clean declared spans).
    Plan,
    /// Optimistic and not yet run: the first run reads into a buffer.
    Pending,
    /// The validated rows of an optimistic attempt.
    Held(HeldRows),
    /// A second executor at another snapshot, streaming (fenced fallback).
    Second(*mut QueryDesc),
}

struct GuardedStatement {
    qd: *mut QueryDesc,
    source: RowSource,
    report: Rc<RefCell<StatementReport>>,
    /// The statement's snapshot as the protocol sees it (optimistic).
    base: Option<BaseSnapshot>,
    /// We replaced the statement's snapshot: it must be the active one
    /// while the statement runs, for functions that read tables.
    swapped: bool,
    /// The second executor has run ExecutorFinish.
    second_finished: bool,
    eflags: i32,
    /// The first statement to read at a REPEATABLE READ transaction's
    /// snapshot (optimistic: still to validate).
    first_fixed_read: bool,
}

thread_local! {
    /// The guarded statements whose executors are live, innermost last.
    /// Each is a leaked Box, owned by this list: the list is borrowed only
    /// to find, add or remove one, never while Postgres runs, so an ERROR
    /// anywhere leaves it usable.
    static STATEMENTS: RefCell<Vec<*mut GuardedStatement>> = const { RefCell::new(Vec::new()) };
}

/// The guarded statement of `qd`.  The pointer stays valid until the
/// statement is taken (ExecutorEnd) or forgotten (its executor's memory
/// goes), neither of which can happen while one of its own hooks runs.
fn statement(qd: *mut QueryDesc) -> Option<*mut GuardedStatement> {
    STATEMENTS.with(|s| {
        // SAFETY: every pointer in the list is a live leaked Box.
        s.try_borrow().ok()?.iter().rev().copied().find(|&st| unsafe { (*st).qd } == qd)
    })
}

fn add_statement(st: GuardedStatement) -> *mut GuardedStatement {
    let p = Box::into_raw(Box::new(st));
    STATEMENTS.with(|s| s.borrow_mut().push(p));
    p
}

/// Removes `qd`'s statement from the list and hands back its ownership.
fn take_statement(qd: *mut QueryDesc) -> Option<Box<GuardedStatement>> {
    STATEMENTS.with(|s| {
        let mut s = s.try_borrow_mut().ok()?;
        // SAFETY: every pointer in the list is a live leaked Box.
        let i = s.iter().position(|&st| unsafe { (*st).qd } == qd)?;
        // SAFETY: removed from the list, so this is the only owner.
        Some(unsafe { Box::from_raw(s.remove(i)) })
    })
}

static mut PREV_START: pg_sys::ExecutorStart_hook_type = None;
static mut PREV_RUN: pg_sys::ExecutorRun_hook_type = None;
static mut PREV_FINISH: pg_sys::ExecutorFinish_hook_type = None;
static mut PREV_END: pg_sys::ExecutorEnd_hook_type = None;

unsafe extern "C-unwind" {
    // nodes/nodeFuncs.h; not in pgrx's bindings.  Called only through the
    // FFI boundary guard.
    fn planstate_tree_walker(
        planstate: *mut pg_sys::PlanState,
        walker: Option<unsafe extern "C-unwind" fn(*mut pg_sys::PlanState, *mut std::ffi::c_void) -> bool>,
        context: *mut std::ffi::c_void,
    ) -> bool;
}

pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe {
        PREV_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
        PREV_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(executor_run);
        PREV_FINISH = pg_sys::ExecutorFinish_hook;
        pg_sys::ExecutorFinish_hook = Some(executor_finish);
        PREV_END = pg_sys::ExecutorEnd_hook;
        pg_sys::ExecutorEnd_hook = Some(executor_end);
    }
}

// ---- finding the guarded scans ---------------------------------------------

/// Every `PgkvxLimitScan` plan node of a statement.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
unsafe fn guard_plans(stmt: *mut pg_sys::PlannedStmt) -> Vec<*mut pg_sys::CustomScan> {
    /// # Safety
    /// `p` is a valid plan tree (or NULL).
    unsafe fn walk(p: *mut pg_sys::Plan, out: &mut Vec<*mut pg_sys::CustomScan>) {
        if p.is_null() {
            return;
        }
        // SAFETY: per contract; each cast follows a tag check.
        unsafe {
            let lists: &[*mut pg_sys::List] = match node_tag(p as *const Node) {
                pg_sys::NodeTag::T_CustomScan => {
                    let cs = p as *mut pg_sys::CustomScan;
                    if std::ptr::eq((*cs).methods, &super::node::SCAN_METHODS.0) {
                        out.push(cs);
                    }
                    &[(*cs).custom_plans]
                }
                pg_sys::NodeTag::T_Append => &[(*(p as *mut pg_sys::Append)).appendplans],
                pg_sys::NodeTag::T_MergeAppend => &[(*(p as *mut pg_sys::MergeAppend)).mergeplans],
                pg_sys::NodeTag::T_BitmapAnd => &[(*(p as *mut pg_sys::BitmapAnd)).bitmapplans],
                pg_sys::NodeTag::T_BitmapOr => &[(*(p as *mut pg_sys::BitmapOr)).bitmapplans],
                pg_sys::NodeTag::T_SubqueryScan => {
                    walk((*(p as *mut pg_sys::SubqueryScan)).subplan, out);
                    &[]
                }
                _ => &[],
            };
            for &l in lists {
                for c in list_iter::<pg_sys::Plan>(l) {
                    walk(c, out);
                }
            }
            walk((*p).lefttree, out);
            walk((*p).righttree, out);
        }
    }
    let mut out = Vec::new();
    // SAFETY: per contract; subplans (init plans, subqueries, CTEs) are
    // all in the statement's list.
    unsafe {
        walk((*stmt).planTree, &mut out);
        for sp in list_iter::<pg_sys::Plan>((*stmt).subplans) {
            walk(sp, &mut out);
        }
    }
    out
}

#[pg_guard]
unsafe extern "C-unwind" fn collect_nodes(ps: *mut pg_sys::PlanState, cx: *mut std::ffi::c_void) -> bool {
    // SAFETY: called by planstate_tree_walker with our Vec as context.
    unsafe {
        if node::is_ours(ps) {
            (*(cx as *mut Vec<*mut pg_sys::CustomScanState>)).push(ps as *mut pg_sys::CustomScanState);
        }
        pg_sys::ffi::pg_guard_ffi_boundary(|| planstate_tree_walker(ps, Some(collect_nodes), cx))
    }
}

/// Every `PgkvxLimitScan` node of a started executor.
///
/// # Safety
/// `qd` has been started.
unsafe fn guard_nodes(qd: *mut QueryDesc) -> Vec<*mut pg_sys::CustomScanState> {
    let mut out: Vec<*mut pg_sys::CustomScanState> = Vec::new();
    // SAFETY: per contract; the walker only reads the tree.
    unsafe { collect_nodes((*qd).planstate, &mut out as *mut _ as *mut std::ffi::c_void) };
    out
}

// ---- values known before the statement runs --------------------------------

/// Evaluates `expr` with the statement's parameters when it needs nothing
/// the statement computes (no PARAM_EXEC, no subplan, no Vars).
///
/// # Safety
/// `expr` is a valid expression; `params` the statement's (or NULL).
unsafe fn eval_at_start(expr: *mut pg_sys::Expr, params: pg_sys::ParamListInfo) -> Option<(pg_sys::Datum, bool)> {
    // SAFETY: per contract; a standalone context, freed before returning.
    unsafe {
        if !known_at_start(expr) {
            return None;
        }
        let econtext = pg_sys::CreateStandaloneExprContext();
        (*econtext).ecxt_param_list_info = params;
        let state = pg_sys::ExecInitExpr(expr, std::ptr::null_mut());
        let mut isnull = false;
        let v = errors::pass(|| raw::eval_expr(state, econtext, &mut isnull));
        // By-reference values live in the caller's context: the per-query
        // context of the standalone ExprContext goes with FreeExprContext.
        let v = if isnull { v } else { copy_datum(v, pg_sys::exprType(expr as *mut Node)) };
        pg_sys::FreeExprContext(econtext, true);
        Some((v, isnull))
    }
}

/// Whether `expr` needs nothing the statement computes (no PARAM_EXEC --
/// an init plan's or a CTE's result --, no subplan, no Vars).
///
/// # Safety
/// `expr` is a valid expression.
unsafe fn known_at_start(expr: *mut pg_sys::Expr) -> bool {
    // SAFETY: per contract; the walkers only read.
    unsafe {
        pg_sys::pull_paramids(expr).is_null()
            && !pg_sys::contain_subplans(expr as *mut Node)
            && !pg_sys::contain_var_clause(expr as *mut Node)
    }
}

/// Whether every bound of every guarded scan is known before the
/// statement runs.  When one is not (a cursor read from a table by a CTE
/// or a subquery), a fence computed at executor start could only span the
/// whole table: it waits for the scan to start instead.
///
/// # Safety
/// `guards` are plan nodes of ours.
unsafe fn bounds_known_at_start(guards: &[*mut pg_sys::CustomScan]) -> bool {
    // SAFETY: per contract.
    unsafe { guards.iter().all(|&g| list_iter::<pg_sys::Expr>((*g).custom_exprs).all(|e| known_at_start(e))) }
}

/// A copy of `v` (of type `typid`) in the current memory context.
///
/// # Safety
/// `v` is a valid non-null datum of `typid`.
unsafe fn copy_datum(v: pg_sys::Datum, typid: pg_sys::Oid) -> pg_sys::Datum {
    // SAFETY: per contract.
    unsafe {
        let mut len = 0i16;
        let mut byval = false;
        pg_sys::get_typlenbyval(typid, &mut len, &mut byval);
        if byval {
            return v;
        }
        let size = match len {
            -1 => return pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(v.cast_mut_ptr())),
            -2 => std::ffi::CStr::from_ptr(v.cast_mut_ptr()).to_bytes_with_nul().len(),
            n => n as usize,
        };
        let p = pg_sys::palloc(size);
        std::ptr::copy_nonoverlapping(v.cast_mut_ptr::<u8>(), p as *mut u8, size);
        pg_sys::Datum::from(p)
    }
}

/// D of one guarded scan as known before the statement runs.
///
/// # Safety
/// `cs` is one of our plan nodes; `params` the statement's.
unsafe fn declared_at_start(
    cs: *mut pg_sys::CustomScan,
    params: pg_sys::ParamListInfo,
) -> Option<(GuardPlan, Footprint)> {
    // SAFETY: per contract.
    unsafe {
        let plan = GuardPlan::from_list((*cs).custom_private)?;
        let latched = registry::lookup(plan.relid)?;
        let quals: Vec<KeyQual> = plan
            .bounds
            .iter()
            .zip(list_iter::<pg_sys::Expr>((*cs).custom_exprs))
            .filter_map(|(b, e)| {
                let (value, isnull) = eval_at_start(e, params)?;
                Some(KeyQual { col: b.col as usize, strategy: b.strategy, value, typid: b.typid, isnull })
            })
            .collect();
        let d = span::declared(&latched.key, quals);
        let rel = backend::rel_id(plan.relid);
        Some((plan, vec![(rel, d)]))
    }
}

/// At most how many rows the statement returns, if that is known before
/// it runs: a top-level LIMIT, or else the planner's estimate.
///
/// # Safety
/// `stmt` is a valid PlannedStmt; `params` its parameters.
unsafe fn rows_wanted(stmt: *mut pg_sys::PlannedStmt, params: pg_sys::ParamListInfo) -> Option<u64> {
    // SAFETY: per contract.
    unsafe {
        let top = (*stmt).planTree;
        if node_tag(top as *const Node) == pg_sys::NodeTag::T_Limit {
            let l = top as *mut pg_sys::Limit;
            if !(*l).limitCount.is_null() {
                let int = |e: *mut Node| -> Option<u64> {
                    if e.is_null() {
                        return Some(0);
                    }
                    let (v, isnull) = eval_at_start(e as *mut pg_sys::Expr, params)?;
                    Some(if isnull { 0 } else { (v.value() as i64).max(0) as u64 })
                };
                if let (Some(c), Some(o)) = (int((*l).limitCount), int((*l).limitOffset)) {
                    return Some(c.saturating_add(o));
                }
            }
        }
        let est = (*top).plan_rows;
        (est.is_finite() && est < 1e12).then(|| est.ceil().max(1.0) as u64)
    }
}

// ---- the hooks ---------------------------------------------------------------

/// Forgets a statement whose executor memory goes away (after an ERROR,
/// when ExecutorEnd never runs).  Its snapshot went with the resource
/// owner; only our memory is left to free.
#[pg_guard]
unsafe extern "C-unwind" fn forget_statement(arg: *mut std::ffi::c_void) {
    drop(take_statement(arg as *mut QueryDesc));
}

// The previous hooks, or the standard functions, as plain C calls: an
// ERROR in them longjmps to the caller's jump buffer (see errors.rs).

unsafe fn prev_start(qd: *mut QueryDesc, eflags: i32) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_START {
            Some(f) => f(qd, eflags),
            None => raw::standard_ExecutorStart(qd, eflags),
        }
    }
}

unsafe fn prev_run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_RUN {
            Some(f) => f(qd, dir, count, once),
            None => raw::standard_ExecutorRun(qd, dir, count, once),
        }
    }
}

unsafe fn prev_finish(qd: *mut QueryDesc) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_FINISH {
            Some(f) => f(qd),
            None => raw::standard_ExecutorFinish(qd),
        }
    }
}

unsafe fn prev_end(qd: *mut QueryDesc) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_END {
            Some(f) => f(qd),
            None => raw::standard_ExecutorEnd(qd),
        }
    }
}

/// Refuses to pretend on a hot standby: its latch table is empty, and its
/// snapshots keep in-progress xids where reads of ours do not look.
fn refuse_on_standby() {
    // SAFETY: a plain read of recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "pgkvx cannot protect LIMIT scans of latched tables on a hot standby",
            "Read from the primary, or SET pgkvx.scan_mode = off to read without the no-skip guarantee.",
        );
    }
}

/// Says so (per `pgkvx.unprotected_reads`) when a guarded table's writes
/// can escape its latches: the read runs, but it cannot keep its promise.
///
/// # Safety
/// `guards` are plan nodes of ours.
unsafe fn report_unprotected(guards: &[*mut pg_sys::CustomScan]) {
    if guc::UNPROTECTED_READS.get() == guc::Unprotected::Allow {
        return;
    }
    for &g in guards {
        // SAFETY: per contract.
        let Some(plan) = (unsafe { GuardPlan::from_list((*g).custom_private) }) else { continue };
        if let Some(latched) = registry::lookup(plan.relid) {
            admit::warn_if_exposed(&latched);
        }
    }
}

/// ExecutorStart.  Statements with no guarded scan pass straight on.
#[pg_guard]
unsafe extern "C-unwind" fn executor_start(qd: *mut QueryDesc, eflags: i32) {
    // SAFETY: the executor's QueryDesc; see errors.rs for the boundary.
    unsafe { errors::rethrow_pending(|| start_statement(qd, eflags)) }
}

/// # Safety
/// `qd` is the QueryDesc ExecutorStart was called with.
unsafe fn start_statement(qd: *mut QueryDesc, eflags: i32) {
    // SAFETY (whole body): the executor's QueryDesc, before and after the
    // standard start.
    unsafe {
        snapshot::note_transaction_snapshot();
        let explain_only = eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0;
        let first_fixed_read = !explain_only && snapshot::mark_fixed_read();
        let stmt = (*qd).plannedstmt;
        let guards =
            if explain_only || crate::shmem::table_if_attached().is_none() { Vec::new() } else { guard_plans(stmt) };
        if guards.is_empty() {
            errors::pass(|| prev_start(qd, eflags));
            return;
        }
        let params = (*qd).params;
        let restartable = (*stmt).commandType == pg_sys::CmdType::CMD_SELECT
            && !(*stmt).hasModifyingCTE
            && (*stmt).rowMarks.is_null()
            && eflags & pg_sys::EXEC_FLAG_BACKWARD as i32 == 0
            && guards.iter().all(|&g| GuardPlan::from_list((*g).custom_private).is_some_and(|p| p.restartable));
        let want = if restartable { rows_wanted(stmt, params) } else { None };
        let Some(mut strategy) = run::choose_mode(want) else {
            // off: plain Postgres.
            errors::pass(|| prev_start(qd, eflags));
            attach(qd, RowSource::Plan, ReadPath::Off, None, false, eflags, false);
            return;
        };
        refuse_on_standby();
        report_unprotected(&guards);
        if !restartable {
            strategy = ReadStrategy { mode: ReadMode::Fenced, declared_first: false, first_fixed_read: false };
        }
        strategy.first_fixed_read = first_fixed_read;
        let declared = || -> Footprint {
            guards.iter().filter_map(|&g| declared_at_start(g, params)).flat_map(|(_, fp)| fp).collect()
        };
        let mut base = BaseSnapshot::of((*qd).snapshot, snapshot::after_for_statement());
        base.reading(
            guards.iter().filter_map(|&g| GuardPlan::from_list((*g).custom_private)).map(|p| backend::rel_id(p.relid)),
        );
        match strategy.mode {
            ReadMode::Fenced if !bounds_known_at_start(&guards) => {
                // Each guarded scan fences when it starts, on its bounds as
                // they are then (node::fence_at_start).
                let after = snapshot::after_for_statement();
                // Folded into in place when a scan starts: a copy no other
                // statement holds, active while the statement runs.
                let private = snapshot::private_copy((*qd).snapshot);
                pg_sys::UnregisterSnapshot((*qd).snapshot);
                (*qd).snapshot = private;
                errors::pass(|| prev_start(qd, eflags));
                attach(qd, RowSource::Plan, ReadPath::FencedAtScan, None, true, eflags, false);
                for n in guard_nodes(qd) {
                    node::runtime(n).fence_at_start = Some(after);
                }
            }
            ReadMode::Fenced => {
                let ran = run::run_protocol(&mut run::NeverBuffers, base, &mut || declared(), strategy, "LIMIT scan");
                let ReadDecision::Stream { pulled } = ran.decision else { unreachable!("fenced reads never buffer") };
                let mut b = ran.base;
                let swapped = !pulled.is_empty() || b.snap != (*qd).snapshot;
                if swapped {
                    let template = b.spliced(&pulled);
                    if first_fixed_read {
                        adopt_for_transaction(template, &pulled, &guards);
                    }
                    let new = pg_sys::RegisterSnapshot(template);
                    pg_sys::UnregisterSnapshot((*qd).snapshot);
                    (*qd).snapshot = new;
                }
                b.release();
                errors::pass(|| prev_start(qd, eflags));
                let st = attach(qd, RowSource::Plan, ReadPath::Fenced, None, swapped, eflags, false);
                st.borrow_mut().report = ran.report;
                st.borrow_mut().wait_us = ran.wait_us;
            }
            ReadMode::Optimistic
                if strategy.declared_first && {
                    let fp = declared();
                    let view = base.view(&[]);
                    let clean = table().check_footprint(&fp, &view, &snapshot::committed, &mut |_| {}).clean();
                    backend::count(crate::latch::Stat::Validations, 1);
                    clean
                } =>
            {
                errors::pass(|| prev_start(qd, eflags));
                let st = attach(qd, RowSource::Plan, ReadPath::Streamed, None, false, eflags, false);
                st.borrow_mut().report.validations = 1;
                st.borrow_mut().report.streamed = true;
            }
            ReadMode::Optimistic => {
                errors::pass(|| prev_start(qd, eflags));
                attach(qd, RowSource::Pending, ReadPath::Optimistic, Some(base), false, eflags, first_fixed_read);
            }
        }
    }
}

/// Registers a started statement and shows its report to its nodes.
///
/// # Safety
/// `qd` has been started.
unsafe fn attach(
    qd: *mut QueryDesc,
    source: RowSource,
    mode: ReadPath,
    base: Option<BaseSnapshot>,
    swapped: bool,
    eflags: i32,
    first_fixed_read: bool,
) -> Rc<RefCell<StatementReport>> {
    let report = Rc::new(RefCell::new(StatementReport { mode, ..Default::default() }));
    // SAFETY: per contract.
    unsafe {
        for n in guard_nodes(qd) {
            node::runtime(n).statement = Some(report.clone());
        }
        let cb = pg_sys::MemoryContextAlloc(
            (*(*qd).estate).es_query_cxt,
            std::mem::size_of::<pg_sys::MemoryContextCallback>(),
        ) as *mut pg_sys::MemoryContextCallback;
        (*cb).func = Some(forget_statement);
        (*cb).arg = qd as *mut std::ffi::c_void;
        (*cb).next = std::ptr::null_mut();
        pg_sys::MemoryContextRegisterResetCallback((*(*qd).estate).es_query_cxt, cb);
    }
    add_statement(GuardedStatement {
        qd,
        source,
        report: report.clone(),
        base,
        swapped,
        second_finished: false,
        eflags,
        first_fixed_read,
    });
    report
}

/// The guarded scans of a started statement's plan.
///
/// # Safety
/// `qd` has been started.
unsafe fn guards_of(qd: *mut QueryDesc) -> Vec<*mut pg_sys::CustomScan> {
    // SAFETY: per contract.
    unsafe { guard_plans((*qd).plannedstmt) }
}

/// The first statement to read at a REPEATABLE READ transaction's snapshot
/// waited for writers in flight at it: the transaction reads at `template`
/// (the snapshot with them folded in) from now on, this statement
/// included.  Where it cannot, the serialization failure stands.
///
/// # Safety
/// `template` is a spliced copy of the transaction snapshot; `guards` the
/// statement's guarded scans.
unsafe fn adopt_for_transaction(template: pg_sys::Snapshot, pulled: &[Xid], guards: &[*mut pg_sys::CustomScan]) {
    // SAFETY: per contract.
    unsafe {
        if snapshot::adopt_for_transaction(template) {
            return;
        }
        let rel = guards
            .first()
            .and_then(|&g| GuardPlan::from_list((*g).custom_private))
            .map_or(crate::latch::RelId::EMPTY, |p| backend::rel_id(p.relid));
        let xid = pulled.first().copied().unwrap_or(Xid::INVALID);
        run::serialization_failure(xid, rel, &crate::latch::Span::EMPTY, "LIMIT scan")
    }
}

/// Runs `f` (which calls Postgres only through [`errors::pass`]) with
/// `snap` as the active snapshot.
unsafe fn with_active<R>(snap: pg_sys::Snapshot, f: impl FnOnce() -> R) -> R {
    // SAFETY: pushing a registered snapshot and popping it again; an ERROR
    // in between resets the active snapshot stack at (sub)transaction abort.
    unsafe {
        pg_sys::PushActiveSnapshot(snap);
        let r = f();
        pg_sys::PopActiveSnapshot();
        r
    }
}

/// ExecutorRun.  Not `#[pg_guard]`: recursion (a function that calls
/// itself through SQL) passes through this frame at every level, so for
/// statements that are not ours it is as small as a C hook's and calls on
/// with a plain C call; it keeps no state, so an ERROR longjmps past it.
unsafe extern "C-unwind" fn executor_run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY: the executor's arguments, passed on unchanged.
    unsafe {
        if statement(qd).is_none() {
            prev_run(qd, dir, count, once)
        } else {
            guarded_run(qd, dir, count, once)
        }
    }
}

/// No `#[pg_guard]` either: [`errors::rethrow_pending`] catches every
/// unwind, and one guard frame less per level of recursion counts.
#[inline(never)]
unsafe fn guarded_run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY: a started statement of ours; see errors.rs for the boundary.
    unsafe { errors::rethrow_pending(|| run_statement(qd, dir, count, once)) }
}

/// Kept small: recursion through a guarded read passes through it at every
/// level, so the rare, heavier steps live in functions of their own.
///
/// # Safety
/// `qd` is a started statement.
unsafe fn run_statement(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY (whole body): the executor's QueryDesc, started by us; `st`
    // stays valid while its hooks run.
    unsafe {
        let Some(st) = statement(qd) else {
            return errors::pass(|| prev_run(qd, dir, count, once));
        };
        enum Step {
            Plain { swapped: bool },
            Pending,
            Held,
            Second(*mut QueryDesc),
        }
        let step = match &(*st).source {
            RowSource::Plan => Step::Plain { swapped: (*st).swapped },
            RowSource::Pending => Step::Pending,
            RowSource::Held(_) => Step::Held,
            RowSource::Second(q2) => Step::Second(*q2),
        };
        match step {
            // No Rust state is live here: a plain call, with no jump
            // buffer of ours on the stack of every recursion level.
            Step::Plain { swapped: false } => prev_run(qd, dir, count, once),
            Step::Plain { swapped: true } => {
                with_active((*(*qd).estate).es_snapshot, || prev_run(qd, dir, count, once));
            }
            Step::Pending => {
                // The first attempt runs here rather than inside the
                // protocol: functions the statement calls may recurse
                // through another guarded read, and the protocol's frames
                // would cost the stack at every level.
                let first = first_attempt(qd, once);
                validate(qd, st, first);
                run_statement(qd, dir, count, once);
            }
            Step::Held => send_held(qd, st, dir, count),
            Step::Second(q2) => {
                (*q2).dest = (*qd).dest;
                with_active((*(*q2).estate).es_snapshot, || {
                    errors::pass(|| raw::standard_ExecutorRun(q2, dir, count, once))
                });
                (*(*qd).estate).es_processed = (*(*q2).estate).es_processed;
            }
        }
    }
}

/// An optimistic statement's first run: its rows in a buffer, and the
/// footprint its guarded scans touched (None: the result outgrew the
/// buffer).
struct FirstAttempt {
    buffer: *mut BufferDest,
    footprint: Option<Footprint>,
}

/// Runs an optimistic statement's own executor into a new buffer, at the
/// statement's snapshot.  The run is on the stack of every level of
/// recursion through a guarded read, so the frames around it make no
/// guarded pgrx call (each inlines a jump buffer): the buffer is made, and
/// the footprint read, in functions of their own.
///
/// # Safety
/// `qd` is a started, optimistic, not yet run statement of ours.
#[inline(never)]
unsafe fn first_attempt(qd: *mut QueryDesc, once: bool) -> FirstAttempt {
    // SAFETY: per contract.
    unsafe {
        let buffer = new_buffer(qd);
        run_into(qd, (*buffer).as_dest(), once);
        let footprint = (!(*buffer).overflowed()).then(|| footprint(qd));
        FirstAttempt { buffer, footprint }
    }
}

/// An empty buffer for `qd`'s rows, in its executor's memory; its rows go
/// in a context of their own.
///
/// # Safety
/// `qd` has been started.
#[inline(never)]
unsafe fn new_buffer(qd: *mut QueryDesc) -> *mut BufferDest {
    // SAFETY: per contract; contexts of the executor's memory go with it.
    unsafe {
        let query_cxt = (*(*qd).estate).es_query_cxt;
        let cx = pg_sys::AllocSetContextCreateInternal(
            query_cxt,
            c"pgkvx held rows".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        let max_rows = guc::MAX_OPTIMISTIC_ROWS.get() as usize;
        let max_bytes = pg_sys::work_mem as usize * 1024;
        let old = pg_sys::MemoryContextSwitchTo(query_cxt);
        let buffer = BufferDest::new(cx, max_rows, max_bytes);
        pg_sys::MemoryContextSwitchTo(old);
        buffer
    }
}

/// Runs `qd`'s own executor to the end into `dest`.  A plain call: nothing
/// of ours on the stack needs dropping (the buffer lives in the executor's
/// memory), so an ERROR longjmps past with no jump buffer of ours on the
/// stack of every recursion level; the receiver left in place then is
/// never used again.
///
/// # Safety
/// `qd` is started and not yet run; `dest` a live receiver.
#[inline(never)]
unsafe fn run_into(qd: *mut QueryDesc, dest: *mut pg_sys::DestReceiver, once: bool) {
    // SAFETY: per contract.
    unsafe {
        let saved = (*qd).dest;
        (*qd).dest = dest;
        prev_run(qd, pg_sys::ScanDirection::ForwardScanDirection, 0, once);
        (*qd).dest = saved;
    }
}

/// Hands on held rows.  As standard_ExecutorRun, the receiver starts and
/// shuts down on every run, also one with no movement or at the end
/// (PL/pgSQL's and SPI's receivers count on it).
///
/// # Safety
/// `st` is `qd`'s entry, holding rows.
#[inline(never)]
unsafe fn send_held(qd: *mut QueryDesc, st: *mut GuardedStatement, dir: pg_sys::ScanDirection::Type, count: u64) {
    // SAFETY: per contract.
    unsafe {
        let RowSource::Held(held) = &mut (*st).source else { return };
        let n = held.send((*qd).dest, (*qd).tupDesc, dir, count);
        (*(*qd).estate).es_processed = n;
    }
}

/// The first run of an optimistic statement: attempts, validation, retries,
/// fallback.  Leaves the statement's source set to what its rows come from.
///
/// # Safety
/// `qd` is a started, optimistic, not yet run statement of ours, `st` its
/// entry.
#[inline(never)]
unsafe fn validate(qd: *mut QueryDesc, st: *mut GuardedStatement, first: FirstAttempt) {
    // SAFETY: per contract.
    unsafe {
        let Some(base) = (*st).base.take() else {
            errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "an optimistic statement lost its snapshot")
        };
        let eflags = (*st).eflags;
        let estate = (*qd).estate;
        let mut reader = OptimisticAttempts {
            qd,
            eflags,
            attempts: 0,
            buffer: first.buffer,
            first: Some(first.footprint),
            last_pulled: Vec::new(),
        };
        // Only a read that falls back to fenced needs its declared spans.
        let mut declared = || -> Footprint {
            guard_plans((*qd).plannedstmt)
                .into_iter()
                .filter_map(|g| declared_at_start(g, (*qd).params))
                .flat_map(|(_, fp)| fp)
                .collect()
        };
        let first_fixed_read = (*st).first_fixed_read;
        let strategy = ReadStrategy { mode: ReadMode::Optimistic, declared_first: false, first_fixed_read };
        let run::ProtocolResult { decision, report, wait_us, base } =
            run::run_protocol(&mut reader, base, &mut declared, strategy, "LIMIT scan");
        let mode = if report.overflowed {
            ReadPath::Overflowed
        } else if report.fell_back {
            ReadPath::FellBack
        } else {
            ReadPath::Optimistic
        };
        let mut base = base;
        let source = match decision {
            ReadDecision::Emit => {
                if first_fixed_read && !reader.last_pulled.is_empty() {
                    adopt_for_transaction(base.spliced(&reader.last_pulled), &reader.last_pulled, &guards_of(qd));
                }
                let rows = (*reader.buffer).take();
                let old = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
                let held = HeldRows::new(rows, (*qd).tupDesc);
                pg_sys::MemoryContextSwitchTo(old);
                RowSource::Held(held)
            }
            // Pulled-in holders are folded in even if more xids have been
            // assigned since the protocol checked the bound: a fresh
            // snapshot here would bring writers nobody checked.
            ReadDecision::Stream { pulled } => {
                let template = base.spliced(&pulled);
                if first_fixed_read && !pulled.is_empty() {
                    adopt_for_transaction(template, &pulled, &guards_of(qd));
                }
                RowSource::Second(start_second_executor(qd, template, (*qd).dest, eflags))
            }
        };
        base.release();
        (*st).source = source;
        let mut r = (*st).report.borrow_mut();
        r.mode = mode;
        r.report = report;
        r.wait_us = wait_us;
    }
}

/// Starts a second executor for `qd`'s plan at `snap` (registered by it),
/// in `qd`'s memory, sending to `dest`.
///
/// # Safety
/// `qd` is started; `snap` a valid MVCC snapshot or template.
unsafe fn start_second_executor(
    qd: *mut QueryDesc,
    snap: pg_sys::Snapshot,
    dest: *mut pg_sys::DestReceiver,
    eflags: i32,
) -> *mut QueryDesc {
    // SAFETY: per contract; the second executor's memory is a child of the
    // first's, so it goes with it at the latest.
    unsafe {
        let old = pg_sys::MemoryContextSwitchTo((*(*qd).estate).es_query_cxt);
        let q2 = pg_sys::CreateQueryDesc(
            (*qd).plannedstmt,
            (*qd).sourceText,
            snap,
            std::ptr::null_mut(),
            dest,
            (*qd).params,
            (*qd).queryEnv,
            (*qd).instrument_options,
        );
        pg_sys::MemoryContextSwitchTo(old);
        errors::pass(|| raw::standard_ExecutorStart(q2, eflags));
        q2
    }
}

/// Ends a second executor.
unsafe fn end_second_executor(q2: *mut QueryDesc, finished: bool) {
    // SAFETY: a second executor we started and have not ended.
    unsafe {
        errors::pass(|| {
            if !finished {
                raw::standard_ExecutorFinish(q2);
            }
            raw::standard_ExecutorEnd(q2);
        });
        pg_sys::FreeQueryDesc(q2);
    }
}

/// Optimistic attempts of one statement: the first runs its own executor,
/// later ones a second executor at the snapshot the protocol asks for.
struct OptimisticAttempts {
    qd: *mut QueryDesc,
    eflags: i32,
    attempts: u32,
    /// In the executor's memory.
    buffer: *mut BufferDest,
    /// The first attempt's footprint, run before the protocol started.
    first: Option<Option<Footprint>>,
    /// The holders folded into the snapshot of the latest attempt.
    last_pulled: Vec<Xid>,
}

/// The footprint of the guarded scans of a started executor that has run.
///
/// # Safety
/// `qd` has been started (and run).
#[inline(never)]
unsafe fn footprint(qd: *mut QueryDesc) -> Footprint {
    let mut fp = Footprint::new();
    // SAFETY: per contract.
    unsafe {
        for n in guard_nodes(qd) {
            let rt = node::runtime(n);
            let rel = rt.rel;
            for s in rt.touched(n) {
                fp.push((rel, s));
            }
        }
    }
    fp
}

impl Reader for OptimisticAttempts {
    fn read_buffered(&mut self, base: &BaseSnapshot, pulled: &[Xid]) -> Option<Footprint> {
        // The protocol's first read of an optimistic statement is the one
        // already run, at the statement's own snapshot.
        if let Some(first) = self.first.take() {
            self.attempts += 1;
            return first;
        }
        // SAFETY: our statement's QueryDesc; the buffer outlives each run.
        let fp = unsafe {
            (*self.buffer).clear();
            let dest = (*self.buffer).as_dest();
            let q2 = start_second_executor(self.qd, base.spliced(pulled), dest, self.eflags);
            with_active((*(*q2).estate).es_snapshot, || {
                errors::pass(|| raw::standard_ExecutorRun(q2, pg_sys::ScanDirection::ForwardScanDirection, 0, true))
            });
            let fp = footprint(q2);
            end_second_executor(q2, false);
            fp
        };
        self.attempts += 1;
        self.last_pulled = pulled.to_vec();
        // SAFETY: as above.
        (!unsafe { (*self.buffer).overflowed() }).then_some(fp)
    }
}

/// ExecutorFinish; like [`executor_run`], as small as a C hook for
/// statements that are not ours.
unsafe extern "C-unwind" fn executor_finish(qd: *mut QueryDesc) {
    // SAFETY: the executor's argument, passed on unchanged.
    unsafe {
        match statement(qd) {
            Some(st) if matches!((*st).source, RowSource::Second(_)) && !(*st).second_finished => guarded_finish(qd),
            _ => prev_finish(qd),
        }
    }
}

#[pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn guarded_finish(qd: *mut QueryDesc) {
    // SAFETY: finishing a second executor we started, then chaining.
    unsafe {
        errors::rethrow_pending(|| {
            if let Some(st) = statement(qd) {
                if let RowSource::Second(q2) = (*st).source {
                    (*st).second_finished = true;
                    errors::pass(|| raw::standard_ExecutorFinish(q2));
                }
            }
            errors::pass(|| prev_finish(qd));
        })
    }
}

/// ExecutorEnd; like [`executor_run`], as small as a C hook for statements
/// that are not ours.
unsafe extern "C-unwind" fn executor_end(qd: *mut QueryDesc) {
    // SAFETY: the executor's argument, passed on unchanged.
    unsafe {
        if statement(qd).is_some() {
            guarded_end(qd)
        } else {
            prev_end(qd)
        }
    }
}

#[pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn guarded_end(qd: *mut QueryDesc) {
    // SAFETY: ending what we started, then chaining.
    unsafe {
        errors::rethrow_pending(|| {
            if let Some(mut st) = take_statement(qd) {
                if let RowSource::Second(q2) = st.source {
                    end_second_executor(q2, st.second_finished);
                }
                if let Some(mut b) = st.base.take() {
                    b.release();
                }
            }
            errors::pass(|| prev_end(qd));
        })
    }
}
