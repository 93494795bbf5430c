//! The guarded scans of a statement, found in its plan and decoded once, as
//! `ExecInitIndexScan` builds its state once: which tables they read, with
//! what bounds, whether the statement may run twice, and the values it
//! knows before it runs (bounds, its LIMIT).

use super::plan_data::GuardPlan;
use super::plan_walk::{for_each_child, is_guard_plan, walk_plans};
use crate::pg::boundary;
use crate::pg::raw;
use crate::pg::{list_iter, node_tag};
use crate::read::admit;
use crate::read::run::CutRule;
use crate::read::span;
use crate::registry::{self, Latched};
use crate::shmem::backend;
use pgkvx_latch::{Footprint, RelId};
use pgrx::pg_sys::{self, Node};
use std::rc::Rc;

/// One `PgkvxLimitScan` of a statement's plan, its plan data decoded.
pub struct Guard {
    pub cs: *mut pg_sys::CustomScan,
    pub plan: Rc<GuardPlan>,
    /// The table as latched when the statement started (None: no longer).
    pub latched: Option<Rc<Latched>>,
    /// The statement's range table, which its scans name tables in.
    rtable: *mut pg_sys::List,
}

/// The latch identity a guarded scan of `plan` validates against: its
/// table's latched parent for a partition, else the table itself (also
/// one no longer latched, `latched` None).
pub fn latch_rel(plan: &GuardPlan, latched: Option<&Latched>) -> RelId {
    latched.map_or_else(|| backend::rel_id(plan.relid), Latched::latch_id)
}

impl Guard {
    /// The latch identity its reads validate against.
    pub fn rel(&self) -> RelId {
        latch_rel(&self.plan, self.latched.as_deref())
    }
}

/// Every guarded scan of a statement.
pub struct Guards(pub Vec<Guard>);

impl Guards {
    /// The one latched table (or partitioned tree) the guards read, by its
    /// latch root; None for none or several.  Cheap, from the decoded
    /// guards: [`reads_only_guarded`] takes it, to walk the plan only when
    /// a cut is weighed.
    pub fn sole_root(&self) -> Option<pg_sys::Oid> {
        let mut roots = self.0.iter().filter_map(|g| g.latched.as_ref().map(|l| l.root));
        let first = roots.next()?;
        roots.all(|r| r == first).then_some(first)
    }

    /// The guarded scans of `stmt`; a plan node whose data this library did
    /// not write (a plan cached by another version) is refused when its
    /// node begins.
    ///
    /// # Safety
    /// `stmt` is a valid PlannedStmt.
    pub unsafe fn of(stmt: *mut pg_sys::PlannedStmt) -> Guards {
        let mut out = Vec::new();
        // SAFETY: per contract.
        let rtable = unsafe { (*stmt).rtable };
        let mut collect = |p: *mut pg_sys::Plan| {
            // SAFETY: a node of the statement's plan.
            if !unsafe { is_guard_plan(p) } {
                return true;
            }
            let cs = p as *mut pg_sys::CustomScan;
            // SAFETY: our plan node.
            let Some(plan) = (unsafe { GuardPlan::from_list((*cs).custom_private) }) else { return true };
            // Under a tree's guard are its partitions' scans, none of them
            // guarded (tree.rs); subplans are walked apart.
            let descend = !plan.tree;
            out.push(Guard { cs, latched: registry::lookup(plan.relid), plan: Rc::new(plan), rtable });
            descend
        };
        // SAFETY: per contract; subplans (init plans, subqueries, CTEs) are
        // all in the statement's list.
        unsafe {
            walk_plans((*stmt).planTree, &mut collect);
            for sp in list_iter::<pg_sys::Plan>((*stmt).subplans) {
                walk_plans(sp, &mut collect);
            }
        }
        Guards(out)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every guarded scan was planned in a statement that may run
    /// twice (scan/restartable.rs).
    pub fn restartable(&self) -> bool {
        self.0.iter().all(|g| g.plan.restartable)
    }

    /// The latched tables the guarded scans read.
    pub fn rels(&self) -> impl Iterator<Item = RelId> + '_ {
        self.0.iter().map(Guard::rel)
    }

