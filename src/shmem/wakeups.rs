//! Wake-ups for `pgkvx.wait_for`: consumers sleep on their latch, and a
//! writer's commit sets the latches of the consumers of its tables whose
//! cursor it passes -- a key it wrote lies past the cursor.
//!
//! Shared memory holds a small open-addressed table of **wait slots**, one
//! per latched table that anyone waited on -- in `wait_for`, or in a read
//! that waited for a writer (its per-table wait counts live here too, for
//! `pgkvx.wait_stats()` and `pgkvx.stats(rel)`) -- (keyed by database and
//! relation oid; claimed and freed under a claim flag, freed when the table
//! is dropped or disabled, and given to another table when all are taken
//! and nobody waits on it, so no role can use them up; slot 0 takes a
//! table only when every other slot has a waiter), each with the number
//! of sessions waiting on it now and cumulative statistics, plus a global
//! count of waiting sessions and one **waiter record** per backend: the
//! table it waits on and its cursor (also for `pgkvx.waiters`).
//!
//! What a commit does (`xact_end`, from the transaction callback, after
//! `ProcArrayEndTransaction`, so the commit is visible to new snapshots):
//! if no session waits anywhere — one atomic load — nothing.  Otherwise for
//! each table the transaction latched (noted by [`note_write`] as latches
//! are published, with the least and greatest key written) whose slot
//! counts a waiter, it reads the waiter records and sets the latch of each
//! waiter on that table whose cursor one of those keys passes.  An abort
//! wakes nobody.
//!
//! What a waiter does (`api/wait_for.rs`): registers (its record, then the
//! slot's count), resets its latch, and only then looks for a committed
//! key past its cursor with a fresh snapshot; if none, it sleeps on its
//! latch, and after every wake-up it resets the latch and looks again.  No
//! wake-up is lost: a commit that its look did not see became visible
//! after the look's snapshot was taken under ProcArrayLock, so the
//! committer's later read of the records sees the registration, and the
//! latch it sets makes the sleep that follows the look return at once.

use pgkvx_latch::{KeyBuf, RelId, Span};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering::SeqCst};

const REGION_NAME: &std::ffi::CStr = c"pgkvx wake-ups";
/// Key of the shared slot 0, which takes tables once the others are used.
const OVERFLOW_KEY: u64 = u64::MAX;
/// Key of a freed slot: probes go on past it, claims may take it.
const FREED_KEY: u64 = u64::MAX - 1;

/// Cumulative per-table counters of a wait slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// `wait_for` calls.
    pub calls: u64,
    /// Calls that found a row at once, without sleeping.
    pub immediate: u64,
    /// Calls that slept and were woken to a row.
    pub woken: u64,
    /// Calls that ended at their timeout.
    pub timeouts: u64,
    /// Microseconds spent in calls that slept.
    pub wait_us: u64,
    /// Commits that woke one of this table's waiters (their keys passed
    /// its cursor).
    pub broadcasts: u64,
    /// Wake-ups after which there was still nothing past the cursor.
    pub spurious: u64,
    /// Waits of reads (LIMIT scans, key-order reads, `arrow_scan`) for a
    /// writer in flight in this table.
    pub read_waits: u64,
    /// Microseconds those reads waited.
    pub read_wait_us: u64,
}

#[repr(C)]
struct Header {
    /// Sessions waiting now, all tables: what a commit reads first.
    waiting: AtomicU32,
    /// Held (1) while a backend claims or frees a slot: a bounded probe,
    /// nothing that waits, so that no key is ever claimed twice.
    claiming: AtomicU32,
    nslots: u32,
    nwaiters: u32,
    /// On a hot standby: broadcast whenever recovery replays the end of a
    /// transaction that logged latches; readers waiting for one sleep on it.
    replayed_end: UnsafeCell<pg_sys::ConditionVariable>,
    /// On a hot standby: the startup process's PGPROC number (-1: none
    /// yet), so that readers waiting for replay see when replay waits for
    /// them.
    startup_proc: AtomicI32,
}

