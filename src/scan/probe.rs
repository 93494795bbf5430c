//! The fenced probe: where a fenced read will end at its snapshot.
//!
//! A fenced read cannot run twice, so before it reads it waits for the
//! writers in flight in the span it will read.  A tail's declared span runs
//! to +∞, and at the head of a busy stream somebody is always writing
//! there -- mostly past the rows the read will return: a LIMIT read
//! returns the first n rows of its span at its snapshot, and a writer
//! whose keys lie past the n-th can never be among them (the consumer
//! reads them next time, from its cursor).  So when the declared span
//! meets writers, the probe reads the key index at the snapshot -- the
//! guarded index scan's own index quals, up to the limit -- and the read
//! fences only up to the last key it found: exactly what an optimistic read
//! of the same rows would have touched (`runtime.rs`, T).
//!
//! The probe must find the rows the scan will return, so it is taken only
//! where that holds (a [`Shape`]): the guard sits on an index scan of the
//! table's key index, forward, whose index quals compare with values that
//! stay put (immutable functions of constants and a client's parameters),
//! with no filter anywhere between the scan and a LIMIT of such a count
//! (only projections and subquery scans between).  Any filter (a qual, a
//! row-level security policy) could make the scan go further than the
//! probe did.  Or the guard sits on a seq scan under a Sort by the key,
//! whose every filter qual compares a key column in that way: the plan
//! PostgreSQL picks for a small table, such as an outbox its relay keeps
//! nearly empty.  The Sort hands up the first rows in key order of those
//! the filter passes, which are the rows the key index returns for the
//! same quals.
//!
//! Where no such probe can tell where the rows end (a join or a filter
//! under the LIMIT), a tail up the key from a bound open above still
//! returns no row past the last key visible at the snapshot it reads at:
//! it fences only up to there ([`Reach::LastVisible`]), what an optimistic
//! read that ran out of rows at that snapshot touched.  Each round of the
//! protocol probes again at its fresh snapshot, so a row committed since
//! is never read past unchecked.  Everything else fences its declared
//! span.
//!
//! Row locks (`FOR UPDATE` and the like) would make it go further too:
//! LockRows drops a row a concurrent writer deleted, or whose new version
//! no longer matches, and pulls the next one (SKIP LOCKED reads are a work
//! queue's and are not guarded at all: `planner.rs`); and it re-checks a row a concurrent writer updated in a plan state
//! of its own (EvalPlanQual), handing up the new version, whose key may
//! lie past the probe's end.  So a locked read is probed only where its
//! scan may stop early (a tail up the key: `cut.rs`), and it then stops
//! before the first key past what it checked ([`stop_past_checked`]): in
//! its own scan, and in EvalPlanQual's copy of it (`node.rs`).  It returns
//! fewer rows only when a lock dropped some; the consumer reads on from
//! its cursor next time.
//!
//! A read with no LIMIT returns every row of its span, so against the
//! writers in flight at its first snapshot it fences its span whole (a
//! range consumer may move its cursor to the bound).  Against writers that
//! started after that snapshot, which a reader never chases, the probe
//! (asked with [`Later::Yes`]) finds its last row by reading the same scan
//! backward, one row: a later writer past it is not waited for.

use super::cut;
use super::guards::{self, Guard};
use crate::keys::codec::KeyWriter;
use crate::pg::index_scan::scan_at;
use crate::pg::{list_iter, node_tag, OpenRel};
use crate::read::run::{CutRule, Later};
use crate::read::span;
use pgkvx_latch::{Footprint, Span};
use pgrx::pg_sys::{self, Node};

/// A guard whose read's end can be probed: how far it reads, and whether
/// row locks lie above it.
pub struct Shape {
    /// Which of the statement's guards.
    guard: usize,
    /// How far its read goes.
    reach: Reach,
    /// Row locks lie between it and its LIMIT: its scan must stop past
    /// what the fence checked ([`stop_past_checked`]).
    locked: bool,
}

