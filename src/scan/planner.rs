//! Planning: which scans of latched tables get a `PgkvxLimitScan` over them.
//!
//! Protection is for tails, the reads a consumer moves a cursor with
//! ([`reads_as_tail`], the one rule): a query level whose ORDER BY is led
//! by the latched table's key (after key columns an equality fixes), going
//! up the key from a bound or the table's start, or down it within a bound.
//! A LIMIT may be here, above, or absent (a cursor read in part, or a
//! consumer moving its cursor to the last key it got).  Every path of that
//! table at that level is wrapped in a `PgkvxLimitScan` path with the same
//! cost, order and parameterization, so the planner picks exactly the plan
//! it would have picked -- any index, a bitmap or sequential scan, the
//! outer or inner side of any join -- and the chosen scan runs under the
//! node.  A table read inside a subquery of a level whose ORDER BY names a
//! subquery's column is judged by that order: its order may come from
//! there.  Every other read is plain PostgreSQL and gets no node: newest
//! first from the open end with no bound (`ORDER BY k DESC`, a
//! newest-first join), `min(k)` and `max(k)` with no bound, counts,
//! `EXISTS`, aggregates, reads in another order.  Rows
//! locked with SKIP LOCKED are a work queue's, skipped by design, and stay
//! plain.
//!
//! The planner does not look at `pgkvx.scan_mode`: a plan made while it is
//! `off` is cached and must protect once the mode changes.  The executor
//! decides (`statement.rs`); in `off` mode the node only passes rows on.
//!
//! Wrapped relations get no partial paths: the node reads where its scan
//! runs, which must be this process.

use super::plan_data::{BoundQual, GuardPlan, StaticMethods, NAME};
use crate::pg::walk::strip_relabel;
use crate::pg::{list_iter, list_nth, list_oids, make_list, node_tag, rel_name};
use crate::registry;
use pgrx::pg_sys::{self, List, Node, PlannerInfo, RelOptInfo};
use pgrx::prelude::*;
use std::cell::RefCell;

static PATH_METHODS: StaticMethods<pg_sys::CustomPathMethods> = StaticMethods(pg_sys::CustomPathMethods {
    CustomName: NAME.as_ptr(),
    PlanCustomPath: Some(plan_custom_path),
    ReparameterizeCustomPathByChild: None,
});

static mut PREV_PATHLIST_HOOK: pg_sys::set_rel_pathlist_hook_type = None;
static mut PREV_PLANNER_HOOK: pg_sys::planner_hook_type = None;

thread_local! {
    /// For each statement being planned (planning nests), whether it may
    /// run twice: a SELECT without side effects, not a cursor that must be
    /// rewound or scrolled.
    static RESTARTABLE: RefCell<Vec<bool>> = const { RefCell::new(Vec::new()) };
    /// Per (planner root, top of a partition or inheritance tree): whether
    /// a latched member of the tree is read in key order.  Asked once per
    /// unlatched member, it would otherwise walk every member each time.
    /// Emptied whenever a planning step starts or ends, so no entry outlives
    /// its root.
    static TREE_HAS_GUARDED_MEMBER: RefCell<Vec<(usize, u32, bool)>> = const { RefCell::new(Vec::new()) };
    /// How many guard nodes this backend has planned: a finished plan is
    /// looked through for partitioned tables (`tree.rs`) only if its
    /// planning made one.
    static GUARDS_PLANNED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe {
        PREV_PATHLIST_HOOK = pg_sys::set_rel_pathlist_hook;
        pg_sys::set_rel_pathlist_hook = Some(rel_pathlist_hook);
        PREV_PLANNER_HOOK = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner_hook);
    }
}

