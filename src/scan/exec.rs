//! The `PgkvxLimitScan` executor node: begin, exec, end, rescan (in that
//! order, as in Postgres's own node*.c files), then EXPLAIN.
//!
//! The node runs a btree scan of the key index, applies the non-index
//! quals, and hands rows to the Limit node above it.  What it adds is the
//! read protocol (latch/protocol.rs): in optimistic mode it reads up to
//! LIMIT+OFFSET rows into a buffer, validates the span it touched and emits
//! only a valid result; in fenced mode it validates the declared span first
//! and then streams.  `pgkvx.scan_mode = off` makes it a plain index scan.

use super::guard::{self, Then};
use super::planner::{private, Methods, NAME};
use super::snapshot::{self, Base};
use super::span;
use crate::api::registry::{self, Latched};
use crate::guc;
use crate::latch::protocol::{ReadMode, Report};
use crate::latch::{Span, Xid};
use crate::memcx::reset_if_used;
use pgrx::pg_sys::{self, List, Node};
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::ffi::{CStr, CString};
use std::rc::Rc;

unsafe extern "C-unwind" {
    // executor/nodeIndexscan.h, not in pgrx's bindings; called through
    // the FFI boundary guard.
    fn ExecIndexBuildScanKeys(
        planstate: *mut pg_sys::PlanState,
        index: pg_sys::Relation,
        quals: *mut List,
        isorderby: bool,
        scan_keys: *mut pg_sys::ScanKey,
        num_scan_keys: *mut i32,
        runtime_keys: *mut *mut pg_sys::IndexRuntimeKeyInfo,
        num_runtime_keys: *mut i32,
        array_keys: *mut *mut std::ffi::c_void,
        num_array_keys: *mut i32,
    );
    fn ExecIndexEvalRuntimeKeys(
        econtext: *mut pg_sys::ExprContext,
        runtime_keys: *mut pg_sys::IndexRuntimeKeyInfo,
        num_runtime_keys: i32,
    );
}

pub static SCAN_METHODS: Methods<pg_sys::CustomScanMethods> =
    Methods(pg_sys::CustomScanMethods { CustomName: NAME.as_ptr(), CreateCustomScanState: Some(create_state) });