#[repr(C)]
struct Slot {
    /// (database << 32 | relation); 0 while free.
    key: AtomicU64,
    waiters: AtomicU32,
    calls: AtomicU64,
    immediate: AtomicU64,
    woken: AtomicU64,
    timeouts: AtomicU64,
    wait_us: AtomicU64,
    broadcasts: AtomicU64,
    spurious: AtomicU64,
    read_waits: AtomicU64,
    read_wait_us: AtomicU64,
}

/// One backend's wait: what commits read to decide whether to wake it,
/// and what the `pgkvx.waiters` view shows.
#[repr(C)]
struct WaiterRec {
    /// The table's key while waiting, 0 otherwise.
    key: AtomicU64,
    pid: AtomicI32,
    since_us: AtomicI64,
    wakeups: AtomicU32,
    /// Odd while `pass` and `bound` change: a commit that reads them then,
    /// or sees this change under it, wakes the waiter (at worst once for
    /// nothing) instead of trusting a torn cursor.
    generation: AtomicU32,
    /// How a commit passes the cursor ([`Pass`]).
    pass: AtomicU32,
    bound: UnsafeCell<KeyBuf>,
}

// SAFETY: `bound` is written only by its own backend, between two bumps
// of `generation`, and read by others only as a seqlock reader that
// discards what it read when the generation moved; everything else is
// atomic.  The region is shared between processes by design.
unsafe impl Sync for WaiterRec {}

/// Which commits pass a waiter's cursor, given the least key `lo` and the
/// greatest end `hi` of the spans they latched in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Any commit to the table (no cursor).
    Any,
    /// One that wrote a key at or past `bound` (`hi > bound`).
    Above(KeyBuf),
    /// One that wrote a key below `bound` (`lo < bound`).
    Below(KeyBuf),
}

impl Pass {
    /// For a cursor of encoded key `bytes` (a prefix of the key's encoding
    /// when `truncated`): `after` it, or `before` it.
    pub fn of_cursor(bytes: &[u8], truncated: bool, before: bool) -> Pass {
        match (before, truncated) {
            // The least key past c is c ++ 0x00: a span ending above it
            // holds one.  Past a truncated prefix p: any key above p.
            (false, false) => Pass::Above(Span::point(bytes).end),
            (false, true) => Pass::Above(KeyBuf::floor(bytes)),
            // Below c: a span starting below it.  Below a truncated
            // prefix: anything starting below the prefix's end.
            (true, false) => Pass::Below(KeyBuf::floor(bytes)),
            (true, true) => Pass::Below(KeyBuf::prefix_successor(bytes)),
        }
    }

    /// Whether a commit that latched spans from `lo` to `hi` passes it.
    pub fn passed_by(&self, lo: &KeyBuf, hi: &KeyBuf) -> bool {
        match self {
            Pass::Any => true,
            Pass::Above(b) => hi > b,
            Pass::Below(b) => lo < b,
        }
    }

    fn encode(&self) -> (u32, KeyBuf) {
        match self {
            Pass::Any => (0, KeyBuf::EMPTY),
            Pass::Above(b) => (1, *b),
            Pass::Below(b) => (2, *b),
        }
    }

    fn decode(mode: u32, bound: KeyBuf) -> Pass {
        match mode {
            1 => Pass::Above(bound),
            2 => Pass::Below(bound),
            _ => Pass::Any,
        }
    }
}

struct Region {
    hdr: &'static Header,
    slots: &'static [Slot],
    waiters: &'static [WaiterRec],
}

struct ProcessGlobal(UnsafeCell<Option<Region>>);
// SAFETY: Postgres processes are single-threaded; set once by the shmem
// startup hook before anything reads it in this process.
unsafe impl Sync for ProcessGlobal {}
static REGION: ProcessGlobal = ProcessGlobal(UnsafeCell::new(None));

