//! Keeping the table small and its ranges balanced: reclaiming and
//! coalescing tombstones, splitting hot or crowded ranges, merging cold
//! neighbours, and purging tables that are no longer latched.
//!
//! Splits and merges run under the exclusive Directory lock, so they never
//! race with each other and every other process holds at most one range lock
//! at a time: no lock-order deadlock is possible.

use super::locks::{LockId, LockSet, Mode};
use super::region::{RangeBody, RelId, MAX_RANGES_PER_TABLE};
use super::span::{KeyBuf, Span};
use super::stats::Stat;
use super::table::LatchTable;
use super::tree::{self, NodeStore, NIL};
use std::sync::atomic::Ordering::{Relaxed, Release};

impl<L: LockSet> LatchTable<'_, L> {
    /// Reclaims every expired tombstone in every range.  Returns how many.
    pub fn reclaim_all(&self, slot: u32) -> u32 {
        self.drain_released(slot);
        let _d = self.lock(LockId::Directory, Mode::Shared);
        let mut n = 0;
        for r in 0..self.config().max_ranges {
            // SAFETY: Directory lock held.
            if !unsafe { self.meta(r) }.in_use {
                continue;
            }
            let _g = self.lock(LockId::Range(r), Mode::Exclusive);
            n += self.reclaim_locked(slot, r, u32::MAX);
        }
        n
    }

    /// Folds all tombstones of range `r` into its summary, freeing their
    /// entries.  Readers then see more conflicts, never fewer.
    pub fn coalesce(&self, slot: u32, r: u32) -> u32 {
        self.drain_released(slot);
        let _g = self.lock(LockId::Range(r), Mode::Exclusive);
        // SAFETY: exclusive range lock held.
        let body = unsafe { self.body(r) };
        let mut n = 0;
        let mut e = body.fifo_head;
        while e != NIL {
            // SAFETY: `e` is a tombstone in range `r`.
            let d = unsafe { self.data(e) };
            let next = d.fifo_next;
            body.summary.absorb(&d.span, d.xid, d.seq, self.seq_hi(e));
            body.root = tree::remove(&self.nodes(), body.root, e);
            // SAFETY: unlinked from the tree; the list is dropped below.
            unsafe { self.free(e) };
            n += 1;
            e = next;
        }
        body.fifo_head = NIL;
        body.fifo_tail = NIL;
        body.tombstones = 0;
        self.count(slot, Stat::TombstonesCoalesced, u64::from(n));
        n
    }

    /// What a writer does when the table is full: reclaim what the horizon
    /// allows, then coalesce tombstones.  Returns the free entries after.
    pub fn relieve_pressure(&self, slot: u32) -> u32 {
        self.reclaim_all(slot);
        if self.free_entries() > 0 {
            return self.free_entries();
        }
        let ranges: Vec<u32> = {
            let _d = self.lock(LockId::Directory, Mode::Shared);
            // SAFETY: Directory lock held.
            (0..self.config().max_ranges).filter(|&r| unsafe { self.meta(r) }.in_use).collect()
        };
        for r in ranges {
            self.coalesce(slot, r);
        }
        self.free_entries()
    }

    /// Splits range `r` near its median key at a point no latch crosses.
    /// Returns the new right-hand range, or None when it cannot split.
    pub fn split(&self, slot: u32, r: u32) -> Option<u32> {
        let _d = self.lock(LockId::Directory, Mode::Exclusive);
        // SAFETY: exclusive Directory lock held.
        let meta = *unsafe { self.meta(r) };
        if !meta.in_use {
            return None;
        }
        // SAFETY: as above.
        let td = unsafe { self.table_data(meta.table) };
        if td.nranges as usize >= MAX_RANGES_PER_TABLE {
            return None;
        }
        // Keep one free range for every free table slot: however one table
        // splits, a new table can always be latched.
        // SAFETY: exclusive Directory lock held.
        let dir = unsafe { self.dir() };
        let reserve = self.config().max_tables - dir.tables_used;
        if dir.ranges_used + reserve >= self.config().max_ranges {
            return None;
        }
        let at = {
            let _g = self.lock(LockId::Range(r), Mode::Shared);
            self.split_point(r, &meta.lo)?
        };
        let r2 = self.new_range(meta.table, at, meta.hi)?;
        let _g1 = self.lock(LockId::Range(r), Mode::Exclusive);
        let _g2 = self.lock(LockId::Range(r2), Mode::Exclusive);
        // SAFETY: exclusive Directory lock held.
        unsafe { self.meta(r) }.hi = at;
        // SAFETY: both range locks held exclusively.
        let (b1, b2) = unsafe { (self.body(r), self.body(r2)) };
        let nodes = self.nodes();
        // Move every entry starting at or after the split point.
        loop {
            let m = tree::last(&nodes, b1.root);
            if m == NIL || *nodes.start(m) < at {
                break;
            }
            b1.root = tree::remove(&nodes, b1.root, m);
            b2.root = tree::insert(&nodes, b2.root, m);
            self.entry(m).range.store(r2, Release);
            // SAFETY: `m` is now in r2, whose lock we hold.  Drained
            // tombstones are counted (and listed) as tombstones; everything
            // else, released-but-undrained included, as live.
            if !unsafe { self.data(m) }.in_fifo {
                b1.live -= 1;
                b2.live += 1;
            }
        }
        self.rebuild_fifo(b1, b2, r2);
        if b1.summary.span.overlaps(&Span { start: at, end: meta.hi }) {
            b2.summary = b1.summary;
        }
        let pos = td.position(r);
        td.insert_range(pos + 1, r2, at.head());
        self.p.hdr.dir_version.fetch_add(1, Relaxed);
        self.count(slot, Stat::RangeSplits, 1);
        Some(r2)
    }

    /// A key near the median start of `r`'s latches, above `lo`, that no
    /// latch spans across.  Range lock held.
    fn split_point(&self, r: u32, lo: &KeyBuf) -> Option<KeyBuf> {
        // SAFETY: the caller holds r's lock.
        let body = unsafe { self.body(r) };
        let n = body.live + body.tombstones;
        if n < 2 {
            return None;
        }
        let nodes = self.nodes();
        for k in [n / 2, n / 3, 2 * n / 3, n / 4, 3 * n / 4, 1, n - 1] {
            let mut i = 0;
            let mut key = None;
            tree::for_each(&nodes, body.root, &mut |e| {
                if i == k {
                    key = Some(*nodes.start(e));
                }
                i += 1;
            });
            let Some(at) = key else { continue };
            if at <= *lo {
                continue;
            }
            let probe = Span::point(at.as_bytes());
            let mut crossed = false;
            tree::for_each_overlap(&nodes, body.root, &probe, &mut |e| {
                crossed = *nodes.start(e) < at;
                !crossed
            });
            if !crossed {
                return Some(at);
            }
        }
        None
    }

    /// Splits the tombstone list of `b1` between `b1` and `b2` (entries now
    /// in `r2`), keeping release order.
    fn rebuild_fifo(&self, b1: &mut RangeBody, b2: &mut RangeBody, r2: u32) {
        let mut e = b1.fifo_head;
        b1.fifo_head = NIL;
        b1.fifo_tail = NIL;
        b1.tombstones = 0;
        while e != NIL {
            // SAFETY: both ranges' locks are held by the caller.
            let next = unsafe { self.data(e) }.fifo_next;
            if self.entry(e).range.load(Relaxed) == r2 {
                self.fifo_push(b2, e);
                b2.tombstones += 1;
            } else {
                self.fifo_push(b1, e);
                b1.tombstones += 1;
            }
            e = next;
        }
    }

    /// Merges range `right` into its left neighbour `left` (same table,
    /// adjacent).  Returns false when they are not neighbours.
    pub fn merge(&self, slot: u32, left: u32, right: u32) -> bool {
        let _d = self.lock(LockId::Directory, Mode::Exclusive);
        // SAFETY: exclusive Directory lock held.
        let (ml, mr) = unsafe { (*self.meta(left), *self.meta(right)) };
        if !ml.in_use || !mr.in_use || ml.table != mr.table || ml.hi != mr.lo {
            return false;
        }
        {
            let _g1 = self.lock(LockId::Range(left), Mode::Exclusive);
            let _g2 = self.lock(LockId::Range(right), Mode::Exclusive);
            // SAFETY: both range locks held exclusively.
            let (bl, br) = unsafe { (self.body(left), self.body(right)) };
            let nodes = self.nodes();
            while br.root != NIL {
                let m = tree::first(&nodes, br.root);
                br.root = tree::remove(&nodes, br.root, m);
                bl.root = tree::insert(&nodes, bl.root, m);
                self.entry(m).range.store(left, Release);
            }
            bl.live += br.live;
            let mut e = br.fifo_head;
            while e != NIL {
                // SAFETY: locks held.
                let next = unsafe { self.data(e) }.fifo_next;
                self.fifo_push(bl, e);
                e = next;
            }
            bl.tombstones += br.tombstones;
            bl.summary.merge(&br.summary);
            *br = RangeBody::EMPTY;
        }
        // SAFETY: exclusive Directory lock held.
        unsafe { self.meta(left) }.hi = mr.hi;
        // SAFETY: as above.
        let td = unsafe { self.table_data(ml.table) };
        let pos = td.position(right);
        td.remove_range(pos);
        self.free_range(right);
        self.count(slot, Stat::RangeMerges, 1);
        true
    }

    /// Forgets a table (disabled or dropped): frees its ranges and
    /// tombstones.  Refuses (false) while any latch on it is still live.
    pub fn purge_table(&self, rel: RelId) -> bool {
        // Latches released but not drained still count as live.
        self.drain_released(u32::MAX);
        let _d = self.lock(LockId::Directory, Mode::Exclusive);
        let Some(t) = self.find_table(rel) else {
            return true;
        };
        // SAFETY: exclusive Directory lock held.
        let td = unsafe { self.table_data(t) };
        let ranges = td.ranges;
        let nranges = td.nranges as usize;
        for &r in &ranges[..nranges] {
            let _g = self.lock(LockId::Range(r), Mode::Shared);
            // SAFETY: range lock held.
            if unsafe { self.body(r) }.live > 0 {
                return false;
            }
        }
        for &r in &ranges[..nranges] {
            {
                let _g = self.lock(LockId::Range(r), Mode::Exclusive);
                // SAFETY: exclusive range lock held.
                let body = unsafe { self.body(r) };
                let nodes = self.nodes();
                while body.root != NIL {
                    let m = tree::first(&nodes, body.root);
                    body.root = tree::remove(&nodes, body.root, m);
                    // SAFETY: tombstones only (no live latches): on no chain.
                    unsafe { self.free(m) };
                }
                *body = RangeBody::EMPTY;
            }
            self.free_range(r);
        }
        td.rel = RelId::DELETED;
        td.nranges = 0;
        // SAFETY: exclusive Directory lock held.
        unsafe { self.dir() }.tables_used -= 1;
        true
    }

    /// Frees the slots of tables that hold nothing (no latch, no tombstone)
    /// and took no latch since the previous call: tables no longer written,
    /// or of a dropped database (DROP DATABASE fires no event trigger).  A
    /// table written again simply gets a fresh slot.  Returns how many.
    pub fn gc_idle_tables(&self) -> u32 {
        let _d = self.lock(LockId::Directory, Mode::Exclusive);
        let mut freed = 0;
        for t in 0..self.config().max_tables {
            // SAFETY: exclusive Directory lock held.
            let td = unsafe { self.table_data(t) };
            if td.rel == RelId::EMPTY || td.rel == RelId::DELETED {
                continue;
            }
            let ranges = td.ranges;
            let ranges = &ranges[..td.nranges as usize];
            let acquires: u64 = ranges.iter().map(|&r| self.p.ranges[r as usize].acquires.load(Relaxed)).sum();
            let idle = acquires == td.seen_acquires;
            td.seen_acquires = acquires;
            let empty = ranges.iter().all(|&r| {
                let _g = self.lock(LockId::Range(r), Mode::Shared);
                // SAFETY: range lock held.
                let b = unsafe { self.body(r) };
                b.live == 0 && b.tombstones == 0 && b.summary.is_empty()
            });
            // A key draw in progress holds the table lock: leave it alone.
            if !idle || !empty || !self.locks.try_acquire(LockId::Table(t), Mode::Exclusive) {
                continue;
            }
            for &r in ranges {
                self.free_range(r);
            }
            td.rel = RelId::DELETED;
            td.nranges = 0;
            // SAFETY: exclusive Directory lock held.
            unsafe { self.dir() }.tables_used -= 1;
            self.locks.release(LockId::Table(t));
            freed += 1;
        }
        freed
    }

    /// The ranges of `rel` in key order (empty when it was never latched).
    pub fn ranges_of(&self, rel: RelId) -> Vec<u32> {
        let _d = self.lock(LockId::Directory, Mode::Shared);
        let Some(t) = self.find_table(rel) else {
            return Vec::new();
        };
        // SAFETY: Directory lock held.
        let td = unsafe { self.table_data(t) };
        td.ranges[..td.nranges as usize].to_vec()
    }

    /// Tree nodes on the pool's free stack (walked; call while quiet).
    #[cfg(test)]
    pub(crate) fn free_tree_nodes(&self) -> u32 {
        use std::sync::atomic::Ordering::Acquire;
        let (mut n, mut count) = (self.p.hdr.node_free_head.load(Acquire) as u32, 0);
        while n != NIL {
            count += 1;
            n = self.p.node_next[n as usize].load(Acquire);
        }
        count
    }

    /// Checks `rel`'s ranges and their trees: ranges in key order with their
    /// cached low-bound heads right, every tree's invariants (tree::check).
    /// Returns how many entries the trees hold.
    #[cfg(test)]
    pub(crate) fn check_structure(&self, rel: RelId) -> usize {
        let _d = self.lock(LockId::Directory, Mode::Shared);
        let Some(t) = self.find_table(rel) else {
            return 0;
        };
        // SAFETY: Directory lock held.
        let td = unsafe { self.table_data(t) };
        let mut total = 0;
        for i in 0..td.nranges as usize {
            let r = td.ranges[i];
            // SAFETY: as above.
            let lo = unsafe { self.meta(r) }.lo;
            assert_eq!(td.lo_heads[i], lo.head(), "cached low bound of range {r}");
            if i > 0 {
                // SAFETY: as above.
                assert!(unsafe { self.meta(td.ranges[i - 1]) }.lo < lo, "ranges out of key order");
            }
            let _g = self.lock(LockId::Range(r), Mode::Shared);
            // SAFETY: range lock held.
            total += tree::check(&self.nodes(), unsafe { self.body(r) }.root);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use crate::locks::heap_table;
    use crate::{Config, Holder, Outcome, RelId, Span, Xid};

    #[test]
    fn idle_empty_tables_are_freed_and_come_back_on_demand() {
        let t = heap_table(Config { max_entries: 64, max_ranges: 8, max_tables: 4, max_backends: 2 });
        let (a, b) = (RelId::new(1, 10), RelId::new(2, 10));
        let h = |x| Holder { xid: Xid(x), pid: 1, now_us: 0, owner: 0 };
        t.acquire(0, a, &Span::point(b"x"), &h(50)).unwrap();
        t.acquire(0, b, &Span::point(b"y"), &h(50)).unwrap();
        assert_eq!(t.gc_idle_tables(), 0, "live latches: nothing to free");
        t.release_all(0, Outcome::Committed);
        t.set_horizon(Xid(51));
        t.reclaim_all(0);
        // b is written again; a stays idle (and empty) since the last look
        t.acquire(0, b, &Span::point(b"y2"), &h(52)).unwrap();
        t.release_all(0, Outcome::Aborted);
        t.drain_released(0);
        {
            let _draws = t.lock_draws(a, 0).unwrap(); // a key draw in progress protects a
            assert_eq!(t.gc_idle_tables(), 0, "a is being drawn from; b was written");
        }
        assert_eq!(t.gc_idle_tables(), 2, "both idle and empty now");
        assert_eq!(t.usage().tables_used, 0);
        assert_eq!(t.usage().ranges_used, 0);
        // Writing again recreates the table.
        t.acquire(0, b, &Span::point(b"z"), &h(60)).unwrap();
        assert_eq!(t.usage().tables_used, 1);
        t.release_all(0, Outcome::Aborted);
    }
}
