//! The latch table handle: write latches in, released latches out.
//!
//! Writers publish a latch (span + holder xid + publication sequence number)
//! into every range its span overlaps, before they change a row.  At commit a
//! latch becomes a tombstone, kept until no snapshot can consider its holder
//! in progress; at abort it goes at once.  Readers look latches up in
//! validate.rs.

use super::holdings::{Cover, Holdings, Latched, Limits};
use super::locks::{Held, LockId, LockSet, Mode};
use super::region::{
    self, bump, BackendSlot, Config, Entry, EntryData, Layout, Parts, RangeBody, RangeMeta, RelId, State, TableData,
    TreeNode, MAX_RANGES_PER_TABLE,
};
use super::span::Span;
use super::stats::{Stat, NSTATS};
use super::tree::{self, NodeStore, NIL};
use super::xid::Xid;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// Released latches pending before a releasing backend drains them itself
/// (normally the maintenance workers drain long before).
const DRAIN_AT: u32 = 4096;

/// Who holds a latch.
#[derive(Clone, Copy, Debug)]
pub struct Holder {
    /// The holder's top-level transaction id; must be assigned.
    pub xid: Xid,
    pub pid: i32,
    /// Wall clock in microseconds, for the age shown in views.
    pub now_us: i64,
    /// The owner of the table latched (a role oid), charged for its slot.
    pub owner: u32,
}

/// What a publication entered.
#[derive(Clone, Copy, Debug)]
struct Published {
    max_load: u32,
    /// The earliest publication number it was given.
    seq_lo: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// No free latch entry (`pgkvx.max_latches`).
    Full,
    /// No free table slot.
    TooManyTables,
    /// No free range for a new table.
    TooManyRanges,
    /// The table's owner has `max_tables_per_owner` slots already.
    TooManyTablesForOwner,
    /// The transaction would hold more latch entries than its budget,
    /// even with every table escalated.
    TransactionBudget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    Aborted,
}

pub struct LatchTable<'r, L: LockSet> {
    pub(crate) p: Parts<'r>,
    pub(crate) locks: L,
}

/// The tree's view of the node pool and the entries.  Only built while a
/// range's lock is held (exclusive when the tree is modified); the pool's
/// free stack is lock-free, shared by all ranges.
pub(crate) struct RangeNodes<'a> {
    hdr: &'a region::Header,
    entries: &'a [Entry],
    nodes: &'a [TreeNode],
    next: &'a [std::sync::atomic::AtomicU32],
}

impl RangeNodes<'_> {
    #[inline(always)]
    fn d(&self, e: u32) -> *const EntryData {
        debug_assert!((e as usize) < self.entries.len());
        // SAFETY: tree slots only ever hold indices of entries of this
        // region (written from alloc() results), so `e` is in bounds;
        // skipping the check matters in the tree's inner loops.
        unsafe { self.entries.get_unchecked(e as usize) }.data.get()
    }
}

impl NodeStore for RangeNodes<'_> {
    #[inline(always)]
    fn node(&self, n: u32) -> *mut tree::Node {
        debug_assert!((n as usize) < self.nodes.len());
        // SAFETY: node links only hold ids alloc_node returned, which are
        // pool indices.
        unsafe { self.nodes.get_unchecked(n as usize) }.0.get()
    }

    fn alloc_node(&self) -> u32 {
        region::stack_pop(&self.hdr.node_free_head, |n| &self.next[n as usize]).unwrap_or(NIL)
    }

    fn free_node(&self, n: u32) {
        region::stack_push(&self.hdr.node_free_head, n, &self.next[n as usize]);
    }

    #[inline(always)]
    fn start(&self, e: u32) -> &super::span::KeyBuf {
        // SAFETY: `e` is in the tree of the range whose lock is held, so its
        // data does not change meanwhile.
        unsafe { &(*self.d(e)).span.start }
    }

    #[inline(always)]
    fn end(&self, e: u32) -> &super::span::KeyBuf {
        // SAFETY: as in start().
        unsafe { &(*self.d(e)).span.end }
    }

    #[inline(always)]
    fn prefetch(&self, n: u32) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.node(n) as *const i8;
            // SAFETY: `n` is a pool index; prefetches are hints that never
            // fault.  A descent reads bytes 0..352 (start heads, kids, end
            // heads); the sixth line only holds the end heads of slots 13+,
            // and prefetching it too measured no different (A/B, noise).
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                for line in 0..5 {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(64 * line));
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = n;
    }
}

