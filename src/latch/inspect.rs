//! Read-only views of the table for `pgkvx.latches`, `pgkvx.ranges` and
//! `pgkvx.stats()`.  Each copies what it reports under the locks and calls
//! back with plain values, so callers never touch shared memory.

use super::locks::{LockId, LockSet, Mode};
use super::region::{RelId, State};
use super::span::{KeyBuf, Span};
use super::table::LatchTable;
use super::tree;
use super::xid::Xid;
use std::sync::atomic::Ordering::Relaxed;

#[derive(Clone, Copy, Debug)]
pub struct LatchInfo {
    pub rel: RelId,
    pub range: u32,
    pub span: Span,
    pub xid: Xid,
    pub pid: i32,
    pub state: State,
    pub seq: u64,
    pub acquired_at: i64,
}

#[derive(Clone, Copy, Debug)]
pub struct RangeInfo {
    pub id: u32,
    pub rel: RelId,
    pub lo: KeyBuf,
    pub hi: KeyBuf,
    pub live: u32,
    pub tombstones: u32,
    /// Tombstones folded into the range's summary.
    pub coalesced: u32,
    pub acquires: u64,
    pub lock_waits: u64,
    pub queue: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub entries_used: u32,
    pub entries_max: u32,
    pub ranges_used: u32,
    pub ranges_max: u32,
    pub tables_used: u32,
    pub tables_max: u32,
}

impl<L: LockSet> LatchTable<'_, L> {
    fn tables_in_use(&self) -> Vec<(u32, RelId)> {
        (0..self.config().max_tables)
            .filter_map(|t| {
                // SAFETY: the caller holds the Directory lock.
                let rel = unsafe { self.table_data(t) }.rel;
                (rel != RelId::EMPTY && rel != RelId::DELETED).then_some((t, rel))
            })
            .collect()
    }

    /// Every latch and tombstone, table by table in key order.
    pub fn for_each_latch(&self, f: &mut dyn FnMut(&LatchInfo)) {
        let _d = self.lock(LockId::Directory, Mode::Shared);
        for (t, rel) in self.tables_in_use() {
            self.for_each_range_of(t, &Span::ALL, &mut |r| {
                let _g = self.lock(LockId::Range(r), Mode::Shared);
                // SAFETY: range lock held.
                let body = unsafe { self.body(r) };
                tree::for_each(&self.nodes(), body.root, &mut |e| {
                    // SAFETY: as above.
                    let d = unsafe { self.data(e) };
                    let state = self.state(e);
                    if state == State::Dead {
                        return;
                    }
                    f(&LatchInfo {
                        rel,
                        range: r,
                        span: d.span,
                        xid: d.xid,
                        pid: d.pid,
                        state,
                        seq: d.seq,
                        acquired_at: d.acquired_at,
                    });
                });
                true
            });
        }
    }

    /// Every range, table by table in key order.
    pub fn for_each_range(&self, f: &mut dyn FnMut(&RangeInfo)) {
        let _d = self.lock(LockId::Directory, Mode::Shared);
        for (t, rel) in self.tables_in_use() {
            self.for_each_range_of(t, &Span::ALL, &mut |r| {
                // SAFETY: Directory lock held.
                let meta = *unsafe { self.meta(r) };
                let body = {
                    let _g = self.lock(LockId::Range(r), Mode::Shared);
                    // SAFETY: range lock held.
                    *unsafe { self.body(r) }
                };
                let slot = &self.p.ranges[r as usize];
                f(&RangeInfo {
                    id: r,
                    rel,
                    lo: meta.lo,
                    hi: meta.hi,
                    live: body.live,
                    tombstones: body.tombstones,
                    coalesced: body.summary.count,
                    acquires: slot.acquires.load(Relaxed),
                    lock_waits: slot.contended.load(Relaxed),
                    queue: slot.queue.load(Relaxed),
                });
                true
            });
        }
    }

    pub fn usage(&self) -> Usage {
        let cfg = self.config();
        let _d = self.lock(LockId::Directory, Mode::Shared);
        // SAFETY: Directory lock held.
        let dir = unsafe { &*self.p.hdr.dir.get() };
        Usage {
            entries_used: cfg.max_entries - self.free_entries(),
            entries_max: cfg.max_entries,
            ranges_used: dir.ranges_used,
            ranges_max: cfg.max_ranges,
            tables_used: dir.tables_used,
            tables_max: cfg.max_tables,
        }
    }
}