/// A latched table this transaction wrote, with the least start and the
/// greatest end of the spans it latched there.
#[derive(Clone, Copy)]
struct Written {
    key: u64,
    lo: KeyBuf,
    hi: KeyBuf,
}

thread_local! {
    /// Latched tables this transaction wrote (published a latch on); the
    /// last one noted comes last: most transactions write one table many
    /// times.
    static WRITTEN: RefCell<Vec<Written>> = const { RefCell::new(Vec::new()) };
    static EXIT_HOOK_SET: Cell<bool> = const { Cell::new(false) };
    /// The slot this backend is counted in while it waits.
    static MY_WAIT: Cell<Option<u32>> = const { Cell::new(None) };
}

fn nslots_for(max_tables: u32) -> u32 {
    (max_tables.saturating_mul(2)).clamp(64, 1 << 20).next_power_of_two() + 1
}

fn sizes(max_tables: u32, max_backends: u32) -> (usize, usize, usize) {
    let hdr = std::mem::size_of::<Header>().next_multiple_of(64);
    let slots = nslots_for(max_tables) as usize * std::mem::size_of::<Slot>();
    let waiters = max_backends as usize * std::mem::size_of::<WaiterRec>();
    (hdr, slots, waiters)
}

/// Shared memory the region needs.
pub fn region_size(max_tables: u32, max_backends: u32) -> usize {
    let (h, s, w) = sizes(max_tables, max_backends);
    h + s + w
}

/// Creates or attaches the region; called from the shmem startup hook with
/// AddinShmemInitLock held.
///
/// # Safety
/// Called once per process from the shmem startup hook, under
/// AddinShmemInitLock.
pub unsafe fn startup(max_tables: u32, max_backends: u32) {
    let (h, s, _) = sizes(max_tables, max_backends);
    let size = region_size(max_tables, max_backends);
    let nslots = nslots_for(max_tables);
    // SAFETY: the add-in shared memory protocol; the region is zeroed when
    // new, only attached when found.  Atomics and key buffers are valid
    // when zeroed.
    unsafe {
        let mut found = false;
        let mem = pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found) as *mut u8;
        if !found {
            std::ptr::write_bytes(mem, 0, size);
            let hdr = mem as *mut Header;
            (*hdr).nslots = nslots;
            (*hdr).nwaiters = max_backends;
            pg_sys::ConditionVariableInit((*hdr).replayed_end.get());
            (*hdr).startup_proc.store(-1, SeqCst);
            let slots = mem.add(h) as *mut Slot;
            (*slots).key.store(OVERFLOW_KEY, SeqCst);
        }
        let hdr = &*(mem as *const Header);
        let slots = std::slice::from_raw_parts(mem.add(h) as *const Slot, hdr.nslots as usize);
        let waiters = std::slice::from_raw_parts(mem.add(h + s) as *const WaiterRec, hdr.nwaiters as usize);
        *REGION.0.get() = Some(Region { hdr, slots, waiters });
    }
}

fn region() -> Option<&'static Region> {
    // SAFETY: see ProcessGlobal.
    unsafe { &*REGION.0.get() }.as_ref()
}

fn key_of(rel: RelId) -> u64 {
    (u64::from(rel.db()) << 32) | u64::from(rel.rel())
}

fn home(key: u64, nslots: u32) -> u32 {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    1 + (h % u64::from(nslots - 1)) as u32
}

/// The slot of `key`, if one was ever claimed for it (writers).
fn find(r: &Region, key: u64) -> Option<u32> {
    let n = r.hdr.nslots;
    let mut i = home(key, n);
    for _ in 1..n {
        match r.slots[i as usize].key.load(SeqCst) {
            k if k == key => return Some(i),
            0 => return None,
            _ => {}
        }
        i = if i + 1 == n { 1 } else { i + 1 };
    }
    None
}