/// Pops the planning stack however planning ends (an ERROR unwinds
/// through here).
struct PlanningFrame;
impl Drop for PlanningFrame {
    fn drop(&mut self) {
        RESTARTABLE.with(|r| r.borrow_mut().pop());
        TREE_HAS_GUARDED_MEMBER.with(|c| c.borrow_mut().clear());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn planner_hook(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the Query about to be planned; identity draws into gapless tables become pgkvx.next_key calls
    // before anything reads it.
    let parse = unsafe { crate::gapless::rewrite::draw_through_next_key(parse) };
    // SAFETY: the same Query: a tail's cursor joined from a CTE becomes an index bound before planning.
    unsafe { super::cte_bound::add_cursor_bounds(parse) };
    // SAFETY: the planner's own arguments, read before planning changes them.
    let restartable = unsafe { super::restartable::statement(parse, cursor_options) };
    // SAFETY: chaining the previous hook (or the standard planner) with the same arguments, as plain C calls:
    // an ERROR in planning (constant folding runs user functions) passes on as raised, once the planning
    // frame is popped (pg/boundary.rs).
    unsafe {
        crate::pg::boundary::rethrow_pending(|| {
            RESTARTABLE.with(|r| r.borrow_mut().push(restartable));
            TREE_HAS_GUARDED_MEMBER.with(|c| c.borrow_mut().clear());
            let _frame = PlanningFrame;
            let planned_before = GUARDS_PLANNED.get();
            let stmt = crate::pg::boundary::pass(|| match PREV_PLANNER_HOOK {
                Some(prev) => prev(parse, query_string, cursor_options, params),
                None => crate::pg::raw::standard_planner(parse, query_string, cursor_options, params),
            });
            if GUARDS_PLANNED.get() != planned_before {
                super::tree::guard_merge_appends(stmt);
            }
            stmt
        })
    }
}

/// Whether `e` is column `attnum` of range table entry `rti` at this level.
///
/// # Safety
/// `e` is a valid expression node.
unsafe fn is_column(e: *mut Node, rti: u32, attnum: i16) -> bool {
    // SAFETY: checked by tag before the cast.
    unsafe {
        let e = strip_relabel(e);
        if e.is_null() || node_tag(e) != pg_sys::NodeTag::T_Var {
            return false;
        }
        let v = &*(e as *mut pg_sys::Var);
        v.varno as u32 == rti && v.varattno == attnum && v.varlevelsup == 0
    }
}

/// Whether an equivalence class holds column `attnum` of `rti`.
///
/// # Safety
/// `ec` is a valid EquivalenceClass of the current planning step.
unsafe fn ec_has_column(ec: *mut pg_sys::EquivalenceClass, rti: u32, attnum: i16) -> bool {
    // SAFETY: `ec` is a live EquivalenceClass of this planning step (the caller's contract); its ec_members
    // holds only EquivalenceMember nodes (pathnodes.h).
    unsafe {
        let found = list_iter::<pg_sys::EquivalenceMember>((*ec).ec_members)
            .any(|em| is_column((*em).em_expr as *mut Node, rti, attnum));
        // Child rels' members (partitions, inheritance children) may be
        // kept apart (pg::compat).
        found
            || list_iter::<pg_sys::EquivalenceMember>(crate::pg::compat::ec_child_members(ec, rti))
                .any(|em| is_column((*em).em_expr as *mut Node, rti, attnum))
    }
}

/// Whether an equality with a constant or parameter fixes column `attnum`.
///
/// # Safety
/// `root` is the planner state of the current level.
unsafe fn fixed_by_equality(root: *mut PlannerInfo, rti: u32, attnum: i16) -> bool {
    // SAFETY: `root` is the live PlannerInfo of this level (the caller's contract); its eq_classes holds only
    // EquivalenceClass nodes.
    unsafe {
        list_iter::<pg_sys::EquivalenceClass>((*root).eq_classes)
            .any(|ec| (*ec).ec_has_const && ec_has_column(ec, rti, attnum))
    }
}

/// Which way a query level reads a latched table in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyOrder {
    /// Up the key (or the whole key fixed: a point read).
    Forward,
    /// Down the key.
    Backward,
}

/// The order this level returns `rti`'s rows in, by the key: its ORDER BY
/// led by the latched key (after key columns an equality fixes), with the
/// lead column that order moves along; None in no key order.  A LIMIT
/// need not be here: it may be above (a subquery, a view, a CTE or an
/// inlined SQL function read under a LIMIT), or the reader may stop early
/// itself (a cursor's FETCH, a PL/pgSQL loop), or take the whole result
/// and move its cursor to the last key.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn level_key_order(root: *mut PlannerInfo, rti: u32, key: &crate::keys::KeyDesc) -> Option<(KeyOrder, usize)> {
    // SAFETY: `root` and its parse tree are live planner state of this planning step (the caller's contract),
    // valid for the whole call.
    unsafe {
        let q = &*(*root).parse;
        if q.sortClause.is_null() {
            return None;
        }
        let Some(lead) = key.cols.iter().position(|c| !fixed_by_equality(root, rti, c.attnum)) else {
            // The whole key is fixed: a point read, in any order.
            return Some((KeyOrder::Forward, 0));
        };
        // The ORDER BY's own pathkeys: query_pathkeys is what the first
        // step above the scan wants (a window's PARTITION BY, a GROUP BY),
        // not the order the rows leave in.
        let pk = list_nth::<pg_sys::PathKey>((*root).sort_pathkeys, 0)?;
        if !ec_has_column((*pk).pk_eclass, rti, key.cols[lead].attnum) {
            return None;
        }
        // Up the key when the ORDER BY runs the way the key's index does.
        let up = crate::pg::pathkey_descending(pk) == key.cols[lead].desc;
        Some((if up { KeyOrder::Forward } else { KeyOrder::Backward }, lead))
    }
}

/// Whether this level's read of `rti` is a tail: rows in key order up
/// the key (from a bound or the table's start), or down the key within a
/// bound (below a cursor, or back to one: `k > $1 ORDER BY k DESC` reads
/// the same span a consumer's tail does).  A read down the key from its
/// open end with no bound at all (newest first) starts where writers
/// always are, and a MIN/MAX of the key returns a value, not keyed rows,
/// unless a bound makes it a step of a consumer (`min(k) WHERE k > $1`),
/// whether the planner made it a one-row scan or aggregates over another
/// (through a filter's index, a sequential scan): neither moves a
/// consumer's cursor, and both run as plain PostgreSQL.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn reads_as_tail(root: *mut PlannerInfo, rel: *mut RelOptInfo, rti: u32, key: &crate::keys::KeyDesc) -> bool {
    // SAFETY: `root` and `rel` are live planner state of this planning step (the caller's contract), valid
    // for the whole call.
    unsafe {
        let (order, lead) = match level_key_order(root, rti, key) {
            Some(o) => o,
            // The column an upper level sorts by may be this key -- unless
            // this level aggregates: its rows are no keyed rows then.
            None if !aggregates(root) => match ancestor_subquery_order(root) {
                Some(descending) => {
                    let lead = lead_column(root, rti, key);
                    let up = descending == key.cols[lead].desc;
                    (if up { KeyOrder::Forward } else { KeyOrder::Backward }, lead)
                }
                None => return false,
            },
            // min(k) past a bound aggregated over another path (a filter's
            // index, a sequential scan) answers what the one-row min/max
            // plan answers, reading the whole bounded span to do it.
            None => {
                let lead = lead_column(root, rti, key);
                let (top, attnum) = as_written(root, rti, key.cols[lead].attnum);
                return only_extremes_of_column(root, top, attnum) && bounded(rel, rti, key, lead);
            }
        };
        if is_minmax_level(root) || order == KeyOrder::Backward {
            return bounded(rel, rti, key, lead);
        }
        true
    }
}

