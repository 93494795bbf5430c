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
//! - `SUBXACT_EVENT_ABORT_SUB`: runs after the subtransaction's abort is
//!   recorded (its rows are dead to every snapshot), so the latches it
//!   published — for writes that never happened, such as a row refused by
//!   a row-level security `WITH CHECK` policy after the BEFORE ROW trigger
//!   latched it — go at once, as at a top-level abort.  What stays, held
//!   to the end of the top-level transaction: the parent's latches (also
//!   on keys the subtransaction latched again), escalated spans that also
//!   stand for the parent's writes, and the latches of keys drawn with
//!   `next_key` (a drawn key may still be written after the rollback; the
//!   draw published its latch for the transaction, not the
//!   subtransaction).  A reader already waiting for the holder waits on
//!   its top-level xid and so waits on until the transaction ends: an
//!   extra wait, never a missed row.  What a subtransaction asked to
//!   happen at commit (purging a disabled or dropped table's tombstones)
//!   is forgotten when it rolls back.

use super::table;
use crate::errors;
use crate::guc;
use crate::keys::KeyWriter;
use crate::standby::End;
use pgkvx_latch::holdings::TOP_SUBXACT;
use pgkvx_latch::{AcquireError, Holder, Holdings, Latched, Limits, RelId, Span, Stat, TxEnd, Xid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};

thread_local! {
    static EXIT_HOOK_SET: Cell<bool> = const { Cell::new(false) };
    static LAST_HORIZON_REFRESH: Cell<i64> = const { Cell::new(0) };
    /// Tables whose latches to purge once the current transaction commits,
    /// with the subtransaction that asked.
    static PENDING_PURGE: RefCell<Vec<(pg_sys::SubTransactionId, RelId)>> = const { RefCell::new(Vec::new()) };
    /// The latches this backend's transaction holds.
    static HOLDINGS: RefCell<Holdings> = RefCell::new(Holdings::new());
}

/// This backend's slot: its PGPROC number.
pub fn my_slot() -> u32 {
    slot_in(table()).expect("this backend's PGPROC number is beyond the latch table's backend slots")
}

/// This process's backend slot in `t`: its PGPROC number, if it has a
/// PGPROC and the number fits.  Panic-free (see `xact_callback`).
fn slot_in(t: &super::SharedLatchTable) -> Option<u32> {
    let n = crate::pg::my_proc_number()?;
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
    table().writer().count(my_slot(), stat, n);
}

/// Installs the transaction callbacks; called from `_PG_init`.
pub fn init() {
    // SAFETY: registering process-wide callbacks during preload.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
    }
}

/// Subtransaction ends: what a rolled-back subtransaction asked for at
/// commit is forgotten; a committed one's passes to its parent.  Runs for
/// every subtransaction of every backend, so it answers "nothing to do"
/// before pgrx's guard.
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    if !matches!(event, SUBXACT_EVENT_ABORT_SUB | SUBXACT_EVENT_COMMIT_SUB) {
        return;
    }
    let busy =
        purge_pending() || super::drawn::pending() || (event == SUBXACT_EVENT_ABORT_SUB && holdings_from_subxact(my));
    if busy {
        // SAFETY: the guarded callback under its own signature.
        unsafe { subxact_event(event, my, parent, arg) };
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    let aborted = event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB;
    if aborted {
        release_subxact(my);
    }
    PENDING_PURGE.with(|p| {
        let mut p = p.borrow_mut();
        if aborted {
            p.retain(|(sub, _)| *sub != my);
        } else {
            for e in p.iter_mut().filter(|(sub, _)| *sub == my) {
                e.0 = parent;
            }
        }
    });
    super::drawn::subxact_end(my, parent, aborted);
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
    let t = table().writer();
    let slot = my_slot();
    if t.holds_any(slot) {
        t.release_all(slot, TxEnd::Aborted);
        wake_maintenance();
    }
    forget_holdings();
    forget_draw_ticket();
}

fn forget_holdings() {
    HOLDINGS.with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            h.clear();
        }
    });
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
    let h = running_horizon();
    table().maintainer().set_horizon(h);
    // On a hot standby: the fog lifts once every transaction below it has
    // ended -- known only once the standby tracks them all, which it does
    // once it admits queries (maintenance workers run before, and redo
    // refreshes the horizon at every replayed end).
    if crate::pg::recovery::hot_standby_active() {
        table().lift_fog_passed(h);
    }
}

