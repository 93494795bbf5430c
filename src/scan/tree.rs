//! One node over a partitioned table's MergeAppend instead of one per
//! partition.
//!
//! The planner wraps each partition's scan in its own `PgkvxLimitScan`: it
//! is the only place a partition's paths can be wrapped, since a
//! partitioned table that is a query's only relation gets its Append paths
//! rebuilt from its partitions' paths after every path hook has run.  But
//! a tail read of a table partitioned by time opens every partition through
//! a MergeAppend, and a node per partition costs a node's start and
//! bookkeeping per partition, per poll.
//!
//! So once the plan is made, a MergeAppend whose every input is a guarded
//! partition scan of one latched tree, sorted on the tree's key, is guarded
//! once: the partitions' nodes are taken out and one node goes over the
//! MergeAppend.  Its rows come in key order, so the span it touched ends at
//! the last row it handed up (`node::ScanPosition::Stream`), which is what
//! the partitions' nodes together recorded, or less.  An input may be a
//! Result that computes the query's expressions from its guard's rows (the
//! guard is taken from under it).  Every other shape keeps its nodes per
//! partition: an Append (in partition order, each input pruned or run on
//! its own), inputs sorted above their scan (a Limit's bound must reach the
//! sort), a MergeAppend carrying its level's init plans, a key the
//! MergeAppend does not sort on.

use super::plan_data::{custom_scan, GuardPlan, StreamOrder};
use crate::pg::{list_iter, list_nth, make_list, node_tag};
use crate::registry;
use pgrx::pg_sys::{self, List, Node, Plan};
use pgrx::prelude::*;

/// Replaces, everywhere in `stmt`, each MergeAppend over guarded partition
/// scans by one guard over it.
///
/// # Safety
/// `stmt` is the PlannedStmt the planner just made, not yet shared.
pub unsafe fn guard_merge_appends(stmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: the caller's contract: `stmt` is the PlannedStmt the planner just made, not yet shared. Every
    // plan node is ours to rewrite in place.
    unsafe {
        let rtable = (*stmt).rtable;
        let mut next_id = None;
        (*stmt).planTree = rewrite((*stmt).planTree, rtable, stmt, &mut next_id);
        let subplans = (*stmt).subplans;
        if !subplans.is_null() {
            for i in 0..(*subplans).length as usize {
                let cell = (*subplans).elements.add(i);
                (*cell).ptr_value =
                    rewrite((*cell).ptr_value as *mut Plan, rtable, stmt, &mut next_id) as *mut std::ffi::c_void;
            }
        }
    }
}

/// `p` with its children rewritten, bottom up, and itself guarded if it is
/// such a MergeAppend.
///
/// # Safety
/// `p` is a plan tree of `stmt` (or NULL).
unsafe fn rewrite(
    p: *mut Plan,
    rtable: *mut List,
    stmt: *mut pg_sys::PlannedStmt,
    next_id: &mut Option<i32>,
) -> *mut Plan {
    if p.is_null() {
        return p;
    }
    // SAFETY: the caller's contract: `p` is a plan tree of `stmt` (or NULL). The cast follows the tag check.
    unsafe {
        super::plan_walk::for_each_child(p, &mut |child| *child = rewrite(*child, rtable, stmt, next_id));
        if node_tag(p as *const Node) != pg_sys::NodeTag::T_MergeAppend {
            return p;
        }
        let ma = p as *mut pg_sys::MergeAppend;
        let Some(guard) = tree_guard(ma, rtable) else { return p };
        let id = *next_id.get_or_insert_with(|| max_plan_node_id(stmt) + 1);
        *next_id = Some(id + 1);
        guard.build(ma, id)
    }
}

/// What one guard over a MergeAppend needs: the partitions' guards it
/// replaces agree on all of it.
struct TreeGuard {
    plan: GuardPlan,
    /// The partitions' bounds (one guard's `custom_exprs`).
    exprs: *mut List,
    /// The first input, to describe columns the MergeAppend's inputs
    /// compute.
    first: Input,
    /// Every input, in the MergeAppend's order.
    inputs: Vec<Input>,
    /// The partitioned table's range table index.
    parent_rti: u32,
}

