//! Walks over plans and plan states that both the plan-time rewrite
//! (tree.rs, planner.rs) and the executor side (guards.rs, statement.rs)
//! take: children of a plan node, every plan of a statement, every plan
//! state of an executor, and which of them are `PgkvxLimitScan`s.

use super::plan_data;
use crate::pg::{list_iter, node_tag};
use pgrx::pg_sys::{self, Node, QueryDesc};

/// Whether plan node `p` is a `PgkvxLimitScan`.
///
/// # Safety
/// `p` is a valid plan node.
pub unsafe fn is_guard_plan(p: *mut pg_sys::Plan) -> bool {
    // SAFETY: the caller's contract: `p` is a valid plan node. The cast follows the tag check.
    unsafe {
        node_tag(p as *const Node) == pg_sys::NodeTag::T_CustomScan
            && std::ptr::eq((*(p as *mut pg_sys::CustomScan)).methods, plan_data::scan_methods())
    }
}

/// Calls `f` with each place in plan node `p` that holds a child (a
/// subquery's plan, the members of Append-like nodes and custom scans,
/// then both subtrees), for walkers that read a child or put a rewritten
/// one back (tree.rs).  Subplans are not children: the statement lists
/// them apart.
///
/// # Safety
/// `p` is a valid plan node.
pub unsafe fn for_each_child(p: *mut pg_sys::Plan, f: &mut dyn FnMut(*mut *mut pg_sys::Plan)) {
    // SAFETY: the caller's contract: `p` is a valid plan node. Each cast follows a tag check, and a pointer
    // List's cells hold the children's pointers.
    unsafe {
        let list: *mut pg_sys::List = match node_tag(p as *const Node) {
            pg_sys::NodeTag::T_CustomScan => (*(p as *mut pg_sys::CustomScan)).custom_plans,
            pg_sys::NodeTag::T_Append => (*(p as *mut pg_sys::Append)).appendplans,
            pg_sys::NodeTag::T_MergeAppend => (*(p as *mut pg_sys::MergeAppend)).mergeplans,
            pg_sys::NodeTag::T_BitmapAnd => (*(p as *mut pg_sys::BitmapAnd)).bitmapplans,
            pg_sys::NodeTag::T_BitmapOr => (*(p as *mut pg_sys::BitmapOr)).bitmapplans,
            pg_sys::NodeTag::T_SubqueryScan => {
                f(&raw mut (*(p as *mut pg_sys::SubqueryScan)).subplan);
                std::ptr::null_mut()
            }
            _ => std::ptr::null_mut(),
        };
        if !list.is_null() {
            for i in 0..(*list).length.max(0) as usize {
                f(&raw mut (*(*list).elements.add(i)).ptr_value as *mut *mut pg_sys::Plan);
            }
        }
        f(&raw mut (*p).lefttree);
        f(&raw mut (*p).righttree);
    }
}

/// Calls `f` on every node of plan tree `p` (not into subplans, which the
/// statement lists apart), and on the nodes under one only when `f` says
/// to descend.
///
/// # Safety
/// `p` is a valid plan tree (or NULL).
pub unsafe fn walk_plans(p: *mut pg_sys::Plan, f: &mut dyn FnMut(*mut pg_sys::Plan) -> bool) {
    // SAFETY: the caller's contract: `p` is a valid plan tree (or NULL).
    unsafe {
        if p.is_null() || !f(p) {
            return;
        }
        for_each_child(p, &mut |child| walk_plans(*child, f));
    }
}

