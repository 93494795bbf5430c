//! The state of the transaction, as cleanup code must ask it.

/// True while the transaction can still run catalog and buffer-manager code.
/// During abort Postgres releases pins, locks and snapshots through resource
/// owners *before* memory contexts (and with them our Rust state) are freed;
/// cleanup that ran then would release everything a second time.
pub fn in_live_transaction() -> bool {
    // SAFETY: reads backend-local transaction state; callable at any time,
    // cannot raise.
    unsafe { super::raw::IsTransactionState() }
}

/// Whether a subtransaction may start now: not in parallel mode, where
/// Postgres refuses one.
pub fn may_start_subtransaction() -> bool {
    // SAFETY: reads backend-local state; cannot raise.
    unsafe { !pgrx::pg_sys::IsInParallelMode() }
}

/// Runs `f` as PL/pgSQL runs a block with an EXCEPTION clause: in an
/// internal subtransaction, rolled back should `f` raise a Postgres ERROR.
/// Some(f's value), or None when it raised, the error forgotten -- except a
/// cancel (pg_cancel_backend, statement_timeout), which is the session's and
/// not `f`'s: it is raised again once the subtransaction is gone.
///
/// # Safety
/// [`may_start_subtransaction`]; `f` calls into Postgres through plain C
/// calls only and does not panic (it runs inside a C frame, as for
/// [`super::boundary::pass`]).  What `f` allocates in the caller's memory
/// context outlives the subtransaction; the resources it holds (buffer
/// pins, open relations) must not.
pub unsafe fn caught<R>(f: impl FnOnce() -> R) -> Option<R> {
    use pgrx::pg_sys;
    // SAFETY: the caller's contract; the same steps as PL/pgSQL's
    // exec_stmt_block: the subtransaction runs in the caller's memory
    // context, and the caller's context and resource owner come back on
    // either path.  The jump buffer is saved and restored as PG_TRY does.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::CurrentMemoryContext = memory;
        let prev_stack = pg_sys::PG_exception_stack;
        let prev_context = pg_sys::error_context_stack;
        let mut out = std::mem::MaybeUninit::<R>::uninit();
        let jumped = cee_scape::call_with_sigsetjmp(false, |jb| {
            pg_sys::PG_exception_stack = jb as *const _ as *mut pg_sys::sigjmp_buf;
            out.write(f());
            0
        });
        pg_sys::PG_exception_stack = prev_stack;
        pg_sys::error_context_stack = prev_context;
        if jumped == 0 {
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::CurrentMemoryContext = memory;
            pg_sys::CurrentResourceOwner = owner;
            return Some(out.assume_init());
        }
        // errfinish left us in ErrorContext.
        pg_sys::CurrentMemoryContext = memory;
        let error = pg_sys::CopyErrorData();
        pg_sys::FlushErrorState();
        pg_sys::RollbackAndReleaseCurrentSubTransaction();
        pg_sys::CurrentMemoryContext = memory;
        pg_sys::CurrentResourceOwner = owner;
        if (*error).sqlerrcode == pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED as i32 {
            pg_sys::ReThrowError(error);
        }
        pg_sys::FreeErrorData(error);
        None
    }
}
