//! The executor hooks pgkvx chains into: the previous hook of each (or the
//! standard function) is called as a plain C call, so an ERROR in it
//! longjmps to the caller's jump buffer (pg/boundary.rs).

use crate::pg::compat;
use crate::pg::raw;
use pgrx::pg_sys::{self, QueryDesc};

static mut PREV_START: pg_sys::ExecutorStart_hook_type = None;

static mut PREV_RUN: pg_sys::ExecutorRun_hook_type = None;

static mut PREV_FINISH: pg_sys::ExecutorFinish_hook_type = None;

static mut PREV_END: pg_sys::ExecutorEnd_hook_type = None;

/// Calls the previous ExecutorStart hook, or the standard function.
///
/// # Safety
/// The arguments of ExecutorStart.
pub unsafe fn prev_start(qd: *mut QueryDesc, eflags: i32) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_START {
            Some(f) => f(qd, eflags),
            None => raw::standard_ExecutorStart(qd, eflags),
        }
    }
}

/// Calls the previous ExecutorRun hook, or the standard function.
///
/// # Safety
/// The arguments of ExecutorRun (`once` is dropped where the hook has none).
pub unsafe fn prev_run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_RUN {
            Some(f) => compat::call_run_hook(f, qd, dir, count, once),
            None => raw::standard_ExecutorRun(qd, dir, count, once),
        }
    }
}

/// Calls the previous ExecutorFinish hook, or the standard function.
///
/// # Safety
/// The arguments of ExecutorFinish.
pub unsafe fn prev_finish(qd: *mut QueryDesc) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_FINISH {
            Some(f) => f(qd),
            None => raw::standard_ExecutorFinish(qd),
        }
    }
}

/// Calls the previous ExecutorEnd hook, or the standard function.
///
/// # Safety
/// The arguments of ExecutorEnd.
pub unsafe fn prev_end(qd: *mut QueryDesc) {
    // SAFETY: chaining with the same arguments.
    unsafe {
        match PREV_END {
            Some(f) => f(qd),
            None => raw::standard_ExecutorEnd(qd),
        }
    }
}

/// Installs the executor hooks, keeping the previous ones to chain to;
/// called from `_PG_init`.
pub fn install(
    start: unsafe extern "C-unwind" fn(*mut QueryDesc, i32),
    run: compat::ExecutorRunHook,
    finish: unsafe extern "C-unwind" fn(*mut QueryDesc),
    end: unsafe extern "C-unwind" fn(*mut QueryDesc),
) {
    // SAFETY: _PG_init, single-threaded.
    unsafe {
        PREV_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(start);
        PREV_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(run);
        PREV_FINISH = pg_sys::ExecutorFinish_hook;
        pg_sys::ExecutorFinish_hook = Some(finish);
        PREV_END = pg_sys::ExecutorEnd_hook;
        pg_sys::ExecutorEnd_hook = Some(end);
    }
}