/// The first key column of `rti` that no equality fixes (the first when
/// all are).
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn lead_column(root: *mut PlannerInfo, rti: u32, key: &crate::keys::KeyDesc) -> usize {
    // SAFETY: the caller's contract is fixed_by_equality's.
    unsafe { key.cols.iter().position(|c| !fixed_by_equality(root, rti, c.attnum)).unwrap_or(0) }
}

/// Whether this level's aggregates are all ones that pick the first or
/// last value of column `attnum` of `rti` in an ordering (`min`, `max`:
/// an aggregate with a sort operator), with no grouping: the queries
/// planagg.c may make a one-row scan of, over the key, however they end
/// up planned.  Beside another aggregate (`min(k), count(*)`) or grouped,
/// it is a report.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn only_extremes_of_column(root: *mut PlannerInfo, rti: u32, attnum: i16) -> bool {
    // SAFETY: `root` and its parse tree are live planner state of this planning step (the caller's
    // contract); nodes are checked by tag before each cast.
    unsafe {
        let q = &*(*root).parse;
        if !q.hasAggs || q.hasWindowFuncs || !q.groupClause.is_null() || !q.groupingSets.is_null() {
            return false;
        }
        let mut extremes = 0;
        // Answers true at the first aggregate of this level that is not one.
        let mut other = |n: *mut Node| {
            if node_tag(n) != pg_sys::NodeTag::T_Aggref {
                return None;
            }
            let a = &*(n as *mut pg_sys::Aggref);
            if a.agglevelsup != 0 {
                // An outer level's, in a subquery: not this level's to judge.
                return Some(false);
            }
            let arg = (crate::pg::list_len(a.args) == 1).then(|| list_nth::<pg_sys::TargetEntry>(a.args, 0)).flatten();
            if arg.is_some_and(|te| is_column((*te).expr as *mut Node, rti, attnum)) && has_sort_operator(a.aggfnoid) {
                extremes += 1;
                return Some(false);
            }
            Some(true)
        };
        let found_other = crate::pg::walk::any_node(q.targetList as *mut Node, &mut other)
            || crate::pg::walk::any_node(q.havingQual, &mut other);
        !found_other && extremes > 0
    }
}

/// Column `attnum` of `rti` as the query wrote it: of the partitioned
/// table (or inheritance parent) when `rti` is one of its members, whose
/// expressions above the scan name the parent's columns.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn as_written(root: *mut PlannerInfo, rti: u32, attnum: i16) -> (u32, i16) {
    // SAFETY: `root` is live planner state of this planning step (the caller's contract); both range table
    // entries are relations of it; get_attname and get_attnum are syscache lookups.
    unsafe {
        if (*root).append_rel_array.is_null() {
            return (rti, attnum);
        }
        let top = hierarchy_top(root, rti);
        if top == rti {
            return (rti, attnum);
        }
        let child = (**(*root).simple_rte_array.add(rti as usize)).relid;
        let parent = (**(*root).simple_rte_array.add(top as usize)).relid;
        let name = pg_sys::get_attname(child, attnum, true);
        if name.is_null() {
            return (rti, attnum);
        }
        (top, pg_sys::get_attnum(parent, name))
    }
}

/// Whether aggregate `aggfnoid` has a sort operator: its value is the
/// first (or last) of its inputs in that operator's order.
fn has_sort_operator(aggfnoid: pg_sys::Oid) -> bool {
    use crate::pg::catalog::{aggregate_oids, AGGREGATE_SORT_OPERATOR};
    aggregate_oids(aggfnoid, [AGGREGATE_SORT_OPERATOR]).is_some_and(|op| op[0] != pg_sys::InvalidOid)
}

/// Whether this level groups or aggregates its rows.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn aggregates(root: *mut PlannerInfo) -> bool {
    // SAFETY: `root` and its parse tree are live planner state of this planning step (the caller's contract).
    unsafe {
        let q = &*(*root).parse;
        q.hasAggs || q.hasWindowFuncs || !q.groupClause.is_null() || !q.groupingSets.is_null()
    }
}

/// Whether this level is one of the one-row queries planagg.c makes of a
/// MIN or MAX over an index (`SELECT k FROM t WHERE k IS NOT NULL AND
/// quals ORDER BY k LIMIT 1`): a LIMIT over a single target entry it names
/// "agg_target", whose quals test it for IS NOT NULL.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn is_minmax_level(root: *mut PlannerInfo) -> bool {
    // SAFETY: `root` is live planner state of this planning step (the caller's contract); its target list
    // holds TargetEntries, the quals are checked by tag.
    unsafe {
        let q = &*(*root).parse;
        if q.limitCount.is_null() || crate::pg::list_len(q.targetList) != 1 || q.jointree.is_null() {
            return false;
        }
        let named = list_nth::<pg_sys::TargetEntry>(q.targetList, 0).is_some_and(|te| {
            !(*te).resjunk && !(*te).resname.is_null() && std::ffi::CStr::from_ptr((*te).resname) == c"agg_target"
        });
        named
            && crate::pg::walk::any_node((*q.jointree).quals, |n| {
                (node_tag(n) == pg_sys::NodeTag::T_NullTest)
                    .then(|| (*(n as *mut pg_sys::NullTest)).nulltesttype == pg_sys::NullTestType::IS_NOT_NULL)
            })
    }
}

