//! Snapshots for reads of latched tables: the base snapshot (the
//! statement's, or a fresh one), the base with waited-for holders folded in,
//! and the waits themselves.
//!
//! A Postgres snapshot does not say which xids at or above its xmax were
//! already running when it was taken (see the latch core's `snapshot`), so
//! every base snapshot carries `after`: the next xid, read as soon after the
//! snapshot as we can.  A statement's snapshot is read when its executor
//! starts, a few microseconds after the snapshot was taken; the fixed
//! snapshot of a REPEATABLE READ or SERIALIZABLE transaction is read right
//! after its first statement's parse analysis, which runs just after that
//! snapshot is taken.  Reading later only errs on the safe side.

use crate::pg;
use crate::shmem::backend;
use pgkvx_latch::{ReadSnapshot, Stat, Xid};
use pgrx::pg_sys::{self, Snapshot};
use pgrx::prelude::*;
use std::cell::Cell;

/// The next xid to be assigned.
pub fn next_xid() -> Xid {
    // SAFETY: reads the shared counter under its lock (taken shared, once:
    // it cannot raise).
    Xid(unsafe { crate::pg::raw::ReadNextFullTransactionId() }.value as u32)
}

thread_local! {
    /// (local transaction id, next xid) recorded for this transaction's
    /// fixed snapshot.
    static XACT_AFTER: Cell<Option<(u32, Xid)>> = const { Cell::new(None) };
}

static mut PREV_ANALYZE_HOOK: pg_sys::post_parse_analyze_hook_type = None;

/// Installs the hook that records `after` for transaction snapshots after
/// parse analysis; utility statements report through [`after_utility`].
pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe {
        PREV_ANALYZE_HOOK = pg_sys::post_parse_analyze_hook;
        pg_sys::post_parse_analyze_hook = Some(after_analyze);
    }
}