/// How far a probeable guard's read goes.
enum Reach {
    /// The first `want` rows of its index scan with `keys` (the scan keys
    /// `ExecIndexBuildScanKeys` makes of its quals): a LIMIT with nothing
    /// between that drops rows.
    Rows { keys: Vec<pg_sys::ScanKeyData>, want: u64 },
    /// Every row of that index scan: no LIMIT, it reads to its bound.
    ToBound { keys: Vec<pg_sys::ScanKeyData> },
    /// Its end cannot be found by reading its scan's rows (a join or a
    /// filter lies under its LIMIT, a bound is computed by the statement),
    /// but it is a tail up the key from a bound open above: it returns no
    /// row past the last key visible at the snapshot it reads at.  At that
    /// snapshot it is what an optimistic read that ran out of rows there
    /// touched (`runtime.rs`, `ran_out`): writers past that key can hold no
    /// row it returns, and a consumer moving its cursor to its last row
    /// reads their rows next time.
    LastVisible,
}

/// The probeable guards of a statement, found once at executor start;
/// None when some latched guard cannot be probed (the read then fences
/// its declared span: narrowing only some guards would still wait for the
/// others' writers), and when its guards read more than one latched table:
/// each would end at its own last row, and a cursor the consumer shares
/// between them (the greatest key of either) could pass a writer in flight
/// behind it in the other.
///
/// # Safety
/// `stmt` is a valid PlannedStmt whose guards are `gs`; `params` its
/// parameters.
unsafe fn shapes(
    stmt: *mut pg_sys::PlannedStmt,
    gs: &super::guards::Guards,
    params: pg_sys::ParamListInfo,
) -> Option<Vec<Shape>> {
    let sole_root = gs.sole_root();
    sole_root?;
    let gs = &gs.0;
    let mut out = Vec::with_capacity(gs.len());
    for (i, g) in gs.iter().enumerate() {
        if g.latched.is_none() {
            continue;
        }
        // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt whose guards are `gs`; `params` its
        // parameters.
        out.push(unsafe { shape_of(stmt, g, params, sole_root) }.map(|mut s| {
            s.guard = i;
            s
        })?);
    }
    (!out.is_empty()).then_some(out)
}

/// The probe of guard `g`, if its read's end can be probed (see the
/// module doc).
///
/// # Safety
/// As [`shapes`].
unsafe fn shape_of(
    stmt: *mut pg_sys::PlannedStmt,
    g: &Guard,
    params: pg_sys::ParamListInfo,
    sole_root: Option<pg_sys::Oid>,
) -> Option<Shape> {
    let latched = g.latched.as_deref()?;
    let (order, open_above) = (cut::order_by_plan(g), guards::open_above(&g.plan, &latched.key));
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt whose guards are `gs`; `params` its
    // parameters.
    unsafe {
        let may_stop = || {
            cut::may_stop_early(stmt, g.cs, &latched.key, order, open_above, CutRule::LastResort)
                && cut::statement_may_cut(stmt, sole_root, CutRule::LastResort)
        };
        let exact = probeable(stmt, g.cs, &g.plan, latched, params).and_then(|Probeable { quals, want, locked }| {
            if locked && !may_stop() {
                return None;
            }
            let keys = scan_keys(&latched.key, quals, params)?;
            let reach = match want {
                Some(want) => Reach::Rows { keys, want },
                None => Reach::ToBound { keys },
            };
            Some(Shape { guard: 0, reach, locked })
        });
        if exact.is_some() {
            return exact;
        }
        // A tail up the key from a bound open above (Reach::LastVisible);
        // one in a partition tree reads several indexes.
        if g.plan.tree || !open_above || order == cut::RowOrder::Other {
            return None;
        }
        let locked = locks_above(stmt, g.cs);
        if locked && !may_stop() {
            return None;
        }
        Some(Shape { guard: 0, reach: Reach::LastVisible, locked })
    }
}

/// Whether row locks lie anywhere above guard `cs` in `stmt`'s plan.
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
unsafe fn locks_above(stmt: *mut pg_sys::PlannedStmt, cs: *mut pg_sys::CustomScan) -> bool {
    // SAFETY: the caller's contract; plan nodes are only looked at by tag.
    unsafe {
        super::plan_walk::path_in_statement(stmt, cs)
            .is_none_or(|path| path.iter().any(|&p| node_tag(p as *const Node) == pg_sys::NodeTag::T_LockRows))
    }
}

/// A read whose end a probe can find: the index quals of its scan, the
/// rows its LIMIT takes (None: no LIMIT), and whether row locks lie
/// between them.
struct Probeable {
    quals: Quals,
    want: Option<u64>,
    locked: bool,
}

