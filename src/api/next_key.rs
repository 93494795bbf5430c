//! `pgkvx.next_key(rel)`: gapless key allocation.
//!
//! A sequence hands out a value before the row's latch exists, so a reader
//! can see key 11 committed while key 10 is drawn but not yet latched — and
//! move past 10 for ever.  No read-side cleverness closes that window: it
//! must close where keys are drawn.  `next_key` draws the value and publishes
//! the caller's write latch on it inside one critical section per table, so
//! when any later key is drawn, every earlier drawn key is already latched
//! (and its latch precedes the later one in publication order).

use super::enable::{check_sequence_cache, gapless_sequence};
use super::regclass::Regclass;
use super::{registry, trigger};
use crate::latch::{Span, Stat};
use crate::shmem::{backend, table};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;

unsafe extern "C-unwind" {
    // commands/sequence.h; not in pgrx's bindings.  Called only through
    // the FFI boundary guard below.
    fn nextval_internal(relid: Oid, check_permissions: bool) -> i64;
}

thread_local! {
    /// Key sequence per table (the relcache callback does not reach this,
    /// so entries are re-checked against the registry on each call).
    static SEQS: RefCell<HashMap<Oid, Oid>> = RefCell::new(HashMap::new());
}

#[pg_extern(volatile, parallel_unsafe)]
fn next_key(rel: Regclass) -> i64 {
    let relid = rel.0;
    // Writers hold ROW EXCLUSIVE already; a bare call takes it too, so the
    // table cannot be disabled or dropped under the draw.
    // SAFETY: standard lock acquisition; raises on a missing relation.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
    let latched = registry::require(relid);
    let seq = match SEQS.with(|s| s.borrow().get(&relid).copied()) {
        Some(seq) => seq,
        None => {
            let seq = gapless_sequence(&latched.key);
            SEQS.with(|s| s.borrow_mut().insert(relid, seq));
            seq
        }
    };
    check_sequence_cache(seq);
    let t = table();
    let rel_id = backend::rel_id(relid);
    let (value, key, xid) = {
        let _draws = t.lock_draws(rel_id).unwrap_or_else(|_| {
            crate::errors::raise(
                PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                "pgkvx cannot register another latched table (pgkvx.max_tables / pgkvx.max_ranges)",
            )
        });
        // Assigning the xid inside the section makes xid order follow draw
        // order for transactions that start by drawing a key.
        let xid = backend::my_xid();
        // SAFETY: nextval with permission checks; errors unwind through the
        // guard, which releases the draw lock.
        let value = unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| nextval_internal(seq, true)) };
        let mut key = crate::keys::KeyWriter::new();
        // SAFETY: an int8 datum for the (integer) key column.
        unsafe { latched.key.encode_datum(0, pg_sys::Datum::from(value), &mut key) };
        backend::latch(relid, &Span::point(key.bytes()));
        (value, key, xid)
    };
    trigger::remember(xid, relid, key);
    backend::count(Stat::KeysDrawn, 1);
    value
}
