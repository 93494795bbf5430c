//! This backend's part in the latch table: its slot, publishing latches for
//! its transaction, and releasing them when the transaction ends.
//!
//! Release points, and why each is right:
//! - `XACT_EVENT_COMMIT`: runs after `ProcArrayEndTransaction`, so the commit
//!   is already visible to new snapshots when latches become tombstones;
//! - `XACT_EVENT_ABORT`: an aborted writer's rows are never visible, its
//!   latches go at once;
//! - `XACT_EVENT_PRE_PREPARE`: refused while latches are held (a prepared
//!   transaction outlives this backend, its latches could not follow it);
//! - `before_shmem_exit`: a backend leaving for any reason (FATAL,
//!   `pg_terminate_backend`) drops whatever is left.
//!
//! A crashed backend takes the postmaster through crash recovery, which
//! re-creates shared memory empty.
//!
//! Subtransaction aborts keep their latches until the top-level transaction
//! ends: the holder is the top-level xid, and a latch held a little longer
//! only costs a reader an extra wait, never a missed row.

use super::table;
use crate::errors;
use crate::latch::{AcquireError, Holder, Outcome, RelId, Span, Stat, Xid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

thread_local! {
    static EXIT_HOOK_SET: Cell<bool> = const { Cell::new(false) };
    static LAST_HORIZON_REFRESH: Cell<i64> = const { Cell::new(0) };
    /// Tables whose latches to purge once the current transaction commits.
    static PENDING_PURGE: std::cell::RefCell<Vec<RelId>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// This backend's slot: its PGPROC number.
pub fn my_slot() -> u32 {
    slot_in(table()).expect("this backend's PGPROC number is beyond the latch table's backend slots")
}

/// This process's backend slot in `t`: its PGPROC number, if it has a
/// PGPROC and the number fits.  Panic-free (see `xact_callback`).
fn slot_in(t: &super::Table) -> Option<u32> {
    // SAFETY: plain read of a backend global; checked for NULL.
    let n = unsafe { pg_sys::MyProc.as_ref() }?.pgprocno;
    u32::try_from(n).ok().filter(|&n| n < t.config().max_backends)
}

pub fn my_db() -> u32 {
    // SAFETY: plain read of a backend global.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

pub fn rel_id(relid: pg_sys::Oid) -> RelId {
    RelId::new(my_db(), relid.to_u32())
}

/// Counts into this backend's statistics.
pub fn count(stat: Stat, n: u64) {
    table().count(my_slot(), stat, n);
}

/// Installs the transaction callbacks; called from `_PG_init`.
pub fn init() {
    // SAFETY: registering process-wide callbacks during preload.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
    }
}

fn ensure_exit_hook() {
    if EXIT_HOOK_SET.with(|c| c.replace(true)) {
        return;
    }
    // SAFETY: registering a callback for this backend's exit.
    unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    let t = table();
    let slot = my_slot();
    if t.holds_any(slot) {
        t.release_all(slot, Outcome::Aborted);
    }
}

/// Refreshes the cached xmin horizon at most every few milliseconds per
/// backend: tombstones older than it can go.
pub fn refresh_horizon(force: bool) {
    // SAFETY: reading the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    if !force && now - LAST_HORIZON_REFRESH.with(|c| c.get()) < 5_000 {
        return;
    }
    LAST_HORIZON_REFRESH.with(|c| c.set(now));
    // SAFETY: computes the cluster-wide horizon under ProcArrayLock; with
    // NULL it covers every database, as tombstones must.
    let h = unsafe { pg_sys::GetOldestNonRemovableTransactionId(std::ptr::null_mut()) };
    table().set_horizon(Xid(h.into_inner()));
}

/// Runs at every transaction event of every backend, whether or not it
/// touched a latched table, so it answers "nothing to do" — the common case
/// — before setting up pgrx's error guard (half a percent of a pgbench
/// backend's CPU).  Nothing on this path can panic or raise.
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    let work = match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            holds_latches() || purge_pending()
        }
        XACT_EVENT_PRE_PREPARE => holds_latches(),
        _ => false,
    };
    if work {
        // SAFETY: the guarded callback under its own signature.
        unsafe { xact_event(event, arg) };
    }
}

/// Whether this backend holds latches; false where there is no latch table
/// or no backend slot.  Panic-free (see `xact_callback`).
fn holds_latches() -> bool {
    let Some(t) = super::table_if_attached() else { return false };
    slot_in(t).is_some_and(|slot| t.holds_any(slot))
}

