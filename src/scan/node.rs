//! The `PgkvxLimitScan` executor node: begin, exec, end, rescan (in that
//! order, as in Postgres's own node*.c files), then mark/restore and
//! EXPLAIN.
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

use super::plan_data::{GuardPlan, StaticMethods, NAME};
use crate::errors::raw;
use crate::keys::codec::KeyWriter;
use crate::keys::KeyDesc;
use crate::pg::{list_iter, list_nth, make_list, node_tag, rel_name};
use crate::read::span::{self, Declared, KeyQual};
use crate::registry::{self, Latched};
use pgkvx_latch::protocol::ReadReport;
use pgkvx_latch::{RelId, Span};
use pgrx::pg_sys::{self, List, Node};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::rc::Rc;

/// How a statement's guarded reads ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadPath {
    /// `pgkvx.scan_mode = off`: plain PostgreSQL.
    #[default]
    Off,
    Fenced,
    /// Fenced when each guarded scan started, on its bounds as they were
    /// then (they came from an init plan or a CTE).
    FencedAtScan,
    /// Optimistic, and its declared spans were clean: it streamed.
    Streamed,
    /// Optimistic, its result held back until valid.
    Optimistic,
    /// Optimistic, but its result outgrew what can be held back.
    Overflowed,
    /// Optimistic, then fenced after `pgkvx.optimistic_retries` conflicts.
    FellBack,
}

impl ReadPath {
    /// As EXPLAIN ANALYZE shows it.
    pub fn describe(self) -> &'static str {
        match self {
            ReadPath::Off => "off",
            ReadPath::Fenced => "fenced",
            ReadPath::FencedAtScan => "fenced when the scan started",
            ReadPath::Streamed => "optimistic, declared spans clean: streamed",
            ReadPath::Optimistic => "optimistic",
            ReadPath::Overflowed => "optimistic, result too large to hold back: fenced",
            ReadPath::FellBack => "optimistic, fell back to fenced",
        }
    }
}

/// What the read protocol did for the node's statement, for EXPLAIN (the
/// statement runs the protocol; its nodes show the outcome).
#[derive(Default, Debug)]
pub struct StatementReport {
    pub mode: ReadPath,
    pub report: ReadReport,
    pub wait_us: i64,
    /// The writers the statement waited for, named by EXPLAIN ANALYZE.
    pub waited: Vec<crate::read::run::Waited>,
}

pub static SCAN_METHODS: StaticMethods<pg_sys::CustomScanMethods> =
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
}

/// Touched spans kept per node before they are merged into one.
const MAX_SPANS: usize = 32;

/// The executor state: Postgres's part first, then ours, all in the
/// executor's memory: no allocation of our own per statement.
#[repr(C)]
pub struct NodeState {
    css: pg_sys::CustomScanState,
    /// Points at `runtime` once the node has begun.
    rt: *mut NodeRuntime,
    runtime: std::mem::MaybeUninit<NodeRuntime>,
    /// Drops `runtime` when the executor's memory goes.
    drop_cb: pg_sys::MemoryContextCallback,
}

/// Where the guarded scan has got to.
enum ScanPosition {
    /// An index scan in key order: its scan slot holds the row it examined
    /// last, `attnos` are the key columns' positions in that slot,
    /// `key_col` maps an index column to its key position, and `forward`
    /// says whether it moves up the key encoding.
    Ordered {
        scan: *mut pg_sys::ScanState,
        keys: *mut pg_sys::ScanKeyData,
        nkeys: usize,
        key_col: Vec<Option<usize>>,
        attnos: Vec<i32>,
        forward: bool,
    },
    /// A partitioned table's MergeAppend in key order (tree.rs): the rows
    /// it handed up end at the last one (`NodeRuntime::last`), whose key
    /// columns are at `attnos`.
    Stream { attnos: Vec<i32>, forward: bool },
    /// Any other scan: it may have looked anywhere in the declared span.
    Anywhere,
}

/// What an execution remembers of the rows it examined, for when it runs
/// out of rows: its scan's slots are empty then, and where D is open in
/// the direction it moves, T ends at the last key it examined (the
/// greatest, for a scan in no key order).  Kept per row, so kept cheap.
enum Seen {
    /// Nothing to remember: D is bounded there, or nothing can tell.
    Off,
    /// A heap scan in key order (its scan slot is `slot`): the TID of its
    /// last row, read back from the heap when the key is wanted.
    Tid { slot: *mut pg_sys::TupleTableSlot, tid: pg_sys::ItemPointerData },
    /// The key of the last row (`greatest`: of the greatest key so far),
    /// read from `slot` (NULL: the row handed up) at `attnos`.
    Key { slot: *mut pg_sys::TupleTableSlot, attnos: Vec<i32>, greatest: bool, key: Option<KeyWriter> },
}

pub struct NodeRuntime {
    pub plan: Rc<GuardPlan>,
    /// None when the table stopped being latched after planning.
    latched: Option<Rc<Latched>>,
    pub rel: RelId,
    child: *mut pg_sys::PlanState,
    position: ScanPosition,
    /// The bounds' expression states, built when first evaluated: most
    /// statements know their bounds at start and never ask the node.
    bounds: Option<Vec<*mut pg_sys::ExprState>>,
    /// D from the quals known before the statement ran (cached).
    static_declared: Option<Declared>,
    seen: Seen,
    /// The scan has run since it began or was last rescanned.
    started: bool,
    /// The row the child handed up last (NULL: none, or it ran out).  It
    /// stays in its slot until the child is run again, which only this
    /// node does.
    last: *mut pg_sys::TupleTableSlot,
    touched: Vec<Span>,
    /// The statement's protocol outcome, for EXPLAIN.
    pub statement: Option<Rc<RefCell<StatementReport>>>,
    /// A fenced statement whose bounds are known only once it runs: the
    /// scan fences when it first runs, with this `after` for the
    /// statement's snapshot.
    pub fence_at_start: Option<pgkvx_latch::Xid>,
    /// The read stops before this key (the protocol's cut): rows at or
    /// past it are left out, and a scan moving up the key ends there.
    cut: Option<pgkvx_latch::KeyBuf>,
    /// A scan moving up the key met the cut: it has ended.
    stopped: bool,
    /// For a scan in no key order (`Anywhere`) of the latched table itself:
    /// its scan state, whose scan slot holds the row it returned last, and
    /// the key columns' positions there -- so that a cut can leave rows
    /// out by key.
    key_source: Option<(*mut pg_sys::ScanState, Vec<i32>)>,
}