/// The oldest xid a running snapshot may still consider in progress: the
/// oldest xid or snapshot xmin of any backend or prepared transaction, in
/// every database.  Unlike Postgres's removal horizon it leaves out what
/// replication slots retain (an idle slot would otherwise keep every
/// tombstone for ever) and the catalog-only xmins of logical decoding and
/// of VACUUM: none of them reads latched tables with a snapshot of ours.
pub fn running_horizon() -> Xid {
    // SAFETY: reads the proc array under ProcArrayLock (shared), as
    // Postgres's own horizon computation does.  Index 4 of the main LWLock
    // array is ProcArrayLock (lwlocknames.txt).
    unsafe {
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(4)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_SHARED);
        let mut h = Xid(crate::pg::latest_completed_xid().wrapping_add(1));
        if !h.is_valid() {
            h = Xid(Xid::FIRST_NORMAL);
        }
        let procs = &*pg_sys::ProcGlobal;
        for i in 0..procs.allProcCount as usize {
            let p = &*procs.allProcs.add(i);
            let xid = Xid(std::ptr::read_volatile(&p.xid).into_inner());
            if xid.is_valid() {
                h = h.min(xid);
            }
            let flags = u32::from(std::ptr::read_volatile(&p.statusFlags));
            if flags & (pg_sys::PROC_IN_LOGICAL_DECODING | pg_sys::PROC_IN_VACUUM) == 0 {
                let xmin = Xid(std::ptr::read_volatile(&p.xmin).into_inner());
                if xmin.is_valid() {
                    h = h.min(xmin);
                }
            }
        }
        pg_sys::LWLockRelease(lock);
        if crate::pg::raw::RecoveryInProgress() {
            h = h.min(oldest_replayed_running());
        }
        h
    }
}

/// On a hot standby the primary's running transactions are in no PGPROC:
/// without the oldest of them a horizon taken before a replayed writer's
/// first latch could pass it, and its tombstone would go at its release
/// while a standby snapshot still has it in flight.  PostgreSQL's oldest
/// xid considered running includes them (KnownAssignedXids); any xid the
/// standby learns of later follows every xid it had seen, as on a primary
/// a later-assigned xid follows the horizon.
fn oldest_replayed_running() -> Xid {
    // SAFETY: takes ProcArrayLock (shared) itself; none of ours is held.
    let x = Xid(unsafe { pg_sys::GetOldestTransactionIdConsideredRunning() }.into_inner());
    if x.is_valid() {
        x
    } else {
        Xid(Xid::FIRST_NORMAL)
    }
}

/// Runs at every transaction event of every backend, whether or not it
/// touched a latched table, so it answers "nothing to do" — the common case
/// — before setting up pgrx's error guard (half a percent of a pgbench
/// backend's CPU).  Nothing on this path can panic or raise.
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    let work = match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            holds_latches()
                || purge_pending()
                || holdings_recorded()
                || super::drawn::pending()
                || crate::standby::log::logged()
                || drew_logged_keys()
        }
        XACT_EVENT_PRE_PREPARE => holds_latches(),
        XACT_EVENT_PREPARE => crate::standby::log::logged() || drew_logged_keys(),
        XACT_EVENT_PRE_COMMIT => drew_logged_keys(),
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
    slot_in(t).is_some_and(|slot| t.writer().holds_any(slot))
}

/// Whether a purge waits for this transaction's end.  Panic-free.
fn purge_pending() -> bool {
    PENDING_PURGE.try_with(|p| p.try_borrow().map_or(true, |v| !v.is_empty())).unwrap_or(false)
}

/// Whether latches published inside subtransaction `sub` (or a later one)
/// may be recorded.  Panic-free.
fn holdings_from_subxact(sub: u32) -> bool {
    HOLDINGS.try_with(|h| h.try_borrow().map_or(true, |h| h.may_hold_from(sub))).unwrap_or(false)
}

/// Subtransaction `sub` rolled back: the latches it published go (see the
/// module's head for what stays).
fn release_subxact(sub: u32) {
    let Some(t) = super::table_if_attached() else { return };
    let Some(slot) = slot_in(t) else { return };
    // Holdings are borrowed only inside latch publication, which never
    // calls back into Postgres; should they be busy all the same, keeping
    // the latches to the end of the transaction is the safe side.
    let released =
        HOLDINGS.with(|h| h.try_borrow_mut().map_or(0, |mut h| t.writer().release_subxact(slot, &mut h, sub)));
    if released > 0 {
        wake_maintenance();
        // The row trigger skips a key it latched last in this transaction;
        // that latch may just have gone, so the next write of the key must
        // latch it again.  An invalid xid matches no transaction.
        LAST_LATCHED_KEY.with(|l| l.set(None));
    }
}