static EXEC_METHODS: Methods<pg_sys::CustomExecMethods> = Methods(pg_sys::CustomExecMethods {
    CustomName: NAME.as_ptr(),
    BeginCustomScan: Some(begin),
    ExecCustomScan: Some(exec),
    EndCustomScan: Some(end),
    ReScanCustomScan: Some(rescan),
    MarkPosCustomScan: None,
    RestrPosCustomScan: None,
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
}

/// The executor state: Postgres's part first, then ours.
#[repr(C)]
struct NodeState {
    css: pg_sys::CustomScanState,
    rt: *mut Runtime,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Not started (or rescanned): the next call runs the protocol.
    Start,
    /// Emitting the validated buffer.
    Emit,
    /// Streaming from the index scan.
    Stream,
    Done,
}

/// What EXPLAIN ANALYZE reports, summed over executions.
#[derive(Default)]
struct Totals {
    executions: u64,
    report: Report,
    wait_us: i64,
    mode: Option<ReadMode>,
    off: bool,
    declared: Option<Span>,
    touched: Option<Span>,
}

struct Runtime {
    latched: Rc<Latched>,
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    forward: bool,
    keys: pg_sys::ScanKey,
    nkeys: i32,
    runtime_keys: *mut pg_sys::IndexRuntimeKeyInfo,
    nruntime: i32,
    runtime_cxt: *mut pg_sys::ExprContext,
    count: *mut pg_sys::ExprState,
    offset: *mut pg_sys::ExprState,
    /// The quals in table-column form, for EXPLAIN.
    quals_orig: *mut List,
    /// Rows buffered by an optimistic read, and the context they live in.
    buffer: Vec<pg_sys::HeapTuple>,
    buffer_cxt: pg_sys::MemoryContext,
    next: usize,
    scan: pg_sys::IndexScanDesc,
    base: Option<Base>,
    /// The next xid when this execution's executor started (see snapshot.rs).
    after_at_start: Xid,
    want: Option<u64>,
    streamed: u64,
    phase: Phase,
    totals: Totals,
}

impl Runtime {
    fn direction(&self) -> pg_sys::ScanDirection::Type {
        if self.forward {
            pg_sys::ScanDirection::ForwardScanDirection
        } else {
            pg_sys::ScanDirection::BackwardScanDirection
        }
    }

    fn end_index_scan(&mut self) {
        if !self.scan.is_null() {
            // SAFETY: a scan we began and have not ended.
            unsafe { pg_sys::index_endscan(self.scan) };
            self.scan = std::ptr::null_mut();
        }
    }

    /// Ends everything an execution holds, ready for the next one.
    fn reset(&mut self) {
        self.end_index_scan();
        if let Some(mut b) = self.base.take() {
            b.release();
        }
        self.buffer.clear();
        // SAFETY: the buffer context is ours; no tuple in it is referenced.
        unsafe { pg_sys::MemoryContextReset(self.buffer_cxt) };
        self.next = 0;
        self.streamed = 0;
        self.phase = Phase::Start;
    }
}

fn list_len(l: *mut List) -> usize {
    if l.is_null() {
        0
    } else {
        // SAFETY: a valid List.
        unsafe { (*l).length as usize }
    }
}

/// # Safety
/// `l` is a List of Integer nodes with at least `i + 1` elements.
unsafe fn int_at(l: *mut List, i: usize) -> i32 {
    // SAFETY: per contract.
    unsafe { (*((*(*l).elements.add(i)).ptr_value as *mut pg_sys::Integer)).ival }
}

/// # Safety
/// `l` has at least `i + 1` elements.
unsafe fn node_at(l: *mut List, i: usize) -> *mut pg_sys::Expr {
    // SAFETY: per contract.
    unsafe { (*(*l).elements.add(i)).ptr_value as *mut pg_sys::Expr }
}

/// Drops the Rust runtime when the executor's memory goes, also after an
/// ERROR (when EndCustomScan never runs).
#[pg_guard]
unsafe extern "C-unwind" fn drop_runtime(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the Box we leaked in begin(), dropped only here.
    drop(unsafe { Box::from_raw(arg as *mut Runtime) });
}

#[pg_guard]
unsafe extern "C-unwind" fn create_state(cscan: *mut pg_sys::CustomScan) -> *mut Node {
    // SAFETY: allocating and tagging our state node as the executor expects.
    unsafe {
        let ns = pg_sys::palloc0(std::mem::size_of::<NodeState>()) as *mut NodeState;
        (*ns).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
        (*ns).css.flags = (*cscan).flags;
        (*ns).css.methods = &EXEC_METHODS.0;
        ns as *mut Node
    }
}

// ---- begin -----------------------------------------------------------------

#[pg_guard]
unsafe extern "C-unwind" fn begin(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, _eflags: i32) {
    // SAFETY (whole body): executor-initialisation protocol; the plan is our
    // CustomScan, built by plan_custom_path, whose private list and exprs
    // have the layout documented there.
    unsafe {
        let ns = node as *mut NodeState;
        let ps = &raw mut (*node).ss.ps;
        let cs = (*ps).plan as *mut pg_sys::CustomScan;
        let heap = (*node).ss.ss_currentRelation;
        let relid = (*heap).rd_id;

        // PG15 gives custom scans a virtual slot; index fetches need the
        // table's own slot type, and quals/projection compiled for it.
        pg_sys::ExecInitScanTupleSlot(estate, &raw mut (*node).ss, (*heap).rd_att, pg_sys::table_slot_callbacks(heap));
        (*ps).qual = pg_sys::ExecInitQual((*cs).scan.plan.qual, ps);
        pg_sys::ExecAssignScanProjectionInfo(&raw mut (*node).ss);

        let private = (*cs).custom_private;
        let index_oid = pg_sys::Oid::from(int_at(private, private::INDEX_OID) as u32);
        let forward = int_at(private, private::FORWARD) != 0;
        let nquals = int_at(private, private::NQUALS) as usize;
        let has_count = int_at(private, private::HAS_COUNT) != 0;
        let has_offset = int_at(private, private::HAS_OFFSET) != 0;
        let exprs = (*cs).custom_exprs;
        let indexqual = pg_sys::list_truncate(pg_sys::list_copy(exprs), nquals as i32);
        let quals_orig =
            pg_sys::list_truncate(pg_sys::list_delete_first_n(pg_sys::list_copy(exprs), nquals as i32), nquals as i32);
        let mut at = 2 * nquals;
        let mut next_expr = |present: bool| {
            if !present {
                return std::ptr::null_mut();
            }
            let e = node_at(exprs, at);
            at += 1;
            pg_sys::ExecInitExpr(e, ps)
        };
        let count = next_expr(has_count);
        let offset = next_expr(has_offset);

        let scanrelid = (*cs).scan.scanrelid as usize;
        let rte = pg_sys::list_nth((*estate).es_range_table, scanrelid as i32 - 1) as *mut pg_sys::RangeTblEntry;
        let lockmode = (*rte).rellockmode;
        let index = pg_sys::index_open(index_oid, lockmode);

        let mut keys: pg_sys::ScanKey = std::ptr::null_mut();
        let mut nkeys = 0;
        let mut runtime_keys: *mut pg_sys::IndexRuntimeKeyInfo = std::ptr::null_mut();
        let mut nruntime = 0;
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            ExecIndexBuildScanKeys(
                ps,
                index,
                indexqual,
                false,
                &mut keys,
                &mut nkeys,
                &mut runtime_keys,
                &mut nruntime,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        });
        // Runtime keys are evaluated in their own context, as nodeIndexscan.c does.
        let mut runtime_cxt = std::ptr::null_mut();
        if nruntime > 0 {
            let saved = (*ps).ps_ExprContext;
            pg_sys::ExecAssignExprContext(estate, ps);
            runtime_cxt = (*ps).ps_ExprContext;
            (*ps).ps_ExprContext = saved;
        }

        let cxt = pg_sys::CurrentMemoryContext;
        let buffer_cxt = pg_sys::AllocSetContextCreateInternal(
            cxt,
            c"PgkvxLimitScan rows".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        let rt = Box::new(Runtime {
            latched: registry::require(relid),
            heap,
            index,
            forward,
            keys,
            nkeys,
            runtime_keys,
            nruntime,
            runtime_cxt,
            count,
            offset,
            quals_orig,
            buffer: Vec::new(),
            buffer_cxt,
            next: 0,
            scan: std::ptr::null_mut(),
            base: None,
            after_at_start: snapshot::next_xid(),
            want: None,
            streamed: 0,
            phase: Phase::Start,
            totals: Totals::default(),
        });
        let rt = Box::into_raw(rt);
        let cb =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::MemoryContextCallback>()) as *mut pg_sys::MemoryContextCallback;
        (*cb).func = Some(drop_runtime);
        (*cb).arg = rt as *mut std::ffi::c_void;
        pg_sys::MemoryContextRegisterResetCallback(cxt, cb);
        (*ns).rt = rt;
    }
}

