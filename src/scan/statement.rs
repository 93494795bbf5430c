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
//!   the writers in flight in the declared spans, take a fresh snapshot
//!   (or stop before later writers' keys: the latch core's `protocol`), and
//!   start the executor at it.  Rows
//!   then stream.  Statements that cannot run twice (side effects, row
//!   locks, volatile functions, scrollable or holdable cursors) and results
//!   too large to hold back always read fenced.
//! - optimistic: start at the statement's snapshot; on the first run, run
//!   the plan to the end into a buffer, then validate the spans the guarded
//!   scans touched.  Clean: hand the rows on.  A conflict: wait for the
//!   holders, run the statement again (a second executor for the same plan)
//!   at a fresh snapshot, validate again; after
//!   `pgkvx.optimistic_retries` such attempts, or if the result outgrows
//!   the buffer, fall back to fenced, again in a second executor.
//!   Before buffering, an optimistic read first checks its declared spans
//!   (a small one only while such checks have lately come out clean,
//!   read/run.rs): when they are clean it streams at once.  A read of
//!   more than 64 rows whose spans met writers then probes where its rows
//!   end, as a fenced read does: clean up to there, it streams too.
//! - off: nothing; the nodes only pass rows on.
//!
//! Fenced, streamed and off executions need nothing of the guard nodes
//! once they start: unless EXPLAIN ANALYZE watches, they run a copy of the
//! plan with the node spliced out, where its shape allows (unguarded.rs).

use super::attempts::{
    self, end_second_executor, start_second_executor, with_active, FirstAttempt, OptimisticAttempts,
};
use super::buffer::HeldRows;
use super::bypass;
use super::cut;
use super::guards::{self, Guards};
use super::hooks::{self, prev_end, prev_finish, prev_run, prev_start};
use super::plan_walk;
use super::probe;
use super::report::{ReadPath, StatementReport};
use super::runtime;
use super::starting;
use super::unguarded;
use crate::errors;
use crate::pg::boundary;
use crate::pg::compat;
use crate::pg::raw;

use crate::read::run::{self, BeforeReading, CutRule, ReadDecision, ReadStrategy};
use crate::read::snapshot::{self, BaseSnapshot};
use pgkvx_latch::protocol::ReadMode;
use pgkvx_latch::{Footprint, Xid};
use pgrx::pg_sys::{self, QueryDesc};
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
    /// Its guarded scans, decoded at executor start.
    guards: Guards,
    /// Their nodes in its executor, found once when it started.
    nodes: Vec<*mut pg_sys::CustomScanState>,
    /// The shapes its start probed with (optimistic), for its attempts.
    prober: probe::Prober,
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