/// Whether a qual bounds lead key column `lead` of `rti`, either way, with
/// a value that does not come from the row itself (a literal, a
/// parameter, a CTE's or another table's value).  An OR does when each of
/// its branches does (`min(k) WHERE k > $1 OR k = 100` reads as `ORDER BY
/// k LIMIT 1` does, a tail).
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn bounded(rel: *mut RelOptInfo, rti: u32, key: &crate::keys::KeyDesc, lead: usize) -> bool {
    // SAFETY: `rel` is live planner state of this planning step (the caller's contract); both its lists hold
    // RestrictInfos, and nodes are checked by tag before each cast.
    unsafe {
        let from_outside =
            |value: *mut Node| !refers_to(value, rti, |_| true) && !pg_sys::contain_volatile_functions(value);
        let bounds_lead = |clause: *mut Node| {
            clause_bounds(rti, key, clause, &from_outside).iter().any(|(b, _)| usize::from(b.col) == lead)
        };
        let clause_bounds_lead = |clause: *mut Node| match bool_args(clause, pg_sys::BoolExprType::OR_EXPR) {
            None => bounds_lead(clause),
            Some(arms) => arms.iter().all(|&arm| {
                bool_args(arm, pg_sys::BoolExprType::AND_EXPR).unwrap_or_else(|| vec![arm]).into_iter().any(bounds_lead)
            }),
        };
        [(*rel).baserestrictinfo, (*rel).joininfo].into_iter().any(|clauses| {
            list_iter::<pg_sys::RestrictInfo>(clauses).any(|ri| clause_bounds_lead((*ri).clause as *mut Node))
        })
    }
}

/// Whether a level above this one orders by a column of a subquery, CTE or
/// function -- whose order this level may produce -- and if so whether
/// descending.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn ancestor_subquery_order(root: *mut PlannerInfo) -> Option<bool> {
    // SAFETY: `root` is live planner state of this planning step (the caller's contract); parent roots
    // outlive their children's planning.
    unsafe {
        let mut p = (*root).parent_root;
        while !p.is_null() {
            let q = &*(*p).parse;
            if let Some(sc) = list_nth::<pg_sys::SortGroupClause>(q.sortClause, 0) {
                let tle = pg_sys::get_sortgroupclause_tle(sc, q.targetList);
                let e = strip_relabel((*tle).expr as *mut Node);
                if !e.is_null() && node_tag(e) == pg_sys::NodeTag::T_Var {
                    let v = &*(e as *mut pg_sys::Var);
                    if v.varlevelsup == 0 {
                        let rte = list_nth::<pg_sys::RangeTblEntry>(q.rtable, v.varno as usize - 1);
                        if rte.is_some_and(|rte| (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION) {
                            let descending = crate::pg::ordering_op_properties((*sc).sortop)
                                .is_some_and(|(_, _, s)| s == pg_sys::BTGreaterStrategyNumber);
                            return Some(descending);
                        }
                    }
                }
            }
            p = (*p).parent_root;
        }
        None
    }
}

