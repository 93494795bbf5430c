//! A node's state in the executor, and the span bookkeeping it does as
//! its scan runs: the declared span D, evaluated once per execution, and
//! the span T each execution touched -- up to the row the scan examined
//! last when it reads in key order, all of D otherwise, only up to the last
//! key examined where it ran out of rows toward an end D leaves open.

use super::plan_data::GuardPlan;
use super::position::{is_empty, key_at_tid, row_key, ScanPosition};
use super::report::StatementReport;
use crate::keys::codec::KeyWriter;
use crate::keys::KeyDesc;
use crate::pg::{list_iter, node_tag};
use crate::read::span::{self, Declared, KeyQual, Spans};
use crate::registry::Latched;
use pgkvx_latch::{RelId, Span};
use pgrx::pg_sys;
use pgrx::prelude::*;
use smallvec::{smallvec, SmallVec};
use std::cell::RefCell;
use std::rc::Rc;

/// Touched spans kept per node before they are merged into one.
const MAX_SPANS: usize = 32;

/// The executor state: Postgres's part first, then ours, all in the
/// executor's memory: no allocation of our own per statement.
/// Its fields are this file's: the rest of `scan/` makes the state with
/// [`NodeState::alloc`] and [`NodeState::start`] and reaches the runtime
/// only through [`with_runtime`], which lends it for one call.
#[repr(C)]
pub struct NodeState {
    css: pg_sys::CustomScanState,
    /// Points at `runtime` once the node has begun.
    rt: *mut NodeRuntime,
    runtime: std::mem::MaybeUninit<NodeRuntime>,
    /// Drops `runtime` when the executor's memory goes.
    drop_cb: pg_sys::MemoryContextCallback,
    /// Whether [`with_runtime`] has lent `runtime` out now (false zeroed).
    lent: std::cell::Cell<bool>,
    /// The read stops before this key (the protocol's cut): rows at or
    /// past it are left out, and a scan moving up the key ends there.
    /// Outside the runtime, so that it is read without a lend
    /// ([`cut_of_node`]): EvalPlanQual's copy of this node begins while
    /// Postgres runs user code, maybe inside a lend of this node.
    cut: std::cell::Cell<Option<pgkvx_latch::KeyBuf>>,
}

impl NodeState {
    /// A zeroed state node for `cscan`, tagged and given our methods, in
    /// the current memory context (CreateCustomScanState).  A plain old
    /// frame: palloc0's ERROR passes straight on.
    ///
    /// # Safety
    /// `cscan` is a PgkvxLimitScan plan node; `methods` lives for ever.
    pub(super) unsafe fn alloc(
        cscan: *mut pg_sys::CustomScan,
        methods: *const pg_sys::CustomExecMethods,
    ) -> *mut pg_sys::Node {
        // SAFETY: palloc0 returns zeroed memory of NodeState's size (or
        // raises), and a zeroed NodeState is valid with `rt` NULL (not begun);
        // `cscan` is a live plan node by the caller's contract.
        unsafe {
            let ns = crate::pg::raw::palloc0(std::mem::size_of::<NodeState>()) as *mut NodeState;
            (*ns).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
            (*ns).css.flags = (*cscan).flags;
            (*ns).css.methods = methods;
            ns as *mut pg_sys::Node
        }
    }

    /// Moves `rt` into the node's own memory, arranges for it to be
    /// dropped when that memory goes (also after an ERROR, when
    /// EndCustomScan never runs), and marks the node begun.
    ///
    /// # Safety
    /// `node` was made by [`NodeState::alloc`] in the current memory context
    /// and has not begun.
    pub(super) unsafe fn start(node: *mut pg_sys::CustomScanState, rt: NodeRuntime) {
        // SAFETY: `node` is a NodeState (the caller's contract) whose
        // `runtime` is still uninitialised, so writing it drops nothing; the
        // callback lives in the node, in the context it is registered with.
        unsafe {
            let ns = node as *mut NodeState;
            let rt: *mut NodeRuntime = (*ns).runtime.write(rt);
            let (cx, cb) = (pg_sys::CurrentMemoryContext, &raw mut (*ns).drop_cb);
            crate::pg::memcx::on_reset_with(cx, cb, drop_runtime, rt as *mut std::ffi::c_void);
            (*ns).rt = rt;
        }
    }
}

