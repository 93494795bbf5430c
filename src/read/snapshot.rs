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

use crate::latch::{ReadSnapshot, RelId, Stat, Xid};
use crate::pg;
use crate::shmem::backend;
use pgrx::pg_sys::{self, Snapshot};
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;
use std::cell::Cell;

/// The most xids a pull-in may add to a snapshot's in-progress list.
/// Postgres searches that list linearly for every recent tuple it checks,
/// and a snapshot taken long ago on a busy system would need one entry per
/// top-level xid assigned since: past this many, the read takes a fresh
/// snapshot instead (READ COMMITTED only; a fixed snapshot never pulls
/// anyone in).  Subtransaction xids need no entry (the spliced snapshot
/// resolves them to their top-level xid), so a batch with a savepoint per
/// row costs one.
pub const MAX_SPLICED_XIDS: u32 = 8192;

/// Past this many xids assigned since the snapshot, the pull-in does not
/// even look for the top-level ones among them.
const MAX_SPLICED_RANGE: u32 = 1 << 20;

/// The next xid to be assigned.
pub fn next_xid() -> Xid {
    // SAFETY: reads the shared counter under its lock (taken shared, once:
    // it cannot raise).
    Xid(unsafe { crate::errors::raw::ReadNextFullTransactionId() }.value as u32)
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

fn local_xact() -> u32 {
    // SAFETY: MyProc is set in every backend.
    unsafe { (*pg_sys::MyProc).lxid }
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
        let lxid = local_xact();
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
    let lxid = local_xact();
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
    FIXED_READ.with(|c| c.get()) == Some((local_xact(), 1))
}

/// Makes `template` (a spliced copy of the transaction snapshot) the
/// snapshot every later statement of this REPEATABLE READ transaction reads
/// at.  Only for the first reading statement: nothing has been read at the
/// old snapshot, so moving it is as if it had been taken after the wait.
/// False -- and the caller raises the serialization failure -- for
/// SERIALIZABLE, whose predicate locks are tied to the snapshot it
/// registered; when another statement has read at the snapshot since this
/// one started; and when the list would not fit the arrays PostgreSQL
/// copies a transaction snapshot into (parallel workers, exports).
///
/// # Safety
/// `template` is a valid MVCC snapshot with the transaction snapshot's xmin.
pub unsafe fn adopt_for_transaction(template: Snapshot) -> bool {
    // SAFETY: per contract.  In REPEATABLE READ, GetTransactionSnapshot
    // returns the transaction's own copy of its first snapshot
    // (FirstXactSnapshot: registered, in TopTransactionContext, never freed
    // before that context goes).  Its xip array is sized for its own xids,
    // so the new list goes into an array of its own in the same context;
    // every later statement copies the snapshot from there.
    unsafe {
        // Parallel workers and exported snapshots copy the transaction
        // snapshot into arrays of GetMaxSnapshotXidCount() xids.
        if pg_sys::XactIsoLevel != pg_sys::XACT_REPEATABLE_READ as i32
            || !only_first_read()
            || (*template).xcnt > pg_sys::GetMaxSnapshotXidCount() as u32
        {
            return false;
        }
        let cur = pg_sys::GetTransactionSnapshot();
        if (*template).xmin != (*cur).xmin {
            return false;
        }
        let n = (*template).xcnt as usize;
        let xip = pg_sys::MemoryContextAlloc(pg_sys::TopTransactionContext, 4 * n.max(1)) as *mut pg_sys::TransactionId;
        if n > 0 {
            std::ptr::copy_nonoverlapping((*template).xip, xip, n);
        }
        set_in_progress(cur, xip, (*template).xcnt, (*template).xmax);
        true
    }
}

/// Makes the statement snapshot `snap` read as `template` (spliced from
/// it, or a fresher snapshot) does, in place: every scan of the statement
/// holds `snap`, and so do the functions it calls.  The in-progress list is
/// copied into `cx`, which lives as long as `snap`; `snap` keeps its xmin
/// (older is only more careful).
///
/// # Safety
/// `snap` is a valid MVCC snapshot owned by the caller's statement;
/// `template` a valid MVCC snapshot no older than it.
pub unsafe fn fold_in_place(cx: pg_sys::MemoryContext, snap: Snapshot, template: Snapshot) {
    // SAFETY: per contract.
    unsafe {
        let n = (*template).xcnt as usize;
        let xip = pg_sys::MemoryContextAlloc(cx, 4 * n.max(1)) as *mut pg_sys::TransactionId;
        if n > 0 {
            std::ptr::copy_nonoverlapping((*template).xip, xip, n);
        }
        set_in_progress(snap, xip, (*template).xcnt, (*template).xmax)
    }
}

/// A snapshot of the statement's own to fold writers into later: a
/// registered copy of `snap` that no other statement holds (a function's
/// statement may run at its caller's snapshot object).
///
/// # Safety
/// `snap` is a valid MVCC snapshot.
pub unsafe fn private_copy(snap: Snapshot) -> Snapshot {
    // SAFETY: RegisterSnapshot copies a snapshot not marked copied; the
    // template is a shallow copy pointing at `snap`'s own arrays, read
    // only by that copy.
    unsafe {
        let template = pg_sys::palloc(std::mem::size_of::<pg_sys::SnapshotData>()) as *mut pg_sys::SnapshotData;
        std::ptr::copy_nonoverlapping(snap, template, 1);
        (*template).copied = false;
        (*template).active_count = 0;
        (*template).regd_count = 0;
        (*template).ph_node = std::mem::zeroed();
        let copy = pg_sys::RegisterSnapshot(template);
        pg_sys::pfree(template as *mut std::ffi::c_void);
        copy
    }
}

/// Gives `snap` a new in-progress list (top-level xids, resolved through
/// pg_subtrans) and xmax; its xmin stays.
///
/// # Safety
/// `xip` holds `xcnt` xids and lives as long as `snap`.
unsafe fn set_in_progress(snap: Snapshot, xip: *mut pg_sys::TransactionId, xcnt: u32, xmax: pg_sys::TransactionId) {
    // SAFETY: per contract.
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
            if lxid == local_xact() {
                return after;
            }
        }
    }
    now
}

