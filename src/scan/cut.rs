//! The cut: when a guarded scan may stop before a later writer's first key
//! (the latch core's `protocol` decides that it should; this says whether
//! the statement's answer allows it), and applying it to the nodes.  One
//! rule per question: whether one guard's rows reach the top as a prefix
//! in key order ([`may_stop_early`]), whether nothing else the statement
//! reads could show ahead of the rows left out ([`statement_may_cut`]),
//! and whether a begun node may ([`can_stop_early`]).  The node applies
//! the cut row by row (`cut_rows`, called from `node.rs`'s per-row path).

use super::guards::Guard;
use super::plan_walk::{path_to, walk_plans};
use super::position::ScanPosition;
use super::runtime::{with_runtime, NodeRuntime};
use crate::pg::{list_iter, node_tag, rel_name};
use crate::read::run::CutRule;
use crate::registry;
use pgrx::pg_sys::{self, Node};
use std::rc::Rc;

/// How a guard's rows come, for [`may_cut`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Up the key (an index scan in key order, an ordered partition stream).
    Up,
    /// Down the key, or in no order a Sort above could restore.
    Other,
    /// In no order, from a scan of the table itself: a Sort by the key
    /// directly above restores key order.
    Unordered,
}

/// Whether the guard `cs` of `stmt` may stop before a later writer's first
/// key (the protocol's cut) and still hand its readers a state some serial
/// order produces:
/// - its rows come up the key (or unordered, sorted by the key right
///   above) from a span open above (`open_above`);
/// - every node from it up to the top of the statement's plan passes a
///   prefix of them on as a prefix: LIMIT, Result, SubqueryScan, Material,
///   Unique, LockRows, Append and MergeAppend -- no aggregate, join,
///   window or sort by anything else, which would turn a shorter prefix
///   into another answer, and no subplan, whose rows become a value.
///
/// The statement-wide half (what else it reads) is [`reads_only_guarded`].
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
pub unsafe fn may_cut(
    stmt: *mut pg_sys::PlannedStmt,
    cs: *mut pg_sys::CustomScan,
    key: &crate::keys::KeyDesc,
    order: RowOrder,
    open_above: bool,
) -> bool {
    if !open_above || order == RowOrder::Other {
        return false;
    }
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt holding `cs`.
    let Some(path) = (unsafe { path_to(stmt, cs) }) else { return false };
    let mut sorted = order == RowOrder::Up;
    // From the guard up: the first node may be a Sort by the key.
    for (i, &p) in path.iter().rev().enumerate() {
        // SAFETY: nodes of the statement's plan, checked by tag.
        let ok = unsafe {
            match node_tag(p as *const Node) {
                pg_sys::NodeTag::T_Limit
                | pg_sys::NodeTag::T_Result
                | pg_sys::NodeTag::T_SubqueryScan
                | pg_sys::NodeTag::T_Material
                | pg_sys::NodeTag::T_Unique
                | pg_sys::NodeTag::T_LockRows
                | pg_sys::NodeTag::T_Append
                | pg_sys::NodeTag::T_MergeAppend => true,
                pg_sys::NodeTag::T_Sort if i == 0 && sorts_by_key(p as *mut pg_sys::Sort, cs, key) => {
                    sorted = true;
                    true
                }
                _ => false,
            }
        };
        if !ok {
            return false;
        }
    }
    sorted
}

/// Whether the guard `cs` of `stmt` may stop before a later writer's first
/// key by `rule`: strictly ([`may_cut`]), or as a last resort
/// ([`may_cut_last_resort`]) when its rows come up the key, or unordered,
/// from a span open above.  The statement-wide half is
/// [`statement_may_cut`].
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
pub unsafe fn may_stop_early(
    stmt: *mut pg_sys::PlannedStmt,
    cs: *mut pg_sys::CustomScan,
    key: &crate::keys::KeyDesc,
    order: RowOrder,
    open_above: bool,
    rule: CutRule,
) -> bool {
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt holding `cs`.
    unsafe {
        match rule {
            CutRule::Strict => may_cut(stmt, cs, key, order, open_above),
            CutRule::LastResort => open_above && order != RowOrder::Other && may_cut_last_resort(stmt, cs),
        }
    }
}