/// Drops the Rust runtime when the executor's memory goes, also after an
/// ERROR (when EndCustomScan never runs).  The memory itself goes with the
/// context, after its callbacks.
#[pg_guard]
unsafe extern "C-unwind" fn drop_runtime(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the runtime begin() wrote, dropped only here.
    unsafe { std::ptr::drop_in_place(arg as *mut NodeRuntime) };
}

/// A plain old frame, like [`exec`]: palloc0's ERROR passes straight on.
unsafe extern "C-unwind" fn create_state(cscan: *mut pg_sys::CustomScan) -> *mut Node {
    // SAFETY: allocating and tagging our state node as the executor expects.
    unsafe {
        let ns = raw::palloc0(std::mem::size_of::<NodeState>()) as *mut NodeState;
        (*ns).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
        (*ns).css.flags = (*cscan).flags;
        (*ns).css.methods = &EXEC_METHODS.0;
        ns as *mut Node
    }
}

/// Whether a scan moving forward through `index` under `keys` returns
/// rows in the order of `key`'s encoding (Some(true)), in its reverse
/// (Some(false)), or neither.  Index columns an equality fixes do not
/// matter; the key's columns must follow in key order.
///
/// # Safety
/// `index` is an open index, `keys` its scan keys.
unsafe fn index_order(index: pg_sys::Relation, keys: &[pg_sys::ScanKeyData], key: &KeyDesc) -> Option<bool> {
    // SAFETY: per contract.
    unsafe {
        // Only a btree index with the key's operator family and collation
        // runs in key order; any other returns rows in an order of its own.
        if (*(*index).rd_rel).relam != pg_sys::BTREE_AM_OID {
            return None;
        }
        let ind = &*(*index).rd_index;
        let n = ind.indnkeyatts as usize;
        let same_order = |col: usize, kc: &crate::keys::desc::KeyCol| {
            *(*index).rd_opfamily.add(col) == kc.opfamily && kc.orders_like_key(*(*index).rd_indcollation.add(col))
        };
        // An equality fixes one value of a column only under a
        // deterministic collation (or none).
        let fixes_one_value = |col: usize| {
            let coll = *(*index).rd_indcollation.add(col);
            coll == pg_sys::InvalidOid || pg_sys::get_collation_isdeterministic(coll)
        };
        let attnums = ind.indkey.values.as_slice(n);
        let fixed = |col: usize| {
            fixes_one_value(col)
                && keys.iter().any(|sk| {
                    let flags = sk.sk_flags as u32;
                    sk.sk_attno as usize == col + 1
                        && u32::from(sk.sk_strategy) == pg_sys::BTEqualStrategyNumber
                        && flags
                            & (pg_sys::SK_SEARCHARRAY
                                | pg_sys::SK_ROW_HEADER
                                | pg_sys::SK_SEARCHNULL
                                | pg_sys::SK_SEARCHNOTNULL)
                            == 0
                })
        };
        let mut next = 0;
        let mut same: Option<bool> = None;
        for (col, &attnum) in attnums.iter().enumerate() {
            if next < key.cols.len() && attnum == key.cols[next].attnum {
                if !same_order(col, &key.cols[next]) {
                    return None;
                }
                if !fixed(col) {
                    let index_desc = *(*index).rd_indoption.add(col) & pg_sys::INDOPTION_DESC as i16 != 0;
                    let s = index_desc == key.cols[next].desc;
                    if same.is_some_and(|d| d != s) {
                        return None;
                    }
                    same = Some(s);
                }
                next += 1;
            } else if !fixed(col) {
                break;
            }
        }
        (next == key.cols.len()).then_some(same.unwrap_or(true))
    }
}

/// How to follow the child's position.
///
/// # Safety
/// `child` is an initialised plan state (not EXPLAIN-only).
unsafe fn position_of(child: *mut pg_sys::PlanState, key: &KeyDesc) -> ScanPosition {
    // SAFETY: per contract; nodes are checked by tag before each cast.
    unsafe {
        let mut s = child;
        // A gating Result (pseudoconstant quals) sits over the scan.
        while node_tag(s) == pg_sys::NodeTag::T_ResultState && !(*s).lefttree.is_null() {
            s = (*s).lefttree;
        }
        let (scan, index, keys, nkeys, dir, only) = match node_tag(s) {
            pg_sys::NodeTag::T_IndexScanState => {
                let is = s as *mut pg_sys::IndexScanState;
                if (*is).iss_NumOrderByKeys > 0 {
                    return ScanPosition::Anywhere;
                }
                let plan = (*s).plan as *mut pg_sys::IndexScan;
                let (k, n) = ((*is).iss_ScanKeys, (*is).iss_NumScanKeys);
                (s as *mut pg_sys::ScanState, (*is).iss_RelationDesc, k, n, (*plan).indexorderdir, false)
            }
            pg_sys::NodeTag::T_IndexOnlyScanState => {
                let is = s as *mut pg_sys::IndexOnlyScanState;
                if (*is).ioss_NumOrderByKeys > 0 {
                    return ScanPosition::Anywhere;
                }
                let plan = (*s).plan as *mut pg_sys::IndexOnlyScan;
                let (k, n) = ((*is).ioss_ScanKeys, (*is).ioss_NumScanKeys);
                (s as *mut pg_sys::ScanState, (*is).ioss_RelationDesc, k, n, (*plan).indexorderdir, true)
            }
            _ => return ScanPosition::Anywhere,
        };
        if index.is_null() {
            return ScanPosition::Anywhere;
        }
        let sks: &[pg_sys::ScanKeyData] =
            if nkeys > 0 { std::slice::from_raw_parts(keys, nkeys as usize) } else { &[] };
        let Some(same) = index_order(index, sks, key) else { return ScanPosition::Anywhere };
        let ind = &*(*index).rd_index;
        let attnums = ind.indkey.values.as_slice(ind.indnatts as usize);
        let key_col = attnums.iter().map(|a| key.cols.iter().position(|c| c.attnum == *a)).collect();
        // An index-only scan's slot holds the index's columns, in its order.
        let attnos = key
            .cols
            .iter()
            .map(|c| {
                if only {
                    attnums.iter().position(|a| *a == c.attnum).map_or(0, |p| p as i32 + 1)
                } else {
                    i32::from(c.attnum)
                }
            })
            .collect::<Vec<_>>();
        if attnos.contains(&0) {
            return ScanPosition::Anywhere;
        }
        let backward = dir == pg_sys::ScanDirection::BackwardScanDirection;
        ScanPosition::Ordered { scan, keys, nkeys: nkeys.max(0) as usize, key_col, attnos, forward: same != backward }
    }
}

