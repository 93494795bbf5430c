//! The `PgkvxLimitScan` executor node: begin, exec, end, rescan (in that
//! order, as in Postgres's own node*.c files), then mark/restore.  Its
//! EXPLAIN output is `explain.rs`'s, its state `runtime.rs`'s, and the cut
//! it applies to rows `cut.rs`'s rule.
//!
//! The node sits on top of the scan the planner chose for a latched table
//! and passes its rows on untouched.  What it adds is bookkeeping: after an
//! execution (at rescan, at restore, and when the statement validates) it
//! records the span of keys that execution touched — from the declared span
//! up to the row its scan examined last, when the scan runs in key order;
//! the whole declared span otherwise.  The read protocol itself runs for
//! the whole statement (`statement.rs`): it needs every guarded scan's
//! footprint and decides, before anything runs, the one snapshot every
//! expression of the statement sees.

use super::explain::explain;
use super::plan_data::{GuardPlan, StaticMethods, NAME};
use super::position::{key_source_of, position_of, ScanPosition};
use super::runtime::{
    cut_of_node, has_cut, note_key, seen_for, with_runtime, FenceAtStart, NodeRuntime, NodeState, Seen,
};
use crate::pg::raw;
use crate::pg::{list_iter, list_nth, make_list, node_tag};
use crate::read::run::CutRule;
use crate::registry;
use pgrx::pg_sys::{self, Node};
use pgrx::prelude::*;
use std::rc::Rc;

static SCAN_METHODS: StaticMethods<pg_sys::CustomScanMethods> =
    StaticMethods(pg_sys::CustomScanMethods { CustomName: NAME.as_ptr(), CreateCustomScanState: Some(create_state) });

static EXEC_METHODS: StaticMethods<pg_sys::CustomExecMethods> = StaticMethods(pg_sys::CustomExecMethods {
    CustomName: NAME.as_ptr(),
    BeginCustomScan: Some(begin),
    ExecCustomScan: Some(exec),
    EndCustomScan: Some(end),
    ReScanCustomScan: Some(rescan),
    MarkPosCustomScan: Some(mark_pos),
    RestrPosCustomScan: Some(restr_pos),
    EstimateDSMCustomScan: None,
    InitializeDSMCustomScan: None,
    ReInitializeDSMCustomScan: None,
    InitializeWorkerCustomScan: None,
    ShutdownCustomScan: None,
    ExplainCustomScan: Some(explain),
});

/// Makes plans with our node readable from serialized form (and findable
/// by name); called from `_PG_init`.
pub fn register() {
    // SAFETY: registering a static method table once, at load.
    unsafe { pg_sys::RegisterCustomScanMethods(&SCAN_METHODS.0) };
    // Cached now, in the postmaster, for every backend it forks.
    let _ = super::plan_data::scan_methods();
}

/// A plain old frame, like [`exec`]: palloc0's ERROR passes straight on.
unsafe extern "C-unwind" fn create_state(cscan: *mut pg_sys::CustomScan) -> *mut Node {
    // SAFETY: the executor passes our own plan node; the methods are static.
    unsafe { NodeState::alloc(cscan, &EXEC_METHODS.0) }
}

// ---- begin -----------------------------------------------------------------

/// No `#[pg_guard]`: [`crate::pg::boundary::rethrow_pending`] catches every
/// unwind.
unsafe extern "C-unwind" fn begin(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    // SAFETY: see pg/boundary.rs.
    unsafe { crate::pg::boundary::rethrow_pending(|| begin_node(node, estate, eflags)) }
}