/// The snapshot a read starts from, before pulling anyone in.
pub struct BaseSnapshot {
    pub snap: Snapshot,
    /// Xids at or above this were assigned after the snapshot.
    after: Xid,
    /// A fresh snapshot we registered (and must unregister).
    registered: bool,
    /// Its in-progress xids, sorted (latch checks binary-search them).
    xip: Vec<Xid>,
    /// The latched tables the read covers (see [`BaseSnapshot::reading`]).
    rels: Vec<RelId>,
}

impl BaseSnapshot {
    /// Views `snap` (owned by the caller).
    ///
    /// # Safety
    /// `snap` is a valid MVCC snapshot that outlives this value, and every
    /// xid assigned before it was taken precedes `after`.
    pub unsafe fn of(snap: Snapshot, after: Xid) -> BaseSnapshot {
        // SAFETY: per contract; xip has xcnt entries.
        let mut xip: Vec<Xid> =
            unsafe { (0..(*snap).xcnt as usize).map(|i| Xid((*(*snap).xip.add(i)).into_inner())).collect() };
        xip.sort_unstable_by_key(|x| x.0);
        BaseSnapshot { snap, after, registered: false, xip, rels: Vec::new() }
    }

    /// Notes latched tables the read covers.  Knowing them, a pull-in hides
    /// only their writers (and every transaction still running) instead of
    /// every transaction that started since the snapshot: its cost is
    /// bounded by the writers of the tables read, not by how fast xids are
    /// assigned anywhere in the cluster.  Every table a guarded scan of the
    /// read may touch must be noted before the first pull-in.
    pub fn rels(&self) -> &[RelId] {
        &self.rels
    }

