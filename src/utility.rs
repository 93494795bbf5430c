//! The ProcessUtility hook.  Utility statements bypass the planner and
//! the executor, so what pgkvx checks or notes around them is done here,
//! in one hook: identity-key DDL and COPY are checked before the statement
//! runs (gapless/ddl.rs), the transaction's snapshot is noted after it
//! (read/snapshot.rs).

use pgrx::pg_sys;

static mut PREV_UTILITY_HOOK: pg_sys::ProcessUtility_hook_type = None;

/// Installs the hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe {
        PREV_UTILITY_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(utility_hook);
    }
}

/// Not `#[pg_guard]`: an error inside the utility must reach Postgres as it
/// was raised, with the CONTEXT lines of the callbacks active then (COPY's
/// line, PL/pgSQL's statement), not be caught and raised again out here.
/// The checks run in a guarded function of their own; nothing in this frame
/// needs dropping, so a longjmp may pass over it.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn utility_hook(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: the hook's own arguments; the checks only read the tree.
    unsafe { crate::gapless::ddl::check_utility(pstmt) };
    // SAFETY: chaining the previous hook, or the standard function, with
    // the same arguments; both are plain C calls, not pgrx's guarded
    // wrappers, so an error longjmps straight past this frame.
    unsafe {
        match PREV_UTILITY_HOOK {
            Some(prev) => prev(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc),
            None => crate::pg::raw::standard_ProcessUtility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
    crate::read::snapshot::after_utility();
}