/// Where the row an unordered scan of the latched table returned last can
/// be read with its key: the scan's slot and the key columns' positions in
/// it.  None for anything but a scan of the table itself (a join, an
/// Append, a function scan).
///
/// # Safety
/// `child` is an initialised plan state (not EXPLAIN-only).
unsafe fn key_source_of(child: *mut pg_sys::PlanState, key: &KeyDesc) -> Option<(*mut pg_sys::ScanState, Vec<i32>)> {
    // SAFETY: per contract; nodes are checked by tag before each cast.
    unsafe {
        let mut s = child;
        while node_tag(s) == pg_sys::NodeTag::T_ResultState && !(*s).lefttree.is_null() {
            s = (*s).lefttree;
        }
        let heap_cols = || key.cols.iter().map(|c| i32::from(c.attnum)).collect::<Vec<_>>();
        match node_tag(s) {
            pg_sys::NodeTag::T_SeqScanState
            | pg_sys::NodeTag::T_SampleScanState
            | pg_sys::NodeTag::T_BitmapHeapScanState
            | pg_sys::NodeTag::T_TidScanState
            | pg_sys::NodeTag::T_TidRangeScanState
            | pg_sys::NodeTag::T_IndexScanState => {
                let ss = s as *mut pg_sys::ScanState;
                let rel = (*ss).ss_currentRelation;
                (!rel.is_null() && (*rel).rd_id == key.relid).then(|| (ss, heap_cols()))
            }
            pg_sys::NodeTag::T_IndexOnlyScanState => {
                let is = s as *mut pg_sys::IndexOnlyScanState;
                let index = (*is).ioss_RelationDesc;
                let rel = (*is).ss.ss_currentRelation;
                if index.is_null() || rel.is_null() || (*rel).rd_id != key.relid {
                    return None;
                }
                let ind = &*(*index).rd_index;
                let attnums = ind.indkey.values.as_slice(ind.indnatts as usize);
                let attnos: Vec<i32> = key
                    .cols
                    .iter()
                    .map(|c| attnums.iter().position(|a| *a == c.attnum).map_or(0, |p| p as i32 + 1))
                    .collect();
                (!attnos.contains(&0)).then_some((s as *mut pg_sys::ScanState, attnos))
            }
            _ => None,
        }
    }
}

// ---- begin -----------------------------------------------------------------

/// No `#[pg_guard]`: [`crate::errors::rethrow_pending`] catches every
/// unwind.
unsafe extern "C-unwind" fn begin(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    // SAFETY: see errors.rs for the boundary.
    unsafe { crate::errors::rethrow_pending(|| begin_node(node, estate, eflags)) }
}

/// # Safety
/// The arguments of BeginCustomScan.
unsafe fn begin_node(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    // SAFETY (whole body): executor-initialisation protocol; the plan is our
    // CustomScan, built by the planner with one child and our private list.
    unsafe {
        let ns = node as *mut NodeState;
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
        let child = crate::errors::pass(|| raw::ExecInitNode(child_plan, estate, eflags));
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
        let seen = match &latched {
            Some(l) => seen_for(&position, key_source.as_ref(), &plan, &l.key),
            None => Seen::Off,
        };
        let rt = (*ns).runtime.write(NodeRuntime {
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
            touched: Vec::new(),
            statement: None,
            fence_at_start: None,
            cut: None,
            stopped: false,
        });
        let rt: *mut NodeRuntime = rt;
        let cb = &raw mut (*ns).drop_cb;
        (*cb).func = Some(drop_runtime);
        (*cb).arg = rt as *mut std::ffi::c_void;
        // The context create_state allocated the node in.
        raw::MemoryContextRegisterResetCallback(pg_sys::CurrentMemoryContext, cb);
        (*ns).rt = rt;
        // A bound with a subquery of its own joins the node's subplans as
        // its state is built: built now, as every other node's, so that
        // rescans and plan-state walks see it from the start.
        let plain = |e: *mut pg_sys::Expr| {
            matches!(node_tag(e as *const Node), pg_sys::NodeTag::T_Const | pg_sys::NodeTag::T_Param)
                || !pg_sys::contain_subplans(e as *mut Node)
        };
        if !list_iter::<pg_sys::Expr>((*cs).custom_exprs).all(plain) {
            (*rt).bound_states(node);
        }
        // Rows come straight from `exec_node`, not through ExecCustomScan:
        // one indirect call and one interrupt check fewer per row (the
        // child's ExecScan checks for interrupts at every row itself).
        // ExecInitCustomScan set ExecCustomScan before calling us, and
        // ExecInitNode installs whatever is here once we return, behind
        // its first-call and instrumentation wrappers.
        (*ps).ExecProcNode = Some(exec_node);
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
        let rt = (*(node as *mut NodeState)).rt;
        if (*rt).fence_at_start.is_some() {
            fence_at_start(node);
        }
        (*rt).started = true;
        let child = (*rt).child;
        // What Postgres's inline ExecProcNode does first: a child whose
        // parameters changed (an inner scan of a nested loop) starts over.
        if !(*child).chgParam.is_null() {
            rescan_child(child);
        }
        let mut slot = ((*child).ExecProcNode.unwrap_unchecked())(child);
        (*rt).last = slot;
        if (*rt).cut.is_some() {
            slot = cut_rows(&mut *rt, slot);
        }
        match &mut (*rt).seen {
            Seen::Off => {}
            Seen::Tid { slot: scan_slot, tid } => {
                // Cleared slots have an invalid TID: only rows are kept.
                let t = (**scan_slot).tts_tid;
                if t.ip_posid != 0 {
                    *tid = t;
                }
            }
            Seen::Key { .. } => note_key(&mut *rt, slot),
        }
        slot
    }
}