/// The statement-wide half of a cut by `rule`: strictly, it reads nothing
/// that could show ahead of the rows left out ([`reads_only_guarded`]); as
/// a last resort, its guards read one latched table or tree (`sole_root`):
/// two would each be cut at their own keys.
///
/// # Safety
/// `stmt` is a valid PlannedStmt; `sole_root` is [`super::guards::Guards::sole_root`] of
/// its guards.
pub unsafe fn statement_may_cut(stmt: *mut pg_sys::PlannedStmt, sole_root: Option<pg_sys::Oid>, rule: CutRule) -> bool {
    match rule {
        // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt; `sole_root` is
        // [`super::guards::Guards::sole_root`] of its guards.
        CutRule::Strict => unsafe { reads_only_guarded(stmt, sole_root) },
        CutRule::LastResort => sole_root.is_some(),
    }
}

/// Whether the guard `cs` of `stmt` may stop before a later writer's first
/// key as a last resort (`CutRule::LastResort`): its rows reach the top of
/// the statement's plan, through sorts and through joins on a side they
/// hand up as they are ([`keeps_its_rows`]), but through no
/// aggregate, window or set operation, whose answer over fewer rows would
/// be another answer, and not from a subplan, whose rows become a value.
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
pub unsafe fn may_cut_last_resort(stmt: *mut pg_sys::PlannedStmt, cs: *mut pg_sys::CustomScan) -> bool {
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt holding `cs`.
    let Some(path) = (unsafe { path_to(stmt, cs) }) else { return false };
    // SAFETY: nodes of the statement's plan, read by tag, joins cast after
    // it is checked.
    path.iter().enumerate().all(|(i, &p)| unsafe {
        let below = path.get(i + 1).copied().unwrap_or(cs as *mut pg_sys::Plan);
        match node_tag(p as *const Node) {
            pg_sys::NodeTag::T_Agg
            | pg_sys::NodeTag::T_WindowAgg
            | pg_sys::NodeTag::T_Group
            | pg_sys::NodeTag::T_SetOp
            | pg_sys::NodeTag::T_RecursiveUnion => false,
            pg_sys::NodeTag::T_NestLoop | pg_sys::NodeTag::T_HashJoin | pg_sys::NodeTag::T_MergeJoin => {
                keeps_its_rows((*(p as *mut pg_sys::Join)).jointype, (*p).lefttree == below)
            }
            _ => true,
        }
    })
}

/// Whether a join of `jointype` hands up the rows of its side below which
/// the guard is (`outer` or inner) as they are, so that fewer of them only
/// leave out output rows: not on the side an outer join fills with NULLs
/// where the rows left out would have matched, nor under a semi or anti
/// join's inner side, whose rows decide which others survive.
fn keeps_its_rows(jointype: pg_sys::JoinType::Type, outer: bool) -> bool {
    use pg_sys::JoinType::*;
    match jointype {
        JOIN_INNER => true,
        JOIN_LEFT | JOIN_SEMI | JOIN_ANTI => outer,
        JOIN_RIGHT => !outer,
        _ => false,
    }
}