/// Whether this level locks `rti`'s rows with SKIP LOCKED: a work queue
/// that skips rows others hold by design, and would otherwise wait for them.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn skips_locked_rows(root: *mut PlannerInfo, rti: u32) -> bool {
    // SAFETY: `root` is live planner state of this planning step (the caller's contract); a Query's rowMarks
    // holds RowMarkClauses.
    unsafe {
        list_iter::<pg_sys::RowMarkClause>((*(*root).parse).rowMarks)
            .any(|rc| (*rc).rti == rti && (*rc).waitPolicy == pg_sys::LockWaitPolicy::LockWaitSkip)
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn rel_pathlist_hook(
    root: *mut PlannerInfo,
    rel: *mut RelOptInfo,
    rti: pg_sys::Index,
    rte: *mut pg_sys::RangeTblEntry,
) {
    // SAFETY: chaining the previous hook with the same arguments.
    unsafe {
        if let Some(prev) = PREV_PATHLIST_HOOK {
            prev(root, rel, rti, rte);
        }
    }
    // SAFETY: planner structures valid for the duration of the hook.
    unsafe {
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
            || (*rte).relkind as u8 != pg_sys::RELKIND_RELATION
            || (*rte).inh
            || !matches!(
                (*rel).reloptkind,
                pg_sys::RelOptKind::RELOPT_BASEREL | pg_sys::RelOptKind::RELOPT_OTHER_MEMBER_REL
            )
        {
            return;
        }
        let Some(latched) = registry::lookup((*rte).relid) else {
            if (*rel).reloptkind == pg_sys::RelOptKind::RELOPT_OTHER_MEMBER_REL {
                report_unlatched_member(root, rti, (*rte).relid);
            }
            return;
        };
        if !reads_as_tail(root, rel, rti, &latched.key) {
            return;
        }
        if skips_locked_rows(root, rti) {
            return;
        }
        // Known now, not when the plan is made: by then the parents'
        // records of what their subqueries refer to are reset.
        let init_params = init_plan_params(root);
        // Gather paths run the scan in other processes.
        let wrapped = list_iter::<pg_sys::Path>((*rel).pathlist)
            .filter(|&p| {
                !matches!(
                    node_tag(p as *const Node),
                    pg_sys::NodeTag::T_GatherPath | pg_sys::NodeTag::T_GatherMergePath
                )
            })
            .map(|p| guard_path(rel, p, &init_params))
            .collect::<Vec<_>>();
        (*rel).pathlist = make_list(wrapped);
        (*rel).partial_pathlist = std::ptr::null_mut();
        (*rel).consider_parallel = false;
    }
}

/// A partition or inheritance child that is not latched, read in key
/// order together with latched siblings: its writes cannot be seen, so the
/// read is not protected there.  Said at planning, as
/// `pgkvx.unprotected_reads` asks.
///
/// # Safety
/// Planner structures of the current planning step; `rti` is a member of
/// an append relation.
unsafe fn report_unlatched_member(root: *mut PlannerInfo, rti: u32, relid: pg_sys::Oid) {
    // SAFETY: `root` is live planner state of this planning step (the caller's contract) and `rti` a member
    // of an append relation; append_rel_array is indexed by relid.
    unsafe {
        let arr = (*root).append_rel_array;
        if arr.is_null() {
            return;
        }
        let me = *arr.add(rti as usize);
        if me.is_null() {
            return;
        }
        let top = hierarchy_top(root, rti);
        let key = (root as usize, top);
        let cached = TREE_HAS_GUARDED_MEMBER
            .with(|c| c.borrow().iter().find(|&&(r, t, _)| (r, t) == key).map(|&(_, _, has)| has));
        // `rti` itself is not latched, so the answer is the same for every
        // member of the tree.
        let latched_sibling = cached.unwrap_or_else(|| {
            let has = list_iter::<pg_sys::AppendRelInfo>((*root).append_rel_list).any(|ai| {
                let child = (*ai).child_relid;
                if hierarchy_top(root, child) != top {
                    return false;
                }
                let rte = *(*root).simple_rte_array.add(child as usize);
                let child_rel = *(*root).simple_rel_array.add(child as usize);
                !child_rel.is_null()
                    && registry::lookup((*rte).relid).is_some_and(|l| reads_as_tail(root, child_rel, child, &l.key))
            });
            TREE_HAS_GUARDED_MEMBER.with(|c| c.borrow_mut().push((key.0, key.1, has)));
            has
        });
        if latched_sibling {
            let parent_rte = *(*root).simple_rte_array.add(top as usize);
            crate::read::admit::report_unprotected_read(format!(
                "\"{}\" is read in key order through \"{}\" with latched tables, but is not latched itself: the read can skip its rows",
                rel_name(relid),
                rel_name((*parent_rte).relid)
            ));
        }
    }
}

/// The table at the top of the partition or inheritance tree `rti` is a
/// member of: a leaf of a sub-partition is read with every other leaf of
/// the tree.  The walk stops below a UNION ALL, whose arms are separate
/// reads.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn hierarchy_top(root: *mut PlannerInfo, rti: u32) -> u32 {
    // SAFETY: `root` is live planner state of this planning step (the caller's contract); append_rel_array
    // and simple_rte_array are indexed by relid and cover every relid of the query.
    unsafe {
        let arr = (*root).append_rel_array;
        let mut at = rti;
        loop {
            let info = *arr.add(at as usize);
            if info.is_null() {
                return at;
            }
            let parent = (*info).parent_relid;
            let prte = *(*root).simple_rte_array.add(parent as usize);
            if (*prte).rtekind != pg_sys::RTEKind::RTE_RELATION {
                return at;
            }
            at = parent;
        }
    }
}

/// A `PgkvxLimitScan` path over `child`, costed and ordered exactly as it.
///
/// # Safety
/// Planner structures of the current planning step.
unsafe fn guard_path(rel: *mut RelOptInfo, child: *mut pg_sys::Path, init_params: &[i32]) -> *mut pg_sys::Path {
    // SAFETY: `rel` and `child` are live planner state of this planning step (the caller's contract); the new
    // node is palloc'd and filled like makeNode(CustomPath).
    unsafe {
        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        let c = &*child;
        let path = &mut (*cp).path;
        path.type_ = pg_sys::NodeTag::T_CustomPath;
        path.pathtype = pg_sys::NodeTag::T_CustomScan;
        path.parent = rel;
        path.pathtarget = c.pathtarget;
        path.param_info = c.param_info;
        path.parallel_aware = false;
        path.parallel_safe = false;
        path.parallel_workers = 0;
        path.rows = c.rows;
        path.startup_cost = c.startup_cost;
        path.total_cost = c.total_cost;
        path.pathkeys = c.pathkeys;
        crate::pg::copy_path_disabled_nodes(path, c);
        (*cp).flags = if pg_sys::ExecSupportsMarkRestore(child) { pg_sys::CUSTOMPATH_SUPPORT_MARK_RESTORE } else { 0 };
        (*cp).custom_paths = make_list([child]);
        // The init plan parameters a bound may use (key_bounds).
        (*cp).custom_private = make_list(init_params.iter().map(|&id| pg_sys::makeInteger(id) as *mut Node));
        (*cp).methods = &PATH_METHODS.0;
        cp as *mut pg_sys::Path
    }
}