impl<'r, L: LockSet> LatchTable<'r, L> {
    /// Bytes needed for a table of this size.
    pub fn region_size(cfg: &Config) -> usize {
        Layout::of(cfg).size
    }

    /// Creates an empty table in `mem`.
    ///
    /// # Safety
    /// `mem` must be `region_size(cfg)` writable bytes, 8-byte aligned, that
    /// nobody else uses during the call and that outlive `'r`.
    pub unsafe fn init(mem: *mut u8, cfg: &Config, locks: L) -> Self {
        // SAFETY: forwarded contract.
        LatchTable { p: unsafe { region::init(mem, cfg) }, locks }
    }

    /// Attaches to a table another process (or an earlier call) created.
    ///
    /// # Safety
    /// `mem` must hold a table written by [`Self::init`] and outlive `'r`.
    pub unsafe fn attach(mem: *mut u8, locks: L) -> Self {
        // SAFETY: forwarded contract.
        LatchTable { p: unsafe { region::attach(mem) }, locks }
    }

    pub fn config(&self) -> Config {
        self.p.hdr.cfg
    }

    pub fn set_max_tables_per_owner(&self, n: u32) {
        self.p.hdr.max_tables_per_owner.store(n, Relaxed);
    }

    pub fn set_range_max_latches(&self, n: u32) {
        self.p.hdr.range_max_latches.store(n.max(16), Relaxed);
    }

    pub fn range_max_latches(&self) -> u32 {
        self.p.hdr.range_max_latches.load(Relaxed)
    }

    /// Publishes the xid horizon: tombstones of holders that precede it can
    /// no longer conflict with any snapshot and are reclaimed.
    pub fn set_horizon(&self, horizon: Xid) {
        self.p.hdr.horizon.store(horizon.0, Release);
    }

    pub fn horizon(&self) -> Xid {
        Xid(self.p.hdr.horizon.load(Acquire))
    }

    /// A maintenance worker is alive at `now_us`.
    pub fn beat(&self, now_us: i64) {
        self.p.hdr.worker_beat.store(now_us, Relaxed);
    }

    /// When a maintenance worker last said it was alive.
    pub fn last_beat(&self) -> i64 {
        self.p.hdr.worker_beat.load(Relaxed)
    }

    /// Free entries left.
    pub fn free_entries(&self) -> u32 {
        self.p.hdr.free_count.load(Relaxed)
    }

    // ---- stats ----------------------------------------------------------

    pub fn count(&self, slot: u32, stat: Stat, n: u64) {
        if let Some(b) = self.p.backends.get(slot as usize) {
            bump(&b.stats[stat as usize], n);
        }
    }

    /// Every counter summed over all backends.
    pub fn stats(&self) -> [u64; NSTATS] {
        let mut out = [0u64; NSTATS];
        for b in self.p.backends {
            for (o, c) in out.iter_mut().zip(b.stats.iter()) {
                *o += c.load(Relaxed);
            }
        }
        out
    }

    // ---- raw access -----------------------------------------------------

    pub(crate) fn entry(&self, i: u32) -> &Entry {
        &self.p.entries[i as usize]
    }

