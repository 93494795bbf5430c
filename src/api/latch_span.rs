//! `pgkvx.latch_span(rel, lo, hi)`: an explicit write latch on a key range,
//! held to the end of the transaction (bulk loads, reserving a range).
//!
//! A span latch makes every reader of the range wait, rows that exist or
//! not, as `LOCK TABLE` in a mode that blocks readers does — and unlike a
//! row lock, which never blocks an MVCC reader.  So it takes what
//! PostgreSQL asks for such a lock: UPDATE, DELETE or TRUNCATE privilege
//! (or ownership); INSERT alone is not enough.  And where row-level
//! security applies to the caller it is refused: the span would reach rows
//! of other users that the caller may neither see nor write.

use crate::args::Regclass;
use crate::errors;
use crate::pg::acl;
use crate::pg::rel_name;
use crate::registry;
use crate::shmem::backend;
use pgkvx_latch::{KeyBuf, Span};
use pgrx::pg_sys;
use pgrx::prelude::*;

#[pg_extern(volatile, parallel_unsafe, schema = "pgkvx")]
fn latch_span(rel: Option<Regclass>, lo: Option<&str>, hi: Option<&str>) {
    let relid = crate::args::required(rel, "rel");
    // A read-only transaction writes nothing, so it has nothing to latch.
    // SAFETY: plain read of a backend global.
    if unsafe { pg_sys::XactReadOnly } {
        errors::raise(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "cannot execute pgkvx.latch_span() in a read-only transaction",
        );
    }
    // A span latch makes readers wait: it takes the privileges LOCK TABLE
    // asks for a mode that blocks readers (owners and superusers have all).
    if !acl::may_any(relid, pg_sys::ACL_UPDATE | pg_sys::ACL_DELETE | pg_sys::ACL_TRUNCATE) {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "permission denied to latch a span of table \"{}\": needs UPDATE, DELETE or TRUNCATE privilege",
                rel_name(relid)
            ),
            "A span latch makes every reader of the span wait, as LOCK TABLE in a mode that blocks readers does, and takes the same privileges; writes latch their own rows without it.",
        );
    }
    // Row-level security limits which rows the caller may write; a span
    // reaches rows of other users.  (Raises 42501 itself when row_security
    // is off and a policy would apply.)
    if acl::rls_applies(relid) {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("pgkvx.latch_span() is refused on table \"{}\": row-level security applies to it", rel_name(relid)),
            "A span latch would make readers of rows the policies keep from you wait; write your rows instead (each write latches its own key).",
        );
    }
    // SAFETY: standard lock acquisition.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
    let latched = registry::require(relid);
    let start = match lo {
        None => KeyBuf::EMPTY,
        Some(t) => KeyBuf::floor(latched.key.parse_bound(t, "lower").0.bytes()),
    };
    let end = match hi {
        None => KeyBuf::INFINITE,
        // A truncated bound is a prefix of the exact one: round it up.
        Some(t) => KeyBuf::ceil(latched.key.parse_bound(t, "upper").0.bytes()),
    };
    let span = Span { start, end };
    if span.is_empty() {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "latch_span: the lower bound must be below the upper bound (got {})",
                latched.key.format_span(&span)
            ),
        );
    }
    // A partition's span is latched under its latched parent.
    backend::latch(latched.root, latched.owner, &span);
}