/// The quals among `clauses` that bound a key column with a value known
/// before the statement runs: `(bound, expression)`.  An OR counts when
/// each of its branches bounds the key (read/span.rs takes the union).
///
/// # Safety
/// Planner structures of the current planning step; `clauses` is a list of
/// RestrictInfo.
unsafe fn key_bounds(
    init_params: &[i32],
    rti: u32,
    key: &crate::keys::KeyDesc,
    clauses: *mut List,
) -> (Vec<(BoundQual, *mut Node)>, u8) {
    let mut out = Vec::new();
    // Key quals whose values change while the statement runs (a nestloop
    // or lateral parameter): they bound each execution, which the plan's
    // bounds do not show (plan_data::RUNTIME_CAPS_*).
    let mut caps = 0u8;
    // SAFETY: `init_params` and the values this is called with come from live expressions of this planning
    // step (the caller's contract).
    let one_value = |value: *mut Node| unsafe { one_value_per_statement(value, init_params) };
    let mut group = 0u16;
    // SAFETY: `clauses` is a List of RestrictInfo of this planning step (the caller's contract); nodes are
    // checked by tag before each cast.
    unsafe {
        for ri in list_iter::<pg_sys::RestrictInfo>(clauses) {
            if (*ri).pseudoconstant {
                continue;
            }
            let clause = (*ri).clause as *mut Node;
            caps |= runtime_caps(rti, key, clause, init_params);
            let Some(arms) = bool_args(clause, pg_sys::BoolExprType::OR_EXPR) else {
                out.extend(clause_bounds(rti, key, clause, &one_value));
                continue;
            };
            let Some(g) = group.checked_add(1) else { continue };
            let mut found = Vec::new();
            let every_branch_bounds = arms.iter().enumerate().all(|(branch, &arm)| {
                let before = found.len();
                let conjuncts = bool_args(arm, pg_sys::BoolExprType::AND_EXPR).unwrap_or_else(|| vec![arm]);
                for c in conjuncts {
                    for (b, e) in clause_bounds(rti, key, c, &one_value) {
                        found.push((BoundQual { group: g, branch: branch as u16, ..b }, e));
                    }
                }
                found.len() > before && branch < usize::from(u16::MAX)
            });
            if every_branch_bounds {
                group = g;
                out.extend(found);
            }
        }
    }
    (out, caps)
}

/// How `clause` bounds the key with values that change while the
/// statement runs: `key < $param` caps it above, `key > $param` below; an
/// equality, a list, a row comparison or an OR with such a value both
/// ways.
///
/// # Safety
/// `clause` is a valid expression of the current planning step.
unsafe fn runtime_caps(rti: u32, key: &crate::keys::KeyDesc, clause: *mut Node, init_params: &[i32]) -> u8 {
    use super::plan_data::{RUNTIME_CAPS_ABOVE as ABOVE, RUNTIME_CAPS_BELOW as BELOW};
    // SAFETY: `clause` is a valid expression of this planning step (the caller's contract); nodes are checked
    // by tag before each cast.
    unsafe {
        if !mentions_key(clause, rti, key) || one_value_per_statement_but_key(clause, rti, init_params) {
            return 0;
        }
        if node_tag(clause) == pg_sys::NodeTag::T_OpExpr {
            let op = &*(clause as *mut pg_sys::OpExpr);
            let args: Vec<*mut Node> = list_iter(op.args).collect();
            if let &[l, r] = args.as_slice() {
                for c in &key.cols {
                    let opno = if is_column(l, rti, c.attnum) {
                        op.opno
                    } else if is_column(r, rti, c.attnum) {
                        pg_sys::get_commutator(op.opno)
                    } else {
                        continue;
                    };
                    let s = if opno == pg_sys::InvalidOid {
                        0
                    } else {
                        pg_sys::get_op_opfamily_strategy(opno, c.opfamily) as u32
                    };
                    // A comparison caps one way; an equality (a point, or a
                    // prefix the plan cannot see) or anything else both.
                    let caps =
                        |up: bool, bit: u8| if crate::read::span::strategy_caps(s, c.desc, up) { bit } else { 0 };
                    return match caps(true, ABOVE) | caps(false, BELOW) {
                        0 => ABOVE | BELOW,
                        one => one,
                    };
                }
            }
        }
        ABOVE | BELOW
    }
}

/// Whether `node` refers to a key column of `rti`.
///
/// # Safety
/// `node` is a valid expression.
unsafe fn mentions_key(node: *mut Node, rti: u32, key: &crate::keys::KeyDesc) -> bool {
    // SAFETY: `node` is a valid expression (the caller's contract), walked read-only.
    unsafe { refers_to(node, rti, |attnum| key.cols.iter().any(|c| c.attnum == attnum)) }
}

/// Whether `node` refers to a column of `rti` at this level that `column`
/// (by attribute number) picks.
///
/// # Safety
/// `node` is a valid expression.
unsafe fn refers_to(node: *mut Node, rti: u32, column: impl Fn(i16) -> bool) -> bool {
    // SAFETY: `node` is a valid expression (the caller's contract); nodes are cast after their tag is
    // checked.
    unsafe {
        crate::pg::walk::any_node(node, |n| {
            (node_tag(n) == pg_sys::NodeTag::T_Var).then(|| {
                let v = &*(n as *mut pg_sys::Var);
                v.varno as u32 == rti && v.varlevelsup == 0 && column(v.varattno)
            })
        })
    }
}