/// Whether `sort`, right above guard `cs`, sorts by the key: its leading
/// sort columns are the key's columns, in key order (ascending encoding),
/// under the key's operator families and collations.
///
/// # Safety
/// `sort` and `cs` are valid plan nodes, `cs` the sort's child.
pub(super) unsafe fn sorts_by_key(
    sort: *mut pg_sys::Sort,
    cs: *mut pg_sys::CustomScan,
    key: &crate::keys::KeyDesc,
) -> bool {
    // SAFETY: the caller's contract: `sort` and `cs` are valid plan nodes, `cs` the sort's child. Arrays hold
    // numCols entries; target entries and
    // their expressions are checked by tag.
    unsafe {
        if (*sort).plan.lefttree != cs as *mut pg_sys::Plan || ((*sort).numCols as usize) < key.cols.len() {
            return false;
        }
        let tlist = (*cs).scan.plan.targetlist;
        key.cols.iter().enumerate().all(|(i, col)| {
            let resno = *(*sort).sortColIdx.add(i);
            let Some(te) = crate::pg::list_nth::<pg_sys::TargetEntry>(tlist, (resno - 1) as usize) else {
                return false;
            };
            let e = (*te).expr;
            if e.is_null() || node_tag(e as *const Node) != pg_sys::NodeTag::T_Var {
                return false;
            }
            if (*(e as *mut pg_sys::Var)).varattno != col.attnum {
                return false;
            }
            let op = *(*sort).sortOperators.add(i);
            let up = if col.desc { pg_sys::BTGreaterStrategyNumber } else { pg_sys::BTLessStrategyNumber };
            crate::pg::ordering_op_properties(op)
                .is_some_and(|(family, _, strategy)| family == col.opfamily && strategy == up)
                && col.orders_like_key(*(*sort).collations.add(i))
        })
    }
}

/// Whether nothing else `stmt` reads could show ahead of rows a cut leaves
/// out: it guards one latched table (or one partitioned tree), it reads no
/// other table -- a watermark written after reading the stream would show
/// beside a stream cut short of it, and a second latched table is cut at
/// its own keys, not at the same point in time -- except rows it locks for
/// update (a consumer group's own offsets row, `FOR UPDATE`), and it calls
/// no function that may read tables (none that is not immutable, no
/// function in FROM).
///
/// # Safety
/// `stmt` is a valid PlannedStmt; `sole_root` is [`super::guards::Guards::sole_root`] of
/// its guards.
pub unsafe fn reads_only_guarded(stmt: *mut pg_sys::PlannedStmt, sole_root: Option<pg_sys::Oid>) -> bool {
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt; `sole_root` is
    // [`super::guards::Guards::sole_root`] of its guards. Range table entries, row marks and plan nodes
    // are read only.
    unsafe {
        let marked: Vec<u32> = list_iter::<pg_sys::PlanRowMark>((*stmt).rowMarks)
            .filter(|&m| {
                matches!(
                    (*m).markType,
                    pg_sys::RowMarkType::ROW_MARK_EXCLUSIVE | pg_sys::RowMarkType::ROW_MARK_NOKEYEXCLUSIVE
                )
            })
            .map(|m| (*m).rti)
            .collect();
        let Some(root) = sole_root else { return false };
        let tables =
            list_iter::<pg_sys::RangeTblEntry>((*stmt).rtable).enumerate().all(|(i, rte)| match (*rte).rtekind {
                pg_sys::RTEKind::RTE_RELATION => {
                    (*rte).relkind as u8 == pg_sys::RELKIND_VIEW
                        || marked.contains(&(i as u32 + 1))
                        || registry::lookup((*rte).relid).is_some_and(|l| l.root == root)
                }
                pg_sys::RTEKind::RTE_FUNCTION | pg_sys::RTEKind::RTE_TABLEFUNC => false,
                _ => true,
            });
        if !tables {
            return false;
        }
        let mut pure = true;
        let impure = |e: *mut Node| pg_sys::contain_mutable_functions(e) || super::restartable::hides_volatile(e);
        let mut check = |p: *mut pg_sys::Plan| {
            pure = pure && !impure((*p).targetlist as *mut Node) && !impure((*p).qual as *mut Node);
            pure
        };
        walk_plans((*stmt).planTree, &mut check);
        for sp in list_iter::<pg_sys::Plan>((*stmt).subplans) {
            walk_plans(sp, &mut check);
        }
        pure
    }
}