/// The cut of the guard node of plan `cs` in the guarded statement whose
/// executor state is `estate`: what EvalPlanQual's copy of that node, re-
/// checking one of its rows, stops before too.
///
/// # Safety
/// `cs` is a PgkvxLimitScan plan node.
pub unsafe fn cut_of(estate: *mut pg_sys::EState, cs: *mut pg_sys::CustomScan) -> Option<pgkvx_latch::KeyBuf> {
    let st = STATEMENTS.with(|s| {
        // SAFETY: every pointer in the list is a live leaked Box, and its
        // QueryDesc lives while it is listed.
        s.try_borrow().ok()?.iter().rev().copied().find(|&st| unsafe { (*(*st).qd).estate } == estate)
    })?;
    // SAFETY: a listed statement's nodes are its begun guard nodes.
    unsafe {
        let n = (*st).nodes.iter().copied().find(|&n| (*n).ss.ps.plan == cs as *mut pg_sys::Plan)?;
        // Not lent: this runs where EvalPlanQual begins its copy of the
        // plan, maybe inside user code a lend of `n` runs (its bounds).
        runtime::cut_of_node(n)
    }
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

pub fn init() {
    unguarded::init();
    hooks::install(executor_start, compat::executor_run_hook::<Run>, executor_finish, executor_end);
}

// ---- the hooks ---------------------------------------------------------------

/// Forgets a statement whose executor memory goes away (after an ERROR,
/// when ExecutorEnd never runs).  Its snapshot went with the resource
/// owner; only our memory is left to free.
unsafe extern "C-unwind" fn forget_statement(arg: *mut std::ffi::c_void) {
    // SAFETY: no Postgres call inside; see pg/boundary.rs.
    unsafe { boundary::rethrow_pending(|| drop(take_statement(arg as *mut QueryDesc))) }
}

/// ExecutorStart.  Statements with no guarded scan pass straight on.  No
/// `#[pg_guard]`: [`boundary::rethrow_pending`] catches every unwind.
unsafe extern "C-unwind" fn executor_start(qd: *mut QueryDesc, eflags: i32) {
    // SAFETY: the executor's QueryDesc; see pg/boundary.rs.
    unsafe { boundary::rethrow_pending(|| start_statement(qd, eflags)) }
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
        let guards = if explain_only || crate::shmem::table_if_attached().is_none() {
            Guards(Vec::new())
        } else {
            Guards::of(stmt)
        };
        if guards.is_empty() {
            boundary::pass(|| prev_start(qd, eflags));
            return;
        }
        let params = (*qd).params;
        let restartable = may_run_twice(stmt, eflags, &guards);
        let want = if restartable { guards::rows_wanted(stmt, params) } else { None };
        let Some(mut strategy) = run::choose_mode(want) else {
            // off: plain Postgres.
            if !start_unguarded(qd, eflags, &guards) {
                let nodes = start_executor(qd, eflags, &guards);
                attach(qd, eflags, guards, nodes, Reads::plan(ReadPath::Off, false));
            }
            return;
        };
        guards.report_unprotected();
        if !restartable {
            strategy = ReadStrategy { mode: ReadMode::Fenced, declared_first: false, first_fixed_read: false };
        }
        strategy.first_fixed_read = first_fixed_read;
        let base = BaseSnapshot::of((*qd).snapshot, snapshot::after_for_statement());
        // Before an optimistic read runs: its declared spans, then, for a
        // read of more rows than holding them back costs little, where its
        // rows end (the probe a fenced read makes); clean, it streams.
        let probe_pays = want.is_some_and(|w| w > run::STREAM_ABOVE_ROWS);
        let mut prober = probe::Prober::default();
        let before = (strategy.mode == ReadMode::Optimistic && strategy.declared_first).then(|| {
            run::clean_before_reading(&guards.declared_at_start(params), &base, probe_pays, || {
                prober.probe(stmt, &guards, params, base.snap, run::Later::No)
            })
        });
        match strategy.mode {
            ReadMode::Fenced => match guards.declared_to_fence(params) {
                None => start_fenced_at_scan(qd, eflags, guards),
                Some(declared) => start_fenced(qd, eflags, guards, base, strategy, declared),
            },
            ReadMode::Optimistic if before.is_some_and(|b| b != BeforeReading::Dirty) => {
                let path = if before == Some(BeforeReading::ProbedClean) {
                    ReadPath::ProbedStreamed
                } else {
                    ReadPath::Streamed
                };
                start_streamed(qd, eflags, guards, path)
            }
            ReadMode::Optimistic => {
                let nodes = start_executor(qd, eflags, &guards);
                bypass::leave_rows_to_parent(qd, &guards, &nodes);
                let reads = Reads {
                    source: RowSource::Pending,
                    mode: ReadPath::Optimistic,
                    base: Some(base),
                    swapped: false,
                    first_fixed_read,
                    prober,
                };
                attach(qd, eflags, guards, nodes, reads);
            }
        }
    }
}

/// Whether the statement may run twice: a plain SELECT without row locks
/// or side effects, not read backward, whose guarded scans allow it.
///
/// # Safety
/// `stmt` is the statement's plan.
unsafe fn may_run_twice(stmt: *mut pg_sys::PlannedStmt, eflags: i32, guards: &Guards) -> bool {
    // SAFETY: the caller's contract: `stmt` is the statement's plan.
    unsafe {
        (*stmt).commandType == pg_sys::CmdType::CMD_SELECT
            && !(*stmt).hasModifyingCTE
            && (*stmt).rowMarks.is_null()
            && eflags & pg_sys::EXEC_FLAG_BACKWARD as i32 == 0
            && guards.restartable()
    }
}

