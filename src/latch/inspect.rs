//! Read-only views of the table for `pgkvx.latches`, `pgkvx.ranges` and
//! `pgkvx.stats()`.  Each copies what it reports under the locks and calls
//! back with plain values, so callers never touch shared memory.

use super::locks::LockSet;
use super::queue::QueueState;
use super::region::guard::{Directory, RangeAccess};
use super::region::{EntryData, RelId, State};
use super::span::{KeyBuf, Span};
use super::table::LatchTable;
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

impl LatchInfo {
    fn of(rel: RelId, range: u32, data: &EntryData, state: State) -> LatchInfo {
        LatchInfo {
            rel,
            range,
            span: data.span,
            xid: data.xid,
            pid: data.pid,
            state,
            seq: data.seq,
            acquired_at: data.acquired_at,
        }
    }
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
    pub queue: QueueState,
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
    /// Every latch and tombstone, table by table in key order.
    pub(crate) fn for_each_latch(&self, f: &mut dyn FnMut(&LatchInfo)) {
        let mut d = self.mem.dir_read();
        for (t, rel) in tables_in_use(&d) {
            for &r in d.ranges_of(t).as_slice() {
                let g = d.range_read(r);
                g.for_each(&mut |e| {
                    let state = self.state(e);
                    if state == State::Dead {
                        return;
                    }
                    f(&LatchInfo::of(rel, r, g.data(e), state));
                });
            }
        }
    }

    /// The latches and tombstones of `rel` that overlap `span`, in key
    /// order (of their ranges): what the head-blocker view and EXPLAIN's
    /// "Waited For" look up, without walking every table's latches.
    pub(crate) fn for_each_latch_of(&self, rel: RelId, span: &Span, f: &mut dyn FnMut(&LatchInfo)) {
        if span.is_empty() {
            return;
        }
        let mut d = self.mem.dir_read();
        let Some(t) = d.find_table(rel) else { return };
        for i in d.ranges_over(t, span) {
            let r = d.range_at(t, i);
            let g = d.range_read(r);
            g.for_each_overlap(span, &mut |e| {
                let state = self.state(e);
                if state != State::Dead {
                    f(&LatchInfo::of(rel, r, g.data(e), state));
                }
                true
            });
        }
    }

    /// Every range, table by table in key order.
    pub(crate) fn for_each_range(&self, f: &mut dyn FnMut(&RangeInfo)) {
        let mut d = self.mem.dir_read();
        for (t, rel) in tables_in_use(&d) {
            for &r in d.ranges_of(t).as_slice() {
                let meta = *d.meta(r);
                let body = *d.range_read(r).body();
                let slot = &self.mem.region.ranges[r as usize];
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
                    queue: QueueState::load(&slot.queue, Relaxed),
                });
            }
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        let cfg = self.config();
        let d = self.mem.dir_read();
        let counts = d.counts();
        Usage {
            entries_used: cfg.max_entries - self.free_entries(),
            entries_max: cfg.max_entries,
            ranges_used: counts.ranges_used,
            ranges_max: cfg.max_ranges,
            tables_used: counts.tables_used,
            tables_max: cfg.max_tables,
        }
    }
}

/// The latched tables' slots.
fn tables_in_use<'t>(d: &impl Directory<'t>) -> Vec<(u32, RelId)> {
    (0..d.region().tables.len() as u32)
        .filter_map(|t| {
            let rel = d.table_data(t).rel;
            (rel != RelId::EMPTY && rel != RelId::DELETED).then_some((t, rel))
        })
        .collect()
}