/// How guard `g`'s rows come, by its plan (before its node begins, which
/// checks it: [`apply_cut`]).
pub fn order_by_plan(g: &Guard) -> RowOrder {
    if g.plan.tree {
        return match &g.plan.stream {
            Some(s) if s.forward => RowOrder::Up,
            _ => RowOrder::Other,
        };
    }
    // SAFETY: our plan node's child list; nodes are checked by tag.
    unsafe {
        let mut p = crate::pg::list_nth::<pg_sys::Plan>((*g.cs).custom_plans, 0).unwrap_or(std::ptr::null_mut());
        while !p.is_null() && node_tag(p as *const Node) == pg_sys::NodeTag::T_Result && !(*p).lefttree.is_null() {
            p = (*p).lefttree;
        }
        if p.is_null() {
            return RowOrder::Other;
        }
        let forward = |dir: pg_sys::ScanDirection::Type| {
            if dir == pg_sys::ScanDirection::ForwardScanDirection {
                RowOrder::Up
            } else {
                RowOrder::Other
            }
        };
        match node_tag(p as *const Node) {
            pg_sys::NodeTag::T_IndexScan => forward((*(p as *mut pg_sys::IndexScan)).indexorderdir),
            pg_sys::NodeTag::T_IndexOnlyScan => forward((*(p as *mut pg_sys::IndexOnlyScan)).indexorderdir),
            pg_sys::NodeTag::T_SeqScan
            | pg_sys::NodeTag::T_SampleScan
            | pg_sys::NodeTag::T_BitmapHeapScan
            | pg_sys::NodeTag::T_TidScan
            | pg_sys::NodeTag::T_TidRangeScan => RowOrder::Unordered,
            _ => RowOrder::Other,
        }
    }
}

/// Gives the guard nodes of a started executor the protocol's cut: each
/// stops before the first key `cut` leaves out of its table.  Raises 40001
/// for a node that cannot stop early by `rule` (the protocol decided the
/// cut from the plan, before the nodes existed).
///
/// # Safety
/// `nodes` are begun guard nodes.
pub unsafe fn apply_cut(nodes: &[*mut pg_sys::CustomScanState], cut: &pgkvx_latch::Footprint, rule: CutRule) {
    for &n in nodes {
        // SAFETY: the caller's contract: `nodes` are begun guard nodes.
        let rel = unsafe { with_runtime(n, |rt| rt.rel) };
        let Some(start) = cut.iter().filter(|(r, _)| *r == rel).map(|(_, s)| s.start).min() else { continue };
        // SAFETY: as above.
        if !unsafe { can_stop_early(n, rule) } {
            crate::read::run::serialization_error(
                format!(
                    "A transaction that started after this statement's snapshot is writing to \"{}\" inside the span it reads, and this scan cannot stop before that write (it does not read up the key into a LIMIT or a cursor).",
                    rel_name(pg_sys::Oid::from(rel.rel()))
                ),
                "The statement might succeed if retried.",
            );
        }
        // SAFETY: as above.
        unsafe { super::runtime::set_cut(n, Some(start)) };
    }
}

/// Whether this node's scan can stop before a later writer's key by
/// `rule`: strictly, leaving its statement a state some serial order
/// produces ([`may_cut`]); as a last resort, when it is a tail up
/// the key from a bound left open above whose rows reach the client as
/// rows ([`may_cut_last_resort`]).
///
/// # Safety
/// `node` is a begun guard node.
pub unsafe fn can_stop_early(node: *mut pg_sys::CustomScanState, rule: CutRule) -> bool {
    // SAFETY: the caller's contract: `node` is a begun guard node, this
    // runtime's (so `rt.declared(node)` may evaluate its bounds).
    unsafe {
        let Some((latched, order, open_above)) = with_runtime(node, |rt| {
            let latched = rt.latched.clone()?;
            let order = match (&rt.position, &rt.key_source) {
                (ScanPosition::Ordered { forward: true, .. } | ScanPosition::Stream { forward: true, .. }, _) => {
                    RowOrder::Up
                }
                (ScanPosition::Anywhere, Some(_)) => RowOrder::Unordered,
                _ => RowOrder::Other,
            };
            // A set whose D, known once the node has begun, is one interval
            // open above (`k > (SELECT c …) OR k = 100` past the cursor) is
            // a tail from its cursor.  One with a gap or a closed part (`k <
            // (SELECT 28) OR k > 90`, `(k > $1 AND k < 50) OR k >= 100`) is
            // not: stopping before a writer there leaves out rows of a part
            // the writer is not in, and looks complete.  Before the
            // statement runs a bound of an init plan or a CTE is unknown:
            // the statement-start callers go by the plan alone.
            let open_above = super::guards::open_above(&rt.plan, &latched.key)
                || (super::guards::bounds_a_set(&rt.plan) && {
                    let d = rt.declared(node);
                    d.open_above && d.spans.len() == 1
                });
            Some((latched, order, open_above))
        }) else {
            return false;
        };
        let stmt = (*(*node).ss.ps.state).es_plannedstmt;
        let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
        may_stop_early(stmt, cs, &latched.key, order, open_above, rule)
    }
}