/// What an execution remembers of the rows it examined, for when it runs
/// out of rows: its scan's slots are empty then, and where D is open in
/// the direction it moves, T ends at the last key it examined (the
/// greatest, for a scan in no key order).  Kept per row, so kept cheap.
pub(super) enum Seen {
    /// Nothing to remember: D is bounded there, or nothing can tell.
    Off,
    /// A heap scan in key order (its scan slot is `slot`): the TID of its
    /// last row, read back from the heap when the key is wanted.
    Tid { slot: *mut pg_sys::TupleTableSlot, tid: pg_sys::ItemPointerData },
    /// The key of the last row (`greatest`: of the greatest key so far),
    /// read from `slot` (NULL: the row handed up) at `attnos`.
    Key { slot: *mut pg_sys::TupleTableSlot, attnos: Vec<i32>, greatest: bool, key: Option<KeyWriter> },
    /// An index scan in key order whose rows the node does not watch
    /// (`bypass.rs`): once it has run out, its last row is the one its own
    /// index scan finds one step back from its end.
    StepBack,
}

/// A scan that fences when it first runs (`node::fence_at_start`).
#[derive(Clone, Copy)]
pub struct FenceAtStart {
    /// The statement's snapshot.
    pub after: pgkvx_latch::Xid,
    /// The one latched table the statement's guards read
    /// (`Guards::sole_root`), for `cut::reads_only_guarded`.
    pub sole_root: Option<pg_sys::Oid>,
}

/// The bounds' expression states: a few pointers, inline.
pub(super) type BoundStates = SmallVec<[*mut pg_sys::ExprState; 4]>;

pub struct NodeRuntime {
    pub(super) plan: Rc<GuardPlan>,
    /// None when the table stopped being latched after planning.
    pub(super) latched: Option<Rc<Latched>>,
    pub(super) rel: RelId,
    pub(super) child: *mut pg_sys::PlanState,
    pub(super) position: ScanPosition,
    /// The bounds' expression states, built when first evaluated: most
    /// statements know their bounds at start and never ask the node.
    pub(super) bounds: Option<BoundStates>,
    /// D from the quals known before the statement ran (cached).
    pub(super) static_declared: Option<Rc<Declared>>,
    pub(super) seen: Seen,
    /// The scan has run since it began or was last rescanned.
    pub(super) started: bool,
    /// The row the child handed up last (NULL: none, or it ran out).  It
    /// stays in its slot until the child is run again, which only this
    /// node does.
    pub(super) last: *mut pg_sys::TupleTableSlot,
    pub(super) touched: Spans,
    /// T against writers that started after the statement's first
    /// snapshot: where a read bounded in its direction ran out of rows,
    /// only up to the last key it examined (the latch core's `protocol`:
    /// a reader never chases them); elsewhere as `touched`.
    pub(super) touched_later: Spans,
    /// The statement's protocol outcome, for EXPLAIN.
    pub(super) statement: Option<Rc<RefCell<StatementReport>>>,
    /// A fenced statement whose bounds are known only once it runs: the
    /// scan fences when it first runs, with this `after` for the
    /// statement's snapshot.
    pub(super) fence_at_start: Option<FenceAtStart>,
    /// In EvalPlanQual's copy of a plan (row locks re-checking a row a
    /// concurrent writer changed): its state, whose slot holds the row
    /// being re-checked, and the scan hands that row up without storing
    /// it in its own scan slot.  Null in every other executor.
    pub(super) epq: *mut pg_sys::EPQState,
    /// A scan moving up the key met the cut: it has ended.
    pub(super) stopped: bool,
    /// Whether the statement guards one latched table ([`Self::reads_one_table`]).
    pub(super) one_table: std::cell::Cell<Option<bool>>,
    /// For a scan in no key order (`Anywhere`) of the latched table itself:
    /// its scan state, whose scan slot holds the row it returned last, and
    /// the key columns' positions there -- so that a cut can leave rows
    /// out by key.
    pub(super) key_source: Option<(*mut pg_sys::ScanState, Vec<i32>)>,
}

