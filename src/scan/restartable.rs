//! Whether a statement may run twice: an optimistic read that meets a
//! conflict runs its statement again at another snapshot, so it must have
//! no effect a second run would repeat.  Decided conservatively, once per
//! planned statement: anything that may write or call a volatile function,
//! anywhere in the statement, makes it read fenced.
//!
//! Row locks count as side effects where a second run could lock other
//! rows than the first: the statement's own `FOR UPDATE` (its row marks:
//! it locks the tail's rows), and a CTE's or subquery's on a latched table
//! or with SKIP LOCKED.  A CTE that locks a row of another table -- a
//! consumer's offsets row, `WITH o AS (SELECT c FROM offsets WHERE name =
//! $1 FOR UPDATE)` -- may run twice: the second run locks the row the
//! first holds, which no one can have changed since.
//! PostgreSQL's `contain_volatile_functions` trusts each node's own
//! function, so it misses three places a volatile function runs:
//! - a coercion to a domain runs the domain's CHECK constraints, which may
//!   call anything (any domain with constraints counts here);
//! - an aggregate is looked at through its own pg_proc row, which says
//!   nothing of its transition, final, combine or (de)serial functions;
//! - a call's omitted arguments get their defaults only while the
//!   statement is planned, after this walk.

use crate::pg::node_tag;
use pgrx::pg_sys::{self, Node};
use pgrx::prelude::*;

use crate::pg::walk::{expression_tree_walker, query_tree_walker};

/// Whether the statement `parse`, planned with `cursor_options`, may run
/// twice.
///
/// # Safety
/// `parse` is the Query being planned.
pub unsafe fn statement(parse: *mut pg_sys::Query, cursor_options: i32) -> bool {
    // SAFETY: the caller's contract: `parse` is the Query being planned. The walkers only read the tree.
    unsafe {
        let q = &*parse;
        q.commandType == pg_sys::CmdType::CMD_SELECT
            && !q.hasModifyingCTE
            && q.rowMarks.is_null()
            && cursor_options & (pg_sys::CURSOR_OPT_SCROLL | pg_sys::CURSOR_OPT_HOLD) as i32 == 0
            && !pg_sys::contain_volatile_functions(parse as *mut Node)
            && !hidden_volatile(parse as *mut Node, std::ptr::null_mut())
    }
}

/// Whether a volatile function PostgreSQL's walker does not see may run
/// under `node`.
#[pg_guard]
unsafe extern "C-unwind" fn hidden_volatile(node: *mut Node, cx: *mut std::ffi::c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: nodes of a valid tree, cast after their tag is checked.
    unsafe {
        match node_tag(node) {
            // Row locks a second run could take elsewhere (module doc).
            pg_sys::NodeTag::T_Query if locks_elsewhere_when_rerun(node as *mut pg_sys::Query) => return true,
            pg_sys::NodeTag::T_Query => {
                return pg_sys::ffi::pg_guard_ffi_boundary(|| {
                    query_tree_walker(node as *mut pg_sys::Query, Some(hidden_volatile), cx, 0)
                });
            }
            pg_sys::NodeTag::T_CoerceToDomain
                if pg_sys::DomainHasConstraints((*(node as *mut pg_sys::CoerceToDomain)).resulttype) =>
            {
                return true;
            }
            _ if crate::pg::json_result_type(node).is_some_and(|t| pg_sys::DomainHasConstraints(t)) => {
                return true;
            }
            pg_sys::NodeTag::T_Aggref if aggregate_is_volatile((*(node as *mut pg_sys::Aggref)).aggfnoid) => {
                return true;
            }
            pg_sys::NodeTag::T_FuncExpr if defaults_are_volatile((*(node as *mut pg_sys::FuncExpr)).funcid) => {
                return true;
            }
            _ => {}
        }
        pg_sys::ffi::pg_guard_ffi_boundary(|| expression_tree_walker(node, Some(hidden_volatile), cx))
    }
}

