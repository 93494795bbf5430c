//! Settings pinned around SQL of ours, as a function's SET clauses pin them.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Runs `f` (which runs SQL of ours) with `search_path` set to
/// `pg_catalog, pg_temp` and `row_security` on, whatever the caller set:
/// no object or operator the caller planted can stand in for ours, and no
/// internal statement fails because the caller turned row security off.
/// The settings come back when `f` returns; after an ERROR the transaction
/// abort restores them.
pub fn with_pinned_settings<R>(f: impl FnOnce() -> R) -> R {
    with_settings(&[(c"search_path", c"pg_catalog, pg_temp"), (c"row_security", c"on")], f)
}

/// Runs `f` with `settings` set for its duration, as a function's SET
/// clauses are; they come back when `f` returns, and after an ERROR the
/// transaction abort restores them.
pub fn with_settings<R>(settings: &[(&CStr, &CStr)], f: impl FnOnce() -> R) -> R {
    // SAFETY: the GUC nest-level protocol, as SECURITY DEFINER functions
    // with SET clauses use it.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for (name, value) in settings {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let r = f();
        pg_sys::AtEOXact_GUC(true, level);
        r
    }
}