/// Whether everything in `clause` but the columns of `rti` itself has one
/// value for the whole statement: no parameter an executor node sets
/// (other than init plans'), no column of another relation or query level.
///
/// # Safety
/// `clause` is a valid expression.
unsafe fn one_value_per_statement_but_key(clause: *mut Node, rti: u32, init_params: &[i32]) -> bool {
    // SAFETY: `clause` is a valid expression (the caller's contract); nodes are cast after their tag is
    // checked.
    // The walk answers true at the first value that changes while the statement runs.
    !unsafe {
        crate::pg::walk::any_node(clause, |n| match node_tag(n) {
            pg_sys::NodeTag::T_Var => {
                let v = &*(n as *mut pg_sys::Var);
                Some(v.varno as u32 != rti || v.varlevelsup != 0)
            }
            pg_sys::NodeTag::T_Param => {
                let p = &*(n as *mut pg_sys::Param);
                Some(p.paramkind == pg_sys::ParamKind::PARAM_EXEC && !init_params.contains(&p.paramid))
            }
            pg_sys::NodeTag::T_SubPlan | pg_sys::NodeTag::T_AlternativeSubPlan | pg_sys::NodeTag::T_SubLink => {
                Some(true)
            }
            _ => None,
        })
    }
}

/// The arguments of `node` when it is a BoolExpr of kind `kind`.
///
/// # Safety
/// `node` is a valid expression.
unsafe fn bool_args(node: *mut Node, kind: pg_sys::BoolExprType::Type) -> Option<Vec<*mut Node>> {
    // SAFETY: `node` is a valid expression (the caller's contract); cast after the tag check.
    unsafe {
        (node_tag(node) == pg_sys::NodeTag::T_BoolExpr && (*(node as *mut pg_sys::BoolExpr)).boolop == kind)
            .then(|| list_iter::<Node>((*(node as *mut pg_sys::BoolExpr)).args).collect())
    }
}

/// The bounds one clause puts on key columns: `key op value` (or `value op
/// key`), a row comparison, `key = ANY(array)`.
///
/// # Safety
/// `clause` is a valid expression of the current planning step.
unsafe fn clause_bounds(
    rti: u32,
    key: &crate::keys::KeyDesc,
    clause: *mut Node,
    one_value: &dyn Fn(*mut Node) -> bool,
) -> Vec<(BoundQual, *mut Node)> {
    let mut out = Vec::new();
    // SAFETY: `clause` is a valid expression of this planning step (the caller's contract); nodes are checked
    // by tag before each cast.
    unsafe {
        let bound = |col: usize, strategy: i32, typid: pg_sys::Oid, array: bool, value: *mut Node| {
            let b = BoundQual { col: col as u16, strategy: strategy as u16, typid, array, group: 0, branch: 0 };
            (b, pg_sys::copyObjectImpl(value as *const _) as *mut Node)
        };
        match node_tag(clause) {
            pg_sys::NodeTag::T_RowCompareExpr => {
                out.extend(row_bound(rti, key, clause as *mut pg_sys::RowCompareExpr, one_value));
            }
            pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                let op = &*(clause as *mut pg_sys::ScalarArrayOpExpr);
                let args: Vec<*mut Node> = list_iter(op.args).collect();
                let &[l, r] = args.as_slice() else { return out };
                let elem = pg_sys::get_element_type(pg_sys::exprType(r));
                if !op.useOr || elem == pg_sys::InvalidOid || !one_value(r) {
                    return out;
                }
                for (col, c) in key.cols.iter().enumerate() {
                    if is_column(l, rti, c.attnum)
                        && pg_sys::get_op_opfamily_strategy(op.opno, c.opfamily) == pg_sys::BTEqualStrategyNumber as i32
                        && c.orders_like_key(op.inputcollid)
                    {
                        out.push(bound(col, pg_sys::BTEqualStrategyNumber as i32, elem, true, r));
                    }
                }
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = &*(clause as *mut pg_sys::OpExpr);
                let args: Vec<*mut Node> = list_iter(op.args).collect();
                let &[l, r] = args.as_slice() else { return out };
                for (col, c) in key.cols.iter().enumerate() {
                    // `key op value`, or `value op key` read with the commutator.
                    let (value, opno) = if is_column(l, rti, c.attnum) {
                        (r, op.opno)
                    } else if is_column(r, rti, c.attnum) {
                        (l, pg_sys::get_commutator(op.opno))
                    } else {
                        continue;
                    };
                    if opno == pg_sys::InvalidOid || !one_value(value) {
                        continue;
                    }
                    // A comparison under another collation bounds another
                    // order than the key's bytes.
                    let strategy = pg_sys::get_op_opfamily_strategy(opno, c.opfamily);
                    if strategy == 0 || !c.orders_like_key(op.inputcollid) {
                        continue;
                    }
                    out.push(bound(col, strategy, pg_sys::exprType(value), false, value));
                }
            }
            _ => {}
        }
    }
    out
}

/// The PARAM_EXEC ids that init plans set which hold one value for the
/// whole statement: a cursor a CTE read, at the statement's level or in a
/// subquery in FROM (`SELECT * FROM (WITH last AS (...) SELECT ... WHERE k >
/// (SELECT acked FROM last)) m ORDER BY k LIMIT n`).  Not nestloop
/// parameters, which change with every outer row, and none at all in a
/// subquery that refers to an outer query (a correlated subquery, a LATERAL
/// one): it may run once per outer row, its init plans with it.
///
/// # Safety
/// `root` is the current planner state, while its paths are made (its
/// parents' plan_params are reset before its plan is).
unsafe fn init_plan_params(root: *mut PlannerInfo) -> Vec<i32> {
    let mut ids = Vec::new();
    // SAFETY: `root` is the live planner state while its paths are made (the caller's contract); init_plans
    // hold SubPlans with int setParam lists.  While a subquery is planned, its parent's plan_params collects
    // the outer values it refers to (SS_replace_correlation_vars): empty all the way up, no level of the
    // chain depends on an outer row.
    unsafe {
        let mut r = root;
        while !r.is_null() {
            let parent = (*r).parent_root;
            if !parent.is_null() && !(*parent).plan_params.is_null() {
                return Vec::new();
            }
            for sp in list_iter::<pg_sys::SubPlan>((*r).init_plans) {
                ids.extend(crate::pg::list_ints((*sp).setParam));
            }
            r = parent;
        }
    }
    ids
}

