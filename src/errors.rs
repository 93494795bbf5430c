//! One way to raise a Postgres error from Rust: SQLSTATE, message, optional
//! detail and hint.  Keeping it in one place keeps messages consistent.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// Raises an ERROR; the current transaction aborts.
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>) -> ! {
    raise_full(code, message, None::<String>, None::<String>)
}

pub fn raise_hint(code: PgSqlErrorCode, message: impl Into<String>, hint: impl Into<String>) -> ! {
    raise_full(code, message, None::<String>, Some(hint))
}

pub fn raise_full(
    code: PgSqlErrorCode,
    message: impl Into<String>,
    detail: Option<impl Into<String>>,
    hint: Option<impl Into<String>>,
) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "pgkvx");
    if let Some(d) = detail {
        report = report.set_detail(d);
    }
    if let Some(h) = hint {
        report = report.set_hint(h);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR returned")
}

/// Emits a WARNING with a hint; execution goes on.
pub fn warn_hint(code: PgSqlErrorCode, message: impl Into<String>, hint: impl Into<String>) {
    ErrorReport::new(code, message.into(), "pgkvx").set_hint(hint).report(PgLogLevel::WARNING);
}

// ---- PostgreSQL's errors pass through us untouched -------------------------
//
// pgrx turns an ERROR raised inside a `pg_sys` call into a Rust panic and
// raises it again at the next `#[pg_guard]`, keeping only its code, message,
// detail and hint: constraint, table, column and datatype names and CONTEXT
// are lost, and with RUST_BACKTRACE set each level captures a backtrace.
// Errors raised by the statements our executor hooks run are the user's,
// not ours, so on those paths we do what a C hook does instead:
//
// - a hook that has nothing to do calls on with a plain C call and keeps
//   no state, so an error longjmps straight past it (`raw`);
// - where we do hold state, [`pass`] catches the longjmp with a jump buffer
//   of its own, leaves the error where Postgres put it (on its error stack,
//   every field intact), and unwinds our Rust frames with a [`Pending`]
//   marker so that their destructors run -- borrows, guards, buffers;
// - the hook's body runs in [`rethrow_pending`], which turns the marker back
//   into the very same error (`PG_RE_THROW`).

/// The payload of an unwind that carries a PostgreSQL ERROR still pending on
/// Postgres's error stack.
struct Pending;

