//! The latch table handle: write latches in, released latches out.
//!
//! Writers publish a latch (span + holder xid + publication sequence number)
//! into every range its span overlaps, before they change a row.  At commit a
//! latch becomes a tombstone, kept until no snapshot can consider its holder
//! in progress; at abort it goes at once.  Readers look latches up in
//! validate.rs.

use super::holdings::{Cover, Holdings, Latched, Limits, ROLE_CHECK_EVERY};
use super::locks::{Held, LockId, LockSet, Mode};
use super::region::guard::{DirWrite, Directory, Locked, RangeAccess, RangeMut};
use super::region::{
    self, bump, BackendSlot, Config, Entry, EntryData, Layout, RangeBody, RangeMeta, RelId, State, TableData,
    MAX_RANGES_PER_TABLE,
};
use super::span::{KeyBuf, Span};
use super::stats::{Stat, NSTATS};
use super::tree::NIL;
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
    /// The role writing (a role oid), charged for the latch entries.
    pub role: u32,
}

/// Which of a table's latches an escalation replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fold {
    Points,
    All,
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
    /// The role's transactions hold more latch entries than its budget,
    /// even with this transaction's tables escalated.
    RoleBudget,
}

/// How a transaction ended, for the latches it releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxEnd {
    Committed,
    Aborted,
}

/// Table `rel`'s draw lock, held until dropped: one backend at a time
/// draws the table's keys and latches them ([`crate::Writer::lock_draws`]).
#[must_use = "the draw lock is released when dropped"]
pub struct DrawLock<'t, L: LockSet> {
    _held: Held<'t, L>,
}