/// One input of the MergeAppend: a partition's guard, straight or under
/// the Result that computes the query's expressions from its rows.
#[derive(Clone, Copy)]
struct Input {
    guard: *mut pg_sys::CustomScan,
    projection: Option<*mut pg_sys::Result>,
}

impl Input {
    /// `input` as a guarded partition scan, if it is one.
    ///
    /// # Safety
    /// `input` is a node of a finished plan.
    unsafe fn of(input: *mut Plan) -> Option<Input> {
        // SAFETY: the caller's contract: `input` is a node of a finished plan. Checked by tag before the
        // cast.
        unsafe {
            if super::plan_walk::is_guard_plan(input) {
                return Some(Input { guard: input as *mut pg_sys::CustomScan, projection: None });
            }
            if node_tag(input as *const Node) != pg_sys::NodeTag::T_Result {
                return None;
            }
            // Only a projection: a Result that also gates (a pseudoconstant
            // qual) or filters stays as it is, over its guard.
            let r = input as *mut pg_sys::Result;
            let p = &(*r).plan;
            let plain_projection = (*r).resconstantqual.is_null()
                && p.qual.is_null()
                && p.initPlan.is_null()
                && p.righttree.is_null()
                && !p.lefttree.is_null()
                && super::plan_walk::is_guard_plan(p.lefttree);
            plain_projection.then_some(Input { guard: p.lefttree as *mut pg_sys::CustomScan, projection: Some(r) })
        }
    }
}

/// The guard `ma` can have, if every input of it is a guarded scan of one
/// latched partitioned table and it sorts on that table's key.
///
/// # Safety
/// `ma` is a MergeAppend of a finished plan; `rtable` its statement's.
unsafe fn tree_guard(ma: *mut pg_sys::MergeAppend, rtable: *mut List) -> Option<TreeGuard> {
    // SAFETY: the caller's contract: `ma` is a MergeAppend of a finished plan; `rtable` its statement's. Plan
    // nodes are checked by tag before each cast.
    unsafe {
        let mut parent_rti = 0;
        // An init plan of the MergeAppend's level hangs on it, and its value
        // may be what the partitions' bounds read: it stays where it is.
        if !(*ma).plan.initPlan.is_null() || !pg_sys::bms_get_singleton_member((*ma).apprelids, &mut parent_rti) {
            return None;
        }
        let parent_rte = list_nth::<pg_sys::RangeTblEntry>(rtable, parent_rti as usize - 1)?;
        if (*parent_rte).relkind as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
            return None;
        }
        let parent = registry::lookup((*parent_rte).relid)?;
        let mut first: Option<(GuardPlan, Input)> = None;
        let mut inputs = Vec::new();
        for input in list_iter::<Plan>((*ma).mergeplans) {
            let input = Input::of(input)?;
            let cs = input.guard;
            let plan = GuardPlan::from_list((*cs).custom_private)?;
            if registry::lookup(plan.relid)?.root != parent.root {
                return None;
            }
            // One child each, as the planner builds them.
            list_nth::<Plan>((*cs).custom_plans, 0)?;
            match &first {
                None => first = Some((plan, input)),
                Some((p, f)) => {
                    let same = p.restartable == plan.restartable
                        && p.bounds == plan.bounds
                        && p.runtime_caps == plan.runtime_caps
                        && pg_sys::equal((*f.guard).custom_exprs as *const _, (*cs).custom_exprs as *const _);
                    if !same {
                        return None;
                    }
                }
            }
            inputs.push(input);
        }
        let (first_plan, first) = first?;
        let stream = sort_order(ma, parent_rti as u32, &parent.key)?;
        let plan = GuardPlan {
            relid: (*parent_rte).relid,
            restartable: first_plan.restartable,
            bounds: first_plan.bounds,
            runtime_caps: first_plan.runtime_caps,
            tree: true,
            stream: Some(stream),
        };
        Some(TreeGuard { plan, exprs: (*first.guard).custom_exprs, first, inputs, parent_rti: parent_rti as u32 })
    }
}