thread_local! {
    /// The last key this backend latched: `next_key` latches a key and the
    /// row trigger then sees the same key in the same transaction.
    static LAST_LATCHED_KEY: Cell<Option<(Xid, pg_sys::Oid, KeyWriter)>> = const { Cell::new(None) };
}

/// Remembers a key just latched, so the row trigger that follows for the
/// same key need not latch it again.
pub fn remember_latched(xid: Xid, relid: pg_sys::Oid, key: KeyWriter) {
    LAST_LATCHED_KEY.with(|l| l.set(Some((xid, relid, key))));
}

/// Whether `key` of `relid` is the key transaction `xid` latched last.
pub fn latched_last(xid: Xid, relid: pg_sys::Oid, key: &KeyWriter) -> bool {
    LAST_LATCHED_KEY.with(|l| l.get()).is_some_and(|(x, r, k)| x == xid && r == relid && k.bytes() == key.bytes())
}

/// Whether holdings were recorded (they must go with the transaction).
fn holdings_recorded() -> bool {
    HOLDINGS.try_with(|h| h.try_borrow().map_or(true, |h| h.live() > 0)).unwrap_or(false)
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    super::wakeups::xact_end(event);
    match event {
        XACT_EVENT_PRE_COMMIT => {
            order_commit_after_earlier_draws();
            return;
        }
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => crate::standby::log::transaction_ended(End::Committed),
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => crate::standby::log::transaction_ended(End::Aborted),
        // Refused while latches are held (PRE_PREPARE), so a prepared
        // transaction holds none; a standby may still have those its
        // rolled-back savepoints released here.
        XACT_EVENT_PREPARE => {
            crate::standby::log::transaction_ended(End::Prepared);
            forget_draw_ticket();
            return;
        }
        _ => {}
    }
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT) {
        forget_draw_ticket();
    }
    let Some(t) = super::table_if_attached().map(|t| t.writer()) else { return };
    let slot = my_slot();
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => {
            if t.holds_any(slot) {
                t.release_all(slot, TxEnd::Committed);
                wake_maintenance();
                refresh_horizon(false);
            }
            forget_holdings();
            super::drawn::forget();
            for (_, rel) in PENDING_PURGE.with(|p| std::mem::take(&mut *p.borrow_mut())) {
                t.purge_table(slot, rel);
                wake_maintenance();
                // Its wait_for callers wake to find it gone.
                super::wakeups::table_gone(rel);
            }
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            if t.holds_any(slot) {
                t.release_all(slot, TxEnd::Aborted);
                wake_maintenance();
            }
            forget_holdings();
            super::drawn::forget();
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

/// Forgets a table's latches once this transaction commits (unless the
/// subtransaction asking rolls back).
pub fn purge_at_commit(rel: RelId) {
    // SAFETY: reads the current subtransaction's id.
    let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
    PENDING_PURGE.with(|p| p.borrow_mut().push((sub, rel)));
}

/// This transaction's top-level xid, assigned now if it has none: a latch
/// is published only with its holder's xid in place.
pub fn my_xid() -> Xid {
    // SAFETY: assigns an xid if needed; errors are proper Postgres errors.
    Xid(unsafe { pg_sys::GetTopTransactionId() }.into_inner())
}

/// The xid this transaction has, if any (no assignment).
pub fn my_xid_if_any() -> Xid {
    // SAFETY: plain read, which cannot raise.
    Xid(unsafe { crate::pg::raw::GetTopTransactionIdIfAny() }.into_inner())
}

/// How far over `pgkvx.range_max_latches` a range may grow before writers
/// wait for the maintenance workers to split it.
const BACK_PRESSURE_FACTOR: u32 = 4;
/// The longest a writer waits for a split, in 1 ms steps.
const BACK_PRESSURE_MAX_MS: u32 = 50;
/// A worker that has not ticked for this long is not running.
const WORKER_GONE_US: i64 = 1_000_000;

/// Back-pressure: a writer that just latched into a range far over its
/// limit gives the maintenance workers a few milliseconds to split it
/// (sleeping on its latch, so interrupts and shutdown are honoured, and
/// holding no lock), and goes on regardless after that.  It never waits
/// for workers that are not running, nor for load that is its own point
/// latches: a split does not thin one writer's latches, escalation does.
pub fn back_off_if_crowded(rel: RelId, span: &Span, load: u32) {
    let t = table().writer();
    let running = workers_running();
    if load > t.range_max_latches() {
        // The latch queued its range for a split.
        wake_maintenance();
    }
    let limit = t.range_max_latches().saturating_mul(BACK_PRESSURE_FACTOR);
    let own = HOLDINGS.with(|held| held.borrow().points_on(rel));
    let crowded = |load: u32| load.saturating_sub(own) > limit;
    if !crowded(load) || !running {
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
        if !crowded(t.max_load(rel, span)) || !workers_running() {
            return;
        }
    }
}

fn now_us() -> i64 {
    // SAFETY: reading the clock, which cannot raise.
    unsafe { crate::pg::raw::GetCurrentTimestamp() }
}

/// Whether a maintenance worker has ticked lately, or rests until woken.
pub fn workers_running() -> bool {
    let t = table().writer();
    guc::MAINTENANCE_CONCURRENCY.get() > 0 && (t.maintainer_resting() || now_us() - t.last_beat() < WORKER_GONE_US)
}

/// Wakes the maintenance launcher if it rests: called after this backend
/// made it work (released latches, crowded a range).  Costs a fence and a
/// load of a word that is nearly always 0.
pub fn wake_maintenance() {
    let Some(t) = super::table_if_attached() else { return };
    if let Some(latch) = t.writer().take_waker() {
        // SAFETY: the launcher published the address of its process latch
        // (`MyLatch`, its PGPROC's latch), which lives in shared memory at
        // the same address in every backend (all are forked from the
        // postmaster) for the server's life.  Should the launcher have
        // exited since, the latch belongs to whichever process took its
        // PGPROC, and a spurious SetLatch is something every latch user
        // tolerates.
        unsafe { pg_sys::SetLatch(latch as usize as *mut pg_sys::Latch) };
    }
}

/// Escalation thinned the ranges it withdrew latches from: they may merge.
fn wake_if_escalated() {
    if HOLDINGS.with(|held| held.borrow_mut().take_withdrawn()) {
        wake_maintenance();
    }
}

/// The waker a resting maintenance process publishes: its latch.
pub fn my_waker() -> u64 {
    // SAFETY: reads this process's latch pointer, set at its start.
    unsafe { pg_sys::MyLatch as usize as u64 }
}

/// The limits a transaction's latches are held to.  Escalation comes
/// early enough that one transaction never crowds a range past the
/// back-pressure limit on its own: its points are folded, not split.
pub fn limits() -> Limits {
    let per = guc::MAX_LATCHES_PER_TRANSACTION.get() as u32;
    let crowd = table().writer().range_max_latches().saturating_mul(BACK_PRESSURE_FACTOR) / 2;
    Limits {
        escalate_points: Limits::DEFAULT.escalate_points.min(per / 2).min(crowd).max(1),
        per_transaction: per,
        per_role: guc::MAX_LATCHES_PER_ROLE.get() as u32,
    }
}

/// Raises the error for a latch that could not be published.
pub fn raise_acquire_error(e: AcquireError) -> ! {
    let t = table();
    match e {
        AcquireError::Full => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("pgkvx latch table is full (pgkvx.max_latches = {})", t.config().max_entries),
            "Raise pgkvx.max_latches (takes a restart), or end the long-running transactions that keep released latches from being reclaimed.",
        ),
        AcquireError::TooManyTables => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("pgkvx latches more tables than pgkvx.max_tables = {}", t.config().max_tables),
            "Raise pgkvx.max_tables (takes a restart).",
        ),
        AcquireError::TooManyRanges => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("pgkvx has no free latch range (pgkvx.max_ranges = {})", t.config().max_ranges),
            "Raise pgkvx.max_ranges (takes a restart).",
        ),
        AcquireError::TooManyTablesForOwner => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "the owner of this table has {} tables in the latch table already (pgkvx.max_tables_per_owner)",
                guc::MAX_TABLES_PER_OWNER.get()
            ),
            "Ask an administrator to raise pgkvx.max_tables_per_owner, or let idle latched tables go (their slots free after a few seconds without writes).",
        ),
        AcquireError::TransactionBudget => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "transaction holds too many pgkvx latches (pgkvx.max_latches_per_transaction = {})",
                guc::MAX_LATCHES_PER_TRANSACTION.get()
            ),
            "Latch wide spans explicitly with pgkvx.latch_span(), or split the transaction.",
        ),
        AcquireError::RoleBudget => errors::raise_hint(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "the transactions of this role hold too many pgkvx latches (pgkvx.max_latches_per_role = {})",
                guc::MAX_LATCHES_PER_ROLE.get()
            ),
            "End some of this role's open transactions, or ask an administrator to raise pgkvx.max_latches_per_role.",
        ),
    }
}