    /// # Safety
    /// The caller holds the lock of the range entry `i` is in (exclusive to
    /// write), or owns `i` because it popped it from the free list.
    // Lock-guarded interior mutability: the lock, not the borrow checker,
    // makes the returned reference exclusive (see the contract).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn data(&self, i: u32) -> &mut EntryData {
        // SAFETY: per the contract nobody else accesses this entry's data.
        unsafe { &mut *self.p.entries[i as usize].data.get() }
    }

    /// # Safety
    /// The Directory lock is held (exclusive to write).
    // Lock-guarded interior mutability: the lock, not the borrow checker,
    // makes the returned reference exclusive (see the contract).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn meta(&self, r: u32) -> &mut RangeMeta {
        // SAFETY: per the contract.
        unsafe { &mut *self.p.ranges[r as usize].meta.get() }
    }

    /// # Safety
    /// Range `r`'s lock is held (exclusive to write).
    // Lock-guarded interior mutability: the lock, not the borrow checker,
    // makes the returned reference exclusive (see the contract).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn body(&self, r: u32) -> &mut RangeBody {
        // SAFETY: per the contract.
        unsafe { &mut *self.p.ranges[r as usize].body.get() }
    }

    /// # Safety
    /// The Directory lock is held (exclusive to write).
    // Lock-guarded interior mutability: the lock, not the borrow checker,
    // makes the returned reference exclusive (see the contract).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn table_data(&self, t: u32) -> &mut TableData {
        // SAFETY: per the contract.
        unsafe { &mut *self.p.tables[t as usize].inner.get() }
    }

    /// # Safety
    /// Exclusive Directory lock held.
    // Lock-guarded interior mutability: the lock, not the borrow checker,
    // makes the returned reference exclusive (see the contract).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn dir(&self) -> &mut region::DirHeader {
        // SAFETY: per the contract.
        unsafe { &mut *self.p.hdr.dir.get() }
    }

    pub(crate) fn nodes(&self) -> RangeNodes<'r> {
        RangeNodes { hdr: self.p.hdr, entries: self.p.entries, nodes: self.p.nodes, next: self.p.node_next }
    }

    pub(crate) fn backend(&self, slot: u32) -> &BackendSlot {
        &self.p.backends[slot as usize]
    }

    pub(crate) fn lock(&self, id: LockId, mode: Mode) -> Held<'_, L> {
        Held::new(&self.locks, id, mode)
    }

    // ---- free list --------------------------------------------------------

    pub(crate) fn alloc(&self) -> Option<u32> {
        let idx = region::stack_pop(&self.p.hdr.free_head, |i| &self.entry(i).free_next)?;
        self.p.hdr.free_count.fetch_sub(1, Relaxed);
        Some(idx)
    }

    /// Returns entry `i` to the free list.
    ///
    /// # Safety
    /// `i` is in no tree, no chain and no tombstone list, and the caller
    /// owns it (nobody can reach it any more).
    pub(crate) unsafe fn free(&self, i: u32) {
        // SAFETY: the caller owns the entry.
        unsafe { *self.data(i) = EntryData::FREE };
        let e = self.entry(i);
        e.state.store(State::Free as u8, Release);
        e.range.store(NIL, Release);
        region::stack_push(&self.p.hdr.free_head, i, &e.free_next);
        self.p.hdr.free_count.fetch_add(1, Relaxed);
    }

    // ---- directory --------------------------------------------------------

    fn hash_slot(&self, rel: RelId) -> usize {
        let h = rel.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        (h % u64::from(self.p.hdr.cfg.max_tables)) as usize
    }

    /// The table slot of `rel`, if it has one.  Directory lock held.
    pub(crate) fn find_table(&self, rel: RelId) -> Option<u32> {
        let n = self.p.tables.len();
        let start = self.hash_slot(rel);
        for k in 0..n {
            let t = ((start + k) % n) as u32;
            // SAFETY: the caller holds the Directory lock.
            let r = unsafe { self.table_data(t) }.rel;
            if r == rel {
                return Some(t);
            }
            if r == RelId::EMPTY {
                return None;
            }
        }
        None
    }

    /// Allocates a range covering `[lo, hi)` of table `t`.  Exclusive
    /// Directory lock held.
    pub(crate) fn new_range(&self, t: u32, lo: super::span::KeyBuf, hi: super::span::KeyBuf) -> Option<u32> {
        // SAFETY: exclusive Directory lock held by the caller.
        let dir = unsafe { self.dir() };
        let r = dir.free_range;
        if r == NIL {
            return None;
        }
        // SAFETY: as above; a free range's body is not reachable by anyone.
        let meta = unsafe { self.meta(r) };
        dir.free_range = meta.next_free;
        dir.ranges_used += 1;
        *meta = RangeMeta { in_use: true, table: t, lo, hi, next_free: NIL };
        let _g = self.lock(LockId::Range(r), Mode::Exclusive);
        // SAFETY: range lock held.
        unsafe { *self.body(r) = RangeBody::EMPTY };
        let slot = &self.p.ranges[r as usize];
        slot.acquires.store(0, Relaxed);
        slot.contended.store(0, Relaxed);
        slot.queue.store(0, Relaxed);
        slot.contended_seen.store(0, Relaxed);
        Some(r)
    }

    /// Returns an empty range to the free list.  Exclusive Directory lock held.
    pub(crate) fn free_range(&self, r: u32) {
        // SAFETY: exclusive Directory lock held and `r` already unlinked
        // from its table, so no one else can reach its body.
        debug_assert!(unsafe { self.body(r) }.root == NIL, "freeing range {r} with tree nodes");
        self.dequeue_freed(r);
        // SAFETY: exclusive Directory lock held by the caller.
        let dir = unsafe { self.dir() };
        // SAFETY: as above.
        let meta = unsafe { self.meta(r) };
        *meta = RangeMeta { in_use: false, table: NIL, lo: meta.lo, hi: meta.hi, next_free: dir.free_range };
        dir.free_range = r;
        dir.ranges_used -= 1;
        self.p.hdr.dir_version.fetch_add(1, Relaxed);
    }

    fn create_table(&self, rel: RelId, owner: u32) -> Result<u32, AcquireError> {
        let _d = self.lock(LockId::Directory, Mode::Exclusive);
        if let Some(t) = self.find_table(rel) {
            return Ok(t);
        }
        let per_owner = self.p.hdr.max_tables_per_owner.load(Relaxed);
        if per_owner > 0 {
            let mine = (0..self.config().max_tables)
                // SAFETY: exclusive Directory lock held.
                .map(|t| unsafe { self.table_data(t) })
                .filter(|td| td.owner == owner && !matches!(td.rel, RelId::EMPTY | RelId::DELETED))
                .count();
            if mine as u32 >= per_owner {
                return Err(AcquireError::TooManyTablesForOwner);
            }
        }
        let n = self.p.tables.len();
        let start = self.hash_slot(rel);
        let t = (0..n)
            .map(|k| ((start + k) % n) as u32)
            // SAFETY: exclusive Directory lock held.
            .find(|&t| matches!(unsafe { self.table_data(t) }.rel, RelId::EMPTY | RelId::DELETED))
            .ok_or(AcquireError::TooManyTables)?;
        let r = self
            .new_range(t, super::span::KeyBuf::EMPTY, super::span::KeyBuf::INFINITE)
            .ok_or(AcquireError::TooManyRanges)?;
        // SAFETY: exclusive Directory lock held.
        let td = unsafe { self.table_data(t) };
        td.rel = rel;
        td.owner = owner;
        td.nranges = 0;
        td.ranges = [NIL; MAX_RANGES_PER_TABLE];
        td.seen_acquires = 0;
        td.insert_range(0, r, super::span::KeyBuf::EMPTY.head());
        // SAFETY: as above.
        unsafe { self.dir() }.tables_used += 1;
        self.p.hdr.dir_version.fetch_add(1, Relaxed);
        Ok(t)
    }

    /// Calls `f` with each range of table `t` that overlaps `span`, in key
    /// order.  Directory lock held.
    pub(crate) fn for_each_range_of(&self, t: u32, span: &Span, f: &mut dyn FnMut(u32) -> bool) {
        // SAFETY: the caller holds the Directory lock.
        let td = unsafe { self.table_data(t) };
        let n = td.nranges as usize;
        let (ranges, heads) = (&td.ranges[..n], &td.lo_heads[..n]);
        // SAFETY: as above (range metas are directory-protected).
        let lo = |i: usize| -> &super::span::KeyBuf { &unsafe { self.meta(ranges[i]) }.lo };
        // Range i's low bound against `k`, by the cached head first.
        let cmp_lo = |i: usize, k: &super::span::KeyBuf| match heads[i].cmp(&k.head()) {
            std::cmp::Ordering::Equal => lo(i).cmp(k),
            o => o,
        };
        // The last range whose low bound is at or below the span's start.
        let (mut a, mut b) = (0, n);
        while a < b {
            let mid = (a + b) / 2;
            if cmp_lo(mid, &span.start).is_le() {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        let first = a.saturating_sub(1);
        for (i, &r) in ranges.iter().enumerate().skip(first) {
            if cmp_lo(i, &span.end).is_ge() {
                break;
            }
            if !f(r) {
                break;
            }
        }
    }

    /// Takes table `rel`'s key-drawing lock (creating its slot if needed):
    /// draws and latch publications inside it are totally ordered.
    pub fn lock_draws(&self, rel: RelId, owner: u32) -> Result<Held<'_, L>, AcquireError> {
        loop {
            let t = {
                let _d = self.lock(LockId::Directory, Mode::Shared);
                self.find_table(rel)
            };
            let t = match t {
                Some(t) => t,
                None => self.create_table(rel, owner)?,
            };
            let held = Held::new(&self.locks, LockId::Table(t), Mode::Exclusive);
            // An idle table's slot may have been freed (and reused) between
            // the lookup and the lock: the lock must be this table's.
            let _d = self.lock(LockId::Directory, Mode::Shared);
            if self.find_table(rel) == Some(t) {
                return Ok(held);
            }
        }
    }

    // ---- acquire / release ------------------------------------------------

    /// Registers (or refreshes) backend slot `slot` for a process.
    pub fn attach_backend(&self, slot: u32, pid: i32) {
        let b = self.backend(slot);
        debug_assert_eq!(b.chain.load(Relaxed), NIL, "a backend slot is reused with latches left");
        b.pid.store(pid, Relaxed);
        b.xid.store(0, Relaxed);
    }

    /// Whether the backend in `slot` holds any latch now.
    pub fn holds_any(&self, slot: u32) -> bool {
        self.backend(slot).chain.load(Relaxed) != NIL
    }

    /// Publishes a write latch on `span` for the transaction in `slot`
    /// (no escalation, no budget: [`Self::latch`] is what writers call).
    ///
    /// On error nothing already published is lost or leaked: earlier pieces
    /// of a multi-range span stay on the holder's chain and go with the rest
    /// at transaction end.
    ///
    /// Returns the load (latches and tombstones) of the most crowded range
    /// the latch went into; ranges over `range_max_latches` are queued for
    /// the maintenance workers.
    pub fn acquire(&self, slot: u32, rel: RelId, span: &Span, h: &Holder) -> Result<u32, AcquireError> {
        self.publish(slot, rel, span, h, None, &mut Vec::new()).map(|p| p.max_load)
    }

    /// Enters a latch on `span` in every range it overlaps, appending the
    /// entries to `out`.  A point latch stands for one write; any other span
    /// stays open to later writes of its holder ([`region::OPEN`]).
    /// `seq_lo` replaces the publication number when the latch stands for
    /// earlier ones (escalation).
    fn publish(
        &self,
        slot: u32,
        rel: RelId,
        span: &Span,
        h: &Holder,
        seq_lo: Option<u64>,
        out: &mut Vec<u32>,
    ) -> Result<Published, AcquireError> {
        assert!(h.xid.is_valid(), "a latch holder must have an xid");
        if span.is_empty() {
            return Ok(Published { max_load: 0, seq_lo: u64::MAX });
        }
        let b = self.backend(slot);
        b.xid.store(h.xid.0, Relaxed);
        b.pid.store(h.pid, Relaxed);
        if b.chain.load(Relaxed) == NIL {
            b.since.store(h.now_us, Relaxed);
        }
        let open = !span.is_point();
        // The common case takes the Directory lock once: the table exists.
        // A slot created here can be freed as idle by a worker before the
        // shared lock is back, so the lookup is repeated under it.
        let (t, _d) = loop {
            let d = self.lock(LockId::Directory, Mode::Shared);
            if let Some(t) = self.find_table(rel) {
                break (t, d);
            }
            drop(d);
            self.create_table(rel, h.owner)?;
        };
        let mut result = Ok(());
        let mut max_load = 0;
        let mut first_seq = u64::MAX;
        let limit = self.range_max_latches();
        self.for_each_range_of(t, span, &mut |r| {
            let Some(e) = self.alloc() else {
                result = Err(AcquireError::Full);
                return false;
            };
            // SAFETY: we popped `e` from the free list; it is ours.
            let d = unsafe { self.data(e) };
            let seq = self.p.hdr.seq.fetch_add(1, Relaxed);
            let seq = seq_lo.map_or(seq, |lo| lo.min(seq));
            first_seq = first_seq.min(seq);
            *d = EntryData { span: *span, xid: h.xid, seq, pid: h.pid, acquired_at: h.now_us, ..EntryData::FREE };
            let ent = self.entry(e);
            ent.seq_hi.store(if open { region::OPEN } else { seq }, Relaxed);
            ent.state.store(State::Live as u8, Release);
            let (_g, waited) = Held::new_counting(&self.locks, LockId::Range(r), Mode::Exclusive);
            let rs = &self.p.ranges[r as usize];
            bump(&rs.acquires, 1);
            if waited {
                bump(&rs.contended, 1);
                self.count(slot, Stat::RangeLockWaits, 1);
            }
            // SAFETY: exclusive range lock held.
            let body = unsafe { self.body(r) };
            body.root = tree::insert(&self.nodes(), body.root, e);
            body.live += 1;
            self.entry(e).range.store(r, Release);
            self.reclaim_locked(slot, r, 2);
            let load = body.live + body.tombstones;
            max_load = max_load.max(load);
            if load > limit {
                self.enqueue(r);
            }
            // Only this backend touches its chain.
            ent.holder_next.store(b.chain.load(Relaxed), Relaxed);
            b.chain.store(e, Relaxed);
            b.count.fetch_add(1, Relaxed);
            self.count(slot, Stat::LatchesAcquired, 1);
            out.push(e);
            true
        });
        if result.is_err() {
            self.count(slot, Stat::LatchTableFull, 1);
        }
        result.map(|()| Published { max_load, seq_lo: first_seq })
    }

    /// Latches `span` of `rel` for the transaction in `slot`, which holds
    /// `held`: nothing new when a span latch it holds covers `span`;
    /// otherwise a new latch, after which a table with too many point
    /// latches has them replaced by one span latch over all of them, and a
    /// transaction over its budget has every table's latches so replaced.
    ///
    /// Escalation publishes the covering span before it withdraws what it
    /// covers, so a reader always finds one of them; the span keeps the
    /// earliest publication number of what it replaces.
    pub fn latch(
        &self,
        slot: u32,
        held: &mut Holdings,
        rel: RelId,
        span: &Span,
        h: &Holder,
        limits: &Limits,
    ) -> Result<Latched, AcquireError> {
        let th = held.table(rel);
        if th.covers.iter().any(|c| c.span.covers(span)) {
            self.count(slot, Stat::LatchesCovered, 1);
            return Ok(Latched::Covered);
        }
        let mut entries = std::mem::take(&mut held.scratch);
        entries.clear();
        let result = self.publish(slot, rel, span, h, None, &mut entries);
        let th = held.table(rel);
        let n = entries.len() as u32;
        // A failed publication may have entered some pieces: they are held
        // (and covered by escalation) like the rest.
        let seq_lo = result.as_ref().map_or(0, |p| p.seq_lo);
        if span.is_point() {
            th.add_point(span, &entries, self);
        } else if n > 0 {
            th.covers.push(Cover { span: *span, entries: entries.clone(), seq_lo });
        }
        held.live += n;
        held.scratch = entries;
        let max_load = result?.max_load;
        self.enforce_limits(slot, held, rel, h, limits)?;
        Ok(Latched::Published { max_load })
    }

    /// Escalates `rel`'s point latches when there are too many, and every
    /// table's when the transaction is over its budget; fails when even
    /// that leaves it over.
    pub fn enforce_limits(
        &self,
        slot: u32,
        held: &mut Holdings,
        rel: RelId,
        h: &Holder,
        limits: &Limits,
    ) -> Result<(), AcquireError> {
        if held.table(rel).points.len() as u32 >= limits.escalate_points {
            self.escalate(slot, held, rel, h)?;
        }
        if held.live > limits.per_transaction {
            for rel in held.tables.iter().filter(|t| t.points.len() > 1).map(|t| t.rel).collect::<Vec<_>>() {
                self.escalate(slot, held, rel, h)?;
            }
            if held.live > limits.per_transaction {
                return Err(AcquireError::TransactionBudget);
            }
        }
        Ok(())
    }

    /// Replaces every latch the transaction holds on `rel` by one span latch
    /// over all of them.
    fn escalate(&self, slot: u32, held: &mut Holdings, rel: RelId, h: &Holder) -> Result<(), AcquireError> {
        let th = held.table(rel);
        let mut hull = th.points_hull;
        let mut seq_lo = th.points_seq_lo;
        let mut old: Vec<u32> = th.points.clone();
        for c in &th.covers {
            hull = hull.hull(&c.span);
            seq_lo = seq_lo.min(c.seq_lo);
            old.extend_from_slice(&c.entries);
        }
        if old.len() < 2 {
            return Ok(());
        }
        let mut entries = Vec::new();
        // Published first: a reader finds the span or what it replaces.
        // On failure the old latches stay, and so does what was entered.
        let published = self.publish(slot, rel, &hull, h, Some(seq_lo), &mut entries);
        if published.is_err() {
            self.withdraw(slot, &entries);
            published?;
        }
        self.withdraw(slot, &old);
        let th = held.table(rel);
        th.points.clear();
        th.points_hull = Span::EMPTY;
        th.points_seq_lo = u64::MAX;
        th.covers = vec![Cover { span: hull, entries: entries.clone(), seq_lo }];
        held.live = held.live + entries.len() as u32 - old.len() as u32;
        self.count(slot, Stat::LatchesEscalated, old.len() as u64);
        Ok(())
    }

    /// Takes live latches of this backend's transaction out of its chain
    /// and the table, as an abort would; the caller has published a latch
    /// that covers them.
    fn withdraw(&self, slot: u32, entries: &[u32]) {
        let mut gone: Vec<u32> = entries.to_vec();
        gone.sort_unstable();
        let b = self.backend(slot);
        let mut keep = NIL;
        let mut kept = 0;
        let mut e = b.chain.swap(NIL, Relaxed);
        let mut stack = Vec::new();
        while e != NIL {
            let next = self.entry(e).holder_next.load(Relaxed);
            if gone.binary_search(&e).is_err() {
                stack.push(e);
            }
            e = next;
        }
        // Rebuild the chain in its old order (newest first).
        for &e in stack.iter().rev() {
            self.entry(e).holder_next.store(keep, Relaxed);
            keep = e;
            kept += 1;
        }
        b.chain.store(keep, Relaxed);
        b.count.store(kept, Relaxed);
        for &e in &gone {
            self.entry(e).holder_next.store(NIL, Relaxed);
            self.release_one(slot, e, Outcome::Aborted);
        }
    }

    /// The load of the most crowded range overlapping `span` (for writers
    /// backing off from a range far over its limit).
    pub fn max_load(&self, rel: RelId, span: &Span) -> u32 {
        let _d = self.lock(LockId::Directory, Mode::Shared);
        let Some(t) = self.find_table(rel) else { return 0 };
        let mut max = 0;
        self.for_each_range_of(t, span, &mut |r| {
            max = max.max(self.load(r));
            true
        });
        max
    }

    /// Releases every latch of the transaction in `slot`: tombstones at
    /// commit (called after the commit is visible), gone at abort.
    pub fn release_all(&self, slot: u32, outcome: Outcome) -> u32 {
        let b = self.backend(slot);
        let mut e = b.chain.swap(NIL, Relaxed);
        let mut n = 0;
        while e != NIL {
            let next = self.entry(e).holder_next.load(Relaxed);
            self.entry(e).holder_next.store(NIL, Relaxed);
            self.release_one(slot, e, outcome);
            n += 1;
            e = next;
        }
        b.count.store(0, Relaxed);
        b.xid.store(0, Relaxed);
        // Without maintenance workers nobody else drains: keep it bounded.
        if self.released_pending() > DRAIN_AT {
            self.drain_released(slot);
        }
        let stat = match outcome {
            Outcome::Committed => Stat::LatchesReleasedCommit,
            Outcome::Aborted => Stat::LatchesReleasedAbort,
        };
        self.count(slot, stat, u64::from(n));
        n
    }

    /// Marks `e` released, then settles it in its range if that range's
    /// lock is free right now, else pushes it on the released stack for
    /// whoever drains next: commit and abort never wait on a range lock.
    /// Readers keep finding a committed latch (now a tombstone) and skip an
    /// aborted one (dead) either way.
    ///
    /// Settling at once rather than always deferring keeps the working set
    /// small: the entry goes back to the free list while its tree path is
    /// still in this CPU's cache, and the next acquire reuses it.  Deferred
    /// in thousands, released entries cycled through ~1 MB of the region
    /// and every tree descent missed the L2 cache.
    fn release_one(&self, slot: u32, e: u32, outcome: Outcome) {
        let state = match outcome {
            Outcome::Committed => State::Tombstone,
            Outcome::Aborted => State::Dead,
        };
        let ent = self.entry(e);
        if ent.seq_hi.load(Relaxed) == region::OPEN {
            // Everything its holder wrote under it came before this.
            ent.seq_hi.store(self.p.hdr.seq.load(Relaxed), Relaxed);
        }
        ent.state.store(state as u8, Release);
        let r = ent.range.load(Acquire);
        // (A chained entry is always in a range; NIL is checked anyway, as
        // this runs in the commit callback where a panic would be a PANIC.)
        let held = if r == NIL { None } else { Held::try_new(&self.locks, LockId::Range(r), Mode::Exclusive) };
        if let Some(_g) = held {
            // A split or merge moves entries only under both ranges' locks:
            // with `r`'s held, `e` is still in `r` if its field says so.
            if ent.range.load(Acquire) == r {
                self.settle_locked(slot, r, e);
                return;
            }
        }
        let hdr = self.p.hdr;
        let mut head = hdr.released.load(Acquire);
        loop {
            ent.free_next.store(head, Relaxed);
            // Pushes only ever race with pushes and whole-stack takes, so
            // a plain CAS on the head is ABA-free.
            match hdr.released.compare_exchange_weak(head, e, AcqRel, Acquire) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        hdr.released_count.fetch_add(1, Relaxed);
    }

    /// Released latches not yet drained.
    pub fn released_pending(&self) -> u32 {
        self.p.hdr.released_count.load(Relaxed)
    }

    /// Moves released latches to their ranges: tombstones onto the range's
    /// tombstone list (to wait for the horizon), dead ones out of the tree
    /// and back to the free list.  Returns how many.
    pub fn drain_released(&self, slot: u32) -> u32 {
        let hdr = self.p.hdr;
        let mut e = hdr.released.swap(NIL, AcqRel);
        let mut n = 0;
        while e != NIL {
            let next = self.entry(e).free_next.load(Relaxed);
            loop {
                let r = self.entry(e).range.load(Acquire);
                let _g = self.lock(LockId::Range(r), Mode::Exclusive);
                if self.entry(e).range.load(Acquire) != r {
                    continue; // moved by a split or merge while we waited
                }
                self.settle_locked(slot, r, e);
                break;
            }
            hdr.released_count.fetch_sub(1, Relaxed);
            n += 1;
            e = next;
        }
        n
    }

    /// Moves released entry `e` (on no chain or stack) from range `r`'s live
    /// count to its tombstone FIFO, or out of the tree to the free list when
    /// dead.  Exclusive lock of `r`, which `e` is in, held.
    fn settle_locked(&self, slot: u32, r: u32, e: u32) {
        // SAFETY: the caller holds `r`'s exclusive lock.
        let body = unsafe { self.body(r) };
        body.live -= 1;
        if self.state(e) == State::Dead {
            body.root = tree::remove(&self.nodes(), body.root, e);
            // SAFETY: out of the tree, the chain and the stack.
            unsafe { self.free(e) };
        } else {
            body.tombstones += 1;
            self.fifo_push(body, e);
        }
        self.reclaim_locked(slot, r, 4);
    }

    /// The last publication latch `e` stands for (see [`region::OPEN`]).
    pub(crate) fn seq_hi(&self, e: u32) -> u64 {
        self.entry(e).seq_hi.load(Relaxed)
    }

    pub(crate) fn state(&self, e: u32) -> State {
        State::from_u8(self.entry(e).state.load(Acquire))
    }

    pub(crate) fn fifo_push(&self, body: &mut RangeBody, e: u32) {
        // SAFETY: the caller holds the exclusive lock of the range `e` is in.
        let d = unsafe { self.data(e) };
        d.fifo_next = NIL;
        d.in_fifo = true;
        if body.fifo_tail == NIL {
            body.fifo_head = e;
        } else {
            // SAFETY: as above; the tail is in the same range.
            unsafe { self.data(body.fifo_tail) }.fifo_next = e;
        }
        body.fifo_tail = e;
    }

    /// Frees up to `budget` tombstones of range `r` whose holders precede
    /// the horizon, oldest release first; drops an expired summary.
    /// Exclusive lock of `r` held.
    pub(crate) fn reclaim_locked(&self, slot: u32, r: u32, budget: u32) -> u32 {
        let horizon = self.horizon();
        if !horizon.is_valid() {
            return 0;
        }
        // SAFETY: exclusive range lock held by the caller.
        let body = unsafe { self.body(r) };
        let mut n = 0;
        while n < budget && body.fifo_head != NIL {
            let e = body.fifo_head;
            // SAFETY: `e` is in range `r`.
            let d = unsafe { self.data(e) };
            if !d.xid.precedes(horizon) {
                break;
            }
            body.fifo_head = d.fifo_next;
            if body.fifo_head == NIL {
                body.fifo_tail = NIL;
            }
            body.root = tree::remove(&self.nodes(), body.root, e);
            body.tombstones -= 1;
            // SAFETY: unlinked from tree and list; tombstones are on no chain.
            unsafe { self.free(e) };
            n += 1;
        }
        if !body.summary.is_empty() && body.summary.xid_hi.precedes(horizon) {
            body.summary = region::Summary::EMPTY;
        }
        if n > 0 {
            self.count(slot, Stat::TombstonesReclaimed, u64::from(n));
        }
        n
    }
}