/// The rows of a scan with cut `cut` (`runtime::set_cut`): each row's
/// key is read from the row the scan examined, rows at or past the cut are
/// left out, and a scan moving up the key ends at the first of them.  A
/// plain old frame like `node.rs`'s `exec_node`, on whose per-row path it
/// runs.
///
/// # Safety
/// `rt` is a begun node's runtime with an ordered position; `slot` is
/// what its child returned last.
#[inline(never)]
pub(super) unsafe fn cut_rows(
    rt: &mut NodeRuntime,
    mut slot: *mut pg_sys::TupleTableSlot,
    cut: pgkvx_latch::KeyBuf,
) -> *mut pg_sys::TupleTableSlot {
    // Not a clone of the Rc: the child's ERROR longjmps over this frame,
    // which must own nothing with a destructor.
    let Some(latched) = rt.latched.as_ref().map(Rc::as_ptr) else { return slot };
    // SAFETY: `rt` is begun with an ordered position (the caller's contract), and `slot` is
    // what its child returned last: the child's slots are live until it runs again.  `latched` is
    // the runtime's own registration, set when the node began and never replaced while it lives.
    unsafe {
        let key = &(*latched).key;
        loop {
            if rt.stopped {
                return std::ptr::null_mut();
            }
            if slot.is_null() || (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                return slot;
            }
            // An unordered scan's rows past the cut are left out one by one.
            let (src, attnos, forward) = match (&rt.position, &rt.key_source) {
                (ScanPosition::Ordered { scan, attnos, forward, .. }, _) => (examined(*scan, rt.epq), attnos, *forward),
                (ScanPosition::Stream { attnos, forward }, _) => (slot, attnos, *forward),
                (ScanPosition::Anywhere, Some((scan, attnos))) => (examined(*scan, rt.epq), attnos, false),
                (ScanPosition::Anywhere, None) => return slot,
            };
            if pgkvx_latch::KeyBuf::floor(key.encode_slot_at(src, attnos).bytes()) < cut {
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

/// The row `scan` examined last: the row in its scan slot -- except in
/// EvalPlanQual's copy of the plan (`epq` not null) re-checking a row of a
/// relation the statement locks, which the scan hands up from
/// EvalPlanQual's own slot for it (ExecScanFetch).  A relation it only
/// references (a join's other side under `FOR UPDATE OF`) is fetched into
/// the scan slot, as always.
///
/// # Safety
/// `scan` is a live scan state of a relation of the range table; `epq`
/// is null or the EvalPlanQual state its executor runs under.
unsafe fn examined(scan: *mut pg_sys::ScanState, epq: *mut pg_sys::EPQState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the caller's contract; EvalPlanQual's slots are an array
    // with one entry per range-table entry, `scanrelid` numbering from 1.
    unsafe {
        let rti = (*((*scan).ps.plan as *mut pg_sys::Scan)).scanrelid as usize;
        if !epq.is_null() && rti != 0 && !(*epq).relsubs_slot.is_null() {
            let s = *(*epq).relsubs_slot.add(rti - 1);
            if !s.is_null() {
                return s;
            }
        }
        (*scan).ss_ScanTupleSlot
    }
}