/// A fenced statement whose bounds are known only once it runs: each
/// guarded scan fences when it starts, on its bounds as they are then, at
/// the statement's snapshot, which other scans may already have read at
/// (node::fence_at_start).
///
/// # Safety
/// The arguments of ExecutorStart; `guards` are the statement's.
unsafe fn start_fenced_at_scan(qd: *mut QueryDesc, eflags: i32, guards: Guards) {
    let after = snapshot::after_for_statement();
    // SAFETY: the caller's contract: the arguments of ExecutorStart; `guards` are the statement's.
    unsafe {
        let sole_root = guards.sole_root();
        let nodes = start_executor(qd, eflags, &guards);
        let st = attach(qd, eflags, guards, nodes, Reads::plan(ReadPath::FencedAtScan, false));
        fence_at_first_run(&(*st).nodes, after, sole_root);
    }
}

/// Makes each guard node of `nodes` fence when its scan first runs
/// (`node::fence_at_start`), for a statement whose snapshot is `after`
/// and whose guards read `sole_root` alone.
///
/// # Safety
/// `nodes` are begun guard nodes of a started executor.
unsafe fn fence_at_first_run(
    nodes: &[*mut pg_sys::CustomScanState],
    after: pgkvx_latch::Xid,
    sole_root: Option<pg_sys::Oid>,
) {
    for &n in nodes {
        // SAFETY: the caller's contract: a begun guard node.
        unsafe { runtime::with_runtime(n, |rt| rt.fence_at_first_run(after, sole_root)) };
    }
}

/// A fenced statement: waits for the writers in flight in its declared
/// spans, then starts at a fresh snapshot, or at `base` stopping before
/// later writers' keys where that leaves a state some serial order
/// produces (the nodes check their order as they begin: apply_cut).
///
/// `declared`: its declared spans as evaluated at `base`, for the first
/// round; each round after evaluates them again, at its snapshot (a STABLE
/// bound may read a table).
///
/// # Safety
/// The arguments of ExecutorStart; `guards` are the statement's, `base`
/// its snapshot.
unsafe fn start_fenced(
    qd: *mut QueryDesc,
    eflags: i32,
    guards: Guards,
    base: BaseSnapshot,
    strategy: ReadStrategy,
    declared: Footprint,
) {
    // SAFETY: the caller's contract: the arguments of ExecutorStart; `guards` are the statement's, `base` its
    // snapshot.
    unsafe {
        let stmt = (*qd).plannedstmt;
        let params = (*qd).params;
        // Its shapes are found when the declared spans first meet writers.
        let mut prober = probe::Prober::default();
        let mut fenced = run::Fenced {
            may_cut: |rule| {
                guards.0.iter().all(|g| {
                    g.latched.as_ref().is_some_and(|l| {
                        let (order, open_above) = (cut::order_by_plan(g), guards::open_above(&g.plan, &l.key));
                        cut::may_stop_early(stmt, g.cs, &l.key, order, open_above, rule)
                    })
                }) && cut::statement_may_cut(stmt, guards.sole_root(), rule)
            },
            rule: None,
            probe: |at: &BaseSnapshot, later| prober.probe(stmt, &guards, params, at.snap, later),
        };
        let mut first = Some(declared);
        let mut declared = || -> Footprint { first.take().unwrap_or_else(|| guards.declared_at_start(params)) };
        let ran = run::run_protocol(&mut fenced, base, &mut declared, strategy, "LIMIT scan");
        let ReadDecision::Stream { mut cut } = ran.decision else { unreachable!("fenced reads never buffer") };
        let mut rule = fenced.rule.unwrap_or(CutRule::Strict);
        // A locked read stops past what its fence checked (probe.rs).
        if let Some(shapes) = prober.shapes() {
            let locked = probe::locked_rels(&guards.0, shapes);
            rule = probe::stop_locked(&mut cut, Some(rule), ran.report.checked.as_ref(), &locked).unwrap_or(rule);
        }
        let mut b = ran.base;
        let swapped = b.snap != (*qd).snapshot;
        if swapped {
            if strategy.first_fixed_read {
                adopt_for_transaction(&b, guards.first_rel());
            }
            let new = pg_sys::RegisterSnapshot(b.snap);
            pg_sys::UnregisterSnapshot((*qd).snapshot);
            (*qd).snapshot = new;
        }
        b.release();
        // The executor starts at the snapshot it reads at, active: initial
        // partition pruning evaluates the bounds there (a STABLE function
        // reading a cursor table says another key at a fresh snapshot).
        let snap = (*qd).snapshot;
        let unguarded = cut.is_empty()
            && if swapped {
                with_active(snap, || start_unguarded(qd, eflags, &guards))
            } else {
                start_unguarded(qd, eflags, &guards)
            };
        if unguarded {
            // Only a snapshot of ours needs the statement: it must be the
            // active one while the statement runs.
            if swapped {
                attach(qd, eflags, guards, Vec::new(), Reads::plan(ReadPath::Fenced, true));
            }
            return;
        }
        let nodes = if swapped {
            with_active(snap, || start_executor(qd, eflags, &guards))
        } else {
            start_executor(qd, eflags, &guards)
        };
        cut::apply_cut(&nodes, &cut, rule);
        let st = attach(qd, eflags, guards, nodes, Reads::plan(ReadPath::Fenced, swapped));
        (*st).report.borrow_mut().record(ran.report, ran.wait_us, ran.waited);
    }
}

