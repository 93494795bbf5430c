//! The guarded scans of a statement, found in its plan and decoded once, as
//! `ExecInitIndexScan` builds its state once: which tables they read, with
//! what bounds, whether the statement may run twice, and the values it
//! knows before it runs (bounds, its LIMIT).

use super::plan_data::GuardPlan;
use super::plan_walk::{is_guard_plan, walk_plans};
use crate::pg::boundary;
use crate::pg::raw;
use crate::pg::xact;
use crate::pg::{list_iter, node_tag};
use crate::read::admit;
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
    /// guards: `cut::reads_only_guarded` takes it, to walk the plan only when
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
        // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt.
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
        // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt. Subplans (init plans, subqueries,
        // CTEs) are
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

    /// D of every guarded scan as known before the statement runs (bounds
    /// not known then bound nothing, `span::KeyQual::unknown`, which only
    /// widens it).
    ///
    /// # Safety
    /// `params` are the statement's.
    pub unsafe fn declared_at_start(&self, params: pg_sys::ParamListInfo) -> Footprint {
        // SAFETY: the caller's contract.
        unsafe { self.declared_spans(params, false) }.unwrap_or_default()
    }

    /// D for a fence before the statement runs; None when a fence must
    /// wait for the scans to start instead: a bound not known before the
    /// statement runs (a cursor read from a table by a CTE or a subquery)
    /// would leave only the whole table to fence, and one that raised then
    /// (`$1 <> 0 AND k > 100 / $1`) PostgreSQL may never evaluate -- the
    /// scan does, if it runs.
    ///
    /// # Safety
    /// `params` are the statement's.
    pub unsafe fn declared_to_fence(&self, params: pg_sys::ParamListInfo) -> Option<Footprint> {
        // SAFETY: the caller's contract.
        unsafe { self.declared_spans(params, true) }
    }

    /// Whether [`Guards::declared_to_fence`] would be None, without
    /// building the spans: a constant or a parameter is known at start and
    /// cannot raise, and only a bound that can is evaluated.
    ///
    /// # Safety
    /// `params` are the statement's.
    pub unsafe fn fence_at_scan(&self, params: pg_sys::ParamListInfo) -> bool {
        // SAFETY: our plan nodes' expressions; the caller's contract.
        self.0.iter().filter(|g| g.latched.is_some()).any(|g| unsafe {
            list_iter::<pg_sys::Expr>((*g.cs).custom_exprs)
                .any(|e| !known_at_start(e) || !cannot_raise(e) && value_at_start(e, params).is_none())
        })
    }

    /// D (`strict`: None if a bound is unknown at start).
    ///
    /// # Safety
    /// `params` are the statement's.
    unsafe fn declared_spans(&self, params: pg_sys::ParamListInfo, strict: bool) -> Option<Footprint> {
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
            // SAFETY: the caller's contract: `params` are the statement's.
            fp.extend(unsafe { declared_quals(g, params, strict) }?.spans.into_iter().map(|s| (rel, s)));
        }
        Some(fp)
    }

    /// The first guarded table, to name in a message.
    pub fn first_rel(&self) -> RelId {
        self.0.first().map_or(RelId::EMPTY, Guard::rel)
    }
}

/// D of guard `g` as known before the statement runs (bounds not known
/// then bound nothing, `span::KeyQual::unknown`, which only widens it);
/// every key for a table no longer latched.
///
/// # Safety
/// `params` are `g`'s statement's.
pub unsafe fn declared_of(g: &Guard, params: pg_sys::ParamListInfo) -> span::Declared {
    // SAFETY: the caller's contract; not strict, so always Some.
    unsafe { declared_quals(g, params, false) }.unwrap_or_else(span::Declared::all)
}

/// [`declared_of`]; `strict`: None when a bound is not known at start.
///
/// # Safety
/// `params` are `g`'s statement's.
unsafe fn declared_quals(g: &Guard, params: pg_sys::ParamListInfo, strict: bool) -> Option<span::Declared> {
    let Some(latched) = &g.latched else { return Some(span::Declared::all()) };
    // SAFETY: our plan node's expression list.
    let exprs = unsafe { list_iter::<pg_sys::Expr>((*g.cs).custom_exprs) };
    let mut quals: smallvec::SmallVec<[span::KeyQual; 4]> = smallvec::SmallVec::new();
    for (b, e) in g.plan.bounds.iter().zip(exprs) {
        // SAFETY: the caller's contract: `params` are `g`'s statement's. Our plan node's expressions.
        quals.push(match unsafe { value_at_start(e, params) } {
            Some((value, isnull)) => b.qual(value, isnull),
            None if strict => return None,
            None => span::KeyQual::unknown(b.group, b.branch),
        });
    }
    Some(span::declared(&latched.key, quals))
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
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt.
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
    // SAFETY: the caller's contract: `plans` is a list of valid plan trees; `rtable` their statement's.
    unsafe {
        for p in list_iter::<pg_sys::Plan>(plans) {
            walk_plans(p, &mut collect);
        }
    }
    out
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
    // A set of keys (`= ANY`, an OR of them) is no tail by its plan alone.
    !bounds_a_set(plan) && plan.bounds.iter().all(|b| !caps(b, key, true))
}

