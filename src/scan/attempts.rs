//! An optimistic statement's attempts: the first runs the statement's own
//! executor into a buffer (before the protocol, so that recursion through
//! a guarded read costs the stack no protocol frames); later ones run a
//! second executor for the same plan at the snapshot the protocol asks for.
//! The buffer lives in executor memory, so an ERROR in a run leaves nothing
//! of ours to free.

use super::buffer::BufferDest;
use super::cut;
use super::hooks::prev_run;
use super::plan_walk;
use super::runtime;
use crate::guc;
use crate::pg::boundary;
use crate::pg::raw;
use crate::read::run::{CutRule, Reader};
use crate::read::snapshot::BaseSnapshot;
use pgkvx_latch::{Conflict, Footprint};
use pgrx::pg_sys::{self, QueryDesc};

/// Runs `f` (which calls Postgres only through [`crate::pg::boundary::pass`]) with
/// `snap` as the active snapshot.
pub(super) unsafe fn with_active<R>(snap: pg_sys::Snapshot, f: impl FnOnce() -> R) -> R {
    // SAFETY: pushing a registered snapshot and popping it again; an ERROR
    // in between resets the active snapshot stack at (sub)transaction abort.
    unsafe {
        pg_sys::PushActiveSnapshot(snap);
        let r = f();
        pg_sys::PopActiveSnapshot();
        r
    }
}

/// An optimistic statement's first run: its rows in a buffer, and the
/// footprint its guarded scans touched (None: the result outgrew the
/// buffer).
pub(super) struct FirstAttempt {
    pub(super) buffer: *mut BufferDest,
    pub(super) footprint: Option<Footprint>,
    /// Its footprint against writers that started after its snapshot.
    pub(super) later: Footprint,
}

/// Runs an optimistic statement's own executor into a new buffer, at the
/// statement's snapshot.  The run is on the stack of every level of
/// recursion through a guarded read: it is inlined into its caller (with
/// `run_into`), so that recursion pays for one frame of ours per level, and
/// the frames around it make no guarded pgrx call (each inlines a jump
/// buffer): the buffer is made, and the footprint read, in functions of
/// their own.
///
/// # Safety
/// `qd` is a started, optimistic, not yet run statement of ours.
#[inline(always)]
pub(super) unsafe fn first_attempt(
    qd: *mut QueryDesc,
    once: bool,
    nodes: &[*mut pg_sys::CustomScanState],
) -> FirstAttempt {
    // SAFETY: the caller's contract: `qd` is a started, optimistic, not yet run statement of ours.
    unsafe {
        let buffer = new_buffer(qd);
        run_into(qd, (*buffer).as_dest(), once);
        let (footprint, later) = match (*buffer).overflowed() {
            true => (None, Footprint::new()),
            false => {
                let (t, later) = footprint_of(nodes);
                (Some(t), later)
            }
        };
        FirstAttempt { buffer, footprint, later }
    }
}

