//! The latch triggers `enable` installs.  They run before the row changes,
//! with the transaction's xid assigned, so a reader that misses the row
//! always finds the latch.  Being row triggers they cover every path that
//! changes rows: INSERT (and ON CONFLICT), UPDATE, DELETE, MERGE, COPY and
//! cascaded foreign-key actions.  TRUNCATE latches the whole table.
//!
//! They are plain C-ABI functions rather than `#[pg_trigger]`s: every write
//! to a latched table runs one, so they skip the wrapper's conversions.
//!
//! On a gapless table a new key (an INSERT, or an UPDATE that changes the
//! key) must have been drawn by `pgkvx.next_key` in this transaction: its
//! latch then exists since the draw.  Any other key is refused, except in
//! `session_replication_role = replica` (logical replication apply), whose
//! keys come from elsewhere — `pgkvx.check()` reports tables written so.

use crate::errors;
use crate::keys::KeyWriter;
use crate::pg::{quote_literal, regclass_text};
use crate::registry::{self, Latched};
use crate::shmem::backend;
use crate::shmem::drawn;
use pgkvx_latch::{Span, Xid};
use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    /// A row of a latched partitioned table being moved to another
    /// partition by an UPDATE, which PostgreSQL runs as the UPDATE's BEFORE
    /// ROW trigger, then a DELETE from the old partition and an INSERT into
    /// the new one, in one command.  The INSERT writes the key the UPDATE
    /// already latched (and, on a gapless table, took as drawn).
    static MOVING_ROW: Cell<Option<MovingRow>> = const { Cell::new(None) };
}

/// See `MOVING_ROW`.
#[derive(Clone, Copy)]
struct MovingRow {
    xid: Xid,
    cid: pg_sys::CommandId,
    root: pg_sys::Oid,
    old: KeyWriter,
    new: KeyWriter,
    /// The DELETE half ran.
    deleted: bool,
}

fn latch_key(latched: &Latched, key: &KeyWriter) {
    // A partition latches under its latched parent.
    let relid = latched.root;
    let xid = backend::my_xid();
    if backend::latched_last(xid, relid, key) {
        return;
    }
    backend::latch(relid, latched.owner, &Span::point(key.bytes()));
    backend::remember_latched(xid, relid, *key);
}

fn replica_role() -> bool {
    // SAFETY: plain read of a backend global.
    unsafe { pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 }
}

/// A new key for a row of gapless table `latched`: it must be one this
/// transaction drew (and so latched) with `next_key`.
///
/// # Safety
/// `tup` is a tuple of the table, `tupdesc` its descriptor.
unsafe fn take_drawn_key(latched: &Latched, tup: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc) -> bool {
    let col = &latched.key.cols[0];
    let mut isnull = false;
    // SAFETY: the caller passes a tuple of the table and its own descriptor, so heap_getattr can read
    // attribute `col.attnum`; the gapless key is one integer column, taken by value (0 when NULL).
    let d = unsafe { pg_sys::heap_getattr(tup, i32::from(col.attnum), tupdesc, &mut isnull) };
    let key = match col.typid {
        pg_sys::INT2OID => i64::from(d.value() as i16),
        pg_sys::INT4OID => i64::from(d.value() as i32),
        _ => d.value() as i64,
    };
    if isnull || drawn::take(latched.root, key) {
        return true; // NULL is refused by the codec with its own error
    }
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_GENERATED_ALWAYS,
        format!("cannot write key {key} into gapless table \"{}\"", latched.key.relname),
        Some(format!(
            "Keys of a gapless table must be drawn by pgkvx.next_key({}) in the writing transaction; a key drawn any other way could commit behind a consumer's cursor.",
            quote_literal(&regclass_text(latched.root))
        )),
        Some("Leave the key column to its DEFAULT, or draw the key with pgkvx.next_key() in the same transaction."),
    )
}

/// How a trigger function of ours must be fired.  Fired any other way it
/// would do the wrong thing quietly: a statement trigger's function returns
/// NULL, which a row trigger takes as "skip this row".
#[derive(Clone, Copy)]
enum Firing {
    /// BEFORE INSERT, UPDATE or DELETE, FOR EACH ROW.
    RowBefore,
    /// BEFORE TRUNCATE (always FOR EACH STATEMENT).
    TruncateBefore,
}

impl Firing {
    fn matches(self, event: u32) -> bool {
        let before = event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE;
        let row = event & pg_sys::TRIGGER_EVENT_ROW != 0;
        let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
        match self {
            Firing::RowBefore => {
                before
                    && row
                    && matches!(
                        op,
                        pg_sys::TRIGGER_EVENT_INSERT | pg_sys::TRIGGER_EVENT_UPDATE | pg_sys::TRIGGER_EVENT_DELETE
                    )
            }
            Firing::TruncateBefore => before && !row && op == pg_sys::TRIGGER_EVENT_TRUNCATE,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Firing::RowBefore => "BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW",
            Firing::TruncateBefore => "BEFORE TRUNCATE ... FOR EACH STATEMENT",
        }
    }
}

/// The trigger data of a call of `what`, which must be fired as `firing`.
///
/// # Safety
/// Called by the function manager.
unsafe fn trigger_data(fcinfo: pg_sys::FunctionCallInfo, what: &str, firing: Firing) -> &'static pg_sys::TriggerData {
    // SAFETY: fcinfo is valid; context is checked to be TriggerData.
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_TriggerData {
            crate::errors::raise(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!("{what} must be called as a trigger"),
            );
        }
        let td = &*(ctx as *const pg_sys::TriggerData);
        // Without the preload nothing can be latched: one error, naming
        // the setting, for every write of a latched table.
        if !crate::shmem::preloaded() {
            crate::shmem::not_preloaded();
        }
        if !firing.matches(td.tg_event) {
            crate::errors::raise_hint(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!("{what} must be fired {}", firing.describe()),
                "pgkvx.enable() installs pgkvx's triggers; do not attach its trigger functions by hand.",
            );
        }
        td
    }
}