/// Runs `f` holding the claim flag: a few atomic operations, never a
/// wait, so the flag is spun on.
fn claiming<T>(r: &Region, f: impl FnOnce() -> T) -> T {
    while r.hdr.claiming.compare_exchange_weak(0, 1, SeqCst, SeqCst).is_err() {
        std::hint::spin_loop();
    }
    let out = f();
    r.hdr.claiming.store(0, SeqCst);
    out
}

/// The slot of `key`, claimed if need be.  When every slot is taken, one
/// that nobody waits on now gives its place up (its counts go to slot 0,
/// which sums the tables without a slot of their own), so tables that were
/// waited on once cannot use the slots up; slot 0 only when every slot has
/// a waiter.
fn find_or_claim(r: &Region, key: u64) -> u32 {
    if let Some(i) = find(r, key) {
        return i;
    }
    claiming(r, || claim_locked(r, key))
}

/// [`find_or_claim`] under the claim flag.
fn claim_locked(r: &Region, key: u64) -> u32 {
    if let Some(i) = find(r, key) {
        return i;
    }
    let n = r.hdr.nslots;
    let take = |i: u32| {
        let s = &r.slots[i as usize];
        s.retire_stats_into(&r.slots[0]);
        s.key.store(key, SeqCst);
        i
    };
    let mut i = home(key, n);
    for _ in 1..n {
        let k = r.slots[i as usize].key.load(SeqCst);
        if k == 0 || k == FREED_KEY {
            return take(i);
        }
        i = if i + 1 == n { 1 } else { i + 1 };
    }
    // Full: no slot is empty, so every probe runs the whole table, and a
    // slot given to `key` anywhere is found.  Registrations hold the claim
    // flag, so a slot with no waiters gets none while it changes hands.
    for _ in 1..n {
        if r.slots[i as usize].waiters.load(SeqCst) == 0 {
            return take(i);
        }
        i = if i + 1 == n { 1 } else { i + 1 };
    }
    0
}

/// A latched table was dropped or disabled (this transaction committed
/// it): its waiters wake to find it gone, and its slot is freed.
pub fn table_gone(rel: RelId) {
    let Some(r) = region() else { return };
    let key = key_of(rel);
    let Some(i) = find(r, key) else { return };
    wake(r, i, key, &KeyBuf::EMPTY, &KeyBuf::INFINITE);
    claiming(r, || {
        let s = &r.slots[i as usize];
        if s.key.load(SeqCst) == key {
            s.key.store(FREED_KEY, SeqCst);
        }
    });
}

impl Slot {
    fn counters(&self) -> [&AtomicU64; 9] {
        [
            &self.calls,
            &self.immediate,
            &self.woken,
            &self.timeouts,
            &self.wait_us,
            &self.broadcasts,
            &self.spurious,
            &self.read_waits,
            &self.read_wait_us,
        ]
    }

    /// Moves a freed slot's counts to slot 0 (which sums the tables that
    /// have no slot of their own, gone ones included) before the slot
    /// serves another table: the totals never go back.
    fn retire_stats_into(&self, overflow: &Slot) {
        for (c, o) in self.counters().into_iter().zip(overflow.counters()) {
            o.fetch_add(c.swap(0, SeqCst), SeqCst);
        }
    }
}

/// Notes that this transaction published a latch on `span` of `rel`, so
/// that its commit wakes the table's waiters whose cursor the span passes.
/// Cheap: the table written last is compared first, and most transactions
/// write one table many times.
pub fn note_write(rel: RelId, span: &Span) {
    let key = key_of(rel);
    WRITTEN.with(|w| {
        let Ok(mut w) = w.try_borrow_mut() else { return };
        let i = match w.iter().rposition(|x| x.key == key) {
            Some(i) => i,
            None => {
                w.push(Written { key, lo: span.start, hi: span.end });
                return;
            }
        };
        let x = &mut w[i];
        x.lo = x.lo.min(span.start);
        x.hi = x.hi.max(span.end);
        let last = w.len() - 1;
        w.swap(i, last);
    });
}