/// Whether a CTE or subquery `q` locks rows a second run at another
/// snapshot could find elsewhere: rows of a latched table (the tail's own),
/// of anything but a plain table, or with SKIP LOCKED, whose second run
/// would leave the first run's rows locked and unread.
///
/// # Safety
/// `q` is a valid Query.
unsafe fn locks_elsewhere_when_rerun(q: *mut pg_sys::Query) -> bool {
    // SAFETY: the caller's contract: `q` is a valid Query; its row marks
    // name entries of its own range table.
    unsafe {
        crate::pg::list_iter::<pg_sys::RowMarkClause>((*q).rowMarks).any(|m| {
            if (*m).waitPolicy == pg_sys::LockWaitPolicy::LockWaitSkip {
                return true;
            }
            let Some(rte) = crate::pg::list_nth::<pg_sys::RangeTblEntry>((*q).rtable, (*m).rti as usize - 1) else {
                return true;
            };
            (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
                || (*rte).relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
                || crate::registry::lookup((*rte).relid).is_some()
                || !pins_one_row(q, (*m).rti, (*rte).relid)
        })
    }
}

/// Whether `q`'s WHERE pins the rows of its range table entry `rti`
/// (table `relid`) to one, by equalities with constants or parameters on
/// every column of a unique index: then a second run locks the row the
/// first locked, or none if it is gone.  A lock by any other predicate
/// (`ORDER BY c LIMIT 1 FOR UPDATE`) may take another row the second
/// time, keeping both, and deadlock where one run would not.
///
/// # Safety
/// `q` is a valid Query and `rti` an entry of its range table for `relid`.
unsafe fn pins_one_row(q: *mut pg_sys::Query, rti: pg_sys::Index, relid: pg_sys::Oid) -> bool {
    let mut cols = Vec::new();
    // SAFETY: the caller's contract; the jointree's quals are a valid
    // expression (or NULL).
    unsafe {
        if (*q).jointree.is_null() {
            return false;
        }
        pinned_columns((*(*q).jointree).quals, rti, &mut cols);
    }
    if cols.is_empty() {
        return false;
    }
    let rel = crate::pg::OpenRel::open(relid, pg_sys::AccessShareLock).keeping_lock();
    let mut sorted = cols.clone();
    sorted.sort_unstable();
    sorted.dedup();
    [cols.as_slice(), sorted.as_slice()].into_iter().any(|c| crate::registry::index_on_columns(&rel, c).is_some())
        || sorted.iter().any(|&c| crate::registry::index_on_columns(&rel, &[c]).is_some())
}

/// The columns of range table entry `rti` that `qual`, a conjunction,
/// equates with a constant or a parameter (in the order it does).
///
/// # Safety
/// `qual` is a valid expression or NULL.
unsafe fn pinned_columns(qual: *mut Node, rti: pg_sys::Index, cols: &mut Vec<i16>) {
    if qual.is_null() {
        return;
    }
    // SAFETY: nodes cast after their tags are checked.
    unsafe {
        match node_tag(qual) {
            pg_sys::NodeTag::T_BoolExpr
                if (*(qual as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR =>
            {
                for a in crate::pg::list_iter::<Node>((*(qual as *mut pg_sys::BoolExpr)).args) {
                    pinned_columns(a, rti, cols);
                }
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = qual as *mut pg_sys::OpExpr;
                let (Some(l), Some(r)) =
                    (crate::pg::list_nth::<Node>((*op).args, 0), crate::pg::list_nth::<Node>((*op).args, 1))
                else {
                    return;
                };
                if pg_sys::get_mergejoin_opfamilies((*op).opno).is_null() {
                    return;
                }
                let value = |n: *mut Node| matches!(node_tag(n), pg_sys::NodeTag::T_Const | pg_sys::NodeTag::T_Param);
                let column = |n: *mut Node| {
                    let n = strip_relabel(n);
                    (node_tag(n) == pg_sys::NodeTag::T_Var)
                        .then_some(n as *mut pg_sys::Var)
                        .filter(|&v| (*v).varno as pg_sys::Index == rti && (*v).varlevelsup == 0)
                };
                if let Some(v) = column(l)
                    .filter(|_| value(strip_relabel(r)))
                    .or_else(|| column(r).filter(|_| value(strip_relabel(l))))
                {
                    cols.push((*v).varattno);
                }
            }
            _ => {}
        }
    }
}

/// `n` without the binary-compatible casts around it.
///
/// # Safety
/// `n` is a valid expression.
unsafe fn strip_relabel(mut n: *mut Node) -> *mut Node {
    // SAFETY: cast after the tag is checked.
    unsafe {
        while node_tag(n) == pg_sys::NodeTag::T_RelabelType {
            n = (*(n as *mut pg_sys::RelabelType)).arg as *mut Node;
        }
    }
    n
}

/// Whether a volatile function that PostgreSQL's `contain_*_functions`
/// walkers do not see (a domain's CHECK, an aggregate's transition
/// function, a function's defaults) may run under expression `node`.
///
/// # Safety
/// `node` is a valid expression tree, or null.
pub unsafe fn hides_volatile(node: *mut Node) -> bool {
    // SAFETY: the caller's contract: `node` is a valid expression tree, or null.
    unsafe { hidden_volatile(node, std::ptr::null_mut()) }
}

/// Whether function `funcid` has a default argument that calls a volatile
/// function.  The planner adds omitted arguments' defaults after this
/// walk has seen the call, so any volatile default counts.
fn defaults_are_volatile(funcid: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup, released before returning; proargdefaults
    // is the nodeToString form of a List of expressions.
    unsafe {
        let tup = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::PROCOID as i32, pg_sys::Datum::from(funcid));
        if tup.is_null() {
            return false;
        }
        let mut isnull = false;
        let d = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            tup,
            pg_sys::Anum_pg_proc_proargdefaults as i16,
            &mut isnull,
        );
        let volatile = !isnull && {
            let defaults = pg_sys::stringToNode(pg_sys::text_to_cstring(d.cast_mut_ptr())) as *mut Node;
            pg_sys::contain_volatile_functions(defaults) || hidden_volatile(defaults, std::ptr::null_mut())
        };
        pg_sys::ReleaseSysCache(tup);
        volatile
    }
}

/// pg_aggregate's support functions, by attribute number (PostgreSQL 15):
/// aggtransfn, aggfinalfn, aggcombinefn, aggserialfn, aggdeserialfn,
/// aggmtransfn, aggminvtransfn, aggmfinalfn.
const AGGREGATE_FUNCTIONS: std::ops::RangeInclusive<i16> = 4..=11;

/// Whether any support function of aggregate `aggfnoid` is volatile (an
/// aggregate unknown to the catalog counts as volatile).
fn aggregate_is_volatile(aggfnoid: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup, released before returning; the attributes
    // read are regproc (oid) columns of pg_aggregate.
    unsafe {
        let tup = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::AGGFNOID as i32, pg_sys::Datum::from(aggfnoid));
        if tup.is_null() {
            return true;
        }
        let volatile = AGGREGATE_FUNCTIONS.into_iter().any(|attno| {
            let mut isnull = false;
            let d = pg_sys::SysCacheGetAttr(pg_sys::SysCacheIdentifier::AGGFNOID as i32, tup, attno, &mut isnull);
            let f = pg_sys::Oid::from(d.value() as u32);
            !isnull && f != pg_sys::InvalidOid && pg_sys::func_volatile(f) as u8 == pg_sys::PROVOLATILE_VOLATILE
        });
        pg_sys::ReleaseSysCache(tup);
        volatile
    }
}
