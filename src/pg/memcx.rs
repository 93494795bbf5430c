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
    // SAFETY: `cxt` is a live memory context (the caller's contract): its header
    // fields are readable, and resetting it is what its owner allows.
    unsafe {
        if !(*cxt).isReset || !(*cxt).firstchild.is_null() {
            pg_sys::MemoryContextReset(cxt);
        }
    }
}

/// A function PostgreSQL calls with its argument when a memory context is
/// reset or deleted (also after an ERROR, when no end callback of ours
/// runs).
pub type OnReset = unsafe extern "C-unwind" fn(*mut std::ffi::c_void);

/// Calls `func(arg)` when `cx` is reset or deleted, with `cb` as the
/// callback's record.
///
/// # Safety
/// `cx` is a live memory context; `cb` lives as long as `cx` (it is
/// allocated in it, or in a parent); `func` may run with `arg` at any
/// reset of `cx`, and must not raise.
pub unsafe fn on_reset_with(
    cx: pg_sys::MemoryContext,
    cb: *mut pg_sys::MemoryContextCallback,
    func: OnReset,
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: the caller passes a live `cx` and a writable `cb` that lives as long as `cx`, so the
    // record stays valid until the callback runs; registering only links it in and cannot raise.
    unsafe {
        (*cb).func = Some(func);
        (*cb).arg = arg;
        (*cb).next = std::ptr::null_mut();
        super::raw::MemoryContextRegisterResetCallback(cx, cb);
    }
}

/// [`on_reset_with`], its record allocated in `cx` itself.
///
/// # Safety
/// As [`on_reset_with`].
pub unsafe fn on_reset(cx: pg_sys::MemoryContext, func: OnReset, arg: *mut std::ffi::c_void) {
    // SAFETY: the caller passes a live `cx`; the record is allocated zeroed in `cx` itself, so it lives
    // exactly as long as the context it is registered on.
    unsafe {
        let cb = pg_sys::MemoryContextAllocZero(cx, std::mem::size_of::<pg_sys::MemoryContextCallback>())
            as *mut pg_sys::MemoryContextCallback;
        on_reset_with(cx, cb, func, arg);
    }
}
