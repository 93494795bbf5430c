//! Keeping the table small and its ranges balanced: reclaiming and
//! coalescing tombstones, splitting hot or crowded ranges, merging cold
//! neighbours, and purging tables that are no longer latched.
//!
//! Splits and merges run under the exclusive Directory lock, so they never
//! race with each other or with a writer; they take the locks of the ranges
//! they change, so a commit settling its latches sees an entry either before
//! or after the move.

use super::locks::{LockId, LockSet, Mode};
use super::region::guard::{Directory, RangeAccess, RangeMut, RangeRef};
use super::region::{RangeBody, RelId, MAX_RANGES_PER_TABLE};
use super::span::{KeyBuf, Span};
use super::stats::Stat;
use super::table::LatchTable;
use super::tree::NIL;
use std::sync::atomic::Ordering::Relaxed;

impl<L: LockSet> LatchTable<'_, L> {
    /// Reclaims every expired tombstone in every range.  Returns how many.
    pub(crate) fn reclaim_all(&self, slot: u32) -> u32 {
        self.drain_released(slot);
        let mut d = self.mem.dir_read();
        let mut n = 0;
        for r in 0..self.config().max_ranges {
            if !d.meta(r).in_use {
                continue;
            }
            n += self.reclaim(&mut d.range_write(r), slot, u32::MAX);
        }
        n
    }

    /// Folds all tombstones of range `r` into its summary, freeing their
    /// entries.  Readers then see more conflicts, never fewer.
    pub(crate) fn coalesce(&self, slot: u32, r: u32) -> u32 {
        self.drain_released(slot);
        let mut d = self.mem.dir_read();
        if !d.meta(r).in_use {
            return 0;
        }
        let mut g = d.range_write(r);
        let mut n = 0;
        let mut e = g.body().fifo_head;
        while e != NIL {
            let data = *g.data(e);
            let seq_hi = self.seq_hi(e);
            g.body_mut().summary.absorb(&data.span, data.xid, data.seq, seq_hi);
            let gone = g.remove(e);
            self.mem.free(gone);
            n += 1;
            e = data.fifo_next;
        }
        let body = g.body_mut();
        body.fifo_head = NIL;
        body.fifo_tail = NIL;
        body.tombstones = 0;
        self.count(slot, Stat::TombstonesCoalesced, u64::from(n));
        n
    }

    /// What a writer does when the table is full: reclaim what the horizon
    /// allows, then coalesce tombstones.  Returns the free entries after.
    pub(crate) fn relieve_pressure(&self, slot: u32) -> u32 {
        self.reclaim_all(slot);
        if self.free_entries() > 0 {
            return self.free_entries();
        }
        let ranges: Vec<u32> = {
            let d = self.mem.dir_read();
            (0..self.config().max_ranges).filter(|&r| d.meta(r).in_use).collect()
        };
        for r in ranges {
            self.coalesce(slot, r);
        }
        self.free_entries()
    }

    /// Splits range `r` near its median key at a point no latch crosses.
    /// Returns the new right-hand range, or None when it cannot split.
    pub(crate) fn split(&self, slot: u32, r: u32) -> Option<u32> {
        let mut d = self.mem.dir_write();
        let meta = *d.meta(r);
        if !meta.in_use || d.table_data(meta.table).nranges as usize >= MAX_RANGES_PER_TABLE {
            return None;
        }
        // Keep one free range for every free table slot: however one table
        // splits, a new table can always be latched.
        let counts = d.counts();
        let reserve = self.config().max_tables - counts.tables_used;
        if counts.ranges_used + reserve >= self.config().max_ranges {
            return None;
        }
        let at = split_point(&d.range_write(r).as_ref(), &meta.lo)?;
        let r2 = self.new_range(&mut d, meta.table, at, meta.hi)?;
        {
            let (mut b1, mut b2) = d.two_ranges_write(r, r2);
            // Move every entry starting at or after the split point.
            loop {
                let m = b1.last();
                if m == NIL || *b1.start(m) < at {
                    break;
                }
                // Drained tombstones are counted (and listed) as tombstones;
                // everything else, released-but-undrained included, as live.
                let live = !b1.data(m).in_fifo;
                let moved = b1.remove(m);
                b2.insert(moved);
                if live {
                    b1.body_mut().live -= 1;
                    b2.body_mut().live += 1;
                }
            }
            rebuild_fifo(&mut b1, &mut b2);
            if b1.body().summary.span.overlaps(&Span { start: at, end: meta.hi }) {
                b2.body_mut().summary = b1.body().summary;
            }
        }
        d.meta_mut(r).hi = at;
        let td = d.table_data_mut(meta.table);
        let pos = td.position(r);
        td.insert_range(pos + 1, r2, at.head());
        self.mem.region.hdr.dir_version.fetch_add(1, Relaxed);
        self.count(slot, Stat::RangeSplits, 1);
        Some(r2)
    }

    /// Merges range `right` into its left neighbour `left` (same table,
    /// adjacent).  Returns false when they are not neighbours.
    pub(crate) fn merge(&self, slot: u32, left: u32, right: u32) -> bool {
        let mut d = self.mem.dir_write();
        let (ml, mr) = (*d.meta(left), *d.meta(right));
        if !ml.in_use || !mr.in_use || ml.table != mr.table || ml.hi != mr.lo {
            return false;
        }
        {
            let (mut bl, mut br) = d.two_ranges_write(left, right);
            loop {
                let m = br.first();
                if m == NIL {
                    break;
                }
                let moved = br.remove(m);
                bl.insert(moved);
            }
            let (live, tombstones, summary, mut e) =
                (br.body().live, br.body().tombstones, br.body().summary, br.body().fifo_head);
            while e != NIL {
                let next = bl.data(e).fifo_next;
                bl.fifo_push(e);
                e = next;
            }
            let body = bl.body_mut();
            body.live += live;
            body.tombstones += tombstones;
            body.summary.merge(&summary);
            *br.body_mut() = RangeBody::EMPTY;
        }
        d.meta_mut(left).hi = mr.hi;
        let td = d.table_data_mut(ml.table);
        let pos = td.position(right);
        td.remove_range(pos);
        self.free_range(&mut d, right);
        self.count(slot, Stat::RangeMerges, 1);
        true
    }

    /// Forgets a table (disabled or dropped): frees its tombstones that no
    /// snapshot can need any more, and its slot once nothing is left.
    /// Tombstones of holders a running snapshot may still see in flight
    /// stay (a reader of a table disabled and enabled again must still find
    /// them); the idle-table sweep frees the slot once the horizon has
    /// passed them.  Refuses (false) while any latch on it is still live.
    pub(crate) fn purge_table(&self, slot: u32, rel: RelId) -> bool {
        // Latches released but not drained still count as live.
        self.drain_released(slot);
        let mut d = self.mem.dir_write();
        let Some(t) = d.find_table(rel) else {
            return true;
        };
        let ranges = d.ranges_of(t);
        if ranges.as_slice().iter().any(|&r| d.range_write(r).body().live > 0) {
            return false;
        }
        let mut left = false;
        for &r in ranges.as_slice() {
            let mut g = d.range_write(r);
            self.reclaim(&mut g, slot, u32::MAX);
            left |= g.body().root != NIL || !g.body().summary.is_empty();
        }
        if left {
            return true;
        }
        for &r in ranges.as_slice() {
            *d.range_write(r).body_mut() = RangeBody::EMPTY;
            self.free_range(&mut d, r);
        }
        let td = d.table_data_mut(t);
        td.rel = RelId::DELETED;
        td.nranges = 0;
        d.counts_mut().tables_used -= 1;
        true
    }

    /// Frees the slots of tables that hold nothing (no latch, no tombstone)
    /// and took no latch since the previous call: tables no longer written,
    /// or of a dropped database (DROP DATABASE fires no event trigger).  A
    /// table written again simply gets a fresh slot.  Returns how many.
    pub(crate) fn gc_idle_tables(&self) -> u32 {
        let mut d = self.mem.dir_write();
        let mut freed = 0;
        for t in 0..self.config().max_tables {
            if matches!(d.table_data(t).rel, RelId::EMPTY | RelId::DELETED) {
                continue;
            }
            let ranges = d.ranges_of(t);
            let ranges = ranges.as_slice();
            let acquires: u64 = ranges.iter().map(|&r| self.mem.region.ranges[r as usize].acquires.load(Relaxed)).sum();
            let td = d.table_data_mut(t);
            let idle = acquires == td.seen_acquires;
            td.seen_acquires = acquires;
            let empty = ranges.iter().all(|&r| {
                let b = *d.range_write(r).body();
                b.live == 0 && b.tombstones == 0 && b.summary.is_empty()
            });
            // A key draw in progress holds the table lock: leave it alone.
            if !idle || !empty || !self.mem.locks.try_acquire(LockId::Table(t), Mode::Exclusive) {
                continue;
            }
            for &r in ranges {
                self.free_range(&mut d, r);
            }
            let td = d.table_data_mut(t);
            td.rel = RelId::DELETED;
            td.nranges = 0;
            d.counts_mut().tables_used -= 1;
            self.mem.locks.release(LockId::Table(t));
            freed += 1;
        }
        freed
    }

    /// The ranges of `rel` in key order (empty when it was never latched).
    #[cfg(any(test, feature = "std-locks"))]
    pub(crate) fn ranges_of(&self, rel: RelId) -> Vec<u32> {
        let d = self.mem.dir_read();
        d.find_table(rel).map_or_else(Vec::new, |t| d.ranges_of(t).as_slice().to_vec())
    }

    /// Tree nodes on the pool's free stack (walked; call while quiet).
    #[cfg(test)]
    pub(crate) fn free_tree_nodes(&self) -> u32 {
        use std::sync::atomic::Ordering::Acquire;
        let (mut n, mut count) = (self.mem.region.hdr.node_free_head.load(Acquire) as u32, 0);
        while n != NIL {
            count += 1;
            n = self.mem.region.node_next[n as usize].load(Acquire);
        }
        count
    }

    /// Checks `rel`'s ranges and their trees: ranges in key order with their
    /// cached low-bound heads right, every tree's invariants (tree::check).
    /// Returns how many entries the trees hold.
    #[cfg(test)]
    pub(crate) fn check_structure(&self, rel: RelId) -> usize {
        let mut d = self.mem.dir_read();
        let Some(t) = d.find_table(rel) else {
            return 0;
        };
        let td = d.table_data(t).clone();
        let mut total = 0;
        for i in 0..td.nranges as usize {
            let r = td.ranges[i];
            let lo = d.meta(r).lo;
            assert_eq!(td.lo_heads[i], lo.head(), "cached low bound of range {r}");
            if i > 0 {
                assert!(d.meta(td.ranges[i - 1]).lo < lo, "ranges out of key order");
            }
            total += d.range_read(r).check_tree();
        }
        total
    }
}

