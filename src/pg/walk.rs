//! Walking expression and query trees: nodeFuncs.h's walkers, declared
//! with the callback type Postgres calls, and a visitor over them.

use pgrx::pg_sys::{self, Node};
use std::ffi::c_void;

pub use super::raw::{expression_tree_mutator, expression_tree_walker, query_tree_mutator, query_tree_walker};

/// Whether `visit` answers true for some node of expression `node`,
/// walked with [`expression_tree_walker`]: `visit` returns the answer
/// for a node it decides (its subtree is not walked), None to walk on
/// into it.
///
/// # Safety
/// `node` is a valid expression (or NULL); `visit` does not panic.
pub unsafe fn any_node(node: *mut Node, mut visit: impl FnMut(*mut Node) -> Option<bool>) -> bool {
    #[pgrx::pg_guard]
    unsafe extern "C-unwind" fn step(node: *mut Node, cx: *mut c_void) -> bool {
        if node.is_null() {
            return false;
        }
        // SAFETY: `cx` is the visitor below, alive for the walk; the
        // nodes are the valid expression's.
        unsafe {
            let visit = &mut *(cx as *mut &mut dyn FnMut(*mut Node) -> Option<bool>);
            if let Some(answer) = visit(node) {
                return answer;
            }
            pg_sys::ffi::pg_guard_ffi_boundary(|| expression_tree_walker(node, Some(step), cx))
        }
    }
    let mut visit: &mut dyn FnMut(*mut Node) -> Option<bool> = &mut visit;
    // SAFETY: `node` is a valid expression or NULL (the caller's contract), and the visitor lives on
    // this frame for the whole walk, which is all `step` reads through `cx`.
    unsafe { step(node, &mut visit as *mut &mut dyn FnMut(*mut Node) -> Option<bool> as *mut c_void) }
}

/// `e` with binary-compatible casts (RelabelType) peeled off.
///
/// # Safety
/// `e` is a valid expression node (or NULL).
pub unsafe fn strip_relabel(mut e: *mut Node) -> *mut Node {
    // SAFETY: checked by tag before the cast.
    unsafe {
        while !e.is_null() && super::node_tag(e) == pg_sys::NodeTag::T_RelabelType {
            e = (*(e as *mut pg_sys::RelabelType)).arg as *mut Node;
        }
    }
    e
}