/// An empty buffer for `qd`'s rows, in its executor's memory; its rows go
/// in a context of their own.
///
/// # Safety
/// `qd` has been started.
#[inline(never)]
unsafe fn new_buffer(qd: *mut QueryDesc) -> *mut BufferDest {
    // SAFETY: the caller's contract: `qd` has been started. Contexts of the executor's memory go with it.
    unsafe {
        let query_cxt = (*(*qd).estate).es_query_cxt;
        let max_rows = guc::MAX_OPTIMISTIC_ROWS.get() as usize;
        let max_bytes = pg_sys::work_mem as usize * 1024;
        let old = pg_sys::MemoryContextSwitchTo(query_cxt);
        let buffer = BufferDest::new(query_cxt, max_rows, max_bytes);
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
#[inline(always)]
unsafe fn run_into(qd: *mut QueryDesc, dest: *mut pg_sys::DestReceiver, once: bool) {
    // SAFETY: the caller's contract: `qd` is started and not yet run; `dest` a live receiver.
    unsafe {
        let saved = (*qd).dest;
        (*qd).dest = dest;
        prev_run(qd, pg_sys::ScanDirection::ForwardScanDirection, 0, once);
        (*qd).dest = saved;
    }
}

/// Starts a second executor for `qd`'s plan at `snap` (registered by it),
/// in `qd`'s memory, sending to `dest`.
///
/// # Safety
/// `qd` is started; `snap` a valid MVCC snapshot or template.
pub(super) unsafe fn start_second_executor(
    qd: *mut QueryDesc,
    snap: pg_sys::Snapshot,
    dest: *mut pg_sys::DestReceiver,
    eflags: i32,
) -> *mut QueryDesc {
    // SAFETY: the caller's contract: `qd` is started; `snap` a valid MVCC snapshot or template. The second
    // executor's memory is a child of the
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
        // At its snapshot, active: initial partition pruning evaluates the
        // bounds there (a STABLE function's cursor).
        with_active(snap, || boundary::pass(|| raw::standard_ExecutorStart(q2, eflags)));
        q2
    }
}

/// Ends a second executor.
pub(super) unsafe fn end_second_executor(q2: *mut QueryDesc, finished: bool) {
    // SAFETY: a second executor we started and have not ended.
    unsafe {
        boundary::pass(|| {
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
pub(super) struct OptimisticAttempts {
    pub(super) qd: *mut QueryDesc,
    /// `Guards::sole_root` of the statement's guards.
    pub(super) sole_root: Option<pgrx::pg_sys::Oid>,
    pub(super) eflags: i32,
    pub(super) attempts: u32,
    /// In the executor's memory.
    pub(super) buffer: *mut BufferDest,
    /// The first attempt's footprint, run before the protocol started.
    pub(super) first: Option<Option<Footprint>>,
    /// The widest rule a cut of this read has used (for applying it).
    pub(super) rule: Option<CutRule>,
    /// The latest attempt's footprint against later writers, until the
    /// snapshot moves (a fenced fallback reads at another).
    pub(super) later: Option<Footprint>,
    /// The statement's guards, decoded at its start; they outlive the
    /// attempts.
    pub(super) guards: *const super::guards::Guards,
    /// The guard nodes of the statement's own executor, as it registered
    /// them: not always in its plan state tree (`bypass.rs`).  They outlive
    /// the attempts, as the guards do.
    pub(super) nodes: *const [*mut pg_sys::CustomScanState],
    /// Where a fenced fallback's read ends (`probe.rs`): the shapes the
    /// statement's start probed with, or found when first asked.
    pub(super) prober: super::probe::Prober,
    /// The fenced fallback fences when its scans start, at their bounds
    /// as they are then (a bound the statement computes).
    pub(super) fence_at_scan: bool,
}

/// The footprint of the guarded scans of a started executor that has run.
///
/// # Safety
/// `qd` has been started (and run).
unsafe fn footprint(qd: *mut QueryDesc) -> (Footprint, Footprint) {
    // SAFETY: the caller's contract: `qd` has been started (and run).
    unsafe { footprint_of(&plan_walk::guard_nodes(qd)) }
}

/// The footprint of `nodes`, the guarded scans of an executor that has
/// run, and that footprint against writers that started after its snapshot.
///
/// # Safety
/// `nodes` are the guard nodes of a started executor.
#[inline(never)]
unsafe fn footprint_of(nodes: &[*mut pg_sys::CustomScanState]) -> (Footprint, Footprint) {
    let (mut fp, mut later) = (Footprint::with_capacity(nodes.len()), Footprint::with_capacity(nodes.len()));
    // SAFETY: the caller's contract: `nodes` are the guard nodes of a started executor.
    unsafe {
        for &n in nodes {
            runtime::with_runtime(n, |rt| {
                let rel = rt.rel;
                fp.extend(rt.touched(n).into_iter().map(|s| (rel, s)));
                later.extend(rt.touched_later(n).into_iter().map(|s| (rel, s)));
            });
        }
    }
    (fp, later)
}

impl OptimisticAttempts {
    /// Whether every guard, and the statement, allow a cut by `rule`; if
    /// so, the rule the read's cut is applied by widens to it.
    fn may_cut(&mut self, rule: CutRule) -> bool {
        let ok = self.allows_cut(rule);
        if ok {
            self.rule = Some(crate::read::run::widest(self.rule, rule));
        }
        ok
    }

    /// Whether every guard, and the statement, allow a cut by `rule`.
    fn allows_cut(&self, rule: CutRule) -> bool {
        // SAFETY: our statement's QueryDesc, started and run once, and its
        // guard nodes, begun, listed in its entry, which outlives us.
        unsafe {
            (*self.nodes).iter().all(|&n| cut::can_stop_early(n, rule))
                && cut::statement_may_cut((*self.qd).plannedstmt, self.sole_root, rule)
        }
    }

    fn cut_by(&mut self, rule: CutRule, conflicts: &[Conflict]) -> Option<Footprint> {
        self.may_cut(rule).then(|| crate::read::run::cut_upward(conflicts))
    }

    /// The rule to apply the cut the protocol settled on with.
    pub(super) fn rule(&self) -> CutRule {
        self.rule.unwrap_or(CutRule::Strict)
    }
}

impl Reader for OptimisticAttempts {
    fn cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
        self.cut_by(CutRule::Strict, conflicts)
    }

    fn last_resort_cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
        self.cut_by(CutRule::LastResort, conflicts)
    }

    fn stop_past(&mut self, touched: &Footprint) -> Option<Footprint> {
        // Strictly only: a join or a watermark beside a tail cut short can
        // show what the rows left out would have matched (an outer
        // join's NULLs, a bound read from another table).
        self.may_cut(CutRule::Strict).then(|| pgkvx_latch::protocol::past(touched))
    }

    fn probe(&mut self, base: &BaseSnapshot) -> Option<Footprint> {
        // A read that may stop short strictly stops past what its attempts
        // touched instead (`stop_past`): no wait past them at all.  A tail
        // whose bound the statement computes (a cursor read from a table)
        // is fenced as a fenced statement of its kind is, when its scans
        // start, from their bounds as they are then (statement.rs,
        // start_fenced_at_scan): nothing to check before.  Others probe as
        // a fenced statement does (start_fenced), over their declared
        // spans as known before they ran (a computed bound left out, which
        // only widens them).
        // SAFETY: our statement's QueryDesc, started and run once, and the guards decoded at its start, all
        // live while it runs.
        unsafe {
            let (stmt, params, guards) = ((*self.qd).plannedstmt, (*self.qd).params, &*self.guards);
            // Only where each scan may stop before the writers it meets
            // then: one that cannot (a range bounded above) would fail with
            // 40001 at a snapshot that can no longer move, where waiting
            // over its widened span below still settles it.
            if guards.fence_at_scan(params) && self.allows_cut(CutRule::LastResort) {
                self.fence_at_scan = true;
                return Some(Footprint::new());
            }
            if self.allows_cut(CutRule::Strict) {
                return None;
            }
            self.prober.probe(stmt, guards, params, base.snap, crate::read::run::Later::No)
        }
    }

    fn later_ends(&mut self, _base: &BaseSnapshot) -> Option<Footprint> {
        self.later.clone()
    }

    fn snapshot_moved(&mut self) {
        self.later = None;
    }

    fn read_buffered(&mut self, base: &BaseSnapshot, cut: &Footprint) -> Option<Footprint> {
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
            let q2 = start_second_executor(self.qd, base.snap, dest, self.eflags);
            if !cut.is_empty() {
                cut::apply_cut(&plan_walk::guard_nodes(q2), cut, self.rule());
            }
            // What it touched, too, at its snapshot: a bound that reads a
            // table (a STABLE function's cursor) says there where the
            // scan's rows started.
            let (fp, later) = with_active((*(*q2).estate).es_snapshot, || {
                boundary::pass(|| raw::standard_ExecutorRun(q2, pg_sys::ScanDirection::ForwardScanDirection, 0, true));
                footprint(q2)
            });
            end_second_executor(q2, false);
            self.later = Some(later);
            fp
        };
        self.attempts += 1;
        // SAFETY: as above.
        (!unsafe { (*self.buffer).overflowed() }).then_some(fp)
    }
}