/// # Safety
/// The arguments of BeginCustomScan.
unsafe fn begin_node(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    // SAFETY (whole body): executor-initialisation protocol; the plan is our
    // CustomScan, built by the planner with one child and our private list.
    unsafe {
        let ps = &raw mut (*node).ss.ps;
        let cs = (*ps).plan as *mut pg_sys::CustomScan;
        let (plan, latched) = super::starting::claim(cs, node, estate).unwrap_or_else(|| {
            let plan = GuardPlan::from_list((*cs).custom_private).unwrap_or_else(|| {
                crate::errors::raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    "this plan was made by another version of pgkvx; run the statement again to re-plan it",
                )
            });
            let latched = registry::lookup(plan.relid);
            (Rc::new(plan), latched)
        });
        let Some(child_plan) = list_nth::<pg_sys::Plan>((*cs).custom_plans, 0) else {
            crate::errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "a PgkvxLimitScan plan has no child plan")
        };
        let child = crate::pg::boundary::pass(|| raw::ExecInitNode(child_plan, estate, eflags));
        (*node).custom_ps = make_list([child]);
        // We hand up the child's own slots, so our result slots are of its
        // kind.  Left as the virtual slots of a CustomScan, a parent would
        // compile its expressions to read our rows without deforming them.
        let mut fixed = false;
        (*ps).resultops = raw::ExecGetResultSlotOps(child, &mut fixed);
        (*ps).resultopsfixed = fixed;
        (*ps).resultopsset = true;

        let explain_only = eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0;
        let position = match (&latched, &plan.stream) {
            _ if explain_only => ScanPosition::Anywhere,
            (Some(_), Some(s)) => {
                ScanPosition::Stream { attnos: s.resnos.iter().map(|&r| i32::from(r)).collect(), forward: s.forward }
            }
            // A tree's guard follows its stream, never a scan below it: the
            // parent's key does not name a partition's columns.
            (Some(l), None) if !plan.tree => position_of(child, &l.key),
            _ => ScanPosition::Anywhere,
        };
        let key_source = match (&position, &latched) {
            (ScanPosition::Anywhere, Some(l)) if !plan.tree && !explain_only => key_source_of(child, &l.key),
            _ => None,
        };
        // EvalPlanQual's copy of the plan re-checks one row at a time for
        // row locks, and no statement reads what it touched.  Its scan
        // hands a locked relation's row up from EvalPlanQual's own slot,
        // leaving its scan slot empty: nothing there to remember.
        let seen = match &latched {
            Some(l) if (*estate).es_epq_active.is_null() => seen_for(&position, key_source.as_ref(), &plan, &l.key),
            _ => Seen::Off,
        };
        NodeState::start(
            node,
            NodeRuntime {
                seen,
                key_source,
                rel: super::guards::latch_rel(&plan, latched.as_deref()),
                plan,
                latched,
                child,
                position,
                bounds: None,
                static_declared: None,
                started: false,
                last: std::ptr::null_mut(),
                touched: Default::default(),
                touched_later: Default::default(),
                statement: None,
                fence_at_start: None,
                epq: (*estate).es_epq_active,
                stopped: false,
                one_table: std::cell::Cell::new(None),
            },
        );
        // A bound with a subquery of its own joins the node's subplans as
        // its state is built: built now, as every other node's, so that
        // rescans and plan-state walks see it from the start.
        let plain = |e: *mut pg_sys::Expr| {
            matches!(node_tag(e as *const Node), pg_sys::NodeTag::T_Const | pg_sys::NodeTag::T_Param)
                || !pg_sys::contain_subplans(e as *mut Node)
        };
        if !list_iter::<pg_sys::Expr>((*cs).custom_exprs).all(plain) {
            with_runtime(node, |rt| rt.bound_states(node));
        }
        take_parents_cut(node, estate, cs);
        // Rows come straight from `exec_node`, not through ExecCustomScan:
        // one indirect call and one interrupt check fewer per row (the
        // child's ExecScan checks for interrupts at every row itself).
        // ExecInitCustomScan set ExecCustomScan before calling us, and
        // ExecInitNode installs whatever is here once we return, behind
        // its first-call and instrumentation wrappers.
        (*ps).ExecProcNode = Some(exec_node);
    }
}