/// Whether a purge waits for this transaction's end.  Panic-free.
fn purge_pending() -> bool {
    PENDING_PURGE.try_with(|p| p.try_borrow().map_or(true, |v| !v.is_empty())).unwrap_or(false)
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    let Some(t) = super::table_if_attached() else { return };
    let slot = my_slot();
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => {
            if t.holds_any(slot) {
                t.release_all(slot, Outcome::Committed);
                refresh_horizon(false);
            }
            for rel in PENDING_PURGE.with(|p| std::mem::take(&mut *p.borrow_mut())) {
                t.purge_table(rel);
            }
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            if t.holds_any(slot) {
                t.release_all(slot, Outcome::Aborted);
            }
            PENDING_PURGE.with(|p| p.borrow_mut().clear());
        }
        XACT_EVENT_PRE_PREPARE if t.holds_any(slot) => {
            errors::raise_hint(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "cannot PREPARE a transaction that holds pgkvx latches",
                "Latches belong to the session that wrote; commit or roll back instead of preparing.",
            );
        }
        _ => {}
    }
}

/// Forgets a table's latches once this transaction commits.
pub fn purge_at_commit(rel: RelId) {
    PENDING_PURGE.with(|p| p.borrow_mut().push(rel));
}

/// This transaction's top-level xid, assigned now if it has none: a latch
/// is published only with its holder's xid in place.
pub fn my_xid() -> Xid {
    // SAFETY: assigns an xid if needed; errors are proper Postgres errors.
    Xid(unsafe { pg_sys::GetTopTransactionId() }.into_inner())
}

/// The xid this transaction has, if any (no assignment).
pub fn my_xid_if_any() -> Xid {
    // SAFETY: plain read.
    Xid(unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner())
}

/// How far over `pgkvx.range_max_latches` a range may grow before writers
/// wait for the maintenance workers to split it.
const BACK_PRESSURE_FACTOR: u32 = 4;
/// The longest a writer waits for a split, in 1 ms steps.
const BACK_PRESSURE_MAX_MS: u32 = 50;

/// Back-pressure: a writer that just latched into a range far over its
/// limit gives the maintenance workers a few milliseconds to split it
/// (sleeping on its latch, so interrupts and shutdown are honoured), and
/// goes on regardless after that.  Without workers there is nobody to wait
/// for.
fn back_off_if_crowded(rel: RelId, span: &Span, load: u32) {
    let t = table();
    let limit = t.range_max_latches().saturating_mul(BACK_PRESSURE_FACTOR);
    if load <= limit || crate::guc::MAINTENANCE_CONCURRENCY.get() == 0 {
        return;
    }
    for _ in 0..BACK_PRESSURE_MAX_MS {
        // SAFETY: waiting on our own latch with a timeout, like pg_sleep.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                1,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pg_sys::check_for_interrupts!();
        if t.max_load(rel, span) <= limit {
            return;
        }
    }
}

/// Publishes a write latch on `span` of `relid` for this transaction.  A
/// full table first reclaims and coalesces tombstones; only if that frees
/// nothing does the writer get SQLSTATE 53400.
pub fn latch(relid: pg_sys::Oid, span: &Span) {
    let t = table();
    let slot = my_slot();
    ensure_exit_hook();
    let h = Holder {
        xid: my_xid(),
        // SAFETY: plain reads of backend globals.
        pid: unsafe { pg_sys::MyProcPid },
        now_us: unsafe { pg_sys::GetCurrentTimestamp() },
    };
    let rel = rel_id(relid);
    let mut result = t.acquire(slot, rel, span, &h);
    if result == Err(AcquireError::Full) {
        refresh_horizon(true);
        t.relieve_pressure(slot);
        result = t.acquire(slot, rel, span, &h);
    }
    match result {
        Ok(load) => back_off_if_crowded(rel, span, load),
        Err(AcquireError::Full) => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("pgkvx latch table is full (pgkvx.max_latches = {})", t.config().max_entries),
            "Raise pgkvx.max_latches (takes a restart), or end the long-running transactions that keep released latches from being reclaimed.",
        ),
        Err(AcquireError::TooManyTables) => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("pgkvx latches more tables than pgkvx.max_tables = {}", t.config().max_tables),
            "Raise pgkvx.max_tables (takes a restart).",
        ),
        Err(AcquireError::TooManyRanges) => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("pgkvx has no free latch range (pgkvx.max_ranges = {})", t.config().max_ranges),
            "Raise pgkvx.max_ranges (takes a restart).",
        ),
    }
}