/// [`Seen::Key`]'s bookkeeping for the row `slot` handed up (none when
/// NULL or empty).  A plain old frame like [`exec_node`].
///
/// # Safety
/// `rt` is a begun node's runtime; `slot` is what it hands up now.
#[inline(never)]
unsafe fn note_key(rt: &mut NodeRuntime, slot: *mut pg_sys::TupleTableSlot) {
    let Some(latched) = rt.latched.as_deref() else { return };
    let Seen::Key { slot: from, attnos, greatest, key } = &mut rt.seen else { return };
    // SAFETY: per contract; the scan's slot holds the row it examined last.
    unsafe {
        if is_empty(slot) {
            return;
        }
        let src = if from.is_null() { slot } else { *from };
        let k = latched.key.encode_slot_at(src, attnos);
        if !*greatest || key.as_ref().is_none_or(|g| k.bytes() > g.bytes()) {
            *key = Some(k);
        }
    }
}

/// How a node over `position` remembers what it examined ([`Seen`]):
/// only where D may be left open in the direction it reads.
///
/// # Safety
/// `position` and `key_source` are of a begun node's child.
unsafe fn seen_for(
    position: &ScanPosition,
    key_source: Option<&(*mut pg_sys::ScanState, Vec<i32>)>,
    plan: &GuardPlan,
    key: &KeyDesc,
) -> Seen {
    let may_open = |up: bool| super::guards::may_be_open(plan, key, up);
    // SAFETY: per contract; the scan states are live.
    unsafe {
        match position {
            ScanPosition::Ordered { scan, attnos, forward, .. } if may_open(*forward) => {
                let slot = (**scan).ss_ScanTupleSlot;
                if node_tag(*scan as *mut pg_sys::PlanState) == pg_sys::NodeTag::T_IndexScanState {
                    Seen::Tid { slot, tid: pg_sys::ItemPointerData::default() }
                } else {
                    Seen::Key { slot, attnos: attnos.clone(), greatest: false, key: None }
                }
            }
            ScanPosition::Stream { attnos, forward } if may_open(*forward) => {
                Seen::Key { slot: std::ptr::null_mut(), attnos: attnos.clone(), greatest: false, key: None }
            }
            ScanPosition::Anywhere if may_open(true) => match key_source {
                Some((scan, attnos)) => {
                    Seen::Key { slot: (**scan).ss_ScanTupleSlot, attnos: attnos.clone(), greatest: true, key: None }
                }
                None => Seen::Off,
            },
            _ => Seen::Off,
        }
    }
}

/// The rows of a scan with a cut ([`NodeRuntime::cut`]): each row's key is
/// read from the row the scan examined, rows at or past the cut are left
/// out, and a scan moving up the key ends at the first of them.  A plain
/// old frame like [`exec_node`].
///
/// # Safety
/// `rt` is a begun node's runtime with a cut and an ordered position;
/// `slot` is what its child returned last.
#[inline(never)]
unsafe fn cut_rows(rt: &mut NodeRuntime, mut slot: *mut pg_sys::TupleTableSlot) -> *mut pg_sys::TupleTableSlot {
    let Some(cut) = rt.cut else { return slot };
    let Some(latched) = rt.latched.clone() else { return slot };
    let key = &latched.key;
    // SAFETY: per contract; the child's slots are live until it runs again.
    unsafe {
        loop {
            if rt.stopped {
                return std::ptr::null_mut();
            }
            if slot.is_null() || (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                return slot;
            }
            // An unordered scan's rows past the cut are left out one by one.
            let (src, attnos, forward) = match (&rt.position, &rt.key_source) {
                (ScanPosition::Ordered { scan, attnos, forward, .. }, _) => {
                    ((**scan).ss_ScanTupleSlot, attnos, *forward)
                }
                (ScanPosition::Stream { attnos, forward }, _) => (slot, attnos, *forward),
                (ScanPosition::Anywhere, Some((scan, attnos))) => ((**scan).ss_ScanTupleSlot, attnos, false),
                (ScanPosition::Anywhere, None) => return slot,
            };
            let k = key.encode_slot_at(src, attnos);
            if pgkvx_latch::KeyBuf::floor(k.bytes()) < cut {
                return slot;
            }
            if forward {
                rt.stopped = true;
                return std::ptr::null_mut();
            }
            let child = rt.child;
            slot = ((*child).ExecProcNode.unwrap_unchecked())(child);
            rt.last = slot;
        }
    }
}