// ---- exec ------------------------------------------------------------------

/// Evaluates LIMIT + OFFSET: how many rows the Limit node above can take.
/// None = unlimited (LIMIT NULL / ALL).
unsafe fn rows_wanted(node: *mut pg_sys::CustomScanState, rt: &Runtime) -> Option<u64> {
    // SAFETY: expression states built in begin(); evaluated in the
    // per-tuple context, which is reset before the next use.
    unsafe {
        let econtext = (*node).ss.ps.ps_ExprContext;
        let eval = |e: *mut pg_sys::ExprState| -> Option<i64> {
            if e.is_null() {
                return Some(0);
            }
            let mut isnull = false;
            let d = pg_sys::ExecEvalExprSwitchContext(e, econtext, &mut isnull);
            (!isnull).then(|| d.value() as i64)
        };
        let offset = eval(rt.offset).unwrap_or(0).max(0) as u64;
        if rt.count.is_null() {
            return None;
        }
        let count = eval(rt.count)?;
        Some((count.max(0) as u64).saturating_add(offset))
    }
}

/// Stores the row into the scan slot's projection and returns what the
/// node hands upward.
unsafe fn project(
    node: *mut pg_sys::CustomScanState,
    slot: *mut pg_sys::TupleTableSlot,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: executor structures of our node.
    unsafe {
        let proj = (*node).ss.ps.ps_ProjInfo;
        if proj.is_null() {
            return slot;
        }
        let econtext = (*node).ss.ps.ps_ExprContext;
        reset_if_used((*econtext).ecxt_per_tuple_memory);
        (*econtext).ecxt_scantuple = slot;
        pg_sys::ExecProject(proj)
    }
}