    /// Says so (per `pgkvx.unprotected_reads`) when a guarded table's
    /// writes can escape its latches: the read runs, but it cannot keep its
    /// promise.
    pub fn report_unprotected(&self) {
        if crate::guc::UNPROTECTED_READS.get() == crate::guc::Unprotected::Allow {
            return;
        }
        for g in &self.0 {
            let Some(latched) = &g.latched else { continue };
            admit::warn_if_exposed(latched);
            if g.plan.tree {
                let exposed = registry::partitions::exposed_members(latched.root);
                if exposed.is_empty() {
                    continue;
                }
                // SAFETY: our plan node, of this statement.
                let read = unsafe { scanned_tables((*g.cs).custom_plans, g.rtable) };
                for latched in exposed.iter().filter(|l| read.contains(&l.key.relid)) {
                    admit::warn_if_exposed(latched);
                }
            }
        }
    }

    /// Whether every bound of every guarded scan is known before the
    /// statement runs.  When one is not (a cursor read from a table by a
    /// CTE or a subquery), a fence computed at executor start could only
    /// span the whole table: it waits for the scan to start instead.
    pub fn bounds_known_at_start(&self) -> bool {
        // SAFETY: our plan nodes' expressions.
        self.0.iter().all(|g| unsafe { list_iter::<pg_sys::Expr>((*g.cs).custom_exprs).all(|e| known_at_start(e)) })
    }

    /// D of every guarded scan as known before the statement runs (bounds
    /// not known then are left out, which only widens it).
    ///
    /// # Safety
    /// `params` are the statement's.
    pub unsafe fn declared_at_start(&self, params: pg_sys::ParamListInfo) -> Footprint {
        let mut fp = Footprint::new();
        // The partitions of a latched parent read under one bound (`id >
        // $1` in each partition's scan): their D is one span of the parent,
        // evaluated once, not once per partition.
        let mut seen: Vec<(pg_sys::Oid, &GuardPlan, *mut pg_sys::List)> = Vec::new();
        for g in &self.0 {
            let Some(latched) = &g.latched else { continue };
            // SAFETY: our plan nodes' expression lists; equal() only reads.
            let again = !seen.is_empty()
                && seen.iter().any(|&(root, plan, exprs)| unsafe {
                    root == latched.root
                        && plan.bounds == g.plan.bounds
                        && pg_sys::equal(
                            exprs as *const std::ffi::c_void,
                            (*g.cs).custom_exprs as *const std::ffi::c_void,
                        )
                });
            if again {
                continue;
            }
            // SAFETY: as above.
            if self.0.len() > 1 {
                seen.push((latched.root, &g.plan, unsafe { (*g.cs).custom_exprs }));
            }
            let rel = latched.latch_id();
            // SAFETY: per contract.
            fp.extend(unsafe { declared_of(g, params) }.spans.into_iter().map(|s| (rel, s)));
        }
        fp
    }

    /// The first guarded table, to name in a message.
    pub fn first_rel(&self) -> RelId {
        self.0.first().map_or(RelId::EMPTY, Guard::rel)
    }
}

/// D of guard `g` as known before the statement runs (bounds not known
/// then are left out, which only widens it); every key for a table no
/// longer latched.
///
/// # Safety
/// `params` are `g`'s statement's.
pub unsafe fn declared_of(g: &Guard, params: pg_sys::ParamListInfo) -> span::Declared {
    let Some(latched) = &g.latched else { return span::Declared::all() };
    // SAFETY: our plan node's expression list.
    let exprs = unsafe { list_iter::<pg_sys::Expr>((*g.cs).custom_exprs) };
    let quals = g.plan.bounds.iter().zip(exprs).filter_map(|(b, e)| {
        // SAFETY: per contract; our plan node's expressions.
        let (value, isnull) = unsafe { value_at_start(e, params) }?;
        Some(b.qual(value, isnull))
    });
    span::declared(&latched.key, quals)
}

/// Whether the guards of `stmt` read one latched table (or tree): what
/// [`Guards::sole_root`] says of its decoded guards, from the plan alone,
/// for a node whose statement did not decode them (a second executor).
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub unsafe fn guards_one_table(stmt: *mut pg_sys::PlannedStmt) -> bool {
    let mut roots: Vec<Option<pg_sys::Oid>> = Vec::new();
    let mut collect = |p: *mut pg_sys::Plan| {
        // SAFETY: a node of the statement's plan; our plan data read only.
        unsafe {
            if is_guard_plan(p) {
                let plan = GuardPlan::from_list((*(p as *mut pg_sys::CustomScan)).custom_private);
                roots.push(plan.and_then(|pl| registry::lookup(pl.relid)).map(|l| l.root));
                return false;
            }
        }
        true
    };
    // SAFETY: per contract.
    unsafe {
        walk_plans((*stmt).planTree, &mut collect);
        for sp in list_iter::<pg_sys::Plan>((*stmt).subplans) {
            walk_plans(sp, &mut collect);
        }
    }
    roots.iter().all(|r| r.is_some() && *r == roots[0])
}