/// An optimistic statement whose declared spans were clean at its
/// snapshot, or its probed end (`path` says which): it streams at once,
/// like a fenced one that met nobody there.
///
/// # Safety
/// The arguments of ExecutorStart; `guards` are the statement's.
unsafe fn start_streamed(qd: *mut QueryDesc, eflags: i32, guards: Guards, path: ReadPath) {
    // SAFETY: the caller's contract: the arguments of ExecutorStart; `guards` are the statement's.
    unsafe {
        if start_unguarded(qd, eflags, &guards) {
            return;
        }
        let nodes = start_executor(qd, eflags, &guards);
        let st = attach(qd, eflags, guards, nodes, Reads::plan(path, false));
        let mut r = (*st).report.borrow_mut();
        let probed = path == ReadPath::ProbedStreamed;
        r.report.validations = 1 + u32::from(probed);
        r.report.probes = u32::from(probed);
        r.report.streamed = true;
    }
}

/// How a started statement reads, for [`attach`].
struct Reads {
    source: RowSource,
    mode: ReadPath,
    /// The statement's snapshot as the protocol sees it (optimistic).
    base: Option<BaseSnapshot>,
    swapped: bool,
    first_fixed_read: bool,
    /// What the start probed with (optimistic).
    prober: probe::Prober,
}

impl Reads {
    /// Rows from the statement's own executor, at its snapshot (`swapped`:
    /// one we replaced).
    fn plan(mode: ReadPath, swapped: bool) -> Reads {
        Reads {
            source: RowSource::Plan,
            mode,
            base: None,
            swapped,
            first_fixed_read: false,
            prober: Default::default(),
        }
    }
}

/// Starts the executor of a statement with guarded scans: its guard nodes,
/// as they begin, take their guards from `guards` (scan/starting.rs).
/// Returns those nodes.
///
/// # Safety
/// The arguments of ExecutorStart.
unsafe fn start_executor(qd: *mut QueryDesc, eflags: i32, guards: &Guards) -> Vec<*mut pg_sys::CustomScanState> {
    let scope = starting::Scope::enter(qd, guards);
    // SAFETY: the caller's contract: the arguments of ExecutorStart. An ERROR unwinds the scope, which ends
    // it.
    unsafe { boundary::pass(|| prev_start(qd, eflags)) };
    scope.nodes()
}

/// Starts the executor of a statement whose read protocol is done (or
/// off) on its plan without the guard node, when EXPLAIN ANALYZE is not
/// watching and the plan's shape allows (scan/unguarded.rs).  Returns
/// whether it did; nothing of pgkvx then runs in that executor.
///
/// # Safety
/// The arguments of ExecutorStart; `guards` are the statement's.
unsafe fn start_unguarded(qd: *mut QueryDesc, eflags: i32, guards: &Guards) -> bool {
    // SAFETY: the caller's contract: the arguments of ExecutorStart; `guards` are the statement's.
    unsafe {
        if unguarded::watched(qd) {
            return false;
        }
        let Some(plain) = unguarded::plan_without_guard((*qd).plannedstmt, guards) else { return false };
        (*qd).plannedstmt = plain;
        boundary::pass(|| prev_start(qd, eflags));
        true
    }
}