/// The transaction callback's part: a commit wakes the waiters of the
/// tables it wrote whose cursor it passes, an abort wakes nobody.
/// Panic-free.
pub fn xact_end(event: pg_sys::XactEvent::Type) {
    use pg_sys::XactEvent::*;
    let commit = match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => true,
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => false,
        _ => return,
    };
    let written = WRITTEN.with(|w| w.try_borrow_mut().map(|mut w| std::mem::take(&mut *w)).unwrap_or_default());
    if !commit || written.is_empty() {
        return;
    }
    let Some(r) = region() else { return };
    // The one check a commit pays when nobody waits anywhere.
    if r.hdr.waiting.load(SeqCst) == 0 {
        return;
    }
    for w in written {
        let i = find(r, w.key).unwrap_or(0);
        wake(r, i, w.key, &w.lo, &w.hi);
    }
}

/// Sets the latch of every waiter on table `key` (counted in slot `i`)
/// whose cursor a commit that latched spans from `lo` to `hi` passes.
fn wake(r: &Region, i: u32, key: u64, lo: &KeyBuf, hi: &KeyBuf) {
    // Its waiters count in its slot, or in slot 0 if they came when every
    // slot was taken (and it got one since).
    let s = &r.slots[i as usize];
    if s.waiters.load(SeqCst) == 0 && r.slots[0].waiters.load(SeqCst) == 0 {
        return;
    }
    let mut woke = false;
    for (procno, w) in r.waiters.iter().enumerate() {
        if w.key.load(SeqCst) != key {
            continue;
        }
        let g = w.generation.load(SeqCst);
        let pass = Pass::decode(w.pass.load(SeqCst), {
            // SAFETY: a seqlock read (see WaiterRec); a torn value is
            // discarded below.
            unsafe { std::ptr::read_volatile(w.bound.get()) }
        });
        let steady = g % 2 == 0 && w.generation.load(SeqCst) == g;
        if steady && !pass.passed_by(lo, hi) {
            continue;
        }
        woke = true;
        // SAFETY: the PGPROC of a live backend slot (procno is below the
        // records' count, which is MaxBackends); SetLatch takes no lock
        // that can raise, and a latch of a backend that exited is left
        // set harmlessly for the next one.
        unsafe { pg_sys::SetLatch(&raw mut (*(*pg_sys::ProcGlobal).allProcs.add(procno)).procLatch) };
    }
    if woke {
        s.broadcasts.fetch_add(1, SeqCst);
    }
}

fn my_procno(r: &Region) -> Option<usize> {
    let n = crate::pg::my_proc_number()?;
    usize::try_from(n).ok().filter(|&n| n < r.waiters.len())
}

/// This backend's registration as a waiter on one table: counted in the
/// table's slot (so commits there broadcast) until dropped, or until the
/// backend exits (FATAL while asleep unwinds nothing).
pub struct Waiting {
    slot: u32,
}

impl Waiting {
    /// Registers as a waiter on `rel`, woken by commits that `pass`.
    pub fn register(rel: RelId, pass: Pass) -> Waiting {
        let r = region().unwrap_or_else(|| super::not_preloaded());
        ensure_exit_hook();
        unregister(); // a leftover of an earlier call (cannot happen, but cheap)
        let key = key_of(rel);
        // The record first, then the counts commits look at.
        if let Some(p) = my_procno(r) {
            let w = &r.waiters[p];
            // SAFETY: plain reads of backend globals and the clock.
            let (pid, now) = unsafe { (pg_sys::MyProcPid, pg_sys::GetCurrentTimestamp()) };
            let (mode, bound) = pass.encode();
            w.generation.fetch_add(1, SeqCst);
            w.pass.store(mode, SeqCst);
            // SAFETY: our own record; readers check the generation.
            unsafe { std::ptr::write_volatile(w.bound.get(), bound) };
            w.generation.fetch_add(1, SeqCst);
            w.pid.store(pid, SeqCst);
            w.since_us.store(now, SeqCst);
            w.wakeups.store(0, SeqCst);
            w.key.store(key, SeqCst);
        }
        // Counted in the slot before the claim flag goes: a slot with a
        // waiter never changes hands.
        let slot = claiming(r, || {
            let i = claim_locked(r, key);
            r.slots[i as usize].waiters.fetch_add(1, SeqCst);
            i
        });
        let s = &r.slots[slot as usize];
        s.calls.fetch_add(1, SeqCst);
        MY_WAIT.with(|c| c.set(Some(slot)));
        r.hdr.waiting.fetch_add(1, SeqCst);
        Waiting { slot }
    }