/// This transaction's holder record for a latch on a table owned by `owner`.
///
/// The latch entries are charged to the role the write runs as: the outer
/// user, which `SET ROLE` sets (so tenants reached through one login have
/// budgets of their own) and which a SECURITY DEFINER function does not
/// change (so its owner is not charged for its callers' writes).
pub fn holder(owner: pg_sys::Oid) -> Holder {
    Holder {
        xid: my_xid(),
        // SAFETY: plain read of a backend global.
        pid: unsafe { pg_sys::MyProcPid },
        now_us: now_us(),
        owner: owner.to_u32(),
        // SAFETY: reads a backend global (asserts it is set, as it is in
        // any backend that runs a transaction, so it cannot raise).
        role: unsafe { crate::pg::raw::GetOuterUserId() }.to_u32(),
    }
}

/// Publishes a write latch on `span` of `relid` (owned by `owner`) for this
/// transaction, unless a span it holds covers it already.  A full table
/// first reclaims and coalesces tombstones; only if that frees nothing does
/// the writer get SQLSTATE 53400.  Then it backs off from a crowded range.
pub fn latch(relid: pg_sys::Oid, owner: pg_sys::Oid, span: &Span) {
    let t = table().writer();
    let slot = my_slot();
    ensure_exit_hook();
    let h = holder(owner);
    let rel = rel_id(relid);
    super::wakeups::note_write(rel, span);
    let l = limits();
    // SAFETY: reads the current subtransaction's id.
    let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let log = crate::standby::log::wanted();
    HOLDINGS.with(|held| {
        let mut held = held.borrow_mut();
        held.set_subxact(sub);
        held.set_journaling(log);
    });
    let mut result = HOLDINGS.with(|held| t.latch(slot, &mut held.borrow_mut(), rel, span, &h, &l));
    if result == Err(AcquireError::Full) {
        refresh_horizon(true);
        t.relieve_pressure(slot);
        result = HOLDINGS.with(|held| t.latch(slot, &mut held.borrow_mut(), rel, span, &h, &l));
    }
    // Before the write it covers, and before any error: what was
    // published is held, so standbys must hold it too.
    if log {
        log_journal(&h);
    }
    wake_if_escalated();
    match result {
        Ok(Latched::Published { max_load }) => back_off_if_crowded(rel, span, max_load),
        Ok(Latched::Covered) => {}
        Err(e) => raise_acquire_error(e),
    }
}