/// The tables the scans in `plans` (a tree guard's MergeAppend and
/// everything under it) read: a partitioned table's partitions.
///
/// # Safety
/// `plans` is a list of valid plan trees; `rtable` their statement's.
unsafe fn scanned_tables(plans: *mut pg_sys::List, rtable: *mut pg_sys::List) -> Vec<pg_sys::Oid> {
    let mut out = Vec::new();
    let mut collect = |p: *mut pg_sys::Plan| {
        use pg_sys::NodeTag::*;
        // SAFETY: a node of the statement's plan; the cast follows the tag
        // check.
        unsafe {
            // Any scan of one table, also another extension's custom scan
            // (ours over a MergeAppend scans none: scanrelid 0).
            if matches!(
                node_tag(p as *const Node),
                T_SeqScan
                    | T_SampleScan
                    | T_IndexScan
                    | T_IndexOnlyScan
                    | T_BitmapHeapScan
                    | T_TidScan
                    | T_TidRangeScan
                    | T_CustomScan
                    | T_ForeignScan
            ) && (*(p as *mut pg_sys::Scan)).scanrelid > 0
            {
                let rti = (*(p as *mut pg_sys::Scan)).scanrelid as usize;
                if let Some(rte) = crate::pg::list_nth::<pg_sys::RangeTblEntry>(rtable, rti.wrapping_sub(1)) {
                    out.push((*rte).relid);
                }
            }
        }
        true
    };
    // SAFETY: per contract.
    unsafe {
        for p in list_iter::<pg_sys::Plan>(plans) {
            walk_plans(p, &mut collect);
        }
    }
    out
}

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
    // SAFETY: per contract.
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
    // SAFETY: per contract.
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
/// `stmt` is a valid PlannedStmt; `sole_root` is [`Guards::sole_root`] of
/// its guards.
pub unsafe fn statement_may_cut(stmt: *mut pg_sys::PlannedStmt, sole_root: Option<pg_sys::Oid>, rule: CutRule) -> bool {
    match rule {
        // SAFETY: per contract.
        CutRule::Strict => unsafe { reads_only_guarded(stmt, sole_root) },
        CutRule::LastResort => sole_root.is_some(),
    }
}

/// Whether the guard `cs` of `stmt` may stop before a later writer's first
/// key as a last resort (`CutRule::LastResort`): its rows reach the top of
/// the statement's plan, through joins and sorts too, but through no
/// aggregate, window or set operation, whose answer over fewer rows would
/// be another answer, and not from a subplan, whose rows become a value.
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
pub unsafe fn may_cut_last_resort(stmt: *mut pg_sys::PlannedStmt, cs: *mut pg_sys::CustomScan) -> bool {
    // SAFETY: per contract.
    let Some(path) = (unsafe { path_to(stmt, cs) }) else { return false };
    // SAFETY: nodes of the statement's plan, read by tag only.
    path.iter().all(|&p| unsafe {
        !matches!(
            node_tag(p as *const Node),
            pg_sys::NodeTag::T_Agg
                | pg_sys::NodeTag::T_WindowAgg
                | pg_sys::NodeTag::T_Group
                | pg_sys::NodeTag::T_SetOp
                | pg_sys::NodeTag::T_RecursiveUnion
        )
    })
}

/// The plan nodes from the top of the statement's plan tree down to `cs`'s
/// parent; None when `cs` is in a subplan.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
unsafe fn path_to(stmt: *mut pg_sys::PlannedStmt, cs: *mut pg_sys::CustomScan) -> Option<Vec<*mut pg_sys::Plan>> {
    let mut path = Vec::new();
    // SAFETY: per contract.  Only the statement's own tree: a subplan's
    // rows become a value (an array, a scalar, a test) that a prefix of
    // them would change.
    unsafe { find_in((*stmt).planTree, cs, &mut path).then_some(path) }
}

