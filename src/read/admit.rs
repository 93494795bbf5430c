//! Whether and how a read of a latched table is protected: the one rule
//! the statement guard (LIMIT scans and every other read in key order),
//! `arrow_scan` and EXPLAIN ask, so that they never disagree.
//!
//! - A read that the mode `off` lets through is plain PostgreSQL -- but
//!   not inside a SECURITY DEFINER function called by another user
//!   ([`effective_mode`]).
//! - A read that can run twice (no side effects, no row locks) and whose
//!   result is small enough to hold back is optimistic; any other is
//!   fenced (`run::choose_mode` decides at run time, with the row count).
//! - A latched table whose writes can escape its latches (a trigger
//!   dropped, disabled or renamed, a logical replication target) is still
//!   read under the protocol, but the read cannot keep its promise: the
//!   user is told, as `pgkvx.unprotected_reads` says.

use crate::errors;
use crate::guc::{self, ScanMode};
use crate::registry::Latched;
use pgrx::PgSqlErrorCode;

/// The scan mode a read runs under: `pgkvx.scan_mode`, except that `off`
/// is not honoured while the read runs as another user than the one the
/// session acts as (inside a SECURITY DEFINER function, or an operation
/// that runs as a table's owner): a caller's `off` must not switch off the
/// protection the function's owner relies on, and there it reads as the
/// default, `optimistic`.
pub fn effective_mode() -> ScanMode {
    let mode = guc::SCAN_MODE.get();
    // SAFETY: plain reads of the backend's user ids, which cannot raise.
    let as_another_user = unsafe { crate::pg::raw::GetUserId() != crate::pg::raw::GetOuterUserId() };
    if mode == ScanMode::Off && as_another_user {
        ScanMode::Optimistic
    } else {
        mode
    }
}

/// The mode a read would run in before it runs, as EXPLAIN shows it: one
/// that cannot run twice never reads optimistically.
pub fn planned_mode(restartable: bool) -> &'static str {
    match effective_mode() {
        ScanMode::Optimistic if !restartable => ScanMode::Fenced.name(),
        m => m.name(),
    }
}

/// Tells the user when `latched`'s writes can escape its latches: a read of
/// it in key order can skip rows whatever mode it runs in.
pub fn warn_if_exposed(latched: &Latched) {
    if let Some(why) = latched.exposure.as_deref() {
        report_unprotected_read(format!("a read of \"{}\" in key order can skip rows: {why}", latched.key.relname));
    }
}

/// Tells the user, as `pgkvx.unprotected_reads` says, that a read in key
/// order cannot be protected.
pub fn report_unprotected_read(msg: String) {
    let hint = "See pgkvx.check(); SET pgkvx.unprotected_reads = allow to read without this message.";
    match guc::UNPROTECTED_READS.get() {
        guc::Unprotected::Allow => {}
        guc::Unprotected::Error => {
            errors::raise_hint(PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, msg, hint)
        }
        guc::Unprotected::Warning => errors::warn_hint(PgSqlErrorCode::ERRCODE_WARNING, msg, hint),
    }
}