/// Where a probeable read's key quals are.
#[derive(Clone, Copy)]
enum Quals {
    /// An index scan of the key index: its index quals, index columns on
    /// the left.
    Index(*mut pg_sys::List),
    /// A scan under a Sort by the key (a small table's seq scan): its
    /// filter, each qual a comparison of a key column, table columns on
    /// the left.  The Sort hands up the first rows in key order of those
    /// the filter passes: what the key index returns for the same quals.
    Filter(*mut pg_sys::List),
}

/// Whether the read of guard `cs` (planned as `plan`) over `latched` ends
/// where a probe can find.
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`; `params` its parameters.
unsafe fn probeable(
    stmt: *mut pg_sys::PlannedStmt,
    cs: *mut pg_sys::CustomScan,
    plan: &super::plan_data::GuardPlan,
    latched: &crate::registry::Latched,
    params: pg_sys::ParamListInfo,
) -> Option<Probeable> {
    if plan.tree {
        return None;
    }
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt holding `cs`; `params` its parameters.
    // Plan nodes are cast after their tags are checked.
    unsafe {
        if !(*cs).scan.plan.qual.is_null() {
            return None;
        }
        let mut p = crate::pg::list_nth::<pg_sys::Plan>((*cs).custom_plans, 0)?;
        while node_tag(p as *const Node) == pg_sys::NodeTag::T_Result {
            if !(*p).qual.is_null() || (*p).lefttree.is_null() {
                return None;
            }
            p = (*p).lefttree;
        }
        let forward = pg_sys::ScanDirection::ForwardScanDirection;
        let (indexid, quals, dir) = match node_tag(p as *const Node) {
            pg_sys::NodeTag::T_IndexScan => {
                let s = p as *mut pg_sys::IndexScan;
                if !(*s).indexorderby.is_null() {
                    return None;
                }
                ((*s).indexid, Quals::Index((*s).indexqual), (*s).indexorderdir)
            }
            pg_sys::NodeTag::T_IndexOnlyScan => {
                let s = p as *mut pg_sys::IndexOnlyScan;
                if !(*s).indexorderby.is_null() {
                    return None;
                }
                ((*s).indexid, Quals::Index((*s).indexqual), (*s).indexorderdir)
            }
            pg_sys::NodeTag::T_SeqScan => (latched.key.index, Quals::Filter((*p).qual), forward),
            _ => return None,
        };
        if indexid != latched.key.index || dir != forward {
            return None;
        }
        let (want, locked, sorted) = limit_above(stmt, cs, params, &latched.key)?;
        match quals {
            Quals::Index(_) if !(*p).qual.is_null() => return None,
            // A locked read re-checks rows in the order its scan found
            // them (docs/limitations.md): a sorted one is not probed.
            Quals::Filter(_) if !sorted || locked => return None,
            _ => {}
        }
        Some(Probeable { quals, want, locked })
    }
}

/// The rows the LIMIT over guard `cs` takes (count plus offset), with only
/// projections, subquery scans, row locks and a Sort by `key` right above
/// the guard between them, and whether row locks and that Sort are among
/// them; a count of None when nothing but those lies above it (no LIMIT:
/// it reads to its bound); None for anything else.
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
unsafe fn limit_above(
    stmt: *mut pg_sys::PlannedStmt,
    cs: *mut pg_sys::CustomScan,
    params: pg_sys::ParamListInfo,
    key: &crate::keys::KeyDesc,
) -> Option<(Option<u64>, bool, bool)> {
    let (mut locked, mut sorted) = (false, false);
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt holding `cs`.
    let path = unsafe { super::plan_walk::path_in_statement(stmt, cs) }?;
    // SAFETY: nodes of the statement's plan, cast after their tags are checked.
    unsafe {
        for &p in path.iter().rev() {
            match node_tag(p as *const Node) {
                pg_sys::NodeTag::T_Result | pg_sys::NodeTag::T_SubqueryScan if (*p).qual.is_null() => {}
                pg_sys::NodeTag::T_Sort if cut::sorts_by_key(p as *mut pg_sys::Sort, cs, key) => sorted = true,
                // Rows they drop, and new versions they hand up, are why
                // a locked read stops past what it checked (module doc).
                pg_sys::NodeTag::T_LockRows => locked = true,
                pg_sys::NodeTag::T_Limit => {
                    let l = p as *mut pg_sys::Limit;
                    if (*l).limitOption != pg_sys::LimitOption::LIMIT_OPTION_COUNT || (*l).limitCount.is_null() {
                        return None;
                    }
                    // As for the index quals: the executor evaluates them again.
                    if !same_at_every_snapshot((*l).limitCount) || !same_at_every_snapshot((*l).limitOffset) {
                        return None;
                    }
                    // LIMIT NULL is no limit: nothing to probe up to.
                    let count = match guards::value_at_start((*l).limitCount as *mut pg_sys::Expr, params)? {
                        (_, true) => return None,
                        (v, false) => (v.value() as i64).max(0) as u64,
                    };
                    let offset = guards::count_at_start((*l).limitOffset, params)?;
                    return Some((Some(count.saturating_add(offset)), locked, sorted));
                }
                _ => return None,
            }
        }
    }
    Some((None, locked, sorted))
}

/// The scan keys of the key index for `quals` (see [`Quals`]), each a
/// plain comparison with a constant or a client's parameter; None for any
/// other qual (a row comparison, `= ANY`, `IS NULL`, a value the statement
/// computes, a function whose value may change with the snapshot, a
/// filter on a column that is not the key's).
///
/// # Safety
/// `quals` are those of a guarded scan of `key`'s table.
unsafe fn scan_keys(
    key: &crate::keys::KeyDesc,
    quals: Quals,
    params: pg_sys::ParamListInfo,
) -> Option<Vec<pg_sys::ScanKeyData>> {
    let indexid = key.index;
    let (list, on_table) = match quals {
        Quals::Index(l) => (l, false),
        Quals::Filter(l) => (l, true),
    };
    let mut out = Vec::new();
    // SAFETY: the caller's contract: `indexqual` is the index quals of a scan of index `indexid`. Nodes are
    // cast after their tags are checked;
    // catalog lookups only.
    unsafe {
        for q in list_iter::<Node>(list) {
            if node_tag(q) != pg_sys::NodeTag::T_OpExpr {
                return None;
            }
            let op = q as *mut pg_sys::OpExpr;
            let left = crate::pg::list_nth::<Node>((*op).args, 0)?;
            let right = crate::pg::list_nth::<pg_sys::Expr>((*op).args, 1)?;
            if node_tag(left) != pg_sys::NodeTag::T_Var {
                return None;
            }
            let var = left as *mut pg_sys::Var;
            let attno = if on_table {
                // The key index's column of this table column, compared by
                // an operator of its family under its collation: only then
                // does the index scan pass what the filter passes.
                let i = key.cols.iter().position(|c| c.attnum == (*var).varattno)?;
                let col = &key.cols[i];
                if !pg_sys::op_in_opfamily((*op).opno, col.opfamily) || !col.orders_like_key((*op).inputcollid) {
                    return None;
                }
                i16::try_from(i + 1).ok()?
            } else {
                (*var).varattno
            };
            let opfamily = pg_sys::get_opclass_family(pg_sys::get_index_column_opclass(indexid, i32::from(attno)));
            let (mut strategy, mut lefttype, mut righttype) = (0i32, pg_sys::InvalidOid, pg_sys::InvalidOid);
            pg_sys::get_op_opfamily_properties(
                (*op).opno,
                opfamily,
                false,
                &mut strategy,
                &mut lefttype,
                &mut righttype,
            );
            if !same_at_every_snapshot(right as *mut Node) {
                return None;
            }
            let (value, isnull) = guards::value_at_start(right, params)?;
            let mut sk = pg_sys::ScanKeyData::default();
            pg_sys::ScanKeyEntryInitialize(
                &mut sk,
                if isnull { pg_sys::SK_ISNULL as i32 } else { 0 },
                attno,
                strategy as u16,
                righttype,
                (*op).inputcollid,
                (*op).opfuncid,
                value,
            );
            out.push(sk);
        }
    }
    Some(out)
}

/// Whether expression `e` (or NULL) calls nothing but immutable
/// functions.  A STABLE function may read a table, and the executor
/// evaluates the expression again at the fresh snapshot the read ends at:
/// the probe would have looked elsewhere.  What the statement computes
/// (an init plan's result, a subplan, a Var) `guards::value_at_start`
/// refuses, which every caller asks next.
///
/// # Safety
/// `e` is a valid expression (or NULL).
unsafe fn same_at_every_snapshot(e: *mut Node) -> bool {
    // SAFETY: the caller's contract: `e` is a valid expression (or NULL). The walker only reads.
    e.is_null() || !unsafe { pg_sys::contain_mutable_functions(e) }
}

/// Probes every shape at snapshot `snap`: the spans of `gs` the read will
/// return rows from, what it fences.  Against writers that started after
/// the first snapshot (`later`), up to the last row even where the span is
/// bounded further (the latch core's `protocol`: a reader never chases
/// them); against every writer a bounded span stays whole, and a read with
/// no LIMIT is not probed (None), unless its end is the last key visible
/// ([`Reach::LastVisible`]).
///
/// # Safety
/// `snap` is a registered MVCC snapshot; `shapes` are of `gs`, whose
/// statement is starting; `params` its parameters.
unsafe fn probe(
    gs: &[Guard],
    shapes: &[Shape],
    params: pg_sys::ParamListInfo,
    snap: pg_sys::Snapshot,
    later: Later,
) -> Option<Footprint> {
    if later == Later::No && shapes.iter().any(|s| matches!(s.reach, Reach::ToBound { .. })) {
        return None;
    }
    let mut out = Footprint::new();
    for s in shapes {
        let g = &gs[s.guard];
        let Some(latched) = g.latched.as_deref() else { continue };
        // SAFETY: the caller's contract: `snap` is a registered MVCC snapshot; `shapes` are of `gs`, whose
        // statement is starting; `params` its parameters.
        let d = unsafe { guards::declared_of(g, params) };
        // SAFETY (each arm): the caller's contract: `snap` is a registered MVCC snapshot; `shapes` are of
        // `gs`, whose statement is starting; `params` its parameters.
        let spans = match &s.reach {
            Reach::ToBound { keys } => d.up_to_last(unsafe { last_of_all(keys, latched, snap) }.as_ref(), true),
            Reach::LastVisible => {
                let last = unsafe { last_of_all(&[], latched, snap) };
                match later {
                    Later::Yes => d.up_to_last(last.as_ref(), true),
                    Later::No => d.ran_out(last.as_ref(), true),
                }
            }
            Reach::Rows { keys, want } => {
                let (last, full) = unsafe { last_key(keys, *want, latched, snap) };
                match later {
                    Later::Yes if !full => d.up_to_last(last.as_ref(), true),
                    _ => returned(&d, last.as_ref(), full),
                }
            }
        };
        let rel = g.rel();
        out.extend(spans.into_iter().map(|sp| (rel, sp)));
    }
    Some(out)
}

/// The key of the last row of the first `want` rows an index scan of
/// `latched`'s key index with `keys` returns at `snap`, and whether it
/// found that many.
///
/// # Safety
/// `snap` is a registered MVCC snapshot; the keys' values outlive the call.
unsafe fn last_key(
    keys: &[pg_sys::ScanKeyData],
    want: u64,
    latched: &crate::registry::Latched,
    snap: pg_sys::Snapshot,
) -> (Option<KeyWriter>, bool) {
    if want == 0 {
        return (None, true);
    }
    let (mut n, mut last) = (0u64, None);
    // SAFETY: the caller's contract: `snap` is a registered MVCC snapshot; the keys' values outlive the call.
    unsafe {
        scan_key_index(keys, latched, snap, pg_sys::ScanDirection::ForwardScanDirection, |slot| {
            n += 1;
            last = Some(latched.key.encode_slot(slot));
            n < want
        });
    }
    (last, n >= want)
}

/// The key of the last row an index scan of `latched`'s key index with
/// `keys` returns at `snap` (None: no row): the first row of the same scan
/// backward.
///
/// # Safety
/// As [`last_key`].
unsafe fn last_of_all(
    keys: &[pg_sys::ScanKeyData],
    latched: &crate::registry::Latched,
    snap: pg_sys::Snapshot,
) -> Option<KeyWriter> {
    let mut last = None;
    // SAFETY: the caller's contract: `snap` is a registered MVCC snapshot; the keys' values outlive the call.
    unsafe {
        scan_key_index(keys, latched, snap, pg_sys::ScanDirection::BackwardScanDirection, |slot| {
            last = Some(latched.key.encode_slot(slot));
            false
        });
    }
    last
}

/// Scans `latched`'s key index with `keys` at `snap` in `direction`,
/// handing each visible row to `visit` until it says stop.
///
/// # Safety
/// As [`last_key`].
unsafe fn scan_key_index(
    keys: &[pg_sys::ScanKeyData],
    latched: &crate::registry::Latched,
    snap: pg_sys::Snapshot,
    direction: pg_sys::ScanDirection::Type,
    visit: impl FnMut(*mut pg_sys::TupleTableSlot) -> bool,
) {
    let lock = pg_sys::AccessShareLock;
    // The executor holds the table's lock already and takes (or took) the
    // index's: both are kept to the end of the transaction, as it keeps them.
    let heap = OpenRel::open(latched.key.relid, lock).keeping_lock();
    let index = OpenRel::open(latched.key.index, lock).keeping_lock();
    // index_rescan copies the keys in; ours stay as they are.
    let mut keys = keys.to_vec();
    // SAFETY: the caller's contract: `snap` is a registered MVCC snapshot; the keys' values outlive the call.
    // Both relations are open and locked.
    unsafe { scan_at(snap, &heap, &index, &mut keys, direction, visit) };
}

/// The spans of `d` a read up the key returns rows from when its scan's
/// last row is `last`, `full` when that filled its LIMIT: nothing past it;
/// else as an optimistic read that ran out of rows (runtime.rs, T).
fn returned(d: &span::Declared, last: Option<&KeyWriter>, full: bool) -> span::Spans {
    match (last, full) {
        (Some(k), true) => d.within(&span::up_to(k, true)).collect(),
        _ => d.ran_out(last, true),
    }
}

/// Probes a guard node as its scan starts (a statement fenced when its
/// scans start: its bounds come from an init plan or a CTE), at `snap`:
/// its index scan's own keys, evaluated now, as the scan will use them.
/// None when its read's end cannot be probed, or its statement's guards
/// read more than one latched table (`sole_root` None); with whether row
/// locks lie above it (it must then stop past what the fence checks:
/// [`stop_past_checked`]).
///
/// # Safety
/// `node` is a begun guard node about to run for the first time; `snap`
/// its statement's registered snapshot.
pub unsafe fn probe_started(
    node: *mut pg_sys::CustomScanState,
    sole_root: Option<pg_sys::Oid>,
    snap: pg_sys::Snapshot,
) -> Option<(span::Spans, bool)> {
    // As for [`shapes`]: one latched table.
    sole_root?;
    // SAFETY: the caller's contract: `node` is a begun guard node about to run for the first time; `snap` its
    // statement's registered snapshot. Plan states are cast after their tags are
    // checked, and their scan keys hold `n` entries.
    unsafe {
        let stmt = (*(*node).ss.ps.state).es_plannedstmt;
        let (spans, locked) = super::runtime::with_runtime(node, |rt| {
            let latched = rt.latched.clone()?;
            let estate = (*node).ss.ps.state;
            let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            let Probeable { want, locked, .. } =
                probeable((*estate).es_plannedstmt, cs, &rt.plan, &latched, (*estate).es_param_list_info)?;
            // A read with no LIMIT fences its declared span.
            let want = want?;
            let mut ps = rt.child;
            while node_tag(ps) == pg_sys::NodeTag::T_ResultState {
                ps = (*ps).lefttree;
            }
            let (keys, n) = match node_tag(ps) {
                pg_sys::NodeTag::T_IndexScanState => {
                    let s = ps as *mut pg_sys::IndexScanState;
                    if (*s).iss_NumRuntimeKeys != 0 && !(*s).iss_RuntimeKeysReady {
                        // What its first run does: evaluate the keys.
                        crate::pg::boundary::pass(|| crate::pg::raw::ExecReScan(ps));
                    }
                    ((*s).iss_ScanKeys, (*s).iss_NumScanKeys)
                }
                pg_sys::NodeTag::T_IndexOnlyScanState => {
                    let s = ps as *mut pg_sys::IndexOnlyScanState;
                    if (*s).ioss_NumRuntimeKeys != 0 && !(*s).ioss_RuntimeKeysReady {
                        crate::pg::boundary::pass(|| crate::pg::raw::ExecReScan(ps));
                    }
                    ((*s).ioss_ScanKeys, (*s).ioss_NumScanKeys)
                }
                _ => return None,
            };
            let keys: &[pg_sys::ScanKeyData] = if n > 0 { std::slice::from_raw_parts(keys, n as usize) } else { &[] };
            // Plain comparisons only: a row comparison's members, an array's
            // elements live elsewhere.
            let plain = (pg_sys::SK_ISNULL | pg_sys::SK_SEARCHNULL | pg_sys::SK_SEARCHNOTNULL) as i32;
            if keys.iter().any(|k| k.sk_flags & !plain != 0) {
                return None;
            }
            let (last, full) = last_key(keys, want, &latched, snap);
            let d = rt.declared(node);
            Some((returned(&d, last.as_ref(), full), locked))
        })?;
        if locked
            && !(cut::can_stop_early(node, CutRule::LastResort)
                && cut::statement_may_cut(stmt, sole_root, CutRule::LastResort))
        {
            return None;
        }
        Some((spans, locked))
    }
}

/// Adds to a fenced read's cut `cut`, applied by `rule` (None: no cut),
/// where each locked read of `rels` must stop (module doc), and returns the
/// rule to apply it by.  `checked` is what the fence found clean last.  A
/// stop is a tail stopping short, so it is applied by
/// [`CutRule::LastResort`] at the least -- which a locked shape allows
/// before it is probed.
pub fn stop_locked(
    cut: &mut Footprint,
    rule: Option<CutRule>,
    checked: Option<&Footprint>,
    rels: &[pgkvx_latch::RelId],
) -> Option<CutRule> {
    let Some(checked) = checked else { return rule };
    let mut rule = rule;
    for &rel in rels {
        let past = stop_past_checked(checked, rel);
        if !past.is_empty() {
            cut.extend(past);
            rule = Some(crate::read::run::widest(rule, CutRule::LastResort));
        }
    }
    rule
}

/// Where a locked read's scan must stop: a cut of its table `rel` from
/// the end of the spans `checked` holds of it -- what its fence found
/// clean -- to +∞.  Nothing when the fence checked its table to +∞ (nobody
/// was writing there), or nothing of it (its cut stops it sooner).
fn stop_past_checked(checked: &Footprint, rel: pgkvx_latch::RelId) -> Footprint {
    let end = checked.iter().filter(|(r, _)| *r == rel).map(|(_, s)| s.end).max();
    match end {
        Some(end) if end != pgkvx_latch::KeyBuf::INFINITE => {
            vec![(rel, Span { start: end, end: pgkvx_latch::KeyBuf::INFINITE })]
        }
        _ => Vec::new(),
    }
}

/// One statement's probes: its shapes are found the first time it probes
/// (they follow from the plan and the parameters alone) and serve every
/// probe after -- a retry at a fresh snapshot, an optimistic statement's
/// fallback to fenced after its start probed.
#[derive(Default)]
pub struct Prober {
    /// None: not looked for yet; Some(None): the statement has none.
    shapes: Option<Option<Vec<Shape>>>,
}

impl Prober {
    /// [`probe`] of the statement's shapes at `snap`; None where it has
    /// none, or where they cannot tell.
    ///
    /// # Safety
    /// As [`shapes`] and [`probe`]: `stmt` is the starting or running
    /// statement whose guards are `gs`, `params` its parameters, `snap` a
    /// registered MVCC snapshot.
    pub unsafe fn probe(
        &mut self,
        stmt: *mut pg_sys::PlannedStmt,
        gs: &super::guards::Guards,
        params: pg_sys::ParamListInfo,
        snap: pg_sys::Snapshot,
        later: Later,
    ) -> Option<Footprint> {
        // SAFETY: the caller's contract.
        unsafe {
            let shapes = self.shapes.get_or_insert_with(|| shapes(stmt, gs, params));
            probe(&gs.0, shapes.as_deref()?, params, snap, later)
        }
    }

    /// The shapes its probes found, if one ran and found some.
    pub fn shapes(&self) -> Option<&[Shape]> {
        self.shapes.as_ref()?.as_deref()
    }
}

/// The tables of `shapes` that must stop past what their fence checked.
pub fn locked_rels(gs: &[Guard], shapes: &[Shape]) -> Vec<pgkvx_latch::RelId> {
    shapes.iter().filter(|s| s.locked).map(|s| gs[s.guard].rel()).collect()
}