/// REPEATABLE READ or SERIALIZABLE: one snapshot for the whole transaction.
pub fn fixed_snapshot() -> bool {
    // SAFETY: plain read of a backend global.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

#[pg_guard]
unsafe extern "C-unwind" fn after_analyze(
    pstate: *mut pg_sys::ParseState,
    query: *mut pg_sys::Query,
    jstate: *mut pg_sys::JumbleState,
) {
    // SAFETY: chaining the previous hook with the same arguments.
    unsafe {
        if let Some(prev) = PREV_ANALYZE_HOOK {
            prev(pstate, query, jstate);
        }
    }
    note_transaction_snapshot();
}

/// A utility statement (`DO`, `CREATE TEMP TABLE`, `SET TRANSACTION
/// SNAPSHOT`, …) can take the transaction snapshot after its own analysis
/// and start no executor: it is seen when the statement returns (from the
/// ProcessUtility hook, utility.rs), not at the next statement, which may
/// come much later.
pub fn after_utility() {
    if pg::in_live_transaction() {
        note_transaction_snapshot();
        // COPY, an imported snapshot, ...: the snapshot is now read at.
        mark_fixed_read();
    }
}

/// Records `after` for this transaction's fixed snapshot the first time it
/// is seen taken: after the parse analysis of a simple query, at every
/// executor start (an EXECUTE or a Bind takes it with no analysis after),
/// and after every utility statement.
/// Recorded later than exact, `after` only makes more writers count as in
/// flight (a spurious 40001, never a missed row), so the earliest sighting
/// is what counts.
pub fn note_transaction_snapshot() {
    // SAFETY: plain read of a backend global.
    if fixed_snapshot() && unsafe { pg_sys::FirstSnapshotSet } {
        let lxid = crate::pg::local_xact_id();
        if XACT_AFTER.with(|c| c.get()).is_none_or(|(l, _)| l != lxid) {
            XACT_AFTER.with(|c| c.set(Some((lxid, next_xid()))));
        }
    }
}

thread_local! {
    /// The local transaction whose fixed snapshot statements have read at,
    /// and how many have started reading at it.
    static FIXED_READ: Cell<Option<(u32, u64)>> = const { Cell::new(None) };
}

/// Notes that a statement starts reading at this transaction's fixed
/// snapshot (REPEATABLE READ or SERIALIZABLE, snapshot taken) and says
/// whether it is the first to: only the first may still move the snapshot
/// ([`adopt_for_transaction`]), since nothing has been read at it yet.
/// Every executor start and every utility statement counts, ours or not.
pub fn mark_fixed_read() -> bool {
    // SAFETY: plain read of a backend global.
    if !fixed_snapshot() || !unsafe { pg_sys::FirstSnapshotSet } {
        return false;
    }
    let lxid = crate::pg::local_xact_id();
    let n = match FIXED_READ.with(|c| c.get()) {
        Some((l, n)) if l == lxid => n + 1,
        _ => 1,
    };
    FIXED_READ.with(|c| c.set(Some((lxid, n))));
    n == 1
}

/// Whether the first statement to read at this transaction's fixed
/// snapshot is still the only one that has: a cursor declared first
/// validates at its first FETCH, and statements run in between (or
/// functions its own run called) read at the old snapshot.
fn only_first_read() -> bool {
    FIXED_READ.with(|c| c.get()) == Some((crate::pg::local_xact_id(), 1))
}

/// Whether the running statement's read decides what the transaction
/// sees: READ COMMITTED, or the first statement to read at a REPEATABLE
/// READ transaction's snapshot (the poll that opens a consumer's
/// transaction).  Such a read may stop before a writer's keys; a later
/// statement of a REPEATABLE READ transaction may not, since earlier ones
/// already read past them at the same snapshot.
pub fn statement_chooses_snapshot() -> bool {
    !fixed_snapshot() || (may_move_transaction_snapshot() && only_first_read())
}

/// Whether the first statement to read at this transaction's fixed
/// snapshot may move it ([`adopt_for_transaction`]): REPEATABLE READ only;
/// SERIALIZABLE ties its predicate locks to the snapshot it registered.
pub fn may_move_transaction_snapshot() -> bool {
    // SAFETY: plain read of a backend global.
    unsafe { pg_sys::XactIsoLevel == pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Makes `newer` (a fresher snapshot, taken after `after`'s writers were
/// waited for) the snapshot every later statement of this REPEATABLE READ
/// transaction reads at, this one included: exactly the state its rows were
/// read at.  Only for the first reading statement: nothing has been read
/// at the old snapshot, so moving it is as if it had been taken later.
/// False -- and the caller raises the serialization failure -- for
/// SERIALIZABLE, when another statement has read at the snapshot since
/// this one started, and when the list would not fit the arrays
/// PostgreSQL copies a transaction snapshot into (parallel workers,
/// exports).
///
/// # Safety
/// `newer` is a valid MVCC snapshot no older than the transaction's.
pub unsafe fn adopt_for_transaction(newer: Snapshot, after: Xid) -> bool {
    // SAFETY: `newer` is a valid MVCC snapshot no older than the transaction's (the caller's contract).
    // In REPEATABLE READ, GetTransactionSnapshot returns the transaction's own copy of its first snapshot
    // (FirstXactSnapshot: registered, in TopTransactionContext, never freed before that context goes).
    // Its xip array is sized for its own xids, so the new list goes into an array of its own in the same
    // context; every later statement copies the snapshot from there.  It keeps its older xmin (its place
    // among the registered snapshots): every xid between the two xmins has ended, and the backend's xmin
    // still protects what either can see.
    unsafe {
        if !may_move_transaction_snapshot()
            || !only_first_read()
            || (*newer).xcnt > pg_sys::GetMaxSnapshotXidCount() as u32
            || (*newer).subxcnt > pg_sys::GetMaxSnapshotSubxidCount()
        {
            return false;
        }
        let cur = pg_sys::GetTransactionSnapshot();
        fold_in_place(pg_sys::TopTransactionContext, cur, newer);
        // Later statements judge writers against the state they read at.
        XACT_AFTER.with(|c| c.set(Some((crate::pg::local_xact_id(), after))));
        true
    }
}

/// The array of a snapshot's running xids and its length: `xip`, or on a
/// hot standby `subxip` (PostgreSQL puts every running xid there, and
/// leaves `xip` empty).
///
/// # Safety
/// `snap` is a valid MVCC snapshot.
unsafe fn running_xids(snap: Snapshot) -> (*mut pg_sys::TransactionId, usize) {
    // SAFETY: per the caller's contract.
    unsafe {
        if (*snap).takenDuringRecovery {
            ((*snap).subxip, (*snap).subxcnt.max(0) as usize)
        } else {
            ((*snap).xip, (*snap).xcnt as usize)
        }
    }
}

/// Makes snapshot `snap` read as `template`, a fresher snapshot, does, in
/// place: everything that holds `snap` (a REPEATABLE READ transaction's
/// later statements) reads at the newer state.  The in-progress list is
/// copied into `cx`, which lives as long as `snap`; `snap` keeps its xmin
/// (older is only more careful).
///
/// # Safety
/// `snap` is a valid MVCC snapshot the caller may change in place (its
/// statement's, or the transaction's own copy) and `cx` lives at least as
/// long as it; `template` a valid MVCC snapshot no older than it.
pub unsafe fn fold_in_place(cx: pg_sys::MemoryContext, snap: Snapshot, template: Snapshot) {
    // SAFETY: the caller passes valid MVCC snapshots, `template` holding xcnt xids in xip; the copy goes
    // into a fresh array in `cx`, which lives as long as `snap`, as set_in_progress needs.
    unsafe {
        let (from, n) = running_xids(template);
        let xip = pg_sys::MemoryContextAlloc(cx, 4 * n.max(1)) as *mut pg_sys::TransactionId;
        if n > 0 {
            std::ptr::copy_nonoverlapping(from, xip, n);
        }
        if (*template).takenDuringRecovery {
            // A standby's snapshot keeps them all in subxip, and XidInMVCCSnapshot
            // reads only that one for a snapshot taken during recovery.
            (*snap).subxip = xip;
            (*snap).subxcnt = n as i32;
            (*snap).xcnt = 0;
            (*snap).xmax = (*template).xmax;
            (*snap).suboverflowed = (*template).suboverflowed;
            (*snap).takenDuringRecovery = true;
            return;
        }
        set_in_progress(snap, xip, n as u32, (*template).xmax)
    }
}

/// Gives `snap` a new in-progress list (top-level xids, resolved through
/// pg_subtrans) and xmax; its xmin stays.
///
/// # Safety
/// `xip` holds `xcnt` xids and lives as long as `snap`.
unsafe fn set_in_progress(snap: Snapshot, xip: *mut pg_sys::TransactionId, xcnt: u32, xmax: pg_sys::TransactionId) {
    // SAFETY: the caller passes a valid snapshot it may change and an `xip` of `xcnt` xids that lives as
    // long as it; suboverflowed makes readers resolve subtransactions through pg_subtrans.
    unsafe {
        (*snap).xip = xip;
        (*snap).xcnt = xcnt;
        (*snap).xmax = xmax;
        (*snap).subxcnt = 0;
        (*snap).suboverflowed = true;
    }
}

/// `after` for a statement whose executor starts now: for a fixed
/// transaction snapshot the value recorded when it was taken, otherwise the
/// next xid now.  Either bound is conservative: it can only be later than
/// exact.
pub fn after_for_statement() -> Xid {
    let now = next_xid();
    if fixed_snapshot() {
        if let Some((lxid, after)) = XACT_AFTER.with(|c| c.get()) {
            if lxid == crate::pg::local_xact_id() {
                return after;
            }
        }
    }
    now
}

/// A snapshot a read runs at: the statement's, or a fresh one it took after
/// waiting.
pub struct BaseSnapshot {
    pub snap: Snapshot,
    /// Xids at or above this were assigned after the snapshot.
    after: Xid,
    /// A fresh snapshot we registered (and must unregister).
    registered: bool,
    /// Its in-progress xids, sorted (latch checks binary-search them).
    xip: Vec<Xid>,
}

impl BaseSnapshot {
    /// Views `snap` (owned by the caller).
    ///
    /// # Safety
    /// `snap` is a valid MVCC snapshot that outlives this value, and every
    /// xid assigned before it was taken precedes `after`.
    pub unsafe fn of(snap: Snapshot, after: Xid) -> BaseSnapshot {
        // SAFETY: the caller passes a valid MVCC snapshot; the running xids are in its xip array
        // (xcnt of them), or for a snapshot taken during recovery all in subxip (subxcnt), which
        // then also holds the subtransactions the standby knows of: extra xids, never latch holders.
        let mut xip: Vec<Xid> = unsafe {
            let (arr, n) = running_xids(snap);
            (0..n).map(|i| Xid((*arr.add(i)).into_inner())).collect()
        };
        xip.sort_unstable_by_key(|x| x.0);
        BaseSnapshot { snap, after, registered: false, xip }
    }

    /// A new snapshot of the latest committed state (READ COMMITTED only).
    pub fn fresh() -> BaseSnapshot {
        // SAFETY: GetLatestSnapshot returns a static snapshot that
        // RegisterSnapshot copies into a registered one we own.
        let snap = unsafe { pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot()) };
        let after = next_xid();
        // SAFETY: registered until release(); `after` was read after it.
        let mut b = unsafe { BaseSnapshot::of(snap, after) };
        b.registered = true;
        b
    }

    /// Unregisters a fresh snapshot (on the normal path; at abort the
    /// resource owner does it).
    pub fn release(&mut self) {
        if self.registered {
            // SAFETY: we registered it and have not unregistered it yet.
            unsafe { pg_sys::UnregisterSnapshot(self.snap) };
            self.registered = false;
        }
    }

    fn xmax(&self) -> Xid {
        // SAFETY: the snapshot is valid while self is.
        Xid(unsafe { (*self.snap).xmax }.into_inner())
    }

    /// Xids at or above this were assigned after the snapshot.
    pub fn after(&self) -> Xid {
        self.after
    }

    pub fn view(&self) -> ReadSnapshot<'_> {
        // SAFETY: the snapshot is valid while self is.
        let xmin = unsafe { (*self.snap).xmin };
        ReadSnapshot {
            xmin: Xid(xmin.into_inner()),
            xmax: self.xmax(),
            xip: &self.xip,
            after: self.after,
            own: backend::my_xid_if_any(),
        }
    }
}

/// Whether `xid` has committed (for coalesced tombstones, which remember
/// only an xid interval).
pub fn committed(xid: Xid) -> bool {
    let x = pg_sys::TransactionId::from(xid.0);
    // SAFETY: clog/procarray lookups for an xid no older than our snapshot's
    // xmin (tombstones older than the horizon are gone).
    unsafe { !pg_sys::TransactionIdIsInProgress(x) && pg_sys::TransactionIdDidCommit(x) }
}

/// Waits for transaction `xid` to end, through the lock manager: the wait
/// shows in pg_locks, honours lock_timeout, statement_timeout and cancel,
/// and takes part in deadlock detection.  On a hot standby, where the
/// primary's transactions hold no locks, until recovery replays its end
/// (woken from our redo; cancel and statement_timeout honoured, recovery
/// conflicts raised as PostgreSQL raises them).  Returns microseconds
/// waited.
pub fn wait_for(xid: Xid) -> i64 {
    // SAFETY: reading the clock and waiting on a transaction lock; with
    // XLTW_None the relation and tuple are not used.  The standby's test is
    // a procarray lookup.
    unsafe {
        let t0 = pg_sys::GetCurrentTimestamp();
        let x = pg_sys::TransactionId::from(xid.0);
        if crate::pg::raw::RecoveryInProgress() {
            let how = crate::shmem::wakeups::sleep_until_replayed(|| !pg_sys::TransactionIdIsInProgress(x));
            if how == crate::shmem::wakeups::Replayed::ReplayWaits {
                replay_waits_for_us(xid);
            }
        } else {
            pg_sys::XactLockTableWait(x, std::ptr::null_mut(), std::ptr::null_mut(), pg_sys::XLTW_Oper::XLTW_None);
        }
        let us = pg_sys::GetCurrentTimestamp() - t0;
        backend::count(Stat::WaitMicros, us as u64);
        us
    }
}

/// Replay waits on a recovery conflict with this session (its snapshot, a
/// lock it holds) while this read waits for replay to show writer `xid`'s
/// end: neither would ever go on, and replay would stall for every reader
/// of the standby until PostgreSQL cancels this one
/// (max_standby_streaming_delay).  The read ends now instead, with the
/// error PostgreSQL's own cancellation gives.
fn replay_waits_for_us(xid: Xid) -> ! {
    crate::errors::raise_full(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "canceling statement due to conflict with recovery",
        Some(format!(
            "This read waited for transaction {} of the primary to end, and replay, which would show its end, waits for queries of this standby.",
            xid.0
        )),
        Some("Run the read again. hot_standby_feedback = on avoids most conflicts with replay."),
    )
}

/// Splicing against Postgres's own visibility test.  The xids used lie
/// below this backend's xmin, so `XidInMVCCSnapshot` decides them from the
/// snapshot alone (no pg_subtrans lookup for xids that were never assigned).
#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use super::*;

    /// A private copy of the active snapshot with the given xmin, xmax and
    /// in-progress xids (no subtransactions), in the current memory context.
    fn snapshot_with(xmin: u32, xmax: u32, xip: &[u32]) -> Snapshot {
        // SAFETY: copies a valid MVCC snapshot into palloc'd room for it and
        // its xip array, then edits only the copy's xid fields.
        unsafe {
            let head = std::mem::size_of::<pg_sys::SnapshotData>();
            let s = pg_sys::palloc0(head + 4 * xip.len().max(1)) as *mut pg_sys::SnapshotData;
            std::ptr::copy_nonoverlapping(pg_sys::GetActiveSnapshot(), s, 1);
            let arr = (s as *mut u8).add(head) as *mut pg_sys::TransactionId;
            for (i, &x) in xip.iter().enumerate() {
                *arr.add(i) = pg_sys::TransactionId::from(x);
            }
            (*s).xmin = pg_sys::TransactionId::from(xmin);
            (*s).xmax = pg_sys::TransactionId::from(xmax);
            (*s).xip = arr;
            (*s).xcnt = xip.len() as u32;
            (*s).subxip = std::ptr::null_mut();
            (*s).subxcnt = 0;
            (*s).suboverflowed = false;
            (*s).copied = false;
            (*s).active_count = 0;
            (*s).regd_count = 0;
            (*s).ph_node = std::mem::zeroed();
            s
        }
    }

    /// Whether Postgres counts `xid` as still running for `snap`.
    fn running(snap: Snapshot, xid: u32) -> bool {
        // SAFETY: a valid MVCC snapshot; the xid precedes TransactionXmin
        // or lies outside [xmin, xmax), see the module docs.
        unsafe { pg_sys::XidInMVCCSnapshot(pg_sys::TransactionId::from(xid), snap) }
    }

    /// This backend's xmin: every xid below it has ended.
    fn my_xmin() -> u32 {
        // SAFETY: a plain read of a backend global, set by the snapshot
        // the test's query runs with.
        let m = unsafe { pg_sys::TransactionXmin }.into_inner();
        assert!(m > 100, "too few xids assigned for the test: {m}");
        m
    }

    #[pg_test]
    fn folding_a_newer_snapshot_in_keeps_xmin_and_reads_as_the_newer() {
        let m = my_xmin();
        // The older snapshot saw m-30 and m-25 running; the newer one, taken
        // after m-30 ended, sees only m-25 and everything up to m-10.
        let old = snapshot_with(m - 40, m - 20, &[m - 25, m - 30]);
        let newer = snapshot_with(m - 26, m - 10, &[m - 25, m - 12]);
        // SAFETY: both are valid snapshots in the current context.
        unsafe { fold_in_place(pg_sys::CurrentMemoryContext, old, newer) };
        assert!(!running(old, m - 30), "ended before the newer snapshot: visible");
        assert!(running(old, m - 25) && running(old, m - 12), "the newer one's running xids still run");
        assert!(running(old, m - 10) && !running(old, m - 15), "xmax is the newer one's");
        // SAFETY: `old` is valid.
        assert_eq!(unsafe { (*old).xmin }, pg_sys::TransactionId::from(m - 40), "the older xmin stays");
    }

    #[pg_test]
    fn committed_asks_the_commit_log() {
        // SAFETY: assigns this transaction its xid (a plain call).
        let mine = unsafe { pg_sys::GetCurrentTransactionId() }.into_inner();
        assert!(!committed(Xid(mine)), "our own transaction is still running");
        assert!(committed(Xid(pg_sys::FrozenTransactionId.into_inner())), "the frozen xid counts as committed");
        assert!(committed(Xid(pg_sys::BootstrapTransactionId.into_inner())));
    }
}