    /// Counts one wake-up of this waiter.
    pub fn woken(&self) {
        if let Some(r) = region() {
            if let Some(p) = my_procno(r) {
                r.waiters[p].wakeups.fetch_add(1, SeqCst);
            }
        }
    }

    /// Counts how the call ended: at once, woken to a row, or at its
    /// timeout; `slept_us` is the time since it started; `spurious` the
    /// wake-ups that found nothing.
    pub fn finish(&self, outcome: Outcome, slept_us: u64, spurious: u64) {
        let Some(r) = region() else { return };
        let s = &r.slots[self.slot as usize];
        match outcome {
            Outcome::Immediate => s.immediate.fetch_add(1, SeqCst),
            Outcome::Woken => s.woken.fetch_add(1, SeqCst),
            Outcome::Timeout => s.timeouts.fetch_add(1, SeqCst),
        };
        if outcome != Outcome::Immediate {
            s.wait_us.fetch_add(slept_us, SeqCst);
        }
        s.spurious.fetch_add(spurious, SeqCst);
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        unregister();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Immediate,
    Woken,
    Timeout,
}

/// Undoes this backend's registration, if any.  Idempotent, panic-free.
fn unregister() {
    let Some(slot) = MY_WAIT.try_with(|c| c.take()).ok().flatten() else { return };
    let Some(r) = region() else { return };
    r.slots[slot as usize].waiters.fetch_sub(1, SeqCst);
    r.hdr.waiting.fetch_sub(1, SeqCst);
    if let Some(p) = my_procno(r) {
        r.waiters[p].key.store(0, SeqCst);
    }
}

fn ensure_exit_hook() {
    if EXIT_HOOK_SET.with(|c| c.replace(true)) {
        return;
    }
    // SAFETY: registering a callback for this backend's exit.
    unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
}

/// A backend terminated while asleep (FATAL does not unwind) still leaves
/// the count.
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    unregister();
}

/// Counts a read's wait of `us` microseconds for a writer in `rel`, in
/// the table's slot (claimed if need be, as a waiter would): the
/// per-table wait statistics of `pgkvx.wait_stats()`.  Atomics only.
pub fn count_read_wait(rel: RelId, us: u64) {
    let Some(r) = region() else { return };
    let s = &r.slots[find_or_claim(r, key_of(rel)) as usize];
    s.read_waits.fetch_add(1, SeqCst);
    s.read_wait_us.fetch_add(us, SeqCst);
}

/// One table's wait statistics and its waiters now.
pub struct TableWaits {
    pub rel: RelId,
    pub waiting: u32,
    pub stats: WaitStats,
}

fn slot_stats(s: &Slot) -> WaitStats {
    WaitStats {
        calls: s.calls.load(SeqCst),
        immediate: s.immediate.load(SeqCst),
        woken: s.woken.load(SeqCst),
        timeouts: s.timeouts.load(SeqCst),
        wait_us: s.wait_us.load(SeqCst),
        broadcasts: s.broadcasts.load(SeqCst),
        spurious: s.spurious.load(SeqCst),
        read_waits: s.read_waits.load(SeqCst),
        read_wait_us: s.read_wait_us.load(SeqCst),
    }
}