/// The plan nodes from the top of the plan tree or subplan holding `cs`
/// down to `cs`'s parent; None when `cs` is the top of one.
///
/// # Safety
/// `stmt` is a valid PlannedStmt holding `cs`.
pub unsafe fn path_in_statement(
    stmt: *mut pg_sys::PlannedStmt,
    cs: *mut pg_sys::CustomScan,
) -> Option<Vec<*mut pg_sys::Plan>> {
    let mut path = Vec::new();
    // SAFETY: per contract.
    unsafe {
        if find_in((*stmt).planTree, cs, &mut path) {
            return Some(path);
        }
        list_iter::<pg_sys::Plan>((*stmt).subplans).find(|&sp| find_in(sp, cs, &mut path)).map(|_| path)
    }
}

/// Whether `cs` is in plan tree `p`; if so `path` holds the nodes from
/// `p` down to its parent.
///
/// # Safety
/// `p` is a valid plan tree (or NULL).
unsafe fn find_in(p: *mut pg_sys::Plan, cs: *mut pg_sys::CustomScan, path: &mut Vec<*mut pg_sys::Plan>) -> bool {
    if p.is_null() {
        return false;
    }
    if p == cs as *mut pg_sys::Plan {
        return true;
    }
    path.push(p);
    let mut found = false;
    // SAFETY: a valid plan node.
    unsafe {
        for_each_child(p, &mut |child| {
            if !found {
                found = find_in(*child, cs, path);
            }
        })
    };
    if !found {
        path.pop();
    }
    found
}