/// The order `ma` hands up rows in, as key order: its leading sort columns
/// are the key's columns, each the parent's own column, all in the key
/// encoding's direction or all against it.
///
/// # Safety
/// As for [`tree_guard`]; `parent_rti` is `ma`'s partitioned table.
unsafe fn sort_order(ma: *mut pg_sys::MergeAppend, parent_rti: u32, key: &crate::keys::KeyDesc) -> Option<StreamOrder> {
    // SAFETY: the caller's contract: `ma` is a MergeAppend of a finished plan; `rtable` its statement's.
    // `parent_rti` is `ma`'s partitioned table. The sort arrays hold numCols entries.
    unsafe {
        let n = (*ma).numCols as usize;
        if n < key.cols.len() {
            return None;
        }
        let tlist = (*ma).plan.targetlist;
        let mut forward = None;
        let mut resnos = Vec::with_capacity(key.cols.len());
        for (i, c) in key.cols.iter().enumerate() {
            let resno = *(*ma).sortColIdx.add(i);
            let te = list_nth::<pg_sys::TargetEntry>(tlist, resno as usize - 1)?;
            let var = (*te).expr as *mut Node;
            if node_tag(var) != pg_sys::NodeTag::T_Var {
                return None;
            }
            let var = var as *mut pg_sys::Var;
            if (*var).varnosyn != parent_rti || (*var).varattnosyn != c.attnum {
                return None;
            }
            let op = *(*ma).sortOperators.add(i);
            let (opfamily, _, strategy) = crate::pg::ordering_op_properties(op)?;
            if opfamily != c.opfamily || !c.orders_like_key(*(*ma).collations.add(i)) {
                return None;
            }
            let ascending = strategy == pg_sys::BTLessStrategyNumber;
            let f = ascending != c.desc;
            if forward.is_some_and(|o| o != f) {
                return None;
            }
            forward = Some(f);
            resnos.push(resno);
        }
        Some(StreamOrder { forward: forward?, resnos })
    }
}

impl TreeGuard {
    /// The guard over `ma`, its inputs' guards taken out.
    ///
    /// # Safety
    /// `ma` is the MergeAppend this was found for.
    unsafe fn build(self, ma: *mut pg_sys::MergeAppend, plan_node_id: i32) -> *mut Plan {
        // SAFETY: the caller's contract: `ma` is the MergeAppend this was found for. The new node is palloc'd
        // and filled like
        // makeNode(CustomScan), with the fields set_plan_references would
        // have set.
        unsafe {
            let l = (*ma).mergeplans;
            for (i, input) in self.inputs.iter().enumerate() {
                let child = list_nth::<Plan>((*input.guard).custom_plans, 0).expect("checked in tree_guard");
                match input.projection {
                    // The Result reads the guard's rows, which are its child's.
                    Some(r) => (*r).plan.lefttree = child,
                    None => (*(*l).elements.add(i)).ptr_value = child as *mut std::ffi::c_void,
                }
            }
            let m = &(*ma).plan;
            // The MergeAppend's rows, unchanged: the output refers to the
            // scan tuple (our child's), column by column.
            let mut scan_tlist = Vec::new();
            let mut tlist = Vec::new();
            for te in list_iter::<pg_sys::TargetEntry>(m.targetlist) {
                let e = (*te).expr as *mut Node;
                let described = self.describe(e, (*te).resno);
                scan_tlist.push(pg_sys::makeTargetEntry(described, (*te).resno, std::ptr::null_mut(), false));
                let out = pg_sys::makeVar(
                    pg_sys::INDEX_VAR,
                    (*te).resno,
                    pg_sys::exprType(e),
                    pg_sys::exprTypmod(e),
                    pg_sys::exprCollation(e),
                    0,
                );
                let out = pg_sys::makeTargetEntry(out as *mut pg_sys::Expr, (*te).resno, (*te).resname, (*te).resjunk);
                (*out).ressortgroupref = (*te).ressortgroupref;
                tlist.push(out);
            }
            let plans = make_list([ma as *mut Plan]);
            let cs = custom_scan(make_list(tlist), make_list(scan_tlist), plans, self.exprs, &self.plan, 0);
            let p = &mut (*cs).scan.plan;
            p.startup_cost = m.startup_cost;
            p.total_cost = m.total_cost;
            p.plan_rows = m.plan_rows;
            p.plan_width = m.plan_width;
            crate::pg::copy_plan_disabled_nodes(p, m);
            p.plan_node_id = plan_node_id;
            p.extParam = pg_sys::bms_copy(m.extParam);
            p.allParam = pg_sys::bms_copy(m.allParam);
            cs as *mut Plan
        }
    }