/// Publishes a point latch inside a key-drawing section: no escalation, no
/// pressure relief and no back-off there (they run after the section, in
/// [`after_draw`]).
pub fn latch_in_draw(relid: pg_sys::Oid, span: &Span, h: &Holder) -> Result<Latched, AcquireError> {
    let t = table().writer();
    ensure_exit_hook();
    let unlimited = Limits::NONE;
    super::wakeups::note_write(rel_id(relid), span);
    HOLDINGS.with(|held| {
        let mut held = held.borrow_mut();
        // A drawn key may be written after a rollback of the subtransaction
        // that drew it (drawn.rs gives it back): its latch lasts to the end
        // of the top-level transaction.
        held.set_subxact(TOP_SUBXACT);
        let log = crate::standby::log::wanted();
        held.set_journaling(log);
        let published = t.latch(my_slot(), &mut held, rel_id(relid), span, h, &unlimited);
        // Logged right after the section (log_draw); the ticket makes every
        // later drawer's commit wait for that (latch/draw_order.rs).  Every
        // draw takes one, also one its transaction's own span covers (a
        // bulk load's latch_span): its commit must still follow every
        // earlier draw's latch in WAL.
        if log {
            let ticket = t.take_draw_ticket(my_slot());
            DRAW_TICKET.with(|d| d.set(d.get().max(ticket)));
        }
        published
    })
}