/// Gives the guard nodes of a started executor the protocol's cut: each
/// stops before the first key `cut` leaves out of its table.  Raises 40001
/// for a node that cannot stop early after all (the protocol allowed the
/// cut from the plan, before the nodes existed).
///
/// # Safety
/// `nodes` are begun guard nodes.
pub unsafe fn apply_cut(nodes: &[*mut pg_sys::CustomScanState], cut: &pgkvx_latch::Footprint) {
    for &n in nodes {
        // SAFETY: per contract.
        let rt = unsafe { runtime(n) };
        let Some(start) = cut.iter().filter(|(r, _)| *r == rt.rel).map(|(_, s)| s.start).min() else { continue };
        // SAFETY: per contract.
        if !unsafe { can_stop_early(n) } {
            crate::read::run::serialization_error(
                format!(
                    "A transaction that started after this statement's snapshot is writing to \"{}\" inside the span it reads, and this scan cannot stop before that write (it does not read up the key into a LIMIT or a cursor).",
                    rel_name(pg_sys::Oid::from(rt.rel.rel()))
                ),
                "The statement might succeed if retried.",
            );
        }
        rt.cut = Some(start);
        rt.stopped = false;
    }
}

/// Whether this node's scan can stop before a later writer's key and
/// leave its statement a state some serial order produces
/// (`guards::may_cut`).
///
/// # Safety
/// `node` is a begun guard node.
pub unsafe fn can_stop_early(node: *mut pg_sys::CustomScanState) -> bool {
    use super::guards::RowOrder;
    // SAFETY: per contract.
    unsafe {
        let rt = runtime(node);
        let Some(latched) = rt.latched.clone() else { return false };
        let order = match (&rt.position, &rt.key_source) {
            (ScanPosition::Ordered { forward: true, .. } | ScanPosition::Stream { forward: true, .. }, _) => {
                RowOrder::Up
            }
            (ScanPosition::Anywhere, Some(_)) => RowOrder::Unordered,
            _ => RowOrder::Other,
        };
        let stmt = (*(*node).ss.ps.state).es_plannedstmt;
        let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
        super::guards::may_cut(stmt, cs, &latched.key, order, super::guards::open_above(&rt.plan, &latched.key))
    }
}