/// Postgres's own functions, declared without pgrx's error guard: an ERROR
/// inside them longjmps to whatever jump buffer is current -- [`pass`]'s, or
/// the caller's when there is no Rust state to unwind.
pub mod raw {
    use pgrx::pg_sys;
    extern "C-unwind" {
        pub fn pg_re_throw() -> !;
        // Reads of backend state that cannot raise, asked by every guarded
        // statement: without pgrx's guard they cost no jump buffer.
        pub fn GetUserId() -> pg_sys::Oid;
        pub fn GetOuterUserId() -> pg_sys::Oid;
        pub fn RecoveryInProgress() -> bool;
        pub fn IsTransactionState() -> bool;
        pub fn GetTopTransactionIdIfAny() -> pg_sys::TransactionId;
        pub fn ReadNextFullTransactionId() -> pg_sys::FullTransactionId;
        pub fn ExecGetResultSlotOps(
            planstate: *mut pg_sys::PlanState,
            isfixed: *mut bool,
        ) -> *const pg_sys::TupleTableSlotOps;
        pub fn MemoryContextRegisterResetCallback(
            context: pg_sys::MemoryContext,
            cb: *mut pg_sys::MemoryContextCallback,
        );
        // Raise only on a misuse: releasing a lock not held, or taking one
        // with MAX_SIMUL_LWLOCKS (200) held.  Ours pair every acquire with
        // a release and hold at most two at once, taken where Postgres
        // holds none; ReadNextFullTransactionId takes XidGenLock the same
        // way.  So these never longjmp over the Rust frames above them.
        pub fn LWLockAcquire(lock: *mut pg_sys::LWLock, mode: pg_sys::LWLockMode::Type) -> bool;
        pub fn LWLockRelease(lock: *mut pg_sys::LWLock);
        pub fn palloc0(size: usize) -> *mut std::ffi::c_void;
        pub fn standard_ExecutorStart(qd: *mut pg_sys::QueryDesc, eflags: i32);
        #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
        pub fn standard_ExecutorRun(
            qd: *mut pg_sys::QueryDesc,
            dir: pg_sys::ScanDirection::Type,
            count: u64,
            execute_once: bool,
        );
        // PG18 dropped execute_once: see standard_ExecutorRun below.
        #[cfg(feature = "pg18")]
        #[link_name = "standard_ExecutorRun"]
        fn standard_ExecutorRun_pg18(qd: *mut pg_sys::QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64);
        pub fn standard_ExecutorFinish(qd: *mut pg_sys::QueryDesc);
        #[allow(clippy::too_many_arguments)]
        pub fn standard_ProcessUtility(
            pstmt: *mut pg_sys::PlannedStmt,
            query_string: *const std::ffi::c_char,
            read_only_tree: bool,
            context: pg_sys::ProcessUtilityContext::Type,
            params: pg_sys::ParamListInfo,
            query_env: *mut pg_sys::QueryEnvironment,
            dest: *mut pg_sys::DestReceiver,
            qc: *mut pg_sys::QueryCompletion,
        );
        pub fn standard_ExecutorEnd(qd: *mut pg_sys::QueryDesc);
        pub fn standard_planner(
            parse: *mut pg_sys::Query,
            query_string: *const std::ffi::c_char,
            cursor_options: i32,
            params: pg_sys::ParamListInfo,
        ) -> *mut pg_sys::PlannedStmt;
        pub fn ExecInitNode(
            plan: *mut pg_sys::Plan,
            estate: *mut pg_sys::EState,
            eflags: i32,
        ) -> *mut pg_sys::PlanState;
        pub fn ExecEndNode(node: *mut pg_sys::PlanState);
        pub fn ExecReScan(node: *mut pg_sys::PlanState);
        pub fn ExecMarkPos(node: *mut pg_sys::PlanState);
        pub fn ExecRestrPos(node: *mut pg_sys::PlanState);
        pub fn ExecStoreMinimalTuple(
            tuple: pg_sys::MinimalTuple,
            slot: *mut pg_sys::TupleTableSlot,
            should_free: bool,
        ) -> *mut pg_sys::TupleTableSlot;
    }

    /// PG18's standard_ExecutorRun under the older signature: the executor
    /// now decides on its own whether a plan may run in parallel, so
    /// `execute_once` has nowhere to go.
    ///
    /// # Safety
    /// As standard_ExecutorRun.
    #[cfg(feature = "pg18")]
    #[inline(always)]
    #[allow(non_snake_case)]
    pub unsafe fn standard_ExecutorRun(
        qd: *mut pg_sys::QueryDesc,
        dir: pg_sys::ScanDirection::Type,
        count: u64,
        _execute_once: bool,
    ) {
        // SAFETY: per contract.
        unsafe { standard_ExecutorRun_pg18(qd, dir, count) }
    }

    /// `ExecEvalExprSwitchContext` (an inline function in C) as a plain C
    /// call of the expression's own evaluation function.
    ///
    /// # Safety
    /// `state` was built by ExecInitExpr; `econtext` is live.
    pub unsafe fn eval_expr(
        state: *mut pg_sys::ExprState,
        econtext: *mut pg_sys::ExprContext,
        isnull: &mut bool,
    ) -> pg_sys::Datum {
        // SAFETY: per contract; what the C inline function does.
        unsafe {
            let old = pg_sys::CurrentMemoryContext;
            pg_sys::CurrentMemoryContext = (*econtext).ecxt_per_tuple_memory;
            let eval = (*state).evalfunc.unwrap_unchecked();
            let v = eval(state, econtext, isnull);
            pg_sys::CurrentMemoryContext = old;
            v
        }
    }
}

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
            return out.assume_init();
        }
        // errfinish leaves us in ErrorContext; destructors allocate where
        // the caller did.
        pg_sys::CurrentMemoryContext = memory;
    }
    std::panic::resume_unwind(Box::new(Pending))
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
