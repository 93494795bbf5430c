//! Memory-context helpers for per-row paths (the LIMIT scan, Arrow).

use pgrx::pg_sys;

/// `MemoryContextReset(cxt)`, without the call when the context holds
/// nothing — the same test MemoryContextReset makes first.  Per-row paths
/// reset once or twice a row and most rows allocate nothing, but each call
/// into Postgres passes pgrx's error boundary (a sigsetjmp).
///
/// # Safety
/// `cxt` is a live memory context.
#[inline(always)]
pub unsafe fn reset_if_used(cxt: pg_sys::MemoryContext) {
    // SAFETY: per the contract.
    unsafe {
        if !(*cxt).isReset || !(*cxt).firstchild.is_null() {
            pg_sys::MemoryContextReset(cxt);
        }
    }
}