/// A key near the median start of `g`'s latches, above `lo`, that no
/// latch spans across.
fn split_point(g: &RangeRef<'_>, lo: &KeyBuf) -> Option<KeyBuf> {
    let n = g.body().live + g.body().tombstones;
    if n < 2 {
        return None;
    }
    for k in [n / 2, n / 3, 2 * n / 3, n / 4, 3 * n / 4, 1, n - 1] {
        let mut i = 0;
        let mut key = None;
        g.for_each(&mut |e| {
            if i == k {
                key = Some(*g.start(e));
            }
            i += 1;
        });
        let Some(at) = key else { continue };
        if at <= *lo {
            continue;
        }
        let probe = Span::point(at.as_bytes());
        let mut crossed = false;
        g.for_each_overlap(&probe, &mut |e| {
            crossed = *g.start(e) < at;
            !crossed
        });
        if !crossed {
            return Some(at);
        }
    }
    None
}

/// Splits the tombstone list of `b1` between `b1` and `b2` (some of its
/// entries now in `b2`), keeping release order.
fn rebuild_fifo(b1: &mut RangeMut<'_>, b2: &mut RangeMut<'_>) {
    let r2 = b2.id();
    let mut e = b1.body().fifo_head;
    let body = b1.body_mut();
    body.fifo_head = NIL;
    body.fifo_tail = NIL;
    body.tombstones = 0;
    while e != NIL {
        let moved = b1.range_of(e) == r2;
        let next = if moved { b2.data(e).fifo_next } else { b1.data(e).fifo_next };
        if moved {
            b2.fifo_push(e);
            b2.body_mut().tombstones += 1;
        } else {
            b1.fifo_push(e);
            b1.body_mut().tombstones += 1;
        }
        e = next;
    }
}

#[cfg(test)]
mod tests {
    use crate::locks::heap_table;
    use crate::{Config, Holder, RelId, Span, TxEnd, Xid};

    #[test]
    fn idle_empty_tables_are_freed_and_come_back_on_demand() {
        let t = heap_table(Config { max_entries: 64, max_ranges: 8, max_tables: 4, max_backends: 2 });
        let (a, b) = (RelId::new(1, 10), RelId::new(2, 10));
        let h = |x| Holder { xid: Xid(x), pid: 1, now_us: 0, owner: 0, role: 0 };
        t.acquire(0, a, &Span::point(b"x"), &h(50)).unwrap();
        t.acquire(0, b, &Span::point(b"y"), &h(50)).unwrap();
        assert_eq!(t.gc_idle_tables(), 0, "live latches: nothing to free");
        t.release_all(0, TxEnd::Committed);
        t.set_horizon(Xid(51));
        t.reclaim_all(0);
        // b is written again; a stays idle (and empty) since the last look
        t.acquire(0, b, &Span::point(b"y2"), &h(52)).unwrap();
        t.release_all(0, TxEnd::Aborted);
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
        t.release_all(0, TxEnd::Aborted);
    }
}