    pub fn reading(&mut self, rels: impl IntoIterator<Item = RelId>) {
        for r in rels {
            if !self.rels.contains(&r) {
                self.rels.push(r);
            }
        }
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

    pub fn view<'a>(&'a self, pulled: &'a [Xid]) -> ReadSnapshot<'a> {
        // SAFETY: the snapshot is valid while self is.
        let xmin = unsafe { (*self.snap).xmin };
        ReadSnapshot {
            xmin: Xid(xmin.into_inner()),
            xmax: self.xmax(),
            xip: &self.xip,
            after: self.after,
            pulled,
            own: backend::my_xid_if_any(),
        }
    }

    /// The xmax a snapshot with `pulled` folded in needs: past every xid
    /// assigned so far, so that subtransactions of pulled-in holders
    /// (assigned after the base snapshot) resolve to their now-visible
    /// parents instead of counting as "in progress because too new".
    fn spliced_xmax(&self, pulled: &[Xid]) -> Xid {
        pulled.iter().map(|p| Xid(p.0.wrapping_add(1))).chain([next_xid()]).fold(self.xmax(), |m, x| m.max(x))
    }

    /// Whether folding `pulled` in stays within [`MAX_SPLICED_XIDS`].
    pub fn can_pull(&self, pulled: &[Xid]) -> bool {
        pulled.is_empty() || self.hidden_after(pulled).is_some_and(|(h, _)| h.len() <= MAX_SPLICED_XIDS as usize)
    }

    /// The xids at or above the base's xmax that must stay in progress for
    /// the base with `pulled` folded in, and the xmax of the result.  None
    /// when they cannot be named within bounds.
    ///
    /// With the tables read known: every transaction running now, and
    /// every writer of those tables (live latch or tombstone) since the
    /// snapshot -- xmax being the latest completed xid's successor, so
    /// every other xid below it has ended; a committed one that wrote none
    /// of those tables may show, which changes nothing the guarded scans
    /// read.  Otherwise every top-level xid since the snapshot.
    fn hidden_after(&self, pulled: &[Xid]) -> Option<(Vec<u32>, Xid)> {
        if !self.rels.is_empty() {
            return self.hidden_writers(pulled);
        }
        let base_xmax = self.xmax();
        let new_xmax = self.spliced_xmax(pulled);
        if new_xmax.0.wrapping_sub(base_xmax.0) > MAX_SPLICED_RANGE {
            return None;
        }
        let assigned = next_xid();
        let is_pulled = |x: Xid| pulled.binary_search_by_key(&x.0, |p| p.0).is_ok();
        let mut out = Vec::new();
        let mut x = base_xmax;
        while x.precedes(new_xmax) {
            if x.is_valid() && !is_pulled(x) && (!x.precedes(assigned) || top_level(x)) {
                out.push(x.0);
            }
            x = Xid(x.0.wrapping_add(1));
        }
        Some((out, new_xmax))
    }

    /// [`Self::hidden_after`] for known tables.
    fn hidden_writers(&self, pulled: &[Xid]) -> Option<(Vec<u32>, Xid)> {
        let is_pulled = |x: Xid| pulled.binary_search_by_key(&x.0, |p| p.0).is_ok();
        // SAFETY: GetLatestSnapshot fills a static snapshot, read here at
        // once: its xip lists every top-level xid running below its xmax.
        let (running, xmax) = unsafe {
            let latest = pg_sys::GetLatestSnapshot();
            let running: Vec<u32> =
                (0..(*latest).xcnt as usize).map(|i| (*(*latest).xip.add(i)).into_inner()).collect();
            (running, Xid((*latest).xmax.into_inner()))
        };
        // Pulled holders have ended, so they precede the latest xmax.
        let xmax = pulled.iter().map(|p| Xid(p.0.wrapping_add(1))).fold(xmax.max(self.xmax()), |m, x| m.max(x));
        let mut out: Vec<u32> = running.into_iter().filter(|&x| !is_pulled(Xid(x))).collect();
        let t = crate::shmem::table();
        for &rel in &self.rels {
            let named = t.holders_between(rel, self.xmax(), xmax, MAX_SPLICED_XIDS, &mut |x| {
                if !is_pulled(x) && x != backend::my_xid_if_any() {
                    out.push(x.0);
                }
            });
            if !named {
                return None;
            }
        }
        out.sort_unstable();
        out.dedup();
        Some((out, xmax))
    }

    /// [`BaseSnapshot::spliced`], allocated in `cx`: the snapshot lives as long as
    /// that context (or as the base, when nothing is pulled in).
    ///
    /// # Safety
    /// `cx` is a valid memory context.
    pub unsafe fn spliced_in(&self, cx: pg_sys::MemoryContext, pulled: &[Xid]) -> Snapshot {
        // SAFETY: switching to a valid context and back (an ERROR in
        // between aborts the transaction, which resets the current context).
        unsafe { PgMemoryContexts::For(cx).switch_to(|_| self.spliced(pulled)) }
    }

    /// The base with `pulled` folded in, allocated in the current memory
    /// context: pulled holders become visible if they committed, writers
    /// that started after the base snapshot stay invisible unless pulled.
    ///
    /// The result is an unregistered template (`copied` is false):
    /// `RegisterSnapshot` makes a registered copy of it, and scans may read
    /// at it directly while it lives.  With nothing pulled in it is the base
    /// itself.  The caller checked [`BaseSnapshot::can_pull`].
    pub fn spliced(&self, pulled: &[Xid]) -> Snapshot {
        if pulled.is_empty() {
            return self.snap;
        }
        let is_pulled = |x: Xid| pulled.binary_search_by_key(&x.0, |p| p.0).is_ok();
        // In progress for the result: the base's in-progress xids that were
        // not pulled, plus the xids at or above its xmax that must stay
        // hidden (hidden_after), up to the new xmax.  With suboverflowed
        // set, Postgres maps a subxid to its top-level xid before searching
        // the list, so subxids need no entry.
        let mut xip: Vec<u32> = self.xip.iter().filter(|&&x| !is_pulled(x)).map(|x| x.0).collect();
        let mut new_xmax = self.spliced_xmax(pulled);
        match self.hidden_after(pulled) {
            Some((h, xmax)) => {
                xip.extend(h);
                new_xmax = xmax;
            }
            // Callers checked can_pull; without it, every xid in the range.
            None => {
                let mut x = self.xmax();
                while x.precedes(new_xmax) {
                    if x.is_valid() && !is_pulled(x) {
                        xip.push(x.0);
                    }
                    x = Xid(x.0.wrapping_add(1));
                }
            }
        }
        xip.sort_unstable();
        xip.dedup();
        // SAFETY: we build a private copy of a valid MVCC snapshot: same
        // xmin (so our proc's xmin still protects everything it can see),
        // the edited in-progress list, and subtransactions resolved through
        // pg_subtrans (suboverflowed) because the copy lists no subxids.
        unsafe {
            let bytes = std::mem::size_of::<pg_sys::SnapshotData>() + 4 * xip.len().max(1);
            let s = pg_sys::palloc0(bytes) as *mut pg_sys::SnapshotData;
            std::ptr::copy_nonoverlapping(self.snap, s, 1);
            let arr = (s as *mut u8).add(std::mem::size_of::<pg_sys::SnapshotData>()) as *mut pg_sys::TransactionId;
            for (i, v) in xip.iter().enumerate() {
                *arr.add(i) = pg_sys::TransactionId::from(*v);
            }
            (*s).xip = arr;
            (*s).xcnt = xip.len() as u32;
            (*s).xmax = pg_sys::TransactionId::from(new_xmax.0);
            (*s).subxip = std::ptr::null_mut();
            (*s).subxcnt = 0;
            (*s).suboverflowed = true;
            (*s).copied = false;
            (*s).active_count = 0;
            (*s).regd_count = 0;
            (*s).ph_node = std::mem::zeroed();
            s
        }
    }
}

/// Whether an assigned xid is a top-level transaction's (not a
/// subtransaction's).
fn top_level(x: Xid) -> bool {
    let t = pg_sys::TransactionId::from(x.0);
    // SAFETY: pg_subtrans covers every assigned xid at or after our xmin,
    // which the base snapshot holds back.
    unsafe { pg_sys::SubTransGetTopmostTransaction(t) == t }
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
/// and takes part in deadlock detection.  Returns microseconds waited.
pub fn wait_for(xid: Xid) -> i64 {
    // SAFETY: reading the clock and waiting on a transaction lock; with
    // XLTW_None the relation and tuple are not used.
    unsafe {
        let t0 = pg_sys::GetCurrentTimestamp();
        pg_sys::XactLockTableWait(
            pg_sys::TransactionId::from(xid.0),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            pg_sys::XLTW_Oper::XLTW_None,
        );
        let us = pg_sys::GetCurrentTimestamp() - t0;
        backend::count(Stat::WaitMicros, us as u64);
        us
    }
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
    fn splicing_makes_pulled_holders_visible_and_keeps_the_rest_running() {
        let m = my_xmin();
        // The base: xids [m-40, m-20) known, m-38, m-30 and m-25 running.
        let snap = snapshot_with(m - 40, m - 20, &[m - 25, m - 38, m - 30]);
        // SAFETY: a valid snapshot in the current context, which outlives
        // the test; `after` read after it was made.
        let base = unsafe { BaseSnapshot::of(snap, next_xid()) };
        let view = base.view(&[]);
        assert_eq!(view.xip, &[Xid(m - 38), Xid(m - 30), Xid(m - 25)], "sorted for binary search");
        assert_eq!((view.xmin, view.xmax), (Xid(m - 40), Xid(m - 20)));
        assert!(running(snap, m - 30) && running(snap, m - 15) && !running(snap, m - 35));

        // Pull in one holder the base saw running and one it did not know.
        let pulled = [Xid(m - 30), Xid(m - 15)];
        assert!(base.can_pull(&pulled));
        let next_before = next_xid().0;
        let s = base.spliced(&pulled);
        assert!(!running(s, m - 30) && !running(s, m - 15), "pulled holders are visible");
        assert!(running(s, m - 38) && running(s, m - 25), "the base's other running xids still run");
        for x in [m - 20, m - 16, m - 14, m - 1] {
            assert!(running(s, x), "xid {x}, unknown to the base and not pulled, still runs");
        }
        assert!(!running(s, m - 35) && !running(s, m - 41), "ended before the base: visible");
        // SAFETY: `s` is the snapshot just built.
        let (xmin, xmax, xcnt, overflowed) =
            unsafe { ((*s).xmin, (*s).xmax.into_inner(), (*s).xcnt, (*s).suboverflowed) };
        assert_eq!(xmin, pg_sys::TransactionId::from(m - 40), "xmin stays, so our proc's xmin still protects it");
        assert!(xmax >= next_before, "xmax {xmax} is past every xid assigned ({next_before})");
        assert!(running(s, xmax) && running(s, xmax + 7), "xids from the new xmax on are running");
        // The base's 2 unpulled xids, plus [m-20, xmax) less the one pulled.
        assert_eq!(xcnt, 2 + (xmax - (m - 20)) - 1);
        assert!(overflowed, "subtransactions resolve through pg_subtrans");
        // Nothing pulled in: the base itself.
        assert_eq!(base.spliced(&[]), snap);
    }

    #[pg_test]
    fn pulling_in_is_bounded_by_max_spliced_xids() {
        let n = next_xid().0;
        let m = my_xmin();
        let xmax = n - 10;
        // SAFETY: a valid snapshot in the current context; `after` read
        // after it was made.
        let base = unsafe { BaseSnapshot::of(snapshot_with(m - 40, xmax, &[]), next_xid()) };
        assert!(base.can_pull(&[]), "nothing to pull is always within bounds");
        // The spliced xmax is one past the newest pulled xid, at least.
        assert!(base.can_pull(&[Xid(xmax + MAX_SPLICED_XIDS - 1)]));
        // Every xid from the snapshot's xmax up to the pulled one stays in
        // progress but the pulled one itself: MAX_SPLICED_XIDS of them fit.
        assert!(base.can_pull(&[Xid(xmax + MAX_SPLICED_XIDS)]));
        assert!(!base.can_pull(&[Xid(xmax + MAX_SPLICED_XIDS + 1)]));
        assert!(!base.can_pull(&[Xid(m - 30), Xid(xmax + 2 * MAX_SPLICED_XIDS)]));
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