/// Drops the Rust runtime when the executor's memory goes, also after an
/// ERROR (when EndCustomScan never runs).  The memory itself goes with the
/// context, after its callbacks.
#[pg_guard]
unsafe extern "C-unwind" fn drop_runtime(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the runtime begin() wrote, dropped only here.
    unsafe { std::ptr::drop_in_place(arg as *mut NodeRuntime) };
}

/// [`Seen::Key`]'s bookkeeping for the row `slot` handed up (none when
/// NULL or empty).  A plain old frame like [`exec_node`].
///
/// # Safety
/// `rt` is a begun node's runtime; `slot` is what it hands up now.
#[inline(never)]
pub(super) unsafe fn note_key(rt: &mut NodeRuntime, slot: *mut pg_sys::TupleTableSlot) {
    let Some(latched) = rt.latched.as_deref() else { return };
    let Seen::Key { slot: from, attnos, greatest, key } = &mut rt.seen else { return };
    // SAFETY: `rt` is begun (the caller's contract), so `from` is its child's scan slot, which holds
    // the row the scan examined last until the child runs again, and `attnos` are its key columns.
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
/// where D may be left open in the direction it reads, and wherever an
/// index scan reads in key order (for T against later writers,
/// `touched_later`, also where D is bounded).
///
/// # Safety
/// `position` and `key_source` are of a begun node's child.
pub(super) unsafe fn seen_for(
    position: &ScanPosition,
    key_source: Option<&(*mut pg_sys::ScanState, Vec<i32>)>,
    plan: &GuardPlan,
    key: &KeyDesc,
) -> Seen {
    let may_open = |up: bool| super::guards::may_be_open(plan, key, up);
    // SAFETY: `position` and `key_source` come from the begun node's child (the caller's contract):
    // the scan states they point at live as long as the executor's memory.
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
            ScanPosition::Ordered { scan, attnos, .. } => {
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

impl NodeRuntime {
    /// Shows the statement's protocol outcome to this node's EXPLAIN.
    pub fn attach_report(&mut self, report: Rc<RefCell<StatementReport>>) {
        self.statement = Some(report);
    }

    /// Makes the scan fence when it first runs, for a statement whose
    /// snapshot is `after` (see `node::fence_at_start`), whose guards read
    /// `sole_root` alone (`Guards::sole_root`).
    pub fn fence_at_first_run(&mut self, after: pgkvx_latch::Xid, sole_root: Option<pg_sys::Oid>) {
        self.fence_at_start = Some(FenceAtStart { after, sole_root });
    }

    /// Whether the node may leave its scan's rows to its parent for an
    /// execution it will not rescan (`bypass.rs`): an index scan of the
    /// table's rows in key order, no filter (its last row is then the last
    /// visible one its index quals match), no array keys, no fence or cut
    /// to apply per row, not EvalPlanQual's copy.  If so, the node stops
    /// watching rows (`Seen::StepBack`), counts as started, and hands back
    /// the plan state its parent should pull rows from.
    ///
    /// # Safety
    /// The runtime of a begun node that has not run.
    pub(super) unsafe fn leave_rows_to_parent(&mut self) -> Option<*mut pg_sys::PlanState> {
        let Seen::Tid { .. } = self.seen else { return None };
        let ScanPosition::Ordered { scan, keys, nkeys, .. } = &self.position else { return None };
        if self.fence_at_start.is_some() || !self.epq.is_null() {
            return None;
        }
        // SAFETY: the caller's contract: the scan state and its keys are
        // the begun child's (Seen::Tid is only ever an index scan's).
        unsafe {
            if node_tag(*scan as *mut pg_sys::PlanState) != pg_sys::NodeTag::T_IndexScanState
                || !(**scan).ps.qual.is_null()
            {
                return None;
            }
            let sks: &[pg_sys::ScanKeyData] = if *nkeys > 0 { std::slice::from_raw_parts(*keys, *nkeys) } else { &[] };
            if sks.iter().any(|k| k.sk_flags as u32 & pg_sys::SK_SEARCHARRAY != 0) {
                return None;
            }
        }
        self.seen = Seen::StepBack;
        self.started = true;
        Some(self.child)
    }

    /// The latch identity the node's reads validate against.
    pub fn rel(&self) -> RelId {
        self.rel
    }

    /// The key of the latched table, if it is still latched.
    pub fn key(&self) -> Option<&KeyDesc> {
        self.latched.as_ref().map(|l| &l.key)
    }

    /// D from the quals known before the statement ran, evaluated in the
    /// node's expression context.
    unsafe fn static_declared(&mut self, node: *mut pg_sys::CustomScanState) -> Rc<Declared> {
        if let Some(d) = &self.static_declared {
            return d.clone();
        }
        let Some(latched) = self.latched.clone() else { return Rc::new(Declared::all()) };
        // Constants and a client's parameters, nearly every tail's bounds,
        // are read where they live: no expression state built for them.
        // SAFETY: `node` is this runtime's begun node (the caller's
        // contract): its plan node's expressions and its executor's
        // parameters are live; a by-reference value is used at once.
        let direct: Option<SmallVec<[(pg_sys::Datum, bool); 4]>> = unsafe {
            let params = (*(*node).ss.ps.state).es_param_list_info;
            let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            list_iter::<pg_sys::Expr>((*cs).custom_exprs).map(|e| super::guards::direct_value(e, params)).collect()
        };
        let quals: SmallVec<[KeyQual; 4]> = match direct {
            Some(values) => self.plan.bounds.iter().zip(values).map(|(b, (v, isnull))| b.qual(v, isnull)).collect(),
            // SAFETY: as above: expression states of this node, evaluated
            // in its per-tuple context.  A bound that raised (the scan has
            // not run, or evaluates it later) bounds nothing: only a wider D.
            None => unsafe {
                let states = self.bound_states(node);
                let econtext = (*node).ss.ps.ps_ExprContext;
                let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
                self.plan
                    .bounds
                    .iter()
                    .zip(states)
                    .zip(list_iter::<pg_sys::Expr>((*cs).custom_exprs))
                    .map(|((b, state), e)| match super::guards::evaluate_bound(e, state, econtext) {
                        Some((value, isnull)) => b.qual(value, isnull),
                        None => KeyQual::unknown(b.group, b.branch),
                    })
                    .collect()
            },
        };
        let d = Rc::new(span::declared(&latched.key, quals));
        self.static_declared = Some(d.clone());
        d
    }

    /// The expression states of the bounds, built in the executor's memory
    /// the first time they are asked for.
    ///
    /// # Safety
    /// `node` is this runtime's node.
    pub(super) unsafe fn bound_states(&mut self, node: *mut pg_sys::CustomScanState) -> BoundStates {
        if let Some(b) = &self.bounds {
            return b.clone();
        }
        // SAFETY: `node` is this runtime's node (the caller's contract): our plan node's
        // expressions, initialised for our plan state in its executor's query context.
        let b: BoundStates = unsafe {
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
    pub(super) unsafe fn fold(&mut self, node: *mut pg_sys::CustomScanState) {
        if !self.started {
            return;
        }
        self.started = false;
        // SAFETY: `node` is this runtime's node (the caller's contract), so its child's scan state and
        // slots, which the execution's span is read from, are live.
        let d = unsafe { self.static_declared(node) };
        let Some(latched) = self.latched.clone() else { return };
        let key = &latched.key;
        // SAFETY: a begun node's executor state.
        let stmt = unsafe { (*(*node).ss.ps.state).es_plannedstmt };
        // SAFETY: the child's scan keys (evaluated for this execution), its
        // slots and the row it handed up last, all live for the scan.
        let (t, t_later): (Spans, Spans) = unsafe {
            let both = |t: Spans| (t.clone(), t);
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
                        Some(k) => both(d.within(&span::up_to(&k, *forward)).collect()),
                        None => self.ran_out(stmt, &d, *forward, *scan, attnos),
                    }
                }
                ScanPosition::Stream { attnos, forward } => match row_key(key, self.last, attnos) {
                    Some(k) => both(d.within(&span::up_to(&k, *forward)).collect()),
                    None => self.ran_out(stmt, &d, *forward, std::ptr::null_mut(), attnos),
                },
                // A scan in no key order that ran out looked at every row,
                // up to the greatest key; one that stopped early, anywhere.
                ScanPosition::Anywhere => {
                    if is_empty(self.last) {
                        self.ran_out(stmt, &d, true, std::ptr::null_mut(), &[])
                    } else {
                        both(d.spans.clone())
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
        // Keys past the cut were left out: the read does not depend on them.
        // SAFETY: `node` is this runtime's node (the caller's contract).
        let cut = |t: Span| match unsafe { cut_of_node(node) } {
            Some(c) => t.intersect(&Span { start: Span::ALL.start, end: c }),
            None => t,
        };
        let (t, t_later): (Spans, Spans) = (t.into_iter().map(cut).collect(), t_later.into_iter().map(cut).collect());
        for t in t {
            add_span(&mut self.touched, t);
        }
        for t in t_later {
            add_span(&mut self.touched_later, t);
        }
    }

    /// T of an execution that ran out of rows, and T against later writers
    /// (see `touched_later`; [`Declared::up_to_last`]): all
    /// of D where D is bounded in the direction it read (a range read may
    /// move its cursor to the bound); else D's open interval only up to
    /// the last key it examined -- rows past the last visible key are rows
    /// it could not have returned, whose writers commit after its
    /// snapshot, and a consumer reading up the key reads them next time
    /// from its cursor.  All of D too when statement `stmt` guards more
    /// than one latched table: a cursor shared between them (the greatest
    /// key read of either) could pass a row in flight in this one.
    ///
    /// # Safety
    /// `scan` (or NULL) is this node's scan, run out of rows; `attnos` are
    /// the key columns' positions in its slot.
    unsafe fn ran_out(
        &self,
        stmt: *mut pg_sys::PlannedStmt,
        d: &Declared,
        forward: bool,
        scan: *mut pg_sys::ScanState,
        attnos: &[i32],
    ) -> (Spans, Spans) {
        let all = || (d.spans.clone(), d.spans.clone());
        let Some(latched) = self.latched.as_deref() else { return all() };
        // SAFETY: `stmt` is this node's statement (the caller's contract), live while it runs.
        if !unsafe { self.reads_one_table(stmt) } {
            return all();
        }
        let last = match &self.seen {
            Seen::Off => return all(),
            Seen::Tid { tid, .. } if tid.ip_posid == 0 => None,
            // SAFETY: `scan` is this node's scan, run out of rows, and `attnos` its key columns (the
            // caller's contract); `tid` is a row that scan returned, read back through its relation.
            Seen::Tid { tid, .. } => match unsafe { key_at_tid(scan, *tid, &latched.key, attnos) } {
                Some(k) => Some(k),
                None => return all(),
            },
            Seen::Key { key, .. } => *key,
            // SAFETY: as for `Tid`: `scan` is this node's index scan, run out of rows.
            Seen::StepBack => match unsafe { super::position::key_one_back(scan, &latched.key, attnos) } {
                Some(k) => k,
                None => return all(),
            },
        };
        (d.ran_out(last.as_ref(), forward), d.up_to_last(last.as_ref(), forward))
    }

    /// Whether statement `stmt` guards one latched table (or tree), found
    /// once per executor.
    ///
    /// # Safety
    /// `stmt` is this node's statement.
    unsafe fn reads_one_table(&self, stmt: *mut pg_sys::PlannedStmt) -> bool {
        if let Some(one) = self.one_table.get() {
            return one;
        }
        // SAFETY: `stmt` is this node's statement (the caller's contract), live while it runs.
        let one = unsafe { super::guards::guards_one_table(stmt) };
        self.one_table.set(Some(one));
        one
    }

    /// Every span this node's executions touched, including the current one.
    ///
    /// # Safety
    /// `node` is this runtime's node.
    pub unsafe fn touched(&mut self, node: *mut pg_sys::CustomScanState) -> Spans {
        // SAFETY: `node` is this runtime's node (the caller's contract).
        unsafe { self.fold(node) };
        self.touched.clone()
    }

    /// Every span its executions touched, against later writers.
    ///
    /// # Safety
    /// `node` is this runtime's node.
    pub unsafe fn touched_later(&mut self, node: *mut pg_sys::CustomScanState) -> Spans {
        // SAFETY: `node` is this runtime's node (the caller's contract).
        unsafe { self.fold(node) };
        self.touched_later.clone()
    }

    /// D as known before the statement runs (for fenced reads).
    ///
    /// # Safety
    /// `node` is this runtime's node.
    pub unsafe fn declared(&mut self, node: *mut pg_sys::CustomScanState) -> Rc<Declared> {
        // SAFETY: `node` is this runtime's node (the caller's contract).
        unsafe { self.static_declared(node) }
    }
}

/// Adds span `t` of one execution to `spans`.
fn add_span(spans: &mut Spans, t: Span) {
    if t.is_empty() {
        return;
    }
    if let Some(last) = spans.last_mut() {
        if last.overlaps(&t) || last.end == t.start || t.end == last.start {
            *last = last.hull(&t);
            return;
        }
    }
    spans.push(t);
    if spans.len() > MAX_SPANS {
        // Many scattered executions (an inner loop): one span over them
        // all is wider, never narrower.
        let all = spans.iter().fold(Span::EMPTY, |a, s| a.hull(s));
        *spans = smallvec![all];
    }
}

/// Gives a begun node its cut ([`NodeState`]'s `cut`): the scan goes on
/// from where it is.
///
/// # Safety
/// `node` is a `PgkvxLimitScan` state that has begun, and not lent now.
pub(super) unsafe fn set_cut(node: *mut pg_sys::CustomScanState, cut: Option<pgkvx_latch::KeyBuf>) {
    // SAFETY: the caller's contract; `cut` is a Cell of the NodeState
    // outside the runtime, so no lend of the runtime aliases it.
    unsafe {
        with_runtime(node, |rt| rt.stopped = false);
        (*(node as *mut NodeState)).cut.set(cut);
    }
}

/// A begun node's cut, read without lending its runtime.
///
/// # Safety
/// `node` is a `PgkvxLimitScan` state that has begun.
pub(super) unsafe fn cut_of_node(node: *mut pg_sys::CustomScanState) -> Option<pgkvx_latch::KeyBuf> {
    // SAFETY: the caller's contract: `node` is a NodeState; a shared read
    // of a Cell no `&mut NodeRuntime` covers.
    unsafe { (*(node as *const NodeState)).cut.get() }
}

/// Whether a begun node has a cut, without copying it out.
///
/// # Safety
/// `node` is a `PgkvxLimitScan` state that has begun.
#[inline(always)]
pub(super) unsafe fn has_cut(node: *mut pg_sys::CustomScanState) -> bool {
    // SAFETY: the caller's contract: `node` is a NodeState; the Cell is
    // read in place, and nothing writes it while this reads (this backend
    // runs one thing at a time, and no `&mut` to the NodeState is live).
    unsafe { (*(*(node as *const NodeState)).cut.as_ptr()).is_some() }
}

/// Lends a begun node's runtime to `f` for the length of the call: the
/// one way the rest of `scan/` reaches it.  `f` cannot keep the borrow,
/// and must not lend the same node again (in `f` or anything it calls):
/// debug builds check that.  A call Postgres may longjmp out of (the
/// child's ExecProcNode) leaves the node lent, which is harmless: an
/// executor an ERROR left is never run again, only freed.  Holds no guard
/// with a destructor, so it may run in the per-row plain old frames.
///
/// # Safety
/// `node` is a `PgkvxLimitScan` state that has begun.
#[inline(always)]
pub(super) unsafe fn with_runtime<R>(node: *mut pg_sys::CustomScanState, f: impl FnOnce(&mut NodeRuntime) -> R) -> R {
    // SAFETY: `node` is a NodeState (every PgkvxLimitScan state is made by
    // NodeState::alloc) that has begun (the caller's contract), so `rt`
    // points at its runtime, which lives as long as the executor's memory;
    // `lent` keeps this the only reference to it while `f` runs.
    unsafe {
        let ns = node as *mut NodeState;
        debug_assert!(!(*ns).lent.get(), "a node's runtime lent while it is lent already");
        (*ns).lent.set(true);
        let r = f(&mut *(*ns).rt);
        (*ns).lent.set(false);
        r
    }
}
