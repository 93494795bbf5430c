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
/// Some(f's value), or None when it raised, the error forgotten -- except
/// an error of the session rather than of `f`'s values ([`of_the_session`]:
/// a cancel, a lock timeout, a deadlock, a serialization failure, a lack of
/// resources), raised again once the subtransaction is gone, with every
/// field it had: forgotten, a deadlock would pick another victim and a lock
/// timeout would be waited out again.
///
/// # Safety
/// [`may_start_subtransaction`]; called inside
/// [`super::boundary::rethrow_pending`] (the error raised again passes
/// through it); `f` calls into Postgres through plain C calls only and
/// does not panic (it runs inside a C frame, as for
/// [`super::boundary::pass`]).  What `f` allocates in the caller's memory
/// context outlives the subtransaction; the resources it holds (buffer
/// pins, open relations) must not.
pub unsafe fn caught<R>(f: impl FnOnce() -> R) -> Option<R> {
    use pgrx::pg_sys;
    // SAFETY: the caller's contract; the same steps as PL/pgSQL's
    // exec_stmt_block: the subtransaction runs in the caller's memory
    // context, and the caller's context and resource owner come back on
    // either path.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::CurrentMemoryContext = memory;
        if let Some(out) = super::boundary::catch_jump(f) {
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::CurrentMemoryContext = memory;
            pg_sys::CurrentResourceOwner = owner;
            return Some(out);
        }
        let error = pg_sys::CopyErrorData();
        pg_sys::FlushErrorState();
        pg_sys::RollbackAndReleaseCurrentSubTransaction();
        pg_sys::CurrentMemoryContext = memory;
        pg_sys::CurrentResourceOwner = owner;
        if of_the_session((*error).sqlerrcode) {
            // Through `pass`, so that it stays on Postgres's error stack as
            // raised (its CONTEXT too) up to the hook's rethrow_pending.
            super::boundary::pass::<()>(|| super::raw::ReThrowError(error));
        }
        pg_sys::FreeErrorData(error);
        None
    }
}

/// Whether an error with SQLSTATE `code` (as ErrorData holds it) comes from
/// the session's circumstances rather than from the values a computation
/// was given: a cancel or statement timeout (57014), a lock timeout
/// (55P03), a deadlock (40P01), a serialization failure (40001, also a
/// standby's recovery conflict), insufficient resources (class 53), a
/// system error (class 58), corrupted data (XX001, XX002).  Codes only a
/// function's own logic chooses (55000, a RAISE's) are its values'.
fn of_the_session(code: i32) -> bool {
    // SQLSTATE characters are six bits each, the first lowest
    // (elog.h's MAKE_SQLSTATE).
    let c: [u8; 5] = std::array::from_fn(|i| ((code >> (6 * i)) & 0x3F) as u8 + b'0');
    matches!(&c, b"57014" | b"55P03" | b"40P01" | b"40001" | b"XX001" | b"XX002") || matches!(&c[..2], b"53" | b"58")
}

#[cfg(test)]
mod tests {
    use super::of_the_session;
    use pgrx::PgSqlErrorCode as E;

    #[test]
    fn session_errors_are_told_from_value_errors() {
        for e in [
            E::ERRCODE_QUERY_CANCELED,
            E::ERRCODE_LOCK_NOT_AVAILABLE,
            E::ERRCODE_T_R_DEADLOCK_DETECTED,
            E::ERRCODE_T_R_SERIALIZATION_FAILURE,
            E::ERRCODE_OUT_OF_MEMORY,
            E::ERRCODE_DISK_FULL,
            E::ERRCODE_IO_ERROR,
            E::ERRCODE_DATA_CORRUPTED,
        ] {
            assert!(of_the_session(e as i32), "{e:?}");
        }
        for e in [
            E::ERRCODE_DIVISION_BY_ZERO,
            E::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            E::ERRCODE_RAISE_EXCEPTION,
            E::ERRCODE_NO_DATA_FOUND,
            E::ERRCODE_UNDEFINED_TABLE,
            E::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            E::ERRCODE_INTERNAL_ERROR,
        ] {
            assert!(!of_the_session(e as i32), "{e:?}");
        }
    }
}