/// EvalPlanQual's copy of a locked read stops where the read does: a
/// re-checked row's new version may carry a key past its cut.
///
/// # Safety
/// `node` has begun in `estate`, for plan `cs`.
unsafe fn take_parents_cut(
    node: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    cs: *mut pg_sys::CustomScan,
) {
    // SAFETY: the caller's contract; `es_epq_active` is null or the live
    // EvalPlanQual state whose parent executor runs the read.
    unsafe {
        let epq = (*estate).es_epq_active;
        if !epq.is_null() {
            super::runtime::set_cut(node, super::statement::cut_of((*epq).parentestate, cs));
        }
    }
}

// ---- exec ------------------------------------------------------------------

/// Every row of the guarded scan, as it comes.
///
/// This is the per-row path, so it stays as thin as C: it notes that the
/// scan has run and calls the child's own ExecProcNode.  It sets up no
/// error guard.  An ERROR in the child longjmps straight over this frame,
/// which is sound because the frame owns nothing with a destructor (a
/// "plain old frame"): nothing here needs unwinding.
unsafe extern "C-unwind" fn exec(node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: as exec_node's.
    unsafe { exec_node(node as *mut pg_sys::PlanState) }
}

/// [`exec`] as the node's own ExecProcNode (see begin_node); the same plain
/// old frame.
unsafe extern "C-unwind" fn exec_node(ps: *mut pg_sys::PlanState) -> *mut pg_sys::TupleTableSlot {
    let node = ps as *mut pg_sys::CustomScanState;
    // SAFETY: our node, set up by begin(); the child's ExecProcNode is the
    // function the executor installed for it (ExecInitNode always sets one).
    unsafe {
        // One lend before the child runs and one after: this runs per row.
        let (fence, child) = with_runtime(node, |rt| {
            let fence = rt.fence_at_start.is_some();
            rt.started |= !fence;
            (fence, rt.child)
        });
        if fence {
            fence_at_start(node);
            with_runtime(node, |rt| rt.started = true);
        }
        // What Postgres's inline ExecProcNode does first: a child whose
        // parameters changed (an inner scan of a nested loop) starts over.
        if !(*child).chgParam.is_null() {
            rescan_child(child);
        }
        let slot = ((*child).ExecProcNode.unwrap_unchecked())(child);
        // The cut is copied out only where there is one.
        let cut = if has_cut(node) { cut_of_node(node) } else { None };
        with_runtime(node, |rt| {
            rt.last = slot;
            let slot = match cut {
                Some(cut) => super::cut::cut_rows(rt, slot, cut),
                None => slot,
            };
            match &mut rt.seen {
                Seen::Off | Seen::StepBack => {}
                Seen::Tid { slot: scan_slot, tid } => {
                    // Cleared slots have an invalid TID: only rows are kept.
                    let t = (**scan_slot).tts_tid;
                    if t.ip_posid != 0 {
                        *tid = t;
                    }
                }
                Seen::Key { .. } => note_key(rt, slot),
            }
            slot
        })
    }
}