/// The next row from the index scan that passes the non-index quals.
unsafe fn next_passing(node: *mut pg_sys::CustomScanState, rt: &mut Runtime) -> Option<*mut pg_sys::TupleTableSlot> {
    // SAFETY: executor structures of our node; the scan was begun.
    unsafe {
        let slot = (*node).ss.ss_ScanTupleSlot;
        let qual = (*node).ss.ps.qual;
        let econtext = (*node).ss.ps.ps_ExprContext;
        loop {
            pg_sys::check_for_interrupts!();
            if !pg_sys::index_getnext_slot(rt.scan, rt.direction(), slot) {
                return None;
            }
            reset_if_used((*econtext).ecxt_per_tuple_memory);
            (*econtext).ecxt_scantuple = slot;
            if qual.is_null() || pg_sys::ExecQual(qual, econtext) {
                return Some(slot);
            }
        }
    }
}

/// (Re)starts the index scan at `snap`.
unsafe fn start_index_scan(rt: &mut Runtime, snap: pg_sys::Snapshot) {
    rt.end_index_scan();
    // SAFETY: open relations, scan keys built in begin() and evaluated.
    unsafe {
        rt.scan = pg_sys::index_beginscan(rt.heap, rt.index, snap, rt.nkeys, 0);
        pg_sys::index_rescan(rt.scan, rt.keys, rt.nkeys, std::ptr::null_mut(), 0);
    }
}

/// How this node reads for an optimistic attempt.
struct NodeReader<'a> {
    node: *mut pg_sys::CustomScanState,
    rt: &'a mut Runtime,
    declared: Span,
}

impl guard::Reader for NodeReader<'_> {
    fn read_buffered(&mut self, base: &Base, pulled: &[Xid]) -> Span {
        let rt = &mut *self.rt;
        rt.buffer.clear();
        // SAFETY: our context; the buffered tuples from the last attempt
        // are dropped with it.
        unsafe { pg_sys::MemoryContextReset(rt.buffer_cxt) };
        let want = rt.want.expect("optimistic reads have a limit");
        if want == 0 {
            return Span { start: self.declared.start, end: self.declared.start };
        }
        // The spliced snapshot lives as long as the buffered rows.
        // SAFETY: our context, valid for the whole execution.
        let snap = unsafe { base.spliced_in(rt.buffer_cxt, pulled) };
        // SAFETY: a valid snapshot for this statement.
        unsafe { start_index_scan(rt, snap) };
        // SAFETY: scan begun above.
        while let Some(slot) = unsafe { next_passing(self.node, rt) } {
            // SAFETY: copying the current row into our context.
            let tup =
                unsafe { PgMemoryContexts::For(rt.buffer_cxt).switch_to(|_| pg_sys::ExecCopySlotHeapTuple(slot)) };
            rt.buffer.push(tup);
            if rt.buffer.len() as u64 >= want {
                // The limit is reached: the scan touched D up to this key.
                // SAFETY: the slot holds a row of the latched table.
                let key = unsafe { rt.latched.key.encode_slot(slot) };
                return span::touched(&self.declared, Some(&key), rt.forward);
            }
        }
        span::touched(&self.declared, None, rt.forward)
    }
}