pub struct LatchTable<'r, L: LockSet> {
    pub(crate) mem: Locked<'r, L>,
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
        LatchTable { mem: Locked::new(unsafe { region::init(mem, cfg) }, locks) }
    }

    /// Attaches to a table another process (or an earlier call) created.
    ///
    /// # Safety
    /// `mem` must hold a table written by [`Self::init`] and outlive `'r`.
    pub unsafe fn attach(mem: *mut u8, locks: L) -> Self {
        // SAFETY: forwarded contract.
        LatchTable { mem: Locked::new(unsafe { region::attach(mem) }, locks) }
    }

    pub fn config(&self) -> Config {
        self.mem.region.hdr.cfg
    }

    /// A hot standby replays latches from WAL, and cannot know those
    /// written before the point its replay started, nor one it failed to
    /// enter: every xid below `below` then counts as a writer that may hold
    /// a latch on every key of every table (the fog).  Only ever raised
    /// while recovery runs; readers wait for such writers like any other.
    pub fn raise_fog(&self, below: Xid) {
        let fog = &self.mem.region.hdr.fog;
        let mut cur = fog.load(Relaxed);
        while cur == 0 || Xid(cur).precedes(below) {
            match fog.compare_exchange_weak(cur, below.0, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Recovery ended: every writer it could not see has ended too.
    pub fn clear_fog(&self) {
        self.mem.region.hdr.fog.store(0, Relaxed);
    }

    /// Lifts the fog once `horizon` -- the oldest xid any snapshot may
    /// still consider running -- has reached it: every transaction below
    /// it has ended, and no snapshot has one in flight.
    pub fn lift_fog_passed(&self, horizon: Xid) {
        let fog = &self.mem.region.hdr.fog;
        let cur = fog.load(Relaxed);
        if cur != 0 && horizon.follows_or_equals(Xid(cur)) {
            let _ = fog.compare_exchange(cur, 0, Relaxed, Relaxed);
        }
    }

    /// Xids below this may hold latches nobody knows of (None: no fog).
    pub(crate) fn fog(&self) -> Option<Xid> {
        Some(Xid(self.mem.region.hdr.fog.load(Relaxed))).filter(|x| x.is_valid())
    }

    pub fn set_max_tables_per_owner(&self, n: u32) {
        self.mem.region.hdr.max_tables_per_owner.store(n, Relaxed);
    }

    pub fn set_range_max_latches(&self, n: u32) {
        self.mem.region.hdr.range_max_latches.store(n.max(16), Relaxed);
    }

    pub(crate) fn range_max_latches(&self) -> u32 {
        self.mem.region.hdr.range_max_latches.load(Relaxed)
    }

    /// Publishes the xid horizon: tombstones of holders that precede it can
    /// no longer conflict with any snapshot and are reclaimed.
    pub(crate) fn set_horizon(&self, horizon: Xid) {
        self.mem.region.hdr.horizon.store(horizon.0, Release);
    }

    pub(crate) fn horizon(&self) -> Xid {
        Xid(self.mem.region.hdr.horizon.load(Acquire))
    }

    /// A maintenance worker is alive at `now_us`.
    pub(crate) fn beat(&self, now_us: i64) {
        self.mem.region.hdr.worker_beat.store(now_us, Relaxed);
    }

    /// When a maintenance worker last said it was alive.
    pub(crate) fn last_beat(&self) -> i64 {
        self.mem.region.hdr.worker_beat.load(Relaxed)
    }

    /// Free entries left.
    pub(crate) fn free_entries(&self) -> u32 {
        self.mem.region.hdr.free_count.load(Relaxed)
    }

    // ---- stats ----------------------------------------------------------

    pub(crate) fn count(&self, slot: u32, stat: Stat, n: u64) {
        if let Some(b) = self.mem.region.backends.get(slot as usize) {
            bump(&b.stats[stat as usize], n);
        }
    }

    /// Every counter summed over all backends.
    pub(crate) fn stats(&self) -> [u64; NSTATS] {
        let mut out = [0u64; NSTATS];
        for b in self.mem.region.backends {
            for (o, c) in out.iter_mut().zip(b.stats.iter()) {
                *o += c.load(Relaxed);
            }
        }
        out
    }

    // ---- raw access -----------------------------------------------------

    /// Entry `i`'s atomic parts (its data is reached through guards).
    pub(crate) fn entry(&self, i: u32) -> &Entry {
        &self.mem.region.entries[i as usize]
    }

    pub(crate) fn backend(&self, slot: u32) -> &BackendSlot {
        &self.mem.region.backends[slot as usize]
    }

    // ---- directory --------------------------------------------------------

    /// Allocates a range covering `[lo, hi)` of table `t`.
    pub(crate) fn new_range(&self, d: &mut DirWrite<'_, L>, t: u32, lo: KeyBuf, hi: KeyBuf) -> Option<u32> {
        let r = d.counts().free_range;
        if r == NIL {
            return None;
        }
        let next_free = d.meta(r).next_free;
        let counts = d.counts_mut();
        counts.free_range = next_free;
        counts.ranges_used += 1;
        *d.meta_mut(r) = RangeMeta { in_use: true, table: t, lo, hi, next_free: NIL };
        *d.range_write(r).body_mut() = RangeBody::EMPTY;
        let slot = &self.mem.region.ranges[r as usize];
        slot.acquires.store(0, Relaxed);
        slot.contended.store(0, Relaxed);
        self.queue_reset(r);
        slot.contended_seen.store(0, Relaxed);
        Some(r)
    }

    /// Returns an empty range, already unlinked from its table, to the
    /// free list.
    pub(crate) fn free_range(&self, d: &mut DirWrite<'_, L>, r: u32) {
        debug_assert!(d.range_write(r).body().root == NIL, "freeing range {r} with tree nodes");
        self.dequeue_freed(r);
        let free = d.counts().free_range;
        let meta = d.meta_mut(r);
        *meta = RangeMeta { in_use: false, table: NIL, lo: meta.lo, hi: meta.hi, next_free: free };
        let counts = d.counts_mut();
        counts.free_range = r;
        counts.ranges_used -= 1;
        self.mem.region.hdr.dir_version.fetch_add(1, Relaxed);
    }

    fn create_table(&self, rel: RelId, owner: u32) -> Result<u32, AcquireError> {
        let mut d = self.mem.dir_write();
        if let Some(t) = d.find_table(rel) {
            return Ok(t);
        }
        let per_owner = self.mem.region.hdr.max_tables_per_owner.load(Relaxed);
        if per_owner > 0 {
            let mine = (0..self.config().max_tables)
                .map(|t| d.table_data(t))
                .filter(|td| td.owner == owner && !matches!(td.rel, RelId::EMPTY | RelId::DELETED))
                .count();
            if mine as u32 >= per_owner {
                return Err(AcquireError::TooManyTablesForOwner);
            }
        }
        let n = self.mem.region.tables.len();
        let start = super::region::guard::hash_slot(rel, n);
        let t = (0..n)
            .map(|k| ((start + k) % n) as u32)
            .find(|&t| matches!(d.table_data(t).rel, RelId::EMPTY | RelId::DELETED))
            .ok_or(AcquireError::TooManyTables)?;
        let r = self.new_range(&mut d, t, KeyBuf::EMPTY, KeyBuf::INFINITE).ok_or(AcquireError::TooManyRanges)?;
        let td: &mut TableData = d.table_data_mut(t);
        td.rel = rel;
        td.owner = owner;
        td.nranges = 0;
        td.ranges = [NIL; MAX_RANGES_PER_TABLE];
        td.seen_acquires = 0;
        td.insert_range(0, r, KeyBuf::EMPTY.head());
        d.counts_mut().tables_used += 1;
        self.mem.region.hdr.dir_version.fetch_add(1, Relaxed);
        Ok(t)
    }

    /// Takes table `rel`'s key-drawing lock (creating its slot if needed):
    /// draws and latch publications inside it are totally ordered.
    pub(crate) fn lock_draws(&self, rel: RelId, owner: u32) -> Result<DrawLock<'_, L>, AcquireError> {
        loop {
            let t = self.mem.dir_read().find_table(rel);
            let t = match t {
                Some(t) => t,
                None => self.create_table(rel, owner)?,
            };
            let held = Held::new(&self.mem.locks, LockId::Table(t), Mode::Exclusive);
            // An idle table's slot may have been freed (and reused) between
            // the lookup and the lock: the lock must be this table's.
            if self.mem.dir_read().find_table(rel) == Some(t) {
                return Ok(DrawLock { _held: held });
            }
        }
    }

    // ---- acquire / release ------------------------------------------------

    /// Whether the backend in `slot` holds any latch now.
    pub(crate) fn holds_any(&self, slot: u32) -> bool {
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
    #[cfg(any(test, feature = "std-locks"))]
    pub(crate) fn acquire(&self, slot: u32, rel: RelId, span: &Span, h: &Holder) -> Result<u32, AcquireError> {
        self.publish(slot, rel, span, h, None, &mut |_| {}).map(|p| p.max_load)
    }

    /// Enters a latch on `span` in every range it overlaps, handing each
    /// entry to `entered`.  A point latch stands for one write; any other span
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
        entered: &mut impl FnMut(u32),
    ) -> Result<Published, AcquireError> {
        assert!(h.xid.is_valid(), "a latch holder must have an xid");
        if span.is_empty() {
            return Ok(Published { max_load: 0, seq_lo: u64::MAX });
        }
        let b = self.backend(slot);
        // A transaction's role is set once, with its first latch.
        if b.chain.load(Relaxed) == NIL {
            b.role.store(h.role, Relaxed);
        }
        let open = !span.is_point();
        // The common case takes the Directory lock once: the table exists.
        // A slot created here can be freed as idle by a worker before the
        // shared lock is back, so the lookup is repeated under it.
        let (t, mut d) = loop {
            let d = self.mem.dir_read();
            if let Some(t) = d.find_table(rel) {
                break (t, d);
            }
            drop(d);
            self.create_table(rel, h.owner)?;
        };
        let mut max_load = 0;
        let mut first_seq = u64::MAX;
        let limit = self.range_max_latches();
        for i in d.ranges_over(t, span) {
            let r = d.range_at(t, i);
            let Some(mut e) = self.mem.alloc() else {
                self.count(slot, Stat::LatchTableFull, 1);
                return Err(AcquireError::Full);
            };
            let seq = self.mem.region.hdr.seq.fetch_add(1, Relaxed);
            let seq = seq_lo.map_or(seq, |lo| lo.min(seq));
            first_seq = first_seq.min(seq);
            *self.mem.owned_data(&mut e) =
                EntryData { span: *span, xid: h.xid, seq, pid: h.pid, acquired_at: h.now_us, ..EntryData::FREE };
            let id = e.id();
            let ent = self.entry(id);
            ent.seq_hi.store(if open { region::OPEN } else { seq }, Relaxed);
            ent.state.store(State::Live as u8, Release);
            let (mut g, waited) = d.range_write_counting(r);
            let rs = &self.mem.region.ranges[r as usize];
            bump(&rs.acquires, 1);
            if waited {
                bump(&rs.contended, 1);
                self.count(slot, Stat::RangeLockWaits, 1);
            }
            g.insert(e);
            g.body_mut().live += 1;
            self.reclaim(&mut g, slot, 2);
            let load = g.body().live + g.body().tombstones;
            drop(g);
            max_load = max_load.max(load);
            if load > limit {
                self.enqueue(r);
            }
            // Only this backend touches its chain.
            ent.holder_next.store(b.chain.load(Relaxed), Relaxed);
            b.chain.store(id, Relaxed);
            b.live.fetch_add(1, Relaxed);
            self.count(slot, Stat::LatchesAcquired, 1);
            entered(id);
        }
        Ok(Published { max_load, seq_lo: first_seq })
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
    pub(crate) fn latch(
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
        let result = self.publish(slot, rel, span, h, None, &mut |id| entries.push(id));
        let sub = held.sub;
        let th = held.table(rel);
        let n = entries.len() as u32;
        // A failed publication may have entered some pieces: they are held
        // (and covered by escalation) like the rest.
        let seq_lo = result.as_ref().map_or(0, |p| p.seq_lo);
        if span.is_point() {
            let first_seq = entries.first().map_or(0, |&e| self.seq_hi(e));
            th.add_point(span, &entries, sub, first_seq);
        } else if n > 0 {
            th.covers.push(Cover { span: *span, entries: entries.clone(), seq_lo, sub });
        }
        if n > 0 {
            held.max_sub = held.max_sub.max(sub);
            held.note_published(rel, span);
        }
        held.live += n;
        held.unchecked = held.unchecked.saturating_add(n);
        held.scratch = entries;
        let max_load = result?.max_load;
        self.enforce_limits(slot, held, rel, h, limits)?;
        Ok(Latched::Published { max_load })
    }

    /// Escalates `rel`'s latches when there are too many, and every table's
    /// when the transaction, or its role, is over its budget; fails when
    /// even that leaves it over.
    pub(crate) fn enforce_limits(
        &self,
        slot: u32,
        held: &mut Holdings,
        rel: RelId,
        h: &Holder,
        limits: &Limits,
    ) -> Result<(), AcquireError> {
        if held.table(rel).points.len() as u32 >= limits.escalate_points {
            self.escalate(slot, held, rel, h, Fold::Points)?;
        }
        let refold_at = held.table(rel).refold_at.max(limits.escalate_points as usize);
        if held.cover_entries(rel) >= refold_at {
            self.escalate(slot, held, rel, h, Fold::All)?;
        }
        if held.live > limits.per_transaction {
            self.escalate_all(slot, held, h)?;
            if held.live > limits.per_transaction {
                return Err(AcquireError::TransactionBudget);
            }
        }
        // The role's total is looked at once every ROLE_CHECK_EVERY entries
        // published, counted since the last look and never lowered by
        // escalation: a transaction that escalated and regrows is looked at
        // as often as one that never escalated, so each session holds at
        // most ROLE_CHECK_EVERY entries its role's budget has not seen.
        // (Summing every backend's count on each short transaction's first
        // latch would cost more than its write, for the same slack.)  The
        // role charged is the one this transaction's latches are counted
        // under: the role of its first latch.
        if limits.per_role > 0 && held.unchecked >= ROLE_CHECK_EVERY {
            let role = self.backend(slot).role.load(Relaxed);
            if self.role_live(role) > limits.per_role {
                self.escalate_all(slot, held, h)?;
                if self.role_live(role) > limits.per_role {
                    // Not reset: every later publication looks again.
                    return Err(AcquireError::RoleBudget);
                }
            }
            held.unchecked = 0;
        }
        Ok(())
    }

    fn escalate_all(&self, slot: u32, held: &mut Holdings, h: &Holder) -> Result<(), AcquireError> {
        let tables: Vec<RelId> = held.tables.iter().map(|t| t.rel).collect();
        for rel in tables {
            if held.foldable(rel) > 1 {
                self.escalate(slot, held, rel, h, Fold::All)?;
            }
        }
        Ok(())
    }

    /// Latch entries the transactions of `role` hold now.
    pub(crate) fn role_live(&self, role: u32) -> u32 {
        self.mem.region.backends.iter().filter(|b| b.role.load(Relaxed) == role).map(|b| b.live.load(Relaxed)).sum()
    }

    /// Replaces latches the transaction holds on `rel` by one span latch
    /// over them: its point latches (`Fold::Points`, the span joins its
    /// other span latches), or all of them (`Fold::All`).  Folding points
    /// alone keeps the span narrow — a load in key order puts each one in
    /// a range or two — and the spans are folded together only when they
    /// are many, so a bulk write pays for a span over all its ranges rarely.
    fn escalate(&self, slot: u32, held: &mut Holdings, rel: RelId, h: &Holder, fold: Fold) -> Result<(), AcquireError> {
        let th = held.table(rel);
        let mut hull = th.points_hull;
        let mut seq_lo = th.points_seq_lo;
        let mut old: Vec<u32> = th.points.clone();
        // The span stands for every write it replaces: it is withdrawn only
        // when the outermost subtransaction among them rolls back.
        let mut sub = th.point_subs.iter().copied().min().unwrap_or(u32::MAX);
        if fold == Fold::All {
            for c in &th.covers {
                hull = hull.hull(&c.span);
                seq_lo = seq_lo.min(c.seq_lo);
                sub = sub.min(c.sub);
                old.extend_from_slice(&c.entries);
            }
        }
        if old.len() < 2 {
            return Ok(());
        }
        let mut entries = Vec::new();
        // Published first: a reader finds the span or what it replaces.
        let published = self.publish(slot, rel, &hull, h, Some(seq_lo), &mut |id| entries.push(id));
        if published.is_err() {
            self.withdraw(slot, &entries);
            published?;
        }
        held.note_published(rel, &hull);
        self.withdraw(slot, &old);
        held.withdrawn = true;
        let th = held.table(rel);
        th.points.clear();
        th.point_subs.clear();
        th.points_hull = Span::EMPTY;
        th.points_seq_lo = u64::MAX;
        let cover = Cover { span: hull, entries: entries.clone(), seq_lo, sub };
        match fold {
            Fold::All => {
                th.refold_at = 2 * entries.len();
                th.covers = vec![cover];
            }
            Fold::Points => th.covers.push(cover),
        }
        held.live = held.live + entries.len() as u32 - old.len() as u32;
        held.unchecked = held.unchecked.saturating_add(entries.len() as u32);
        self.count(slot, Stat::LatchesEscalated, old.len() as u64);
        Ok(())
    }

    /// Subtransaction `sub` of the transaction in `slot` rolled back:
    /// releases, as an abort does (dead at once), every latch `held`
    /// records as published inside `sub` or a subtransaction started
    /// after it (its children: subtransaction ids only grow, and when
    /// `sub` rolls back every later one has ended inside it).  What they
    /// latched was never written.  Latches tagged with an earlier
    /// subtransaction stay: the parent's own latches, even on the same
    /// keys, escalated spans that also stand for a parent's writes, and
    /// the latches of keys drawn with `next_key` (tagged top-level, since
    /// a drawn key may still be written after the rollback).  Readers
    /// waiting for the holder wait on its top-level xid, which is still
    /// running: they wait on until it ends, as before.  Returns how many
    /// entries went.
    pub(crate) fn release_subxact(&self, slot: u32, held: &mut Holdings, sub: u32) -> u32 {
        if !held.may_hold_from(sub) {
            return 0;
        }
        let mut gone = Vec::new();
        for th in &mut held.tables {
            if th.point_subs.iter().any(|&s| s >= sub) {
                let mut keep = Vec::with_capacity(th.points.len());
                let mut keep_subs = Vec::with_capacity(th.points.len());
                for (&e, &s) in th.points.iter().zip(&th.point_subs) {
                    if s >= sub {
                        gone.push(e);
                    } else {
                        keep.push(e);
                        keep_subs.push(s);
                    }
                }
                th.points = keep;
                th.point_subs = keep_subs;
                // The hull and earliest publication of what stays are kept
                // as they were: wider and earlier, hence conservative.
                if th.points.is_empty() {
                    th.points_hull = Span::EMPTY;
                    th.points_seq_lo = u64::MAX;
                }
            }
            th.covers.retain(|c| {
                if c.sub >= sub {
                    gone.extend_from_slice(&c.entries);
                    false
                } else {
                    true
                }
            });
        }
        held.max_sub = held.max_sub.min(sub - 1);
        if gone.is_empty() {
            return 0;
        }
        held.live -= gone.len() as u32;
        self.withdraw(slot, &gone);
        self.count(slot, Stat::LatchesReleasedAbort, gone.len() as u64);
        gone.len() as u32
    }

    /// Takes live latches of this backend's transaction out of its chain
    /// and the table, as an abort would; the caller has published a latch
    /// that covers them.
    fn withdraw(&self, slot: u32, entries: &[u32]) {
        let mut gone: Vec<u32> = entries.to_vec();
        gone.sort_unstable();
        let b = self.backend(slot);
        let mut keep = NIL;
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
        }
        b.chain.store(keep, Relaxed);
        b.live.fetch_sub(gone.len() as u32, Relaxed);
        for &e in &gone {
            self.entry(e).holder_next.store(NIL, Relaxed);
            self.release_one(slot, e, TxEnd::Aborted);
        }
    }

    /// The load of the most crowded range overlapping `span` (for writers
    /// backing off from a range far over its limit).
    pub(crate) fn max_load(&self, rel: RelId, span: &Span) -> u32 {
        let mut d = self.mem.dir_read();
        let Some(t) = d.find_table(rel) else { return 0 };
        let mut max = 0;
        for i in d.ranges_over(t, span) {
            let r = d.range_at(t, i);
            let g = d.range_read(r);
            max = max.max(g.body().live + g.body().tombstones);
        }
        max
    }

    /// Releases every latch of the transaction in `slot`: tombstones at
    /// commit (called after the commit is visible), gone at abort.
    pub(crate) fn release_all(&self, slot: u32, end: TxEnd) -> u32 {
        let b = self.backend(slot);
        let mut e = b.chain.swap(NIL, Relaxed);
        let mut n = 0;
        while e != NIL {
            let next = self.entry(e).holder_next.load(Relaxed);
            self.entry(e).holder_next.store(NIL, Relaxed);
            self.release_one(slot, e, end);
            n += 1;
            e = next;
        }
        b.live.store(0, Relaxed);
        // Without maintenance workers nobody else drains: keep it bounded.
        if self.released_pending() > DRAIN_AT {
            self.drain_released(slot);
        }
        let stat = match end {
            TxEnd::Committed => Stat::LatchesReleasedCommit,
            TxEnd::Aborted => Stat::LatchesReleasedAbort,
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
    fn release_one(&self, slot: u32, e: u32, end: TxEnd) {
        let state = match end {
            TxEnd::Committed => State::Tombstone,
            TxEnd::Aborted => State::Dead,
        };
        let ent = self.entry(e);
        if ent.seq_hi.load(Relaxed) == region::OPEN {
            // Everything its holder wrote under it came before this.
            ent.seq_hi.store(self.mem.region.hdr.seq.load(Relaxed), Relaxed);
        }
        ent.state.store(state as u8, Release);
        // Settling waits for no lock (reclaim's budget keeps it short), as
        // a range lock taken without the Directory lock requires.
        if let Some(mut g) = self.mem.try_lock_range_of(e) {
            self.settle(&mut g, slot, e);
            return;
        }
        let hdr = self.mem.region.hdr;
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
    pub(crate) fn released_pending(&self) -> u32 {
        self.mem.region.hdr.released_count.load(Relaxed)
    }

    /// Moves released latches to their ranges: tombstones onto the range's
    /// tombstone list (to wait for the horizon), dead ones out of the tree
    /// and back to the free list.  Returns how many.
    pub(crate) fn drain_released(&self, slot: u32) -> u32 {
        let hdr = self.mem.region.hdr;
        let mut e = hdr.released.swap(NIL, AcqRel);
        if e == NIL {
            return 0;
        }
        let mut n = 0;
        let mut d = self.mem.dir_read();
        while e != NIL {
            let next = self.entry(e).free_next.load(Relaxed);
            let r = self.entry(e).range.load(Acquire);
            let mut g = d.range_write(r);
            self.settle(&mut g, slot, e);
            drop(g);
            hdr.released_count.fetch_sub(1, Relaxed);
            n += 1;
            e = next;
        }
        n
    }

    /// Moves released entry `e` (on no chain or stack) of range `g` from
    /// the live count to the tombstone FIFO, or out of the tree to the free
    /// list when dead.
    fn settle(&self, g: &mut RangeMut<'_>, slot: u32, e: u32) {
        g.body_mut().live -= 1;
        if self.state(e) == State::Dead {
            let gone = g.remove(e);
            self.mem.free(gone);
        } else {
            g.body_mut().tombstones += 1;
            g.fifo_push(e);
        }
        self.reclaim(g, slot, 4);
    }

    /// The last publication latch `e` stands for (see [`region::OPEN`]).
    pub(crate) fn seq_hi(&self, e: u32) -> u64 {
        self.entry(e).seq_hi.load(Relaxed)
    }

    pub(crate) fn state(&self, e: u32) -> State {
        State::from_u8(self.entry(e).state.load(Acquire))
    }

    /// Frees up to `budget` tombstones of range `g` whose holders precede
    /// the horizon, oldest release first; drops an expired summary.
    pub(crate) fn reclaim(&self, g: &mut RangeMut<'_>, slot: u32, budget: u32) -> u32 {
        let horizon = self.horizon();
        if !horizon.is_valid() {
            return 0;
        }
        let mut n = 0;
        while n < budget && g.body().fifo_head != NIL {
            let e = g.body().fifo_head;
            let d = g.data(e);
            if !d.xid.precedes(horizon) {
                break;
            }
            let next = d.fifo_next;
            let body = g.body_mut();
            body.fifo_head = next;
            if next == NIL {
                body.fifo_tail = NIL;
            }
            body.tombstones -= 1;
            // Tombstones are on no chain: out of the tree, it is ours.
            let gone = g.remove(e);
            self.mem.free(gone);
            n += 1;
        }
        let body = g.body_mut();
        if !body.summary.is_empty() && body.summary.xid_hi.precedes(horizon) {
            body.summary = region::Summary::EMPTY;
        }
        if n > 0 {
            self.count(slot, Stat::TombstonesReclaimed, u64::from(n));
        }
        n
    }
}