/// Whether `sort`, right above guard `cs`, sorts by the key: its leading
/// sort columns are the key's columns, in key order (ascending encoding),
/// under the key's operator families and collations.
///
/// # Safety
/// `sort` and `cs` are valid plan nodes, `cs` the sort's child.
unsafe fn sorts_by_key(sort: *mut pg_sys::Sort, cs: *mut pg_sys::CustomScan, key: &crate::keys::KeyDesc) -> bool {
    // SAFETY: per contract; arrays hold numCols entries; target entries and
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

/// Whether `plan`'s declared span may come out open toward `up` (above)
/// or below once its bounds are known: no plain bound caps the key there.
/// A set (`= ANY`, an OR) may still leave its last interval open (`k >
/// $cursor OR k IN (…)`), which only the evaluated span tells.
pub fn may_be_open(plan: &GuardPlan, key: &crate::keys::KeyDesc, up: bool) -> bool {
    use super::plan_data::{RUNTIME_CAPS_ABOVE, RUNTIME_CAPS_BELOW};
    let runtime = plan.runtime_caps & if up { RUNTIME_CAPS_ABOVE } else { RUNTIME_CAPS_BELOW } != 0;
    !runtime && plan.bounds.iter().filter(|b| !b.array && b.group == 0).all(|b| !caps(b, key, up))
}

/// Whether bound `b` limits the key from above (`up`) or below, in the
/// key's encoded order.
fn caps(b: &super::plan_data::BoundQual, key: &crate::keys::KeyDesc, up: bool) -> bool {
    span::strategy_caps(u32::from(b.strategy), key.cols.get(b.col as usize).is_some_and(|c| c.desc), up)
}

/// Whether `plan`'s span is open above: no bound of its quals limits the
/// key from above (equalities on a prefix do not: within them the span
/// runs to the prefix's end, where a tail of that prefix never moves on).
pub fn open_above(plan: &GuardPlan, key: &crate::keys::KeyDesc) -> bool {
    // A set of keys (`= ANY`, an OR of them) is no tail.
    plan.bounds.iter().all(|b| !b.array && b.group == 0 && !caps(b, key, true))
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
/// `stmt` is a valid PlannedStmt; `sole_root` is [`Guards::sole_root`] of
/// its guards.
pub unsafe fn reads_only_guarded(stmt: *mut pg_sys::PlannedStmt, sole_root: Option<pg_sys::Oid>) -> bool {
    // SAFETY: per contract; range table entries, row marks and plan nodes
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
/// checks it: `node::apply_cut`).
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

// ---- values known before the statement runs --------------------------------

/// Evaluates `expr` with the statement's parameters when it needs nothing
/// the statement computes (no PARAM_EXEC, no subplan, no Vars).
///
/// # Safety
/// `expr` is a valid expression; `params` the statement's (or NULL).
pub(super) unsafe fn value_at_start(
    expr: *mut pg_sys::Expr,
    params: pg_sys::ParamListInfo,
) -> Option<(pg_sys::Datum, bool)> {
    // SAFETY: per contract.
    if let Some(v) = unsafe { direct_value(expr, params) } {
        return Some(v);
    }
    // SAFETY: per contract; a standalone context, freed before returning.
    unsafe {
        if !known_at_start(expr) {
            return None;
        }
        let econtext = pg_sys::CreateStandaloneExprContext();
        (*econtext).ecxt_param_list_info = params;
        let state = pg_sys::ExecInitExpr(expr, std::ptr::null_mut());
        let mut isnull = false;
        let v = boundary::pass(|| raw::eval_expr(state, econtext, &mut isnull));
        // By-reference values live in the caller's context: the per-query
        // context of the standalone ExprContext goes with FreeExprContext.
        let v = if isnull { v } else { copy_datum(v, pg_sys::exprType(expr as *mut Node)) };
        pg_sys::FreeExprContext(econtext, true);
        Some((v, isnull))
    }
}

/// The value of the bounds nearly every tail read has, a constant or a
/// query parameter with no fetch hook (`k > $1` from a client), read
/// where it lives instead of through an expression context built and freed
/// for it: that costs a memory context and a few guarded calls per
/// statement.  None for anything else, and for a parameter whose type does
/// not match the plan's (the general path raises the executor's error).
/// A by-reference value points into the plan or the parameter list, which
/// live as long as the statement; callers use it at once.
///
/// # Safety
/// `expr` is a valid expression; `params` the statement's (or NULL).
unsafe fn direct_value(expr: *mut pg_sys::Expr, params: pg_sys::ParamListInfo) -> Option<(pg_sys::Datum, bool)> {
    // SAFETY: per contract; each cast follows a tag check, and a parameter
    // is read only within numParams.
    unsafe {
        match node_tag(expr as *const Node) {
            pg_sys::NodeTag::T_Const => {
                let c = expr as *mut pg_sys::Const;
                Some(((*c).constvalue, (*c).constisnull))
            }
            pg_sys::NodeTag::T_Param => {
                let p = expr as *mut pg_sys::Param;
                if (*p).paramkind != pg_sys::ParamKind::PARAM_EXTERN
                    || params.is_null()
                    || (*params).paramFetch.is_some()
                    || (*p).paramid < 1
                    || (*p).paramid > (*params).numParams
                {
                    return None;
                }
                let prm = &*(*params).params.as_ptr().add((*p).paramid as usize - 1);
                (prm.ptype == (*p).paramtype).then_some((prm.value, prm.isnull))
            }
            _ => None,
        }
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
        // A constant or a client's parameter: no tree to walk.
        let simple = match node_tag(expr as *const Node) {
            pg_sys::NodeTag::T_Const => true,
            pg_sys::NodeTag::T_Param => (*(expr as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN,
            _ => false,
        };
        simple
            || super::plan_walk::param_ids(expr as *mut Node, pg_sys::ParamKind::PARAM_EXEC).is_empty()
                && !pg_sys::contain_subplans(expr as *mut Node)
                && !pg_sys::contain_var_clause(expr as *mut Node)
    }
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

/// At most how many rows the statement returns, if that is known before
/// it runs: a top-level LIMIT, or else the planner's estimate.
///
/// # Safety
/// `stmt` is a valid PlannedStmt; `params` its parameters.
pub unsafe fn rows_wanted(stmt: *mut pg_sys::PlannedStmt, params: pg_sys::ParamListInfo) -> Option<u64> {
    // SAFETY: per contract.
    unsafe {
        let top = (*stmt).planTree;
        if node_tag(top as *const Node) == pg_sys::NodeTag::T_Limit {
            let l = top as *mut pg_sys::Limit;
            if !(*l).limitCount.is_null() {
                let int = |e: *mut Node| count_at_start(e, params);
                if let (Some(c), Some(o)) = (int((*l).limitCount), int((*l).limitOffset)) {
                    return Some(c.saturating_add(o));
                }
            }
        }
        let est = (*top).plan_rows;
        (est.is_finite() && est < 1e12).then(|| est.ceil().max(1.0) as u64)
    }
}

/// A LIMIT's count or offset (an int8 expression; NULL or none: 0) when it
/// is known before the statement runs.
///
/// # Safety
/// `e` is a LIMIT's count or offset expression (or NULL); `params` the
/// statement's.
pub(super) unsafe fn count_at_start(e: *mut Node, params: pg_sys::ParamListInfo) -> Option<u64> {
    if e.is_null() {
        return Some(0);
    }
    // SAFETY: per contract.
    let (v, isnull) = unsafe { value_at_start(e as *mut pg_sys::Expr, params) }?;
    Some(if isnull { 0 } else { (v.value() as i64).max(0) as u64 })
}