/// Calls `f` on every plan state of an executor's tree, as
/// `planstate_tree_walker` visits them: init plans, both subtrees, the
/// members of Append-like nodes and custom scans, subplans.  In Rust, with
/// no boundary crossed per node: it runs at every guarded statement's start.
///
/// # Safety
/// `ps` is a valid, initialised plan state tree (or NULL).
unsafe fn walk_planstates(ps: *mut pg_sys::PlanState, f: &mut dyn FnMut(*mut pg_sys::PlanState)) {
    if ps.is_null() {
        return;
    }
    // SAFETY: the caller's contract: `ps` is a valid, initialised plan state tree (or NULL). Each cast
    // follows a tag check of the plan,
    // whose state the executor made of the matching kind.
    unsafe {
        f(ps);
        for sp in list_iter::<pg_sys::SubPlanState>((*ps).initPlan) {
            walk_planstates((*sp).planstate, f);
        }
        walk_planstates((*ps).lefttree, f);
        walk_planstates((*ps).righttree, f);
        let members = |arr: *mut *mut pg_sys::PlanState, n: i32, f: &mut dyn FnMut(*mut pg_sys::PlanState)| {
            for i in 0..n.max(0) as usize {
                walk_planstates(*arr.add(i), f);
            }
        };
        match node_tag((*ps).plan as *const Node) {
            pg_sys::NodeTag::T_Append => {
                let a = ps as *mut pg_sys::AppendState;
                members((*a).appendplans, (*a).as_nplans, f);
            }
            pg_sys::NodeTag::T_MergeAppend => {
                let m = ps as *mut pg_sys::MergeAppendState;
                members((*m).mergeplans, (*m).ms_nplans, f);
            }
            pg_sys::NodeTag::T_BitmapAnd => {
                let b = ps as *mut pg_sys::BitmapAndState;
                members((*b).bitmapplans, (*b).nplans, f);
            }
            pg_sys::NodeTag::T_BitmapOr => {
                let b = ps as *mut pg_sys::BitmapOrState;
                members((*b).bitmapplans, (*b).nplans, f);
            }
            pg_sys::NodeTag::T_SubqueryScan => {
                walk_planstates((*(ps as *mut pg_sys::SubqueryScanState)).subplan, f);
            }
            pg_sys::NodeTag::T_CustomScan => {
                for c in list_iter::<pg_sys::PlanState>((*(ps as *mut pg_sys::CustomScanState)).custom_ps) {
                    walk_planstates(c, f);
                }
            }
            _ => {}
        }
        for sp in list_iter::<pg_sys::SubPlanState>((*ps).subPlan) {
            walk_planstates((*sp).planstate, f);
        }
    }
}

/// Every `PgkvxLimitScan` node of a started executor.
///
/// # Safety
/// `qd` has been started.
pub unsafe fn guard_nodes(qd: *mut QueryDesc) -> Vec<*mut pg_sys::CustomScanState> {
    let mut out: Vec<*mut pg_sys::CustomScanState> = Vec::new();
    // SAFETY: the caller's contract: `qd` has been started. The walk only reads the tree.
    unsafe {
        walk_planstates((*qd).planstate, &mut |ps| {
            if is_ours(ps) {
                out.push(ps as *mut pg_sys::CustomScanState);
            }
        })
    };
    out
}

/// Whether a plan state is one of our nodes.
///
/// # Safety
/// `ps` is a valid plan state.
pub unsafe fn is_ours(ps: *mut pg_sys::PlanState) -> bool {
    // SAFETY: the caller's contract: `ps` is a valid plan state. A custom scan state's plan is its
    // CustomScan.
    unsafe { node_tag(ps) == pg_sys::NodeTag::T_CustomScanState && is_guard_plan((*ps).plan) }
}

/// The ids of the parameters of `kind` in `value`: PARAM_EXEC for init plan
/// results, PARAM_EXTERN for the query's own `$n`.  Not pull_paramids:
/// from PG16 on it returns both kinds.
///
/// # Safety
/// `value` is a valid expression.
pub unsafe fn param_ids(value: *mut Node, kind: pg_sys::ParamKind::Type) -> Vec<i32> {
    let mut ids = Vec::new();
    // SAFETY: the caller's contract: `value` is a valid expression. Nodes are cast after their tag is
    // checked.
    unsafe {
        crate::pg::walk::any_node(value, |n| {
            (node_tag(n) == pg_sys::NodeTag::T_Param).then(|| {
                let p = &*(n as *mut pg_sys::Param);
                if p.paramkind == kind {
                    ids.push(p.paramid);
                }
                false
            })
        })
    };
    ids
}

/// The plan nodes from the top of the statement's plan tree down to `cs`'s
/// parent; None when `cs` is in a subplan.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub(super) unsafe fn path_to(
    stmt: *mut pg_sys::PlannedStmt,
    cs: *mut pg_sys::CustomScan,
) -> Option<Vec<*mut pg_sys::Plan>> {
    let mut path = Vec::new();
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt. Only the statement's own tree: a
    // subplan's
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
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt holding `cs`.
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