/// The first run of a scan whose statement fences when its scans start:
/// its bounds are known now (init plans and CTEs they read from have run
/// or run as they are evaluated).  The statement's snapshot cannot move any
/// more -- other scans may have read at it -- so the scan waits for the
/// writers in flight at it in its declared span (one that aborts is gone),
/// and stops before the first key of those that committed: they stay
/// invisible, and a tail reads their rows next time.  Where stopping early
/// would change the statement's answer (`guards::may_cut`,
/// `guards::reads_only_guarded`, REPEATABLE READ) it waits for them
/// instead, and fails with 40001 when one committed.
#[pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn fence_at_start(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node, begun; see errors.rs for the boundary.
    unsafe {
        crate::errors::rethrow_pending(|| {
            use crate::read::{run, snapshot};
            let rt = &mut *(*(node as *mut NodeState)).rt;
            let Some(after) = rt.fence_at_start.take() else { return };
            let d = rt.declared(node);
            let fp: pgkvx_latch::Footprint = d.spans.iter().map(|s| (rt.rel, *s)).collect();
            let estate = (*node).ss.ps.state;
            let base = snapshot::BaseSnapshot::of((*estate).es_snapshot, after);
            let t = crate::shmem::table().reader();
            let check = |out: &mut Vec<pgkvx_latch::Conflict>| {
                let view = base.view();
                crate::shmem::backend::count(pgkvx_latch::Stat::Validations, 1);
                t.check_footprint(&fp, &view, &snapshot::committed, &mut |c| out.push(c));
            };
            let mut met = Vec::new();
            check(&mut met);
            let mut report = pgkvx_latch::ReadReport { validations: 1, ..Default::default() };
            if met.is_empty() {
                if let Some(st) = &rt.statement {
                    st.borrow_mut().report.add(&report);
                }
                return;
            }
            let mut waited = Vec::new();
            let mut wait_us = 0;
            let mut xids: Vec<_> = met.iter().map(|c| c.xid).collect();
            xids.sort_unstable_by_key(|x| x.0);
            xids.dedup();
            report.conflicts = xids.len() as u32;
            // Under REPEATABLE READ later statements would show what a cut
            // left out.
            if !snapshot::fixed_snapshot()
                && can_stop_early(node)
                && super::guards::reads_only_guarded((*estate).es_plannedstmt)
            {
                // Their rows would stay invisible even after a wait.
                report.cuts = 1;
                apply_cut(&[node], &run::cut_upward(&met));
            } else {
                // A writer that aborts leaves nothing to hide.
                let mut live: Vec<_> = met.iter().filter(|c| c.live).copied().collect();
                live.sort_unstable_by_key(|c| c.xid.0);
                live.dedup_by_key(|c| c.xid);
                for c in &live {
                    wait_us += run::wait_for_holder(c, &mut waited);
                    report.waits += 1;
                }
                met.clear();
                check(&mut met);
                report.validations += 1;
                if let Some(c) = met.first() {
                    run::count(&report);
                    run::fenced_at_scan_failure(c.xid, c.rel);
                }
            }
            report.checked = Some(fp.clone());
            run::count(&report);
            if let Some(st) = &rt.statement {
                let mut st = st.borrow_mut();
                st.report.add(&report);
                st.wait_us += wait_us;
                let room = run::MAX_WAITED.saturating_sub(st.waited.len());
                st.waited.extend(waited.into_iter().take(room));
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
    unsafe { raw::ExecEndNode((*(*(node as *mut NodeState)).rt).child) };
}

// ---- rescan ----------------------------------------------------------------

#[pg_guard]
unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node.  The execution that ends here is recorded before
    // its scan moves back to the start.
    unsafe {
        crate::errors::rethrow_pending(|| {
            let rt = &mut *(*(node as *mut NodeState)).rt;
            rt.fold(node);
            rt.stopped = false;
            let child = rt.child;
            let changed = (*node).ss.ps.chgParam;
            if !changed.is_null() {
                pg_sys::UpdateChangedParamSet(child, changed);
            }
            // With changed parameters the child rescans itself when next run.
            if (*child).chgParam.is_null() {
                crate::errors::pass(|| raw::ExecReScan(child));
            }
        })
    }
}

// ---- mark / restore (the inner side of a merge join) -----------------------

#[pg_guard]
unsafe extern "C-unwind" fn mark_pos(node: *mut pg_sys::CustomScanState) {
    // SAFETY: our node; offered only over a child that supports marking.
    unsafe { raw::ExecMarkPos((*(*(node as *mut NodeState)).rt).child) };
}

#[pg_guard]
unsafe extern "C-unwind" fn restr_pos(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as above.  How far the scan got is recorded before it moves
    // back; it goes on from the mark, so it has still started.
    unsafe {
        crate::errors::rethrow_pending(|| {
            let rt = &mut *(*(node as *mut NodeState)).rt;
            rt.fold(node);
            rt.started = true;
            let child = rt.child;
            crate::errors::pass(|| raw::ExecRestrPos(child));
        })
    }
}

impl NodeRuntime {
    /// The key of the latched table, if it is still latched.
    pub fn key(&self) -> Option<&KeyDesc> {
        self.latched.as_ref().map(|l| &l.key)
    }

    /// D from the quals known before the statement ran, evaluated in the
    /// node's expression context.
    unsafe fn static_declared(&mut self, node: *mut pg_sys::CustomScanState) -> Declared {
        if let Some(d) = &self.static_declared {
            return d.clone();
        }
        if self.latched.is_none() {
            return Declared::all();
        }
        // SAFETY: per contract.
        let states = unsafe { self.bound_states(node) };
        let Some(key) = self.latched.as_ref().map(|l| &l.key) else { return Declared::all() };
        // SAFETY: expression states of this node, evaluated in its per-tuple
        // context.
        let quals: Vec<KeyQual> = unsafe {
            let econtext = (*node).ss.ps.ps_ExprContext;
            self.plan
                .bounds
                .iter()
                .zip(states)
                .map(|(b, e)| {
                    let mut isnull = false;
                    let value = crate::errors::pass(|| raw::eval_expr(e, econtext, &mut isnull));
                    b.qual(value, isnull)
                })
                .collect()
        };
        let d = span::declared(key, quals);
        self.static_declared = Some(d.clone());
        d
    }

    /// The expression states of the bounds, built in the executor's memory
    /// the first time they are asked for.
    ///
    /// # Safety
    /// `node` is this runtime's node.
    unsafe fn bound_states(&mut self, node: *mut pg_sys::CustomScanState) -> Vec<*mut pg_sys::ExprState> {
        if let Some(b) = &self.bounds {
            return b.clone();
        }
        // SAFETY: per contract: our plan node's expressions, initialised for
        // our plan state in its executor's query context.
        let b: Vec<_> = unsafe {
            let ps = &raw mut (*node).ss.ps;
            let cs = (*ps).plan as *mut pg_sys::CustomScan;
            let old = pg_sys::MemoryContextSwitchTo((*(*ps).state).es_query_cxt);
            let b = list_iter::<pg_sys::Expr>((*cs).custom_exprs).map(|e| pg_sys::ExecInitExpr(e, ps)).collect();
            pg_sys::MemoryContextSwitchTo(old);
            b
        };
        self.bounds = Some(b.clone());
        b
    }

    /// Records the spans the current execution touched, if it ran, and
    /// forgets what it examined.
    ///
    /// # Safety
    /// `node` is this runtime's node.
    unsafe fn fold(&mut self, node: *mut pg_sys::CustomScanState) {
        if !self.started {
            return;
        }
        self.started = false;
        // SAFETY: per contract.
        let d = unsafe { self.static_declared(node) };
        let Some(latched) = self.latched.clone() else { return };
        let key = &latched.key;
        // SAFETY: the child's scan keys (evaluated for this execution), its
        // slots and the row it handed up last, all live for the scan.
        let t: Vec<Span> = unsafe {
            match &self.position {
                ScanPosition::Ordered { scan, keys, nkeys, key_col, attnos, forward } => {
                    let sks: &[pg_sys::ScanKeyData] =
                        if *nkeys > 0 { std::slice::from_raw_parts(*keys, *nkeys) } else { &[] };
                    let col = |c: usize| key_col.get(c).copied().flatten();
                    let mut d = span::declared(key, span::scan_key_quals(sks, col)).intersect(&d);
                    if span::scan_keys_cap(sks, col, key, *forward) {
                        d.open_above &= !*forward;
                        d.open_below &= *forward;
                    }
                    let slot = (**scan).ss_ScanTupleSlot;
                    match row_key(key, slot, attnos) {
                        Some(k) => d.within(&span::up_to(&k, *forward)).collect(),
                        None => self.ran_out(&d, *forward, *scan, attnos),
                    }
                }
                ScanPosition::Stream { attnos, forward } => match row_key(key, self.last, attnos) {
                    Some(k) => d.within(&span::up_to(&k, *forward)).collect(),
                    None => self.ran_out(&d, *forward, std::ptr::null_mut(), attnos),
                },
                // A scan in no key order that ran out looked at every row,
                // up to the greatest key; one that stopped early, anywhere.
                ScanPosition::Anywhere => {
                    if is_empty(self.last) {
                        self.ran_out(&d, true, std::ptr::null_mut(), &[])
                    } else {
                        d.spans.clone()
                    }
                }
            }
        };
        if let Seen::Key { key, .. } = &mut self.seen {
            *key = None;
        }
        if let Seen::Tid { tid, .. } = &mut self.seen {
            *tid = pg_sys::ItemPointerData::default();
        }
        for t in t {
            // Keys past the cut were left out: the read does not depend on them.
            let t = match self.cut {
                Some(c) => t.intersect(&Span { start: Span::ALL.start, end: c }),
                None => t,
            };
            self.add_touched(t);
        }
    }

    /// T of an execution that ran out of rows ([`Declared::ran_out`]): all
    /// of D where D is bounded in the direction it read (a range read may
    /// move its cursor to the bound); else D's open interval only up to
    /// the last key it examined -- rows past the last visible key are rows
    /// it could not have returned, whose writers commit after its
    /// snapshot, and a consumer reading up the key reads them next time
    /// from its cursor.
    ///
    /// # Safety
    /// `scan` (or NULL) is this node's scan, run out of rows; `attnos` are
    /// the key columns' positions in its slot.
    unsafe fn ran_out(&self, d: &Declared, forward: bool, scan: *mut pg_sys::ScanState, attnos: &[i32]) -> Vec<Span> {
        if !d.open_toward(forward) {
            return d.spans.clone();
        }
        let Some(latched) = self.latched.as_deref() else { return d.spans.clone() };
        let last = match &self.seen {
            Seen::Off => return d.spans.clone(),
            Seen::Tid { tid, .. } if tid.ip_posid == 0 => None,
            // SAFETY: per contract.
            Seen::Tid { tid, .. } => match unsafe { key_at_tid(scan, *tid, &latched.key, attnos) } {
                Some(k) => Some(k),
                None => return d.spans.clone(),
            },
            Seen::Key { key, .. } => *key,
        };
        d.ran_out(last.as_ref(), forward)
    }

    fn add_touched(&mut self, t: Span) {
        if t.is_empty() {
            return;
        }
        if let Some(last) = self.touched.last_mut() {
            if last.overlaps(&t) || last.end == t.start || t.end == last.start {
                *last = last.hull(&t);
                return;
            }
        }
        self.touched.push(t);
        if self.touched.len() > MAX_SPANS {
            // Many scattered executions (an inner loop): one span over
            // them all is wider, never narrower.
            let all = self.touched.iter().fold(Span::EMPTY, |a, s| a.hull(s));
            self.touched = vec![all];
        }
    }

    /// Every span this node's executions touched, including the current one.
    ///
    /// # Safety
    /// `node` is this runtime's node.
    pub unsafe fn touched(&mut self, node: *mut pg_sys::CustomScanState) -> Vec<Span> {
        // SAFETY: per contract.
        unsafe { self.fold(node) };
        self.touched.clone()
    }

    /// D as known before the statement runs (for fenced reads).
    ///
    /// # Safety
    /// `node` is this runtime's node.
    pub unsafe fn declared(&mut self, node: *mut pg_sys::CustomScanState) -> Declared {
        // SAFETY: per contract.
        unsafe { self.static_declared(node) }
    }
}

/// Whether `slot` is NULL or holds no row.
///
/// # Safety
/// `slot` is NULL or a live slot.
unsafe fn is_empty(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: per contract.
    slot.is_null() || unsafe { (*slot).tts_flags } & pg_sys::TTS_FLAG_EMPTY as u16 != 0
}

/// The key of the row in `slot` (its key columns at `attnos`), or None
/// when it holds none: the scan ran out of rows.
///
/// # Safety
/// `slot` is NULL or a live slot holding a row of the latched table.
unsafe fn row_key(key: &KeyDesc, slot: *mut pg_sys::TupleTableSlot, attnos: &[i32]) -> Option<KeyWriter> {
    // SAFETY: per contract.
    unsafe { (!is_empty(slot)).then(|| key.encode_slot_at(slot, attnos)) }
}

/// The key of the heap row at `tid`, read into `scan`'s own slot -- empty,
/// as the scan has run out of rows -- and cleared from it again.  The row
/// was visible to the statement's snapshot, which is still registered, so
/// no vacuum can have removed it; None if it is gone all the same.
///
/// # Safety
/// `scan` is a heap scan of the latched table that has run out of rows;
/// `attnos` are the key columns' positions in its slot.
unsafe fn key_at_tid(
    scan: *mut pg_sys::ScanState,
    tid: pg_sys::ItemPointerData,
    key: &KeyDesc,
    attnos: &[i32],
) -> Option<KeyWriter> {
    // SAFETY: per contract; the fetch is the table AM's own, into a slot
    // of the AM's kind (the scan's), under any snapshot: the TID names the
    // row version the scan returned.
    unsafe {
        let rel = (*scan).ss_currentRelation;
        let slot = (*scan).ss_ScanTupleSlot;
        if rel.is_null() || !is_empty(slot) {
            return None;
        }
        let fetch = (*(*rel).rd_tableam).tuple_fetch_row_version?;
        let mut tid = tid;
        let found = crate::errors::pass(|| fetch(rel, &mut tid, &raw mut pg_sys::SnapshotAnyData, slot));
        if !found {
            return None;
        }
        let k = key.encode_slot_at(slot, attnos);
        crate::errors::pass(|| ((*(*slot).tts_ops).clear.unwrap_unchecked())(slot));
        Some(k)
    }
}

/// The runtime of a node of ours.
///
/// # Safety
/// `node` is a `PgkvxLimitScan` state that has begun.
pub unsafe fn runtime<'a>(node: *mut pg_sys::CustomScanState) -> &'a mut NodeRuntime {
    // SAFETY: per contract.
    unsafe { &mut *(*(node as *mut NodeState)).rt }
}

/// Whether a plan state is one of our nodes.
///
/// # Safety
/// `ps` is a valid plan state.
pub unsafe fn is_ours(ps: *mut pg_sys::PlanState) -> bool {
    // SAFETY: per contract; methods are compared by address.
    unsafe {
        node_tag(ps) == pg_sys::NodeTag::T_CustomScanState
            && std::ptr::eq((*(ps as *mut pg_sys::CustomScanState)).methods, &EXEC_METHODS.0)
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

/// Intervals shown before the rest are only counted.
const SHOWN_SPANS: usize = 8;

fn spans_text(key: &KeyDesc, spans: &[Span]) -> String {
    if spans.is_empty() {
        return "none".into();
    }
    let mut text = spans.iter().take(SHOWN_SPANS).map(|s| key.format_span(s)).collect::<Vec<_>>().join(", ");
    if spans.len() > SHOWN_SPANS {
        text.push_str(&format!(", … ({} intervals)", spans.len()));
    }
    text
}

#[pg_guard]
unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    _ancestors: *mut List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: see errors.rs for the boundary.
    unsafe { crate::errors::rethrow_pending(|| explain_node(node, es)) }
}

/// # Safety
/// The arguments of ExplainCustomScan.
unsafe fn explain_node(node: *mut pg_sys::CustomScanState, es: *mut pg_sys::ExplainState) {
    // SAFETY (whole body): our node and the caller's ExplainState.
    unsafe {
        let rt = &mut *(*(node as *mut NodeState)).rt;
        let analyze = (*es).analyze;
        let st = rt.statement.clone();
        let mode = match (&st, analyze) {
            (Some(st), true) => st.borrow().mode.describe().to_string(),
            // What the statement would read in: one that cannot run twice
            // (row locks, side effects) never reads optimistically.
            _ => crate::read::admit::planned_mode(rt.plan.restartable).to_string(),
        };
        prop_text(es, c"Mode", &mode);
        let Some(key) = rt.latched.as_ref().map(|l| l.key.clone()) else {
            prop_text(es, c"Table", &format!("{} (no longer latched)", rel_name(rt.plan.relid)));
            return;
        };
        match rt.latched.as_ref().map(|l| l.root).filter(|&r| r != rt.plan.relid) {
            // The latch identity, and the partition this scan reads.
            Some(root) => prop_text(es, c"Table", &format!("{} (partition {})", rel_name(root), key.relname)),
            None => prop_text(es, c"Table", &key.relname),
        }
        // Plain EXPLAIN runs nothing of the user's: bounds that call
        // functions other than immutable ones, or read an init plan's
        // result, are known only at run time.
        let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
        let bounds_run_functions = || {
            list_iter::<pg_sys::Node>((*cs).custom_exprs)
                .any(|e| pg_sys::contain_mutable_functions(e) || !super::planner::exec_param_ids(e).is_empty())
        };
        // Spans are keys, and keys are table data: only for a role that
        // may read every row of the key (a view can hide the key column).
        let attnums: Vec<i16> = key.cols.iter().map(|c| c.attnum).collect();
        let (_, keys_visible) = crate::read::admit::may_see(rt.plan.relid, &attnums);
        // Read through its parent, a partition's privileges are the parent's.
        let keys_visible = keys_visible
            || rt.latched.as_ref().filter(|l| l.root != rt.plan.relid).is_some_and(|l| {
                let root_attnums: Vec<i16> = crate::registry::lookup(l.root)
                    .map(|r| r.key.cols.iter().map(|c| c.attnum).collect())
                    .unwrap_or_default();
                crate::read::admit::may_see(l.root, &root_attnums).1
            });
        const HIDDEN: &str = "(keys hidden: requires SELECT on every row of the key)";
        if !keys_visible {
            prop_text(es, c"Declared Span", HIDDEN);
        } else if analyze || !bounds_run_functions() {
            let declared = rt.declared(node);
            prop_text(es, c"Declared Span", &spans_text(&key, &declared.spans));
        } else {
            prop_text(es, c"Declared Span", "computed when the statement runs");
        }
        let Some(st) = st.filter(|_| analyze) else { return };
        let st = st.borrow();
        if st.mode == ReadPath::Off {
            return;
        }
        let touched = rt.touched(node);
        prop_text(es, c"Touched Span", &if keys_visible { spans_text(&key, &touched) } else { HIDDEN.to_string() });
        let r = &st.report;
        let outcome = if r.conflicts == 0 { "clean" } else { "conflicts resolved" };
        prop_text(es, c"Validation", outcome);
        prop_int(es, c"Validations", i64::from(r.validations));
        prop_int(es, c"Conflicts", i64::from(r.conflicts));
        prop_int(es, c"Retries", i64::from(r.retries));
        if r.cuts > 0 {
            prop_int(es, c"Stopped Before Later Writers", i64::from(r.cuts));
        }
        if r.fresh_snapshots > 0 {
            prop_int(es, c"Fresh Snapshots", i64::from(r.fresh_snapshots));
        }
        prop_int(es, c"Waits", i64::from(r.waits));
        if (*es).timing {
            pg_sys::ExplainPropertyFloat(c"Wait Time".as_ptr(), c"ms".as_ptr(), st.wait_us as f64 / 1000.0, 3, es);
        }
        let mine: Vec<_> = st.waited.iter().filter(|w| w.rel == rt.rel).collect();
        if !mine.is_empty() {
            let named: Vec<String> = mine.iter().map(|w| waited_for(&key, w, keys_visible)).collect();
            prop_text(es, c"Waited For", &named.join("; "));
        }
    }
}

/// One writer a statement waited for, as EXPLAIN ANALYZE names it: its xid
/// (as `pg_locks` and `pg_stat_activity.backend_xid` show it), its pid and
/// its first latch in the span the read checked -- looked up now: the
/// holder's released latch is kept while this statement's snapshot lives,
/// unless it was coalesced under pressure (then the checked span is shown).
/// Spans only when the caller may see keys (`keys_visible`).
fn waited_for(key: &KeyDesc, w: &crate::read::run::Waited, keys_visible: bool) -> String {
    let mut first: Option<(i32, Span)> = None;
    crate::shmem::table().reader().for_each_latch_of(w.rel, &w.checked, &mut |l| {
        if l.xid == w.xid && first.is_none_or(|(_, s)| l.span.start < s.start) {
            first = Some((l.pid, l.span));
        }
    });
    let at = |span: &Span| if keys_visible { key.format_span(span) } else { "(keys hidden)".to_string() };
    match first {
        Some((pid, span)) => format!("pid {pid} xid {} at {}", w.xid.0, at(&span)),
        None => format!("xid {} in {}", w.xid.0, at(&w.checked)),
    }
}
