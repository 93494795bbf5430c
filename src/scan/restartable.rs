//! Whether a statement may run twice: an optimistic read that meets a
//! conflict runs its statement again at another snapshot, so it must have
//! no effect a second run would repeat.  Decided conservatively, once per
//! planned statement: anything that may write or call a volatile function,
//! anywhere in the statement, makes it read fenced.
//!
//! Row locks in a CTE or a subquery count as side effects too (the
//! statement's own `FOR UPDATE` is in its row marks).
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
            // Row locks anywhere (a CTE or subquery FOR UPDATE): a second
            // run would lock again at another snapshot.
            pg_sys::NodeTag::T_Query if !(*(node as *mut pg_sys::Query)).rowMarks.is_null() => return true,
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

/// Whether any support function of aggregate `aggfnoid` is volatile (an
/// aggregate unknown to the catalog counts as volatile).
fn aggregate_is_volatile(aggfnoid: pg_sys::Oid) -> bool {
    use crate::pg::catalog::{aggregate_oids, AGGREGATE_FUNCTIONS};
    aggregate_oids(aggfnoid, AGGREGATE_FUNCTIONS).is_none_or(|fs| {
        fs.into_iter().any(|f| {
            // SAFETY: a syscache lookup of a function the catalog names.
            f != pg_sys::InvalidOid && unsafe { pg_sys::func_volatile(f) } as u8 == pg_sys::PROVOLATILE_VOLATILE
        })
    })
}