/// Every claimed slot but the shared one, and the shared one's counters
/// (tables beyond the slots) separately.
pub fn per_table() -> (Vec<TableWaits>, TableWaits) {
    let mut out = Vec::new();
    let Some(r) = region() else {
        return (out, TableWaits { rel: RelId::new(0, 0), waiting: 0, stats: WaitStats::default() });
    };
    for s in &r.slots[1..] {
        let key = s.key.load(SeqCst);
        if key != 0 && key != FREED_KEY {
            let rel = RelId::new((key >> 32) as u32, key as u32);
            out.push(TableWaits { rel, waiting: s.waiters.load(SeqCst), stats: slot_stats(s) });
        }
    }
    let s0 = &r.slots[0];
    (out, TableWaits { rel: RelId::new(0, 0), waiting: s0.waiters.load(SeqCst), stats: slot_stats(s0) })
}

/// One table's statistics and the sessions waiting on it now; zeros for a
/// table that never had a slot of its own.
pub fn table_stats(rel: RelId) -> (WaitStats, u32) {
    let Some(r) = region() else { return (WaitStats::default(), 0) };
    match find(r, key_of(rel)) {
        Some(i) => {
            let s = &r.slots[i as usize];
            (slot_stats(s), s.waiters.load(SeqCst))
        }
        None => (WaitStats::default(), 0),
    }
}

/// Totals over all tables, and the sessions waiting now.
pub fn totals() -> (WaitStats, u32) {
    let mut t = WaitStats::default();
    let Some(r) = region() else { return (t, 0) };
    for s in r.slots {
        let x = slot_stats(s);
        t.calls += x.calls;
        t.immediate += x.immediate;
        t.woken += x.woken;
        t.timeouts += x.timeouts;
        t.wait_us += x.wait_us;
        t.broadcasts += x.broadcasts;
        t.spurious += x.spurious;
        t.read_waits += x.read_waits;
        t.read_wait_us += x.read_wait_us;
    }
    (t, r.hdr.waiting.load(SeqCst))
}

/// A session waiting now.
pub struct WaiterInfo {
    pub pid: i32,
    pub rel: RelId,
    pub since_us: i64,
    pub wakeups: u32,
}

/// The sessions waiting now.
pub fn waiters() -> Vec<WaiterInfo> {
    let Some(r) = region() else { return Vec::new() };
    r.waiters
        .iter()
        .filter_map(|w| {
            let key = w.key.load(SeqCst);
            (key != 0).then(|| WaiterInfo {
                pid: w.pid.load(SeqCst),
                rel: RelId::new((key >> 32) as u32, key as u32),
                since_us: w.since_us.load(SeqCst),
                wakeups: w.wakeups.load(SeqCst),
            })
        })
        .collect()
}

/// On a hot standby, recovery replayed the commit of a transaction that
/// latched keys from `lo` to `hi` of `rel`: wakes that table's `wait_for`
/// callers whose cursor it passes, as the commit did on the primary.
pub fn replayed_commit(rel: RelId, lo: &KeyBuf, hi: &KeyBuf) {
    let Some(r) = region() else { return };
    if r.hdr.waiting.load(SeqCst) == 0 {
        return;
    }
    let key = key_of(rel);
    let i = find(r, key).unwrap_or(0);
    wake(r, i, key, lo, hi);
}

/// Recovery replayed the end of a transaction that logged latches: wakes
/// the standby's readers waiting for one (standby/redo.rs).
pub fn replayed_end() {
    let Some(r) = region() else { return };
    // SAFETY: a condition variable in shared memory, initialised with the
    // region; broadcasting takes its spinlock only.
    unsafe { pg_sys::ConditionVariableBroadcast(r.hdr.replayed_end.get()) };
}

/// Recovery starts in this process (the startup process): readers
/// waiting for replay watch it from now on.
pub fn note_startup_process() {
    let Some(r) = region() else { return };
    r.hdr.startup_proc.store(crate::pg::my_proc_number().unwrap_or(-1), SeqCst);
}