thread_local! {
    /// This transaction's newest draw ticket (0: it drew no logged key):
    /// its commit waits for every older one (latch/draw_order.rs).
    static DRAW_TICKET: Cell<u64> = const { Cell::new(0) };
}

/// Right after a key-drawing section: WAL-logs the latch drawn there and
/// hands its ticket back.  Before anything that can raise: an error on the
/// way would leave the ticket out until the transaction's end.
pub fn log_draw(h: &Holder) {
    log_journal(h);
    table().writer().return_draw_ticket(my_slot());
}

/// Whether this transaction drew keys whose latches went into WAL.
/// Panic-free (see `xact_callback`).
fn drew_logged_keys() -> bool {
    DRAW_TICKET.try_with(|d| d.get() != 0).unwrap_or(false)
}

/// Before this transaction's commit record: waits until every key drawn
/// before its own has its latch in WAL, so that a standby replays those
/// latches before this commit.  The drawers log right after their
/// sections, so this rarely waits and never long; no lock is held.
fn order_commit_after_earlier_draws() {
    let ticket = DRAW_TICKET.with(|d| d.get());
    let t = table().writer();
    let slot = my_slot();
    if !t.older_draw_unlogged(slot, ticket) {
        return;
    }
    let _wait = crate::pg::WaitEvent::extension();
    let mut spins = 0u32;
    while t.older_draw_unlogged(slot, ticket) {
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            pgrx::check_for_interrupts!();
            // SAFETY: a plain sleep.
            unsafe { pg_sys::pg_usleep(50) };
        }
    }
}

/// The transaction ended: its draws are ordered no more, and a ticket an
/// error left out goes back.  Panic-free.
fn forget_draw_ticket() {
    if DRAW_TICKET.try_with(|d| d.replace(0)).unwrap_or(0) != 0 {
        if let Some(t) = super::table_if_attached() {
            if let Some(slot) = slot_in(t) {
                t.writer().return_draw_ticket(slot);
            }
        }
    }
}

/// WAL-logs the latches this transaction published since the last call
/// (standby/log.rs): one record per table.
fn log_journal(h: &Holder) {
    HOLDINGS.with(|held| log_drained(&mut held.borrow_mut(), h));
}

fn log_drained(held: &mut Holdings, h: &Holder) {
    // Encoded in place from the drained journal: a write's one latch
    // costs no copy and no allocation.
    let journal = held.drain_journal();
    for group in journal.as_slice().chunk_by(|a, b| a.0 == b.0) {
        crate::standby::log::latches(group[0].0, h.owner, h.xid, h.pid, group.iter().map(|(_, s)| s));
    }
}

/// What a key draw leaves for after its section: escalation and the
/// transaction's budget, then back-off from a crowded range.
pub fn after_draw(relid: pg_sys::Oid, span: &Span, h: &Holder, published: Latched) {
    let t = table().writer();
    let rel = rel_id(relid);
    let r = HOLDINGS.with(|held| t.enforce_limits(my_slot(), &mut held.borrow_mut(), rel, h, &limits()));
    log_journal(h);
    wake_if_escalated();
    if let Err(e) = r {
        raise_acquire_error(e);
    }
    if let Latched::Published { max_load } = published {
        back_off_if_crowded(rel, span, max_load);
    }
}

/// Makes room in the latch table before a key draw when it is nearly full,
/// so that the draw's own publication does not fail inside its section.
pub fn make_room() {
    let t = table().writer();
    if t.free_entries() < 64 {
        refresh_horizon(true);
        t.relieve_pressure(my_slot());
    }
}

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// Every key draw takes a draw ticket, so its commit waits for earlier
    /// draws' latches to be in WAL -- also a draw the transaction's own
    /// span latch covers (nothing new published, nothing to log).
    #[pg_test]
    fn every_draw_orders_its_commit_covered_or_not() {
        assert!(crate::standby::log::wanted(), "the test server writes WAL for standbys (wal_level replica)");
        Spi::run("CREATE TABLE dt (id bigserial PRIMARY KEY); SELECT pgkvx.enable('dt', gapless => true)").unwrap();
        Spi::run("SELECT pgkvx.latch_span('dt', NULL, NULL)").unwrap();
        assert!(!super::drew_logged_keys());
        Spi::run("INSERT INTO dt DEFAULT VALUES").unwrap();
        assert!(super::drew_logged_keys(), "a draw under the transaction's own span took no ticket");
    }
}