    /// Column `resno` of the MergeAppend's output as EXPLAIN names it: the
    /// parent's column it came from, or what the first partition computes
    /// there.
    ///
    /// # Safety
    /// `e` is the MergeAppend's target entry expression at `resno`.
    unsafe fn describe(&self, e: *mut Node, resno: i16) -> *mut pg_sys::Expr {
        // SAFETY: the caller's contract: `e` is the MergeAppend's target entry expression at `resno`. Checked
        // by tag before the cast.
        unsafe {
            // A column of the parent, named as the parent.  (A column read
            // through an aliased join names the join in varnosyn, which
            // plans are not deparsed by.)
            if node_tag(e) == pg_sys::NodeTag::T_Var {
                let v = e as *mut pg_sys::Var;
                if (*v).varnosyn == self.parent_rti {
                    let var = pg_sys::makeVar(
                        (*v).varnosyn as i32,
                        (*v).varattnosyn,
                        (*v).vartype,
                        (*v).vartypmod,
                        (*v).varcollid,
                        0,
                    );
                    (*var).varnosyn = (*v).varnosyn;
                    (*var).varattnosyn = (*v).varattnosyn;
                    return var as *mut pg_sys::Expr;
                }
            }
            let scan_tlist = (*self.first.guard).custom_scan_tlist;
            let computed = match self.first.projection {
                // The Result's expression reads its child's columns as
                // OUTER_VAR; EXPLAIN finds them in the partition's scan.
                Some(r) => list_nth::<pg_sys::TargetEntry>((*r).plan.targetlist, resno as usize - 1)
                    .map(|te| outer_vars_replaced((*te).expr as *mut Node, scan_tlist)),
                None => list_nth::<pg_sys::TargetEntry>(scan_tlist, resno as usize - 1)
                    .map(|te| pg_sys::copyObjectImpl((*te).expr as *const _) as *mut Node),
            };
            computed.unwrap_or_else(|| pg_sys::copyObjectImpl(e as *const _) as *mut Node) as *mut pg_sys::Expr
        }
    }
}

/// A copy of `expr` with each OUTER_VAR Var replaced by the expression at
/// its position in `tlist`.
///
/// # Safety
/// `expr` is a valid expression whose OUTER_VAR Vars index into `tlist`.
unsafe fn outer_vars_replaced(expr: *mut Node, tlist: *mut List) -> *mut Node {
    #[pg_guard]
    unsafe extern "C-unwind" fn mutate(node: *mut Node, cx: *mut std::ffi::c_void) -> *mut Node {
        // SAFETY: called by expression_tree_mutator on nodes of the
        // expression, with our target list as the context.
        unsafe {
            if node.is_null() {
                return node;
            }
            if node_tag(node) == pg_sys::NodeTag::T_Var {
                let v = node as *mut pg_sys::Var;
                if (*v).varno == pg_sys::OUTER_VAR {
                    if let Some(te) = list_nth::<pg_sys::TargetEntry>(cx as *mut List, (*v).varattno as usize - 1) {
                        return pg_sys::copyObjectImpl((*te).expr as *const _) as *mut Node;
                    }
                }
            }
            pg_sys::ffi::pg_guard_ffi_boundary(|| crate::pg::walk::expression_tree_mutator(node, Some(mutate), cx))
        }
    }
    // SAFETY: the caller's contract: `expr` is a valid expression whose OUTER_VAR Vars index into `tlist`.
    unsafe { mutate(expr, tlist as *mut std::ffi::c_void) }
}

/// The largest plan node id in `stmt`: the new guard takes the next.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
unsafe fn max_plan_node_id(stmt: *mut pg_sys::PlannedStmt) -> i32 {
    let mut max = 0;
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt.
    unsafe {
        super::plan_walk::walk_plans((*stmt).planTree, &mut |p| {
            max = max.max((*p).plan_node_id);
            true
        });
        for sp in list_iter::<Plan>((*stmt).subplans) {
            super::plan_walk::walk_plans(sp, &mut |p| {
                max = max.max((*p).plan_node_id);
                true
            });
        }
    }
    max
}