/// The first run of a scan whose statement fences when its scans start:
/// its bounds are known now (init plans and CTEs they read from have run
/// or run as they are evaluated).  The statement's snapshot cannot move any
/// more -- other scans may have read at it -- so waiting cannot show a
/// writer in flight at it in its declared span: a tail stops before the
/// first key of those writers (a tail reads their rows next time).  Any
/// other scan (a bounded span, a scan in no key order, a later statement
/// of a REPEATABLE READ transaction) waits for them instead, and fails
/// with 40001 when one committed.
#[pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn fence_at_start(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node, begun; see pg/boundary.rs.
    unsafe {
        crate::pg::boundary::rethrow_pending(|| {
            use crate::read::{run, snapshot};
            // The runtime is lent for this step only: the probe, the cut
            // rule and apply_cut borrow it themselves.
            let Some((FenceAtStart { after, sole_root }, rel, fp)) = with_runtime(node, |rt| {
                let start = rt.fence_at_start.take()?;
                let rel = rt.rel;
                let fp: pgkvx_latch::Footprint = rt.declared(node).spans.iter().map(|s| (rel, *s)).collect();
                Some((start, rel, fp))
            }) else {
                return;
            };
            let estate = (*node).ss.ps.state;
            let base = snapshot::BaseSnapshot::of((*estate).es_snapshot, after);
            let stmt = (*estate).es_plannedstmt;
            let may =
                |rule| super::cut::can_stop_early(node, rule) && super::cut::statement_may_cut(stmt, sole_root, rule);
            let locked = std::cell::Cell::new(false);
            let probe = || {
                let (spans, l) = super::probe::probe_started(node, sole_root, base.snap)?;
                locked.set(l);
                Some(spans.into_iter().map(|s| (rel, s)).collect())
            };
            let fence = run::fence_at_scan(fp, &base, probe, || {
                if !snapshot::statement_chooses_snapshot() {
                    None
                } else if !snapshot::fixed_snapshot() && may(CutRule::Strict) {
                    // Strictly only in READ COMMITTED: a REPEATABLE READ
                    // transaction's later statements would see what was left out.
                    Some(CutRule::Strict)
                } else {
                    may(CutRule::LastResort).then_some(CutRule::LastResort)
                }
            });
            let (mut cut, rule) = fence.cut.clone().map_or((Vec::new(), None), |(fp, r)| (fp, Some(r)));
            let locked: &[_] = if locked.get() { &[rel] } else { &[] };
            if let Some(rule) = super::probe::stop_locked(&mut cut, rule, fence.report.checked.as_ref(), locked) {
                super::cut::apply_cut(&[node], &cut, rule);
            }
            if let Some(st) = with_runtime(node, |rt| rt.statement.clone()) {
                st.borrow_mut().record(fence.report, fence.wait_us, fence.waited);
            }
        })
    }
}

/// The cold path of [`exec`].  A plain C call like `exec` itself: an
/// ERROR in the child's rescan (its run-time keys are user expressions)
/// passes on as raised.
#[inline(never)]
unsafe fn rescan_child(child: *mut pg_sys::PlanState) {
    // SAFETY: a child plan state whose parameters changed.
    unsafe { raw::ExecReScan(child) };
}

// ---- end -------------------------------------------------------------------

/// A plain old frame: the child's ERROR passes straight on.
unsafe extern "C-unwind" fn end(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node; the child was initialised in begin().  The Rust
    // runtime itself is dropped with the executor's memory context.
    unsafe { raw::ExecEndNode(with_runtime(node, |rt| rt.child)) };
}

// ---- rescan ----------------------------------------------------------------

#[pg_guard]
unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node.  The execution that ends here is recorded before
    // its scan moves back to the start.
    unsafe {
        crate::pg::boundary::rethrow_pending(|| {
            let child = with_runtime(node, |rt| {
                rt.fold(node);
                rt.stopped = false;
                rt.child
            });
            let changed = (*node).ss.ps.chgParam;
            if !changed.is_null() {
                pg_sys::UpdateChangedParamSet(child, changed);
            }
            // With changed parameters the child rescans itself when next run.
            if (*child).chgParam.is_null() {
                crate::pg::boundary::pass(|| raw::ExecReScan(child));
            }
        })
    }
}

// ---- mark / restore (the inner side of a merge join) -----------------------

#[pg_guard]
unsafe extern "C-unwind" fn mark_pos(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node; offered only over a child that supports marking.
    unsafe { raw::ExecMarkPos(with_runtime(node, |rt| rt.child)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn restr_pos(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as above.  How far the scan got is recorded before it moves
    // back; it goes on from the mark, so it has still started.
    unsafe {
        crate::pg::boundary::rethrow_pending(|| {
            let child = with_runtime(node, |rt| {
                rt.fold(node);
                rt.started = true;
                rt.child
            });
            crate::pg::boundary::pass(|| raw::ExecRestrPos(child));
        })
    }
}