/// Registers a started statement with its guard nodes `nodes` and shows
/// its report to them.
///
/// # Safety
/// `qd` has been started; `nodes` are its guard nodes.
unsafe fn attach(
    qd: *mut QueryDesc,
    eflags: i32,
    guards: Guards,
    nodes: Vec<*mut pg_sys::CustomScanState>,
    reads: Reads,
) -> *mut GuardedStatement {
    let Reads { source, mode, base, swapped, first_fixed_read, prober } = reads;
    let report = Rc::new(RefCell::new(StatementReport { mode, ..Default::default() }));
    // SAFETY: the caller's contract: `qd` has been started; `nodes` are its guard nodes.
    unsafe {
        for &n in &nodes {
            runtime::with_runtime(n, |rt| rt.attach_report(report.clone()));
        }
        crate::pg::memcx::on_reset((*(*qd).estate).es_query_cxt, forget_statement, qd as *mut std::ffi::c_void);
    }
    add_statement(GuardedStatement {
        qd,
        source,
        report,
        base,
        swapped,
        second_finished: false,
        eflags,
        first_fixed_read,
        guards,
        nodes,
        prober,
    })
}

/// The first statement to read at a REPEATABLE READ transaction's snapshot
/// waited for writers in flight at it and read at `base`, a fresher
/// snapshot: the transaction reads at exactly that from now on.  Where it
/// cannot, the serialization failure stands.
///
/// # Safety
/// `base` is a valid snapshot newer than the transaction's; `rel` names a
/// table the statement reads.
unsafe fn adopt_for_transaction(base: &BaseSnapshot, rel: pgkvx_latch::RelId) {
    // SAFETY: the caller's contract: `base` is a valid snapshot newer than the transaction's; `rel` names a
    // table the statement reads.
    unsafe {
        if snapshot::adopt_for_transaction(base.snap, base.after()) {
            return;
        }
        run::serialization_failure(Xid::INVALID, rel, "LIMIT scan")
    }
}

/// ExecutorRun.  Not `#[pg_guard]`: recursion (a function that calls
/// itself through SQL) passes through this frame at every level, so for
/// statements that are not ours it is as small as a C hook's and calls on
/// with a plain C call; it keeps no state, so an ERROR longjmps past it.
struct Run;

impl compat::ExecutorRun for Run {
    #[inline(always)]
    unsafe fn run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
        // SAFETY: the executor's arguments, passed on unchanged.
        unsafe { executor_run_with(qd, dir, count, once) }
    }
}

#[inline(always)]
unsafe fn executor_run_with(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY: per executor_run.
    unsafe {
        if statement(qd).is_none() {
            prev_run(qd, dir, count, once)
        } else {
            guarded_run(qd, dir, count, once)
        }
    }
}

