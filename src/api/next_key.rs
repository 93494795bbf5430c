//! `pgkvx.next_key(rel)`: gapless key allocation.
//!
//! A sequence hands out a value before the row's latch exists, so a reader
//! can see key 11 committed while key 10 is drawn but not yet latched — and
//! move past 10 for ever.  No read-side cleverness closes that window: it
//! must close where keys are drawn.  `next_key` draws the value and publishes
//! the caller's write latch on it inside one critical section per table, so
//! when any later key is drawn, every earlier drawn key is already latched
//! (and its latch precedes the later one in publication order).
//!
//! The section is an LWLock, so nothing in it may wait on a heavyweight
//! lock, sleep or do unbounded work: interrupts are held while it is held,
//! and the deadlock detector cannot see it.  Everything that can wait or
//! fail slowly happens first — privilege checks, the table's and the
//! sequence's locks (which `nextval` would otherwise take inside), the
//! xid, the catalog entries `nextval` reads, room in the latch table —
//! and escalation and back-pressure happen after.  Inside remain the
//! sequence page update and one latch publication.

use crate::args::Regclass;
use crate::errors;
use crate::gapless::sequence::{self, check_sequence_cache};
use crate::keys::KeyWriter;
use crate::pg::acl;
use crate::pg::{rel_name, OpenRel};
use crate::registry;
use crate::shmem::drawn;
use crate::shmem::{backend, table};
use pgkvx_latch::{Span, Stat};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

/// Raises 42501 unless the current user may write a key into `relid`
/// (INSERT a row, or UPDATE one's key).
fn require_write_privilege(relid: Oid) {
    if !acl::may_any_column(relid, pg_sys::ACL_INSERT | pg_sys::ACL_UPDATE) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "permission denied to draw a key of table \"{}\": needs INSERT or UPDATE privilege",
                rel_name(relid)
            ),
        );
    }
}

#[pg_extern(volatile, parallel_unsafe, strict, schema = "pgkvx")]
fn next_key(rel: Regclass) -> i64 {
    let relid = rel.0;
    // Drawing a key latches it: it takes the right to write a key into
    // the table (INSERT a row, or UPDATE one's key), checked before any
    // lock or latch.
    require_write_privilege(relid);
    // SAFETY: plain read of a backend global.
    if unsafe { pg_sys::XactReadOnly } {
        errors::raise(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "cannot execute pgkvx.next_key() in a read-only transaction",
        );
    }
    // Writers hold ROW EXCLUSIVE already; a bare call takes it too, so the
    // table cannot be disabled or dropped under the draw.
    // SAFETY: standard lock acquisition; raises on a missing relation.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
    let mut latched = registry::require(relid);
    // A partition draws from its latched parent: one sequence and one draw
    // lock for the whole tree.
    let relid = if latched.root != relid {
        let root = latched.root;
        // The keys drawn are the parent's: so is the right to draw them.
        require_write_privilege(root);
        // SAFETY: as above.
        unsafe { pg_sys::LockRelationOid(root, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
        latched = registry::require(root);
        root
    } else {
        relid
    };
    let (seq, identity) = sequence::drawn_sequence(relid, &latched.key);
    // An identity sequence is the table's own: writing the table is the
    // right to draw from it, as for Postgres's own identity default.
    if !identity && !acl::may(seq, pg_sys::ACL_USAGE | pg_sys::ACL_UPDATE) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for sequence {}", rel_name(seq)),
        );
    }
    // nextval's own lock and relcache entry, taken now: inside the section
    // it finds the lock held and the entry built, and waits for neither.
    let _seq = OpenRel::open(seq, pg_sys::RowExclusiveLock);
    // Its pg_sequence entry, read under that lock, is also the one nextval
    // reads: the check leaves it in the catalog cache.
    check_sequence_cache(seq);
    let h = backend::holder(latched.owner);
    backend::make_room();
    // Invalidations that arrived meanwhile are processed here, outside the
    // section: inside it nextval finds its lock already held and cleared,
    // and no relcache or catalog rebuild (which could wait on a
    // heavyweight lock) happens under the draw lock.
    // SAFETY: processes pending shared invalidation messages.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let t = table().writer();
    let rel_id = backend::rel_id(relid);
    let (value, key, published) = {
        let _draws = t.lock_draws(rel_id, latched.owner.to_u32()).unwrap_or_else(|e| backend::raise_acquire_error(e));
        // SAFETY: nextval without its own permission check (done above);
        // errors unwind through the guard, which releases the draw lock.
        let value = unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| crate::pg::raw::nextval_internal(seq, false)) };
        let mut key = KeyWriter::new();
        // SAFETY: an int8 datum for the (integer) key column.
        unsafe { latched.key.encode_datum(0, pg_sys::Datum::from(value), &mut key) };
        let published = backend::latch_in_draw(relid, &Span::point(key.bytes()), &h);
        (value, key, published)
    };
    backend::log_draw(&h);
    // A failed publication raises only now, outside the section; the value
    // it drew is never written, so it leaves no hole.
    let published = published.unwrap_or_else(|e| backend::raise_acquire_error(e));
    drawn::record(relid, value);
    backend::remember_latched(h.xid, relid, key);
    backend::after_draw(relid, &Span::point(key.bytes()), &h, published);
    backend::count(Stat::KeysDrawn, 1);
    value
}