/// How long a standby reader sleeps before it looks again without being
/// woken: whether replay now waits on a recovery conflict (which wakes
/// nobody), and a writer whose end was never logged (its primary crashed),
/// which ends for the standby when recovery learns so from the primary's
/// running transactions.
const STANDBY_RECHECK_MS: i64 = 20;

/// How a sleep for replay ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replayed {
    /// `ended()` said so.
    Ended,
    /// Replay waits on a recovery conflict this session is part of, so it
    /// would never reach the end waited for.
    ReplayWaits,
}

/// On a hot standby: sleeps until `ended()` says so, woken whenever
/// recovery replays the end of a latching transaction, or until replay
/// itself waits on a recovery conflict with this session.  The sleep is interruptible
/// (cancel, statement_timeout, recovery conflicts) and shows as wait event
/// Extension.
pub fn sleep_until_replayed(ended: impl Fn() -> bool) -> Replayed {
    let Some(r) = region() else { return Replayed::Ended };
    let cv = r.hdr.replayed_end.get();
    let startup = r.hdr.startup_proc.load(SeqCst);
    // SAFETY: the condition variable protocol: prepare, test, sleep, and
    // cancel on the way out; the sleep checks for interrupts, and an error
    // there cancels the sleep at abort.
    unsafe {
        pg_sys::ConditionVariablePrepareToSleep(cv);
        let mut how = Replayed::Ended;
        while !ended() {
            if crate::pg::recovery::replay_waits_on_me(startup) {
                how = Replayed::ReplayWaits;
                break;
            }
            pg_sys::ConditionVariableTimedSleep(cv, STANDBY_RECHECK_MS, pg_sys::PG_WAIT_EXTENSION);
        }
        crate::pg::compat::condition_variable_cancel_sleep();
        how
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_counts_are_powers_of_two_plus_the_shared_one() {
        assert_eq!(nslots_for(1), 65);
        assert_eq!(nslots_for(256), 513);
        assert_eq!(nslots_for(300), 1025);
    }

    #[test]
    fn a_commit_passes_a_cursor_only_with_a_key_past_it() {
        let k = |b: &[u8]| KeyBuf::floor(b);
        let span = |a: &[u8], b: &[u8]| Span { start: k(a), end: k(b) };
        let passes = |p: Pass, s: Span| p.passed_by(&s.start, &s.end);
        let after5 = Pass::of_cursor(&[5], false, false);
        assert!(!passes(after5, Span::point(&[5])), "the cursor's own key is not past it");
        assert!(!passes(after5, span(&[1], &[4])));
        assert!(passes(after5, Span::point(&[6])));
        assert!(passes(after5, Span::point(&[5, 0])), "the least key past it");
        assert!(passes(after5, Span::ALL), "TRUNCATE");
        let before5 = Pass::of_cursor(&[5], false, true);
        assert!(!passes(before5, Span::point(&[5])) && !passes(before5, Span::point(&[9])));
        assert!(passes(before5, Span::point(&[4, 9])));
        // A truncated cursor (a prefix of the key): anything that may lie
        // past the real key wakes, never less.
        let after_prefix = Pass::of_cursor(&[5], true, false);
        assert!(passes(after_prefix, Span::point(&[5, 7])) && !passes(after_prefix, Span::point(&[4, 9])));
        let before_prefix = Pass::of_cursor(&[5], true, true);
        assert!(passes(before_prefix, Span::point(&[5, 7])) && !passes(before_prefix, Span::point(&[6])));
        assert!(passes(Pass::Any, Span::point(&[0])));
        for p in [after5, before5, Pass::Any] {
            let (m, b) = p.encode();
            assert_eq!(Pass::decode(m, b), p);
        }
    }

    #[test]
    fn homes_avoid_the_shared_slot() {
        for k in [1u64, 2, 1 << 32 | 5, u64::MAX - 1] {
            let h = home(k, 65);
            assert!((1..65).contains(&h), "{k}: {h}");
        }
    }
}