/// Whether `plan`'s bounds make a set of keys or intervals (`= ANY`, an
/// OR): then only its evaluated D says whether it is open above.
pub fn bounds_a_set(plan: &GuardPlan) -> bool {
    plan.bounds.iter().any(|b| b.array || b.group != 0)
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
    // SAFETY: the caller's contract: `expr` is a valid expression; `params` the statement's (or NULL).
    if let Some(v) = unsafe { direct_value(expr, params) } {
        return Some(v);
    }
    // SAFETY: the caller's contract: `expr` is a valid expression; `params` the statement's (or NULL). A
    // standalone context, freed before returning.
    unsafe {
        if !known_at_start(expr) {
            return None;
        }
        let econtext = pg_sys::CreateStandaloneExprContext();
        (*econtext).ecxt_param_list_info = params;
        let state = pg_sys::ExecInitExpr(expr, std::ptr::null_mut());
        let v = evaluate_bound(expr, state, econtext);
        // By-reference values live in the caller's context: the per-query
        // context of the standalone ExprContext goes with FreeExprContext,
        // which runs the shutdown callbacks of what it evaluated only if
        // that ended well (as for an aborted subtransaction's).
        let v =
            v.map(|(v, isnull)| (if isnull { v } else { copy_datum(v, pg_sys::exprType(expr as *mut Node)) }, isnull));
        pg_sys::FreeExprContext(econtext, v.is_some());
        v
    }
}

/// Evaluates bound `expr` through its expression state `state` in
/// `econtext`, as far as PostgreSQL would: it evaluates a scan's bounds only
/// when the scan runs, which a condition on the parameters alone may stop
/// (`$1 <> 0 AND k > 100 / $1`).  So a bound that can raise is evaluated in
/// a subtransaction, and an error leaves it unknown (None) -- to us only a
/// wider span -- for the scan to evaluate it where PostgreSQL does, and
/// raise there if it raises at all.  In parallel mode, where no
/// subtransaction starts, such a bound is left unknown unevaluated.  A
/// by-reference value lives in `econtext`'s per-tuple memory.
///
/// # Safety
/// `state` is `expr`'s, built by ExecInitExpr; `econtext` is live.
pub(super) unsafe fn evaluate_bound(
    expr: *mut pg_sys::Expr,
    state: *mut pg_sys::ExprState,
    econtext: *mut pg_sys::ExprContext,
) -> Option<(pg_sys::Datum, bool)> {
    let mut isnull = false;
    // SAFETY: the caller's contract; the evaluation calls Postgres through
    // a plain C call only, as both boundaries require.
    unsafe {
        let evaluate = || raw::eval_expr(state, econtext, &mut isnull);
        let v = if cannot_raise(expr) {
            Some(boundary::pass(evaluate))
        } else if xact::may_start_subtransaction() {
            xact::caught(evaluate)
        } else {
            None
        };
        v.map(|v| (v, isnull))
    }
}

/// Whether evaluating `expr` cannot raise an error its values could cause:
/// constants, parameters and binary-compatible casts, combined by leakproof
/// functions only (a leakproof function raises no error that depends on
/// its arguments).
///
/// # Safety
/// `expr` is a valid expression.
pub(super) unsafe fn cannot_raise(expr: *mut pg_sys::Expr) -> bool {
    let leakproof =
        |f: pg_sys::Oid| if f != pg_sys::InvalidOid && pg_sys::get_func_leakproof(f) { None } else { Some(true) };
    // SAFETY: the caller's contract: `expr` is a valid expression. Nodes are cast after their tag is checked.
    !unsafe {
        crate::pg::walk::any_node(expr as *mut Node, |n| match node_tag(n) {
            // Leaves: decided here, with no walk below them (nearly every
            // bound is one).
            pg_sys::NodeTag::T_Const | pg_sys::NodeTag::T_Param => Some(false),
            pg_sys::NodeTag::T_RelabelType | pg_sys::NodeTag::T_List => None,
            pg_sys::NodeTag::T_FuncExpr => leakproof((*(n as *mut pg_sys::FuncExpr)).funcid),
            pg_sys::NodeTag::T_OpExpr => {
                let op = n as *mut pg_sys::OpExpr;
                leakproof(if (*op).opfuncid != pg_sys::InvalidOid {
                    (*op).opfuncid
                } else {
                    pg_sys::get_opcode((*op).opno)
                })
            }
            _ => Some(true),
        })
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
pub(super) unsafe fn direct_value(
    expr: *mut pg_sys::Expr,
    params: pg_sys::ParamListInfo,
) -> Option<(pg_sys::Datum, bool)> {
    // SAFETY: the caller's contract: `expr` is a valid expression; `params` the statement's (or NULL). Each
    // cast follows a tag check, and a parameter
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
    // SAFETY: the caller's contract: `expr` is a valid expression. The walkers only read.
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
    // SAFETY: the caller's contract: `v` is a valid non-null datum of `typid`.
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
    // SAFETY: the caller's contract: `stmt` is a valid PlannedStmt; `params` its parameters.
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
    // SAFETY: the caller's contract: `e` is a LIMIT's count or offset expression (or NULL); `params` the
    // statement's.
    let (v, isnull) = unsafe { value_at_start(e as *mut pg_sys::Expr, params) }?;
    Some(if isnull { 0 } else { (v.value() as i64).max(0) as u64 })
}
