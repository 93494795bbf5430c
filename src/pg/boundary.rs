//! PostgreSQL's errors pass through our hooks untouched.
//!
//! pgrx turns an ERROR raised inside a `pg_sys` call into a Rust panic and
//! raises it again at the next `#[pg_guard]`, keeping only its code, message,
//! detail and hint: constraint, table, column and datatype names and CONTEXT
//! are lost, and with RUST_BACKTRACE set each level captures a backtrace.
//! Errors raised by the statements our executor hooks run are the user's,
//! not ours, so on those paths we do what a C hook does instead:
//!
//! - a hook that has nothing to do calls on with a plain C call and keeps
//!   no state, so an error longjmps straight past it (`raw`);
//! - where we do hold state, [`pass`] catches the longjmp with a jump buffer
//!   of its own, leaves the error where Postgres put it (on its error stack,
//!   every field intact), and unwinds our Rust frames with a `Pending`
//!   marker so that their destructors run -- borrows, guards, buffers;
//! - the hook's body runs in [`rethrow_pending`], which turns the marker back
//!   into the very same error (`PG_RE_THROW`).

use super::raw;

/// The payload of an unwind that carries a PostgreSQL ERROR still pending on
/// Postgres's error stack.
struct Pending;

/// Runs `f`, which calls into Postgres through plain C calls only ([`raw`]
/// functions, hook and receiver pointers).  Should Postgres raise an ERROR
/// in it, the error stays pending as raised and our frames unwind to the
/// enclosing [`rethrow_pending`].
///
/// `f` must not panic: it runs inside a C frame (sigsetjmp) that Rust
/// unwinding cannot cross.
///
/// # Safety
/// Called inside [`rethrow_pending`]; whatever `f` calls follows the usual
/// Postgres contracts.
pub unsafe fn pass<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: the caller's contract.
    match unsafe { catch_jump(f) } {
        Some(r) => r,
        None => std::panic::resume_unwind(Box::new(Pending)),
    }
}

/// Runs `f` under a jump buffer of its own, as a PG_TRY block does: Some(f's
/// value), or None when Postgres raised an ERROR in it -- then still on
/// Postgres's error stack, with the caller's memory context current again.
///
/// # Safety
/// `f` calls into Postgres through plain C calls only and does not panic:
/// it runs inside a C frame (sigsetjmp) that Rust unwinding cannot cross.
pub unsafe fn catch_jump<R>(f: impl FnOnce() -> R) -> Option<R> {
    use pgrx::pg_sys;
    // SAFETY: the same save/restore of Postgres's error-handling globals a
    // PG_TRY block does; single-threaded backend.
    unsafe {
        let prev_stack = pg_sys::PG_exception_stack;
        let prev_context = pg_sys::error_context_stack;
        let memory = pg_sys::CurrentMemoryContext;
        let mut out = std::mem::MaybeUninit::<R>::uninit();
        let jumped = cee_scape::call_with_sigsetjmp(false, |jb| {
            pg_sys::PG_exception_stack = jb as *const _ as *mut pg_sys::sigjmp_buf;
            out.write(f());
            0
        });
        pg_sys::PG_exception_stack = prev_stack;
        pg_sys::error_context_stack = prev_context;
        if jumped == 0 {
            return Some(out.assume_init());
        }
        // errfinish leaves us in ErrorContext; what follows allocates where
        // the caller did.
        pg_sys::CurrentMemoryContext = memory;
        None
    }
}

/// Runs a hook's body; an ERROR that [`pass`] let through is raised again
/// exactly as Postgres raised it, once every Rust frame inside has unwound.
///
/// Catches every unwind, so a hook may run it without `#[pg_guard]`: a Rust
/// panic becomes an ERROR as under pgrx's guard.
///
/// # Safety
/// Called from a hook (or callback) that Postgres calls directly, with no
/// Rust state of its own left to drop after `f` returns.
pub unsafe fn rethrow_pending<R>(f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) if payload.is::<Pending>() => {
            drop(payload);
            // SAFETY: the error is still on Postgres's error stack; the
            // jump buffer current now is the one of our caller's frame.
            unsafe { raw::pg_re_throw() }
        }
        Err(payload) => raise_panic(payload),
    }
}

/// Raises a Rust panic (a bug of ours) as pgrx does, as an ERROR, from a
/// guard of its own: hooks on hot paths run without `#[pg_guard]` and
/// catch everything in [`rethrow_pending`].
fn raise_panic(payload: Box<dyn std::any::Any + Send>) -> ! {
    #[pgrx::pg_guard]
    unsafe extern "C-unwind" fn reraise(payload: *mut std::ffi::c_void) {
        // SAFETY: the box leaked below, taken back once.
        let payload = unsafe { Box::from_raw(payload as *mut Box<dyn std::any::Any + Send>) };
        std::panic::resume_unwind(*payload)
    }
    // SAFETY: reraise never returns: its guard turns the panic into an ERROR.
    unsafe { reraise(Box::into_raw(Box::new(payload)) as *mut std::ffi::c_void) };
    unreachable!("an ERROR returned")
}
