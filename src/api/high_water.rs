//! `pgkvx.high_water(rel)`: where a consumer that starts at the end of a
//! stream begins.
//!
//! `max(k)` is no safe start: a row below it may still be in flight (drawn
//! earlier, committing later), and a consumer starting past it skips it
//! for ever.  The high water is the greatest committed key below every
//! latch of a writer in flight, read from the latch table without
//! waiting: every row at or below it that will ever commit has committed.
//!
//! Why no row is missed, in order: a fresh snapshot S first, then the
//! latches judged against S (tombstones of writers in flight at S
//! included: S holds them back), then the keys visible at S below the
//! lowest of them.  A row invisible at S was written by a transaction in
//! flight at S -- its latch, published when its key was drawn (before any
//! later key's row could commit), is among those judged -- or by one that
//! drew its key after S, and gapless draws are increasing: that key is
//! past every key visible at S.  Keys that bypass the draw (hand-drawn
//! `nextval`, explicit ids) are `pgkvx.check()`'s to report.

use super::cursor::{scan_keys, After};
use crate::args::Regclass;
use crate::errors;
use crate::keys::KeyDesc;
use crate::pg::acl::Visibility;
use crate::pg::index_scan::scan_at;
use crate::pg::{rel_name, OpenRel};
use crate::read::snapshot::{self, BaseSnapshot};
use crate::registry::{self, Latched};
use crate::shmem::table;
use pgkvx_latch::{KeyBuf, Span};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

/// The greatest committed key of `rel` below every latch of a writer in
/// flight, as text (a row literal for a key of several columns); NULL when
/// there is none.
#[pg_extern(volatile, parallel_restricted, schema = "pgkvx")]
fn high_water(rel: Regclass) -> Option<String> {
    let relid = rel.0;
    let Visibility { latches, keys } = registry::visibility(relid);
    if !latches || !keys {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", rel_name(relid)),
            "pgkvx.high_water shows a key: it needs SELECT on every row of the key (no row level security applying to you).",
        );
    }
    // Resolved once, without waiting for a lock; handed down.
    let table = match registry::Table::nowait(relid) {
        Ok(t) => t,
        Err(u) if u.locked => locked(relid),
        Err(_) => registry::not_latched(relid),
    };
    let mut base = BaseSnapshot::fresh();
    let lowest = lowest_in_flight(&table, &base);
    let found = greatest_below(relid, &table.latched, base.snap, lowest.as_ref());
    base.release();
    found.map(|(_, text)| text)
}

/// Monitoring never waits for a table lock.
fn locked(relid: Oid) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!("table {} is locked: its keys cannot be read now", rel_name(relid)),
    )
}

/// The lowest key latched by a writer in flight at `base` (its own
/// transaction's latches aside), None when there is none.
fn lowest_in_flight(of: &registry::Table, base: &BaseSnapshot) -> Option<KeyBuf> {
    let view = base.view();
    let mut lowest: Option<KeyBuf> = None;
    table().reader().check_footprint(&[(of.latch_id, Span::ALL)], &view, &snapshot::committed, &mut |c| {
        if lowest.is_none_or(|l| c.at.start < l) {
            lowest = Some(c.at.start);
        }
    });
    lowest
}

/// The greatest key visible at `snap` below `below` (anywhere without it)
/// in `relid` -- in each leaf of a partitioned table -- with its text.
fn greatest_below(
    relid: Oid,
    latched: &Latched,
    snap: pg_sys::Snapshot,
    below: Option<&KeyBuf>,
) -> Option<(KeyBuf, String)> {
    let heap = OpenRel::try_open_nowait(relid, pg_sys::AccessShareLock).unwrap_or_else(|| locked(relid));
    if heap.relkind() == pg_sys::RELKIND_PARTITIONED_TABLE {
        drop(heap);
        let mut best: Option<(KeyBuf, String)> = None;
        for m in registry::partitions::members(relid) {
            // SAFETY: a syscache probe.
            if unsafe { pg_sys::get_rel_relkind(m) as u8 } != pg_sys::RELKIND_RELATION {
                continue;
            }
            let Some(leaf) = registry::lookup_nowait(m).unwrap_or_else(|| locked(m)) else { continue };
            if leaf.key.index == pg_sys::InvalidOid {
                continue;
            }
            if let Some(found) = greatest_below(m, &leaf, snap, below) {
                if best.as_ref().is_none_or(|(b, _)| found.0 > *b) {
                    best = Some(found);
                }
            }
        }
        return best;
    }
    let key = &latched.key;
    let index = OpenRel::try_open_nowait(key.index, pg_sys::AccessShareLock).unwrap_or_else(|| locked(relid));
    // From the lowest latch down; a latch whose key cannot be written as
    // scan keys (truncated) starts the scan at the end, rows being checked
    // by their encoding anyway.
    let from = below.and_then(|b| {
        key.key_fields(b.as_bytes()).map(|fields| After { fields, bytes: b.as_bytes().to_vec(), truncated: false })
    });
    let (mut keys, _members, _) = scan_keys(key, &index, from.as_ref(), false, true);
    let mut found = None;
    // SAFETY: `snap` is the caller's registered snapshot.
    unsafe {
        scan_at(snap, &heap, &index, &mut keys, pg_sys::ScanDirection::BackwardScanDirection, |slot| {
            // A row whose key holds a NULL (a unique key index's column
            // whose NOT NULL was dropped after enable) is no key a consumer
            // can stand at; a backward scan meets such rows first.
            let Some(text) = key_text(key, slot) else { return true };
            let k = key.encode_slot(slot);
            let at = KeyBuf::floor(k.bytes());
            if below.is_some_and(|b| at >= *b) {
                return true;
            }
            found = Some((at, text));
            false
        });
    }
    found
}

/// The key of the row in `slot` as text: the column's own output, or a
/// row literal of every key column; None when a key column is NULL.
///
/// # Safety
/// `slot` holds a row of the keyed table.
unsafe fn key_text(key: &KeyDesc, slot: *mut pg_sys::TupleTableSlot) -> Option<String> {
    let fields: Option<Vec<String>> = key
        .cols
        .iter()
        .map(|c| {
            let mut isnull = false;
            // SAFETY: the caller's slot holds a row of the keyed table, so attribute `c.attnum` is key
            // column `c`: `d`, when not NULL, is a value of `c.typid`, which the type's own output
            // function turns into a palloc'd C string, freed after the copy.
            unsafe {
                let d = pg_sys::slot_getattr(slot, i32::from(c.attnum), &mut isnull);
                if isnull {
                    return None;
                }
                let (mut out, mut varlena) = (pg_sys::InvalidOid, false);
                pg_sys::getTypeOutputInfo(c.typid, &mut out, &mut varlena);
                let p = pg_sys::OidOutputFunctionCall(out, d);
                let s = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
                pg_sys::pfree(p.cast());
                Some(s)
            }
        })
        .collect();
    let fields = fields?;
    if fields.len() == 1 {
        return fields.into_iter().next();
    }
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if !f.is_empty() && !f.chars().any(|ch| matches!(ch, '(' | ')' | ',' | '"' | '\\') || ch.is_whitespace()) {
                f.clone()
            } else {
                format!("\"{}\"", f.replace('\\', "\\\\").replace('"', "\\\""))
            }
        })
        .collect();
    Some(format!("({})", quoted.join(",")))
}
