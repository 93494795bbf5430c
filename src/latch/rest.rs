//! Rest: a maintainer with nothing to do sleeps until a writer makes work.
//!
//! A maintainer that finds the table at rest (nothing released to drain,
//! nothing queued, no range the sweep would queue) publishes a *waker*, an
//! opaque word the platform turns into a wake-up (Postgres: the address of
//! its process latch), and sleeps without a timeout.  The writer that next
//! makes work (releases latches, or crowds a range) takes the waker and
//! wakes it.  Time alone makes no work while the table is at rest: live
//! latches wait for their holders, whose release rings, and there are no
//! tombstones waiting for the horizon.
//!
//! No wake-up is lost.  The maintainer stores its waker and *then* looks
//! for work; a writer publishes its work and *then* looks for a waker, both
//! across a sequentially consistent fence (Dekker's pattern): either the
//! maintainer sees the work and does not rest, or the writer sees the
//! waker and wakes it.

use super::locks::LockSet;
use super::table::LatchTable;
use std::sync::atomic::fence;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// What [`LatchTable::rest`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rest {
    /// There is work (or may soon be, as the horizon moves): keep ticking.
    Busy,
    /// At rest, with this many table slots still held: the idle-table
    /// sweep frees them in time, the only work time alone makes.
    Resting { tables: u32 },
}

impl<L: LockSet> LatchTable<'_, L> {
    /// Publishes `waker` and checks the table is at rest; when it is not,
    /// withdraws the waker.
    pub(crate) fn rest(&self, waker: u64) -> Rest {
        let hdr = self.mem.region.hdr;
        hdr.rest.store(waker.wrapping_add(1).max(1), SeqCst);
        fence(SeqCst);
        let at_rest = self.released_pending() == 0 && self.queued() == 0 && !self.any_needs_attention();
        if !at_rest {
            hdr.rest.store(0, SeqCst);
            return Rest::Busy;
        }
        Rest::Resting { tables: self.usage().tables_used }
    }

    /// The maintainer is up (woken, or ticking): writers need not wake it.
    pub(crate) fn stop_resting(&self) {
        self.mem.region.hdr.rest.store(0, Relaxed);
    }

    /// Called by a writer after it made work: the resting maintainer's
    /// waker, taken (only one writer wakes it), or None.
    pub(crate) fn take_waker(&self) -> Option<u64> {
        let rest = &self.mem.region.hdr.rest;
        fence(SeqCst);
        // Nearly always 0: a load keeps the cache line shared.
        if rest.load(SeqCst) == 0 {
            return None;
        }
        match rest.swap(0, SeqCst) {
            0 => None,
            w => Some(w - 1),
        }
    }

    /// Whether a maintainer rests (it is alive and will be woken).
    pub(crate) fn resting(&self) -> bool {
        self.mem.region.hdr.rest.load(Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::Rest;
    use crate::locks::heap_table;
    use crate::{Config, Holder, RelId, Span, TxEnd, Xid};

    #[test]
    fn a_maintainer_rests_only_while_time_alone_makes_no_work() {
        let t = heap_table(Config { max_entries: 64, max_ranges: 8, max_tables: 4, max_backends: 2 });
        let a = RelId::new(1, 10);
        let h = |x| Holder { xid: Xid(x), pid: 1, now_us: 0, owner: 0, role: 0 };
        assert_eq!(t.rest(7), Rest::Resting { tables: 0 });
        assert!(t.resting());
        assert_eq!(t.take_waker(), Some(7), "a writer takes the waker");
        assert_eq!(t.take_waker(), None, "and only one writer");
        assert!(!t.resting());
        // A live latch is no work: its holder's release will ring.
        t.acquire(0, a, &Span::point(b"x"), &h(50)).unwrap();
        assert_eq!(t.rest(7), Rest::Resting { tables: 1 });
        t.release_all(0, TxEnd::Committed);
        // Its tombstone waits for the horizon, which moves without a ring.
        t.stop_resting();
        assert_eq!(t.rest(7), Rest::Busy);
        assert!(!t.resting(), "a busy table withdraws the waker");
        t.set_horizon(Xid(51));
        t.reclaim_all(0);
        assert_eq!(t.rest(9), Rest::Resting { tables: 1 });
        assert_eq!(t.gc_idle_tables(), 0, "first look at the idle table");
        assert_eq!(t.gc_idle_tables(), 1);
        assert_eq!(t.rest(9), Rest::Resting { tables: 0 });
        assert_eq!(t.take_waker(), Some(9));
    }

    #[test]
    fn escalation_tells_its_caller_it_made_work() {
        let t = heap_table(Config { max_entries: 4096, max_ranges: 8, max_tables: 4, max_backends: 2 });
        let a = RelId::new(1, 10);
        let h = Holder { xid: Xid(100), pid: 1, now_us: 0, owner: 0, role: 0 };
        let limits = crate::Limits { escalate_points: 4, ..crate::Limits::DEFAULT };
        let mut held = crate::Holdings::new();
        for i in 0..3u32 {
            t.writer().latch(0, &mut held, a, &Span::point(&i.to_be_bytes()), &h, &limits).unwrap();
        }
        assert!(!held.take_withdrawn(), "three points: nothing folded yet");
        for i in 3..6u32 {
            t.writer().latch(0, &mut held, a, &Span::point(&i.to_be_bytes()), &h, &limits).unwrap();
        }
        assert!(held.take_withdrawn(), "the points were folded into a span");
        assert!(!held.take_withdrawn(), "told once");
        t.release_all(0, TxEnd::Aborted);
    }

    #[test]
    fn a_crowded_range_keeps_the_maintainer_up() {
        let t = heap_table(Config { max_entries: 4096, max_ranges: 8, max_tables: 4, max_backends: 2 });
        t.set_range_max_latches(8);
        let a = RelId::new(1, 10);
        for i in 0..20u32 {
            let h = Holder { xid: Xid(100 + i), pid: 1, now_us: 0, owner: 0, role: 0 };
            t.acquire(0, a, &Span::point(&i.to_be_bytes()), &h).unwrap();
        }
        assert_eq!(t.rest(1), Rest::Busy, "a range over its limit needs a split");
        t.release_all(0, TxEnd::Aborted);
    }
}
