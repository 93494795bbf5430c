//! A cursor a tail joins to from a CTE is a bound.
//!
//! A consumer that locks its offsets row and reads on from it in one
//! statement writes
//!
//! ```sql
//! WITH o AS (SELECT c FROM offsets WHERE name = $1 FOR UPDATE)
//! SELECT e.* FROM events e, o WHERE e.id > o.c ORDER BY e.id LIMIT 100
//! ```
//!
//! PostgreSQL plans that as a nested loop over the whole key index with
//! `e.id > o.c` as its join filter: it cannot know that `o` has one row, so
//! it never turns the cursor into an index bound.  The read then starts at
//! the table's first key, and a fenced read of it (a row lock makes it
//! fenced) has no bound to fence from: it meets every writer of the table.
//! The design says a bound that comes from the statement itself is a
//! bound, so before planning a tail's level whose WHERE or ON holds such a
//! conjunct, `key > cte.col` (or `>=`, either way round), gets the
//! conjunct's consequence beside it:
//!
//! ```sql
//!   AND e.id > (SELECT c FROM o ORDER BY c LIMIT 1)
//! ```
//!
//! Every row the join keeps has some row of `o` below it, so it is above
//! the least of them: the added conjunct is implied by the first, and the
//! answer is the same (no row of `o`, or only NULLs: neither keeps a row).
//! PostgreSQL makes it an init plan over the same CTE (which still runs
//! once) and an index bound, so the scan starts at the cursor, and the
//! read is fenced from its value when its scan starts, as the scalar
//! subquery form is (`node.rs`, `fence_at_start`).
//!
//! Only for a CTE with row locks, or a data-modifying one: PostgreSQL
//! materializes both however often they are read (another reference to a
//! CTE it would have inlined would change its plan), and neither is one
//! whose reading the statement may want to put off.  The bound reads the
//! CTE when the scan starts, before the scan's first row: a data-modifying
//! CTE runs to completion anyway, and a locking one locks its rows then --
//! what a consumer polling from a locked cursor asks for, and what the
//! scalar-subquery form of the same poll does -- even when the stream has
//! no row past the cursor (the join alone would not read the CTE then).  A
//! plain CTE, `MATERIALIZED` or not, is read only as far as the statement
//! fetches it (a recursive one may never end, a large one need not be read
//! whole), so it keeps the plan PostgreSQL gives it.

use crate::pg::{list_iter, list_nth, make_list, node_tag};
use crate::registry;
use pgrx::pg_sys::{self, Node, Query};
use pgrx::prelude::*;
use std::ffi::c_void;

/// Adds the cursor bound to every tail level of `parse` that joins its
/// key to the column of a CTE that locks or writes (module doc).  Changes
/// the Query in place, as the planner does with its input.
///
/// # Safety
/// `parse` is the Query about to be planned.
pub unsafe fn add_cursor_bounds(parse: *mut Query) {
    // SAFETY: the caller's contract: `parse` is the Query about to be planned.
    unsafe {
        if parse.is_null() || (*parse).commandType == pg_sys::CmdType::CMD_UTILITY {
            return;
        }
        let mut levels: Vec<*mut Query> = Vec::new();
        visit(parse as *mut Node, &mut levels as *mut Vec<*mut Query> as *mut c_void);
    }
}

/// The walk: at each Query, its own level first (with the levels above it
/// on the stack `cx`, which `ctelevelsup` counts), then what it holds.
#[pg_guard]
unsafe extern "C-unwind" fn visit(node: *mut Node, cx: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: nodes of a valid tree, cast after their tag is checked; `cx`
    // is the level stack of add_cursor_bounds, alive for the whole walk.
    unsafe {
        if node_tag(node) == pg_sys::NodeTag::T_Query {
            let q = node as *mut Query;
            let levels = &mut *(cx as *mut Vec<*mut Query>);
            levels.push(q);
            bound_level(q, levels);
            let found =
                pg_sys::ffi::pg_guard_ffi_boundary(|| crate::pg::walk::query_tree_walker(q, Some(visit), cx, 0));
            (*(cx as *mut Vec<*mut Query>)).pop();
            return found;
        }
        pg_sys::ffi::pg_guard_ffi_boundary(|| crate::pg::walk::expression_tree_walker(node, Some(visit), cx))
    }
}