/// No `#[pg_guard]` either: [`boundary::rethrow_pending`] catches every
/// unwind, and one guard frame less per level of recursion counts.
#[inline(never)]
unsafe fn guarded_run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY: a started statement of ours; see pg/boundary.rs.
    unsafe { boundary::rethrow_pending(|| run_statement(qd, dir, count, once)) }
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
            return boundary::pass(|| prev_run(qd, dir, count, once));
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
                let first = attempts::first_attempt(qd, once, &(*st).nodes);
                validate(qd, st, first);
                run_statement(qd, dir, count, once);
            }
            Step::Held => send_held(qd, st, dir, count),
            Step::Second(q2) => {
                (*q2).dest = (*qd).dest;
                with_active((*(*q2).estate).es_snapshot, || {
                    boundary::pass(|| raw::standard_ExecutorRun(q2, dir, count, once))
                });
                (*(*qd).estate).es_processed = (*(*q2).estate).es_processed;
            }
        }
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
    // SAFETY: the caller's contract: `st` is `qd`'s entry, holding rows.
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
    // SAFETY: the caller's contract: `qd` is a started, optimistic, not yet run statement of ours, `st` its
    // entry.
    unsafe {
        let Some(base) = (*st).base.take() else {
            errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "an optimistic statement lost its snapshot")
        };
        let eflags = (*st).eflags;
        let estate = (*qd).estate;
        let mut reader = OptimisticAttempts {
            qd,
            sole_root: (*st).guards.sole_root(),
            eflags,
            attempts: 0,
            buffer: first.buffer,
            first: Some(first.footprint),
            rule: None,
            later: Some(first.later),
            guards: &raw const (*st).guards,
            nodes: (*st).nodes.as_slice(),
            prober: std::mem::take(&mut (*st).prober),
            fence_at_scan: false,
        };
        // Only a read that falls back to fenced needs its declared spans.
        let guards = &(*st).guards;
        let mut declared = || -> Footprint { guards.declared_at_start((*qd).params) };
        let first_fixed_read = (*st).first_fixed_read;
        let strategy = ReadStrategy { mode: ReadMode::Optimistic, declared_first: false, first_fixed_read };
        let run::ProtocolResult { decision, report, wait_us, base, waited } =
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
                if first_fixed_read && report.fresh_snapshots > 0 {
                    adopt_for_transaction(&base, guards.first_rel());
                }
                let rows = (*reader.buffer).take();
                let old = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
                let held = HeldRows::new(rows, (*qd).tupDesc);
                pg_sys::MemoryContextSwitchTo(old);
                RowSource::Held(held)
            }
            // At the snapshot the protocol checked: a fresher one would
            // bring writers nobody checked.
            ReadDecision::Stream { cut } => {
                if first_fixed_read && report.fresh_snapshots > 0 {
                    adopt_for_transaction(&base, guards.first_rel());
                }
                let q2 = start_second_executor(qd, base.snap, (*qd).dest, eflags);
                if !cut.is_empty() {
                    cut::apply_cut(&plan_walk::guard_nodes(q2), &cut, reader.rule());
                }
                if reader.fence_at_scan {
                    fence_at_first_run(
                        &plan_walk::guard_nodes(q2),
                        snapshot::after_for_statement(),
                        guards.sole_root(),
                    );
                }
                RowSource::Second(q2)
            }
        };
        base.release();
        (*st).source = source;
        *(*st).report.borrow_mut() = StatementReport { mode, report, wait_us, waited };
    }
}

/// ExecutorFinish; like ExecutorRun ([`Run`]), as small as a C hook for
/// statements that are not ours.
unsafe extern "C-unwind" fn executor_finish(qd: *mut QueryDesc) {
    // SAFETY: the executor's argument, passed on unchanged.
    unsafe {
        match statement(qd) {
            Some(st) if matches!((*st).source, RowSource::Second(_)) && !(*st).second_finished => guarded_finish(qd),
            Some(st) if (*st).swapped => swapped_finish(qd),
            _ => prev_finish(qd),
        }
    }
}

/// ExecutorFinish of a statement whose snapshot we replaced: with that
/// snapshot active, as while it ran -- a data-modifying CTE the statement
/// did not read runs to its end here, and its bounds are evaluated there.
#[pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn swapped_finish(qd: *mut QueryDesc) {
    // SAFETY: the executor's argument; its snapshot, registered by us, is
    // live until ExecutorEnd.
    unsafe { boundary::rethrow_pending(|| with_active((*qd).snapshot, || boundary::pass(|| prev_finish(qd)))) }
}

#[pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn guarded_finish(qd: *mut QueryDesc) {
    // SAFETY: finishing a second executor we started, then chaining.
    unsafe {
        boundary::rethrow_pending(|| {
            if let Some(st) = statement(qd) {
                if let RowSource::Second(q2) = (*st).source {
                    (*st).second_finished = true;
                    boundary::pass(|| raw::standard_ExecutorFinish(q2));
                }
            }
            boundary::pass(|| prev_finish(qd));
        })
    }
}

/// ExecutorEnd; like ExecutorRun ([`Run`]), as small as a C hook for statements
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

/// No `#[pg_guard]`: [`boundary::rethrow_pending`] catches every unwind.
#[inline(never)]
unsafe extern "C-unwind" fn guarded_end(qd: *mut QueryDesc) {
    // SAFETY: ending what we started, then chaining.
    unsafe {
        boundary::rethrow_pending(|| {
            if let Some(mut st) = take_statement(qd) {
                if let RowSource::Second(q2) = st.source {
                    end_second_executor(q2, st.second_finished);
                }
                if let Some(mut b) = st.base.take() {
                    b.release();
                }
            }
            boundary::pass(|| prev_end(qd));
        })
    }
}