/// Runs the protocol for one execution and sets up what exec() emits.
unsafe fn start(node: *mut pg_sys::CustomScanState, rt: &mut Runtime) {
    // SAFETY (whole body): executor structures of our node.
    unsafe {
        if rt.nruntime > 0 {
            pg_sys::ffi::pg_guard_ffi_boundary(|| {
                ExecIndexEvalRuntimeKeys(rt.runtime_cxt, rt.runtime_keys, rt.nruntime)
            });
        }
        rt.want = rows_wanted(node, rt);
        let keys = std::slice::from_raw_parts(rt.keys, rt.nkeys as usize);
        let declared = span::declared(&rt.latched.key, keys);
        let estate = (*node).ss.ps.state;
        let base = Base::of((*estate).es_snapshot, snapshot::after_for_statement(rt.after_at_start));
        rt.totals.executions += 1;
        rt.totals.declared = Some(declared);

        let Some(choice) = guard::choose_mode(rt.want) else {
            rt.totals.off = true;
            rt.base = Some(base);
            start_index_scan(rt, (*estate).es_snapshot);
            rt.phase = Phase::Stream;
            return;
        };
        rt.totals.mode = Some(choice.mode);
        let latched = rt.latched.clone();
        let heap = rt.heap;
        let mut reader = NodeReader { node, rt: &mut *rt, declared };
        let run = guard::run(&mut reader, &latched.key, heap, base, &declared, choice, "LIMIT scan");
        record(rt, &run.report, run.wait_us);
        rt.base = Some(run.base);
        match run.then {
            Then::Emit => rt.phase = Phase::Emit,
            Then::Stream { pulled } => {
                let snap = rt.base.as_ref().expect("base snapshot").spliced_in(rt.buffer_cxt, &pulled);
                start_index_scan(rt, snap);
                rt.phase = Phase::Stream;
            }
        }
    }
}

/// Adds one execution's protocol report to what EXPLAIN ANALYZE shows.
fn record(rt: &mut Runtime, r: &Report, wait_us: i64) {
    let t = &mut rt.totals;
    t.report.validations += r.validations;
    t.report.conflicts += r.conflicts;
    t.report.retries += r.retries;
    t.report.fresh_snapshots += r.fresh_snapshots;
    t.report.waits += r.waits;
    t.report.pulled_after += r.pulled_after;
    t.report.fell_back |= r.fell_back;
    t.report.streamed |= r.streamed;
    t.touched = r.checked;
    t.wait_us += wait_us;
}

#[pg_guard]
unsafe extern "C-unwind" fn exec(node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: our node; rt was set in begin().
    unsafe {
        let rt = &mut *(*(node as *mut NodeState)).rt;
        if rt.phase == Phase::Start {
            start(node, rt);
        }
        let slot = (*node).ss.ss_ScanTupleSlot;
        match rt.phase {
            Phase::Emit if rt.next < rt.buffer.len() => {
                let tup = rt.buffer[rt.next];
                rt.next += 1;
                pg_sys::ExecForceStoreHeapTuple(tup, slot, false);
                project(node, slot)
            }
            Phase::Stream if rt.want.is_none_or(|w| rt.streamed < w) => match next_passing(node, rt) {
                Some(slot) => {
                    rt.streamed += 1;
                    project(node, slot)
                }
                None => {
                    rt.phase = Phase::Done;
                    std::ptr::null_mut()
                }
            },
            _ => {
                rt.phase = Phase::Done;
                std::ptr::null_mut()
            }
        }
    }
}

// ---- end -------------------------------------------------------------------

#[pg_guard]
unsafe extern "C-unwind" fn end(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node; closing what begin() opened.  The Rust runtime
    // itself is dropped with the executor's memory context.
    unsafe {
        let rt = &mut *(*(node as *mut NodeState)).rt;
        rt.reset();
        pg_sys::index_close(rt.index, pg_sys::NoLock as pg_sys::LOCKMODE);
        rt.index = std::ptr::null_mut();
    }
}

// ---- rescan ----------------------------------------------------------------

#[pg_guard]
unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node.  Parameters may have changed: the next exec()
    // re-evaluates runtime keys and the limit and runs the protocol again.
    unsafe {
        let rt = &mut *(*(node as *mut NodeState)).rt;
        rt.reset();
        if !rt.runtime_cxt.is_null() {
            pg_sys::MemoryContextReset((*rt.runtime_cxt).ecxt_per_tuple_memory);
        }
    }
}