/// `e` as a Var of this level, if it is one.
///
/// # Safety
/// `e` is a valid expression or NULL.
unsafe fn level_var(e: *mut Node) -> Option<*mut pg_sys::Var> {
    // SAFETY: checked by tag before the cast.
    unsafe {
        let e = crate::pg::walk::strip_relabel(e);
        (!e.is_null() && node_tag(e) == pg_sys::NodeTag::T_Var && (*(e as *mut pg_sys::Var)).varlevelsup == 0)
            .then_some(e as *mut pg_sys::Var)
    }
}

/// The tail of level `q`: the range table index of the latched table its
/// ORDER BY leads with, up the key, and that table's key.
///
/// # Safety
/// `q` is a valid Query.
unsafe fn tail_of(q: *mut Query) -> Option<(i32, std::rc::Rc<registry::Latched>)> {
    // SAFETY: the caller's contract: a valid Query; its lists hold the node types parsenodes.h says.
    unsafe {
        let q = &*q;
        if q.commandType != pg_sys::CmdType::CMD_SELECT || q.jointree.is_null() {
            return None;
        }
        let sc = list_nth::<pg_sys::SortGroupClause>(q.sortClause, 0)?;
        let tle = pg_sys::get_sortgroupclause_tle(sc, q.targetList);
        let v = level_var((*tle).expr as *mut Node)?;
        let rte = list_nth::<pg_sys::RangeTblEntry>(q.rtable, usize::try_from((*v).varno).ok()?.checked_sub(1)?)?;
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION {
            return None;
        }
        let latched = registry::lookup((*rte).relid)?;
        let lead = latched.key.cols.first()?;
        if lead.attnum != (*v).varattno || lead.desc {
            return None;
        }
        // Up the key: ascending by the key index's own family.
        let (family, _, strategy) = crate::pg::compat::ordering_op_properties((*sc).sortop)?;
        (family == lead.opfamily && strategy == pg_sys::BTLessStrategyNumber).then_some(((*v).varno, latched))
    }
}

/// Adds the cursor bound to level `q` (the top of `levels`), if it is a
/// tail joined to the column of a CTE that locks or writes.
///
/// # Safety
/// `q` is a valid Query; `levels` the queries above it, outermost first.
unsafe fn bound_level(q: *mut Query, levels: &[*mut Query]) {
    // SAFETY: the caller's contract: `q` and the levels above it are valid Queries.
    unsafe {
        // The cheap test every level of every planned statement passes.
        let reads_a_cte =
            list_iter::<pg_sys::RangeTblEntry>((*q).rtable).any(|r| (*r).rtekind == pg_sys::RTEKind::RTE_CTE);
        if !reads_a_cte {
            return;
        }
        let Some((rti, latched)) = tail_of(q) else { return };
        let lead = &latched.key.cols[0];
        for slot in qual_slots(q) {
            for conj in conjuncts(*slot) {
                if let Some(bound) = cursor_bound(q, levels, conj, rti, lead) {
                    *slot = pg_sys::make_and_qual(*slot, bound);
                    (*q).hasSubLinks = true;
                    return;
                }
            }
        }
    }
}

/// Where level `q`'s conjuncts live: its WHERE and the ON of each join in
/// its FROM.  A conjunct implied by another may join it in either place.
///
/// # Safety
/// `q` is a valid Query with a join tree.
unsafe fn qual_slots(q: *mut Query) -> Vec<*mut *mut Node> {
    // SAFETY: the caller's contract; join tree nodes are cast after their tags are checked.
    unsafe {
        let mut out = vec![&raw mut (*(*q).jointree).quals];
        let mut todo: Vec<*mut Node> = list_iter::<Node>((*(*q).jointree).fromlist).collect();
        while let Some(n) = todo.pop() {
            match node_tag(n) {
                pg_sys::NodeTag::T_JoinExpr => {
                    let j = n as *mut pg_sys::JoinExpr;
                    out.push(&raw mut (*j).quals);
                    todo.push((*j).larg);
                    todo.push((*j).rarg);
                }
                pg_sys::NodeTag::T_FromExpr => {
                    let f = n as *mut pg_sys::FromExpr;
                    out.push(&raw mut (*f).quals);
                    todo.extend(list_iter::<Node>((*f).fromlist));
                }
                _ => {}
            }
        }
        out
    }
}

