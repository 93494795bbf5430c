//! `pgkvx.latch_span(rel, lo, hi)`: an explicit write latch on a key range,
//! held to the end of the transaction (bulk loads, reserving a range).

use crate::args::Regclass;
use crate::errors;
use crate::latch::{KeyBuf, Span};
use crate::pg::rel_name;
use crate::registry;
use crate::shmem::backend;
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
    // A latch makes readers wait: only those who may write the table may take one.
    // SAFETY: catalog ACL check.
    let ok = unsafe {
        pg_sys::pg_class_aclmask(
            relid,
            pg_sys::GetUserId(),
            (pg_sys::ACL_INSERT | pg_sys::ACL_UPDATE | pg_sys::ACL_DELETE) as pg_sys::AclMode,
            pg_sys::AclMaskHow::ACLMASK_ANY,
        ) != 0
    };
    if !ok {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to latch table \"{}\": needs INSERT, UPDATE or DELETE", rel_name(relid)),
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
    backend::latch(relid, latched.owner, &span);
}