// ---- explain ---------------------------------------------------------------

fn prop_text(es: *mut pg_sys::ExplainState, label: &CStr, value: &str) {
    let v = CString::new(value.replace('\0', "")).expect("no NUL");
    // SAFETY: ExplainState from the caller; strings outlive the call.
    unsafe { pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), es) };
}

fn prop_int(es: *mut pg_sys::ExplainState, label: &CStr, value: i64) {
    // SAFETY: as above.
    unsafe { pg_sys::ExplainPropertyInteger(label.as_ptr(), std::ptr::null(), value, es) };
}

#[pg_guard]
unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    ancestors: *mut List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY (whole body): our node and the caller's ExplainState.
    unsafe {
        let rt = &*(*(node as *mut NodeState)).rt;
        let analyze = (*es).analyze;
        let mode = if analyze && rt.totals.executions > 0 {
            match (rt.totals.off, rt.totals.mode) {
                (true, _) => "off".to_string(),
                (_, Some(ReadMode::Optimistic)) if rt.totals.report.fell_back => {
                    "optimistic, fell back to fenced".into()
                }
                (_, Some(ReadMode::Optimistic)) if rt.totals.report.streamed => {
                    "optimistic, declared span clean: streamed".into()
                }
                (_, Some(ReadMode::Optimistic)) => "optimistic".into(),
                (_, Some(ReadMode::Fenced)) => "fenced".into(),
                (_, None) => "off".into(),
            }
        } else {
            guc::SCAN_MODE.get().name().to_string()
        };
        prop_text(es, c"Mode", &mode);
        prop_text(es, c"Index", &rt.latched.key.index_name);
        if list_len(rt.quals_orig) > 0 {
            let plan = (*node).ss.ps.plan;
            let ctx = pg_sys::set_deparse_context_plan((*es).deparse_cxt, plan, ancestors);
            let expr = pg_sys::make_ands_explicit(rt.quals_orig);
            let useprefix = list_len((*es).rtable) > 1 || (*es).verbose;
            let text = pg_sys::deparse_expression(expr as *mut Node, ctx, useprefix, false);
            prop_text(es, c"Index Cond", &CStr::from_ptr(text).to_string_lossy());
        }
        let key = &rt.latched.key;
        let declared = match (rt.totals.declared, rt.nruntime) {
            (Some(d), _) => key.format_span(&d),
            (None, 0) => key.format_span(&span::declared(key, std::slice::from_raw_parts(rt.keys, rt.nkeys as usize))),
            (None, _) => "computed at run time from parameters".to_string(),
        };
        prop_text(es, c"Declared Span", &declared);
        if !analyze || rt.totals.executions == 0 || rt.totals.off {
            return;
        }
        let t = &rt.totals;
        if let Some(touched) = t.touched {
            let checked_declared = t.mode == Some(ReadMode::Fenced) || t.report.fell_back || t.report.streamed;
            let label = if checked_declared { c"Checked Span" } else { c"Touched Span" };
            prop_text(es, label, &key.format_span(&touched));
        }
        let outcome = if t.report.conflicts == 0 { "clean" } else { "conflicts resolved" };
        prop_text(es, c"Validation", outcome);
        prop_int(es, c"Validations", i64::from(t.report.validations));
        prop_int(es, c"Conflicts", i64::from(t.report.conflicts));
        prop_int(es, c"Retries", i64::from(t.report.retries));
        if t.report.pulled_after > 0 {
            prop_int(es, c"Pulled In After Snapshot", i64::from(t.report.pulled_after));
        }
        if t.report.fresh_snapshots > 0 {
            prop_int(es, c"Fresh Snapshots", i64::from(t.report.fresh_snapshots));
        }
        prop_int(es, c"Waits", i64::from(t.report.waits));
        if (*es).timing {
            pg_sys::ExplainPropertyFloat(c"Wait Time".as_ptr(), c"ms".as_ptr(), t.wait_us as f64 / 1000.0, 3, es);
        }
    }
}