/// Whether `value` has one value for the whole statement: constants, the
/// query's parameters, stable functions of them, and results of init plans
/// (`init_params`) -- no Vars, no subplans, no nestloop parameters.
///
/// # Safety
/// `value` is a valid expression.
unsafe fn one_value_per_statement(value: *mut Node, init_params: &[i32]) -> bool {
    // SAFETY: `value` is a valid expression (the caller's contract); the walkers only read.
    unsafe {
        pg_sys::is_pseudo_constant_clause(value)
            && !pg_sys::contain_subplans(value)
            && super::plan_walk::param_ids(value, pg_sys::ParamKind::PARAM_EXEC)
                .iter()
                .all(|id| init_params.contains(id))
    }
}

/// A row comparison `(k1, k2, ...) op (v1, v2, ...)` whose first column is
/// a key column, as the bound it implies on that column alone: `>` and
/// `>=` give `k1 >= v1`, `<` and `<=` give `k1 <= v1` (a keyset tail's
/// cursor).  Conservative: the row bound is never tighter than this.
///
/// # Safety
/// As for [`key_bounds`]; `rc` is a RowCompareExpr of its clauses.
unsafe fn row_bound(
    rti: u32,
    key: &crate::keys::KeyDesc,
    rc: *mut pg_sys::RowCompareExpr,
    one_value: &dyn Fn(*mut Node) -> bool,
) -> Option<(BoundQual, *mut Node)> {
    // SAFETY: `rc` is a live RowCompareExpr among the RestrictInfo clauses of this planning step (the
    // caller's contract, as for key_bounds).
    unsafe {
        let rc = &*rc;
        let l = list_nth::<Node>(rc.largs, 0)?;
        let r = list_nth::<Node>(rc.rargs, 0)?;
        let opno = pg_sys::Oid::from(list_oids(rc.opnos).next()?.to_u32());
        let collation = list_oids(rc.inputcollids).next().unwrap_or(pg_sys::InvalidOid);
        let (column, value, upward) = (l, r, crate::pg::row_compare_lower_bound(rc)?);
        let (col, c, value, opno, upward) = match key.cols.iter().position(|c| is_column(column, rti, c.attnum)) {
            Some(col) => (col, &key.cols[col], value, opno, upward),
            None => {
                // `(v1, ...) op (k1, ...)`: the key on the right.
                let col = key.cols.iter().position(|c| is_column(value, rti, c.attnum))?;
                (col, &key.cols[col], column, pg_sys::get_commutator(opno), !upward)
            }
        };
        if opno == pg_sys::InvalidOid
            || !one_value(value)
            || pg_sys::get_op_opfamily_strategy(opno, c.opfamily) == 0
            || !c.orders_like_key(collation)
        {
            return None;
        }
        let strategy = if upward { pg_sys::BTGreaterEqualStrategyNumber } else { pg_sys::BTLessEqualStrategyNumber };
        let b = BoundQual {
            col: col as u16,
            strategy: strategy as u16,
            typid: pg_sys::exprType(value),
            array: false,
            group: 0,
            branch: 0,
        };
        Some((b, pg_sys::copyObjectImpl(value as *const _) as *mut Node))
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn plan_custom_path(
    root: *mut PlannerInfo,
    rel: *mut RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    _tlist: *mut List,
    clauses: *mut List,
    custom_plans: *mut List,
) -> *mut pg_sys::Plan {
    // SAFETY (whole body): the planner hands us the plan of our one child
    // path; we build a CustomScan that returns that plan's rows unchanged.
    unsafe {
        let child = list_nth::<pg_sys::Plan>(custom_plans, 0).expect("one child plan");
        let rti = (*rel).relid;
        let relid = (**(*root).simple_rte_array.add(rti as usize)).relid;
        let latched = registry::require(relid);
        let init_params: Vec<i32> =
            list_iter::<pg_sys::Integer>((*best_path).custom_private).map(|i| (*i).ival).collect();
        let (bounds, runtime_caps) = key_bounds(&init_params, rti, &latched.key, clauses);
        let restartable = RESTARTABLE.with(|r| r.borrow().last().copied()).unwrap_or(false);
        GUARDS_PLANNED.set(GUARDS_PLANNED.get().wrapping_add(1));
        let plan = GuardPlan {
            relid,
            restartable,
            bounds: bounds.iter().map(|(b, _)| *b).collect(),
            runtime_caps,
            tree: false,
            stream: None,
        };

        // The child's rows, unchanged: our output is its target list.
        let tlist = pg_sys::copyObjectImpl((*child).targetlist as *const _) as *mut List;
        let scan_tlist = pg_sys::copyObjectImpl((*child).targetlist as *const _) as *mut List;
        let exprs = make_list(bounds.iter().map(|&(_, e)| e));
        // Not backward-scannable: a cursor declared without SCROLL then
        // stays forward-only (and reads optimistically); a SCROLL cursor
        // gets a Material over the plan and reads fenced.
        super::plan_data::custom_scan(tlist, scan_tlist, custom_plans, exprs, &plan, (*best_path).flags)
            as *mut pg_sys::Plan
    }
}