/// The top-level AND conjuncts of `qual` (not yet flattened by the
/// planner: ANDs may nest).
///
/// # Safety
/// `qual` is a valid expression or NULL.
unsafe fn conjuncts(qual: *mut Node) -> Vec<*mut Node> {
    let mut out = Vec::new();
    let mut todo = vec![qual];
    // SAFETY: the caller's contract; nodes are cast after their tags are checked.
    unsafe {
        while let Some(n) = todo.pop() {
            if n.is_null() {
                continue;
            }
            if node_tag(n) == pg_sys::NodeTag::T_BoolExpr
                && (*(n as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR
            {
                todo.extend(list_iter::<Node>((*(n as *mut pg_sys::BoolExpr)).args));
            } else {
                out.push(n);
            }
        }
    }
    out
}

/// For conjunct `conj` of level `q`, `key > cte.col` (or `>=`, or written
/// the other way round) with `key` the lead column `lead` of range table
/// entry `rti` and `cte` a CTE that locks or writes: the same
/// comparison with the least `cte.col` instead (module doc), the CTE
/// counted as read once more.  None for anything else.
///
/// # Safety
/// `q` is a valid Query; `levels` the queries above it, outermost first.
unsafe fn cursor_bound(
    q: *mut Query,
    levels: &[*mut Query],
    conj: *mut Node,
    rti: i32,
    lead: &crate::keys::desc::KeyCol,
) -> Option<*mut Node> {
    // SAFETY: the caller's contract; nodes are cast after their tags are checked, catalog lookups only.
    unsafe {
        if node_tag(conj) != pg_sys::NodeTag::T_OpExpr {
            return None;
        }
        let op = conj as *mut pg_sys::OpExpr;
        if crate::pg::list_len((*op).args) != 2 || !pg_sys::op_in_opfamily((*op).opno, lead.opfamily) {
            return None;
        }
        let is_key = |v: *mut pg_sys::Var| (*v).varno == rti && (*v).varattno == lead.attnum;
        let (left, right) = (list_nth::<Node>((*op).args, 0)?, list_nth::<Node>((*op).args, 1)?);
        let (key_left, other) = match (level_var(left), level_var(right)) {
            (Some(l), Some(r)) if is_key(l) && !is_key(r) => (true, r),
            (Some(l), Some(r)) if is_key(r) && !is_key(l) => (false, l),
            _ => return None,
        };
        let (mut strategy, mut lefttype, mut righttype) = (0i32, pg_sys::InvalidOid, pg_sys::InvalidOid);
        pg_sys::get_op_opfamily_properties(
            (*op).opno,
            lead.opfamily,
            false,
            &mut strategy,
            &mut lefttype,
            &mut righttype,
        );
        let (gt, ge) = (pg_sys::BTGreaterStrategyNumber as i32, pg_sys::BTGreaterEqualStrategyNumber as i32);
        let (lt, le) = (pg_sys::BTLessStrategyNumber as i32, pg_sys::BTLessEqualStrategyNumber as i32);
        let lower = if key_left { strategy == gt || strategy == ge } else { strategy == lt || strategy == le };
        if !lower {
            return None;
        }
        let rte =
            list_nth::<pg_sys::RangeTblEntry>((*q).rtable, usize::try_from((*other).varno).ok()?.checked_sub(1)?)?;
        if (*rte).rtekind != pg_sys::RTEKind::RTE_CTE || (*rte).self_reference {
            return None;
        }
        let owner = *levels.len().checked_sub(1 + (*rte).ctelevelsup as usize).and_then(|i| levels.get(i))?;
        let cte = list_iter::<pg_sys::CommonTableExpr>((*owner).cteList)
            .find(|&c| std::ffi::CStr::from_ptr((*c).ctename) == std::ffi::CStr::from_ptr((*rte).ctename))?;
        if !locks_or_writes(cte) {
            return None;
        }
        // The least value by the key's own order, NULLs last, compared
        // under the conjunct's collation.
        let ctype = (*other).vartype;
        let coll = (*op).inputcollid;
        if coll != pg_sys::InvalidOid && coll != (*other).varcollid {
            return None;
        }
        let less = pg_sys::get_opfamily_member(lead.opfamily, ctype, ctype, pg_sys::BTLessStrategyNumber as i16);
        let equal = pg_sys::get_opfamily_member(lead.opfamily, ctype, ctype, pg_sys::BTEqualStrategyNumber as i16);
        if less == pg_sys::InvalidOid || equal == pg_sys::InvalidOid {
            return None;
        }
        let least = least_of(rte, other, less, equal);
        (*cte).cterefcount += 1;
        let bound = pg_sys::copyObjectImpl(op as *const c_void) as *mut pg_sys::OpExpr;
        let (key_arg, bound_arg) = (if key_left { left } else { right }, least as *mut Node);
        let key_arg = pg_sys::copyObjectImpl(key_arg as *const c_void) as *mut Node;
        (*bound).args = if key_left { make_list([key_arg, bound_arg]) } else { make_list([bound_arg, key_arg]) };
        (*bound).location = -1;
        Some(bound as *mut Node)
    }
}

/// Whether `cte` locks the rows it reads or writes (module doc): then
/// PostgreSQL materializes it however often it is read (subselect.c
/// inlines only CTEs without either), and reading it when the scan starts
/// puts off nothing the statement may want put off.
///
/// # Safety
/// `cte` is a valid CommonTableExpr of the Query being planned.
unsafe fn locks_or_writes(cte: *mut pg_sys::CommonTableExpr) -> bool {
    // SAFETY: the caller's contract; the CTE's query is a Query.
    unsafe {
        let c = &*cte;
        let q = c.ctequery as *mut Query;
        !c.cterecursive
            && !q.is_null()
            && node_tag(q) == pg_sys::NodeTag::T_Query
            && ((*q).commandType != pg_sys::CmdType::CMD_SELECT || !(*q).rowMarks.is_null())
    }
}

/// `(SELECT col FROM cte ORDER BY col LIMIT 1)`, one level below the
/// conjunct's, where `rte` is the conjunct's reference to the CTE and
/// `col` its column `var`, ordered by `less` (equality `equal`).
///
/// # Safety
/// `rte` is an RTE_CTE of the level being bounded, `var` a Var of it.
unsafe fn least_of(
    rte: *mut pg_sys::RangeTblEntry,
    var: *mut pg_sys::Var,
    less: pg_sys::Oid,
    equal: pg_sys::Oid,
) -> *mut pg_sys::SubLink {
    // SAFETY: the caller's contract; every node is allocated zeroed and tagged, as makeNode does, in the
    // planner's current memory context, which holds the Query.
    unsafe {
        let sub_rte = pg_sys::copyObjectImpl(rte as *const c_void) as *mut pg_sys::RangeTblEntry;
        (*sub_rte).ctelevelsup += 1;
        let col = pg_sys::makeVar(1, (*var).varattno, (*var).vartype, (*var).vartypmod, (*var).varcollid, 0);
        let tle = pg_sys::makeTargetEntry(col as *mut pg_sys::Expr, 1, std::ptr::null_mut(), false);
        (*tle).ressortgroupref = 1;
        let sort = make_node::<pg_sys::SortGroupClause>(pg_sys::NodeTag::T_SortGroupClause);
        (*sort).tleSortGroupRef = 1;
        (*sort).eqop = equal;
        (*sort).sortop = less;
        (*sort).nulls_first = false;
        let rtr = make_node::<pg_sys::RangeTblRef>(pg_sys::NodeTag::T_RangeTblRef);
        (*rtr).rtindex = 1;
        let one = pg_sys::makeConst(pg_sys::INT8OID, -1, pg_sys::InvalidOid, 8, pg_sys::Datum::from(1i64), false, true);
        let sub = make_node::<Query>(pg_sys::NodeTag::T_Query);
        (*sub).commandType = pg_sys::CmdType::CMD_SELECT;
        (*sub).querySource = pg_sys::QuerySource::QSRC_ORIGINAL;
        (*sub).canSetTag = true;
        (*sub).rtable = make_list([sub_rte]);
        (*sub).jointree = pg_sys::makeFromExpr(make_list([rtr]), std::ptr::null_mut());
        (*sub).targetList = make_list([tle]);
        (*sub).sortClause = make_list([sort]);
        (*sub).limitCount = one as *mut Node;
        (*sub).limitOption = pg_sys::LimitOption::LIMIT_OPTION_COUNT;
        let link = make_node::<pg_sys::SubLink>(pg_sys::NodeTag::T_SubLink);
        (*link).subLinkType = pg_sys::SubLinkType::EXPR_SUBLINK;
        (*link).subselect = sub as *mut Node;
        (*link).location = -1;
        link
    }
}

/// makeNode(T): a zeroed node of `tag`.
///
/// # Safety
/// `T` is the node struct of `tag`.
unsafe fn make_node<T>(tag: pg_sys::NodeTag) -> *mut T {
    // SAFETY: the caller's contract; palloc0 returns zeroed memory of T's size, whose first field is the tag.
    unsafe {
        let n = pg_sys::palloc0(std::mem::size_of::<T>()) as *mut T;
        (*(n as *mut Node)).type_ = tag;
        n
    }
}