#[no_mangle]
pub extern "C" fn pg_finfo_pgkvx_latch_row() -> &'static pg_sys::Pg_finfo_record {
    static V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// BEFORE ROW trigger: latch the old key, the new key, or both.
///
/// # Safety
/// Called by the function manager as a BEFORE ROW trigger.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn pgkvx_latch_row(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: the trigger protocol: fields of TriggerData are valid for the
    // duration of the call; tuples belong to the relation being changed.
    unsafe {
        let td = trigger_data(fcinfo, "pgkvx.latch_row()", Firing::RowBefore);
        let event = td.tg_event;
        let rel = td.tg_relation;
        let relid = (*rel).rd_id;
        let latched = registry::require(relid);
        let tupdesc = (*rel).rd_att;
        let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
        let gapless = latched.gapless && !replica_role();
        let old = latched.key.encode_heap_tuple(td.tg_trigtuple, tupdesc);
        let moving = latched.root != relid;
        if op == pg_sys::TRIGGER_EVENT_INSERT {
            if moving && moved_here(&latched, &old) {
                // The row an UPDATE of this command latched, arriving in
                // its new partition: the same key, latched already.
                return Datum::from(td.tg_trigtuple);
            }
            if gapless {
                // Latched since it was drawn.
                take_drawn_key(&latched, td.tg_trigtuple, tupdesc);
                return Datum::from(td.tg_trigtuple);
            }
        }
        latch_key(&latched, &old);
        if op == pg_sys::TRIGGER_EVENT_DELETE && moving {
            moving_out(&latched, &old);
        }
        if op == pg_sys::TRIGGER_EVENT_UPDATE {
            let new = latched.key.encode_heap_tuple(td.tg_newtuple, tupdesc);
            if new.bytes() != old.bytes() {
                if gapless {
                    take_drawn_key(&latched, td.tg_newtuple, tupdesc);
                } else {
                    latch_key(&latched, &new);
                }
            }
            if moving {
                // The row may move to another partition (PostgreSQL decides
                // after this trigger): remember it for the INSERT there.
                // SAFETY: reads the current command id.
                let cid = pg_sys::GetCurrentCommandId(false);
                let row = MovingRow { xid: backend::my_xid(), cid, root: latched.root, old, new, deleted: false };
                MOVING_ROW.with(|m| m.set(Some(row)));
            }
            return Datum::from(td.tg_newtuple);
        }
        Datum::from(td.tg_trigtuple)
    }
}

/// The DELETE half of a row moving between partitions: the old key of the
/// UPDATE remembered last.
fn moving_out(latched: &Latched, key: &KeyWriter) {
    MOVING_ROW.with(|m| {
        if let Some(row) = m.get().filter(|r| !r.deleted) {
            // SAFETY: reads the current command id.
            let now = unsafe { pg_sys::GetCurrentCommandId(false) };
            if row.xid == backend::my_xid()
                && row.cid == now
                && row.root == latched.root
                && row.old.bytes() == key.bytes()
            {
                m.set(Some(MovingRow { deleted: true, ..row }));
                return;
            }
        }
        m.set(None);
    });
}

/// Whether an INSERT of `key` is the INSERT half of a row moving between
/// partitions of `latched`'s root: the new key of the UPDATE whose DELETE
/// half just ran, in the same command of the same transaction.  That key
/// is latched by this transaction already (drawn, or latched by the
/// UPDATE), so the row is written under its latch.
fn moved_here(latched: &Latched, key: &KeyWriter) -> bool {
    MOVING_ROW.with(|m| {
        let Some(row) = m.take().filter(|r| r.deleted) else { return false };
        // SAFETY: reads the current command id.
        let now = unsafe { pg_sys::GetCurrentCommandId(false) };
        row.xid == backend::my_xid() && row.cid == now && row.root == latched.root && row.new.bytes() == key.bytes()
    })
}

#[no_mangle]
pub extern "C" fn pg_finfo_pgkvx_latch_truncate() -> &'static pg_sys::Pg_finfo_record {
    static V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// BEFORE TRUNCATE trigger: latch the whole table.
///
/// # Safety
/// Called by the function manager as a statement trigger.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn pgkvx_latch_truncate(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: as above.
    unsafe {
        let td = trigger_data(fcinfo, "pgkvx.latch_truncate()", Firing::TruncateBefore);
        let relid = (*td.tg_relation).rd_id;
        // A table detached from a latched partitioned table keeps this
        // trigger (it is its own, not a clone): it is not latched now.
        let Some(latched) = registry::lookup(relid) else { return Datum::from(0) };
        // A partition's TRUNCATE latches all of its latched parent's key
        // space: its rows may have any key.
        backend::latch(latched.root, latched.owner, &Span::ALL);
        Datum::from(0)
    }
}

extension_sql!(
    r#"
CREATE FUNCTION pgkvx.latch_row() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'pgkvx_latch_row';
COMMENT ON FUNCTION pgkvx.latch_row() IS 'pgkvx row latch trigger (installed by pgkvx.enable)';
CREATE FUNCTION pgkvx.latch_truncate() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'pgkvx_latch_truncate';
COMMENT ON FUNCTION pgkvx.latch_truncate() IS 'pgkvx TRUNCATE latch trigger (installed by pgkvx.enable)';
"#,
    name = "latch_triggers",
    requires = ["catalog"],
);
