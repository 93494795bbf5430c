//! The four faces of the latch table: each caller takes the one that holds
//! the verbs it needs, and sees nothing else of the table (README.md,
//! "Faces").  A face is a copyable borrow of the table; its methods forward
//! to the table's crate-private ones, where the work is done.

use super::holdings::{Holdings, Latched, Limits};
use super::inspect::{LatchInfo, RangeInfo, Usage};
use super::locks::LockSet;
use super::queue::Action;
use super::region::RelId;
use super::rest::Rest;
use super::snapshot::ReadSnapshot;
use super::span::Span;
use super::stats::{Stat, NSTATS};
use super::table::{AcquireError, DrawLock, Holder, LatchTable, TxEnd};
use super::validate::{Check, Conflict};
use super::xid::Xid;

macro_rules! face {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name<'t, L: LockSet>(&'t LatchTable<'t, L>);

        impl<L: LockSet> Clone for $name<'_, L> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<L: LockSet> Copy for $name<'_, L> {}

    };
}

face! {
    /// A backend that writes: publishes latches before it changes rows,
    /// keeps them within its limits and releases them when its
    /// (sub)transaction ends.
    Writer
}

face! {
    /// A reader: checks the spans it read against the latches of writers
    /// its snapshot cannot see, and names those writers (EXPLAIN).
    Reader
}

face! {
    /// A maintenance worker: drains released latches, publishes the xid
    /// horizon, and splits, merges, coalesces and frees ranges and tables.
    Maintainer
}

face! {
    /// The views: every latch, range and counter, read without changing
    /// anything.
    Inspector
}

impl<L: LockSet> LatchTable<'_, L> {
    /// The table as a writing backend sees it.
    pub fn writer(&self) -> Writer<'_, L> {
        Writer(self)
    }

    /// The table as a reader sees it.
    pub fn reader(&self) -> Reader<'_, L> {
        Reader(self)
    }

    /// The table as a maintenance worker sees it.
    pub fn maintainer(&self) -> Maintainer<'_, L> {
        Maintainer(self)
    }

    /// The table as the views see it.
    pub fn inspector(&self) -> Inspector<'_, L> {
        Inspector(self)
    }
}

impl<'t, L: LockSet> Writer<'t, L> {
    /// Publishes a write latch on `span` of `rel` for the transaction whose
    /// latches `held` records, unless a span latch it holds covers `span`;
    /// then keeps the transaction within `limits` (escalation).
    pub fn latch(
        self,
        slot: u32,
        held: &mut Holdings,
        rel: RelId,
        span: &Span,
        h: &Holder,
        limits: &Limits,
    ) -> Result<Latched, AcquireError> {
        self.0.latch(slot, held, rel, span, h, limits)
    }

    /// Escalates `rel`'s latches when there are too many, and every table's
    /// when the transaction or its role is over its budget; fails when even
    /// that leaves it over.
    pub fn enforce_limits(
        self,
        slot: u32,
        held: &mut Holdings,
        rel: RelId,
        h: &Holder,
        limits: &Limits,
    ) -> Result<(), AcquireError> {
        self.0.enforce_limits(slot, held, rel, h, limits)
    }

    /// Releases every latch of the transaction in `slot`: tombstones at
    /// commit (called once the commit is visible), gone at abort.
    pub fn release_all(self, slot: u32, end: TxEnd) -> u32 {
        self.0.release_all(slot, end)
    }

    /// Releases the latches published in subtransaction `sub` or a later one,
    /// which rolled back.
    pub fn release_subxact(self, slot: u32, held: &mut Holdings, sub: u32) -> u32 {
        self.0.release_subxact(slot, held, sub)
    }

    /// Whether the backend in `slot` holds any latch now.
    pub fn holds_any(self, slot: u32) -> bool {
        self.0.holds_any(slot)
    }

    /// Inside a draw section: a ticket for the drawn latch the backend in
    /// `slot` logs right after the section (draw_order.rs).
    pub fn take_draw_ticket(self, slot: u32) -> u64 {
        self.0.take_draw_ticket(slot)
    }

    /// The drawn latch of `slot` is logged, or never will be.
    pub fn return_draw_ticket(self, slot: u32) {
        self.0.return_draw_ticket(slot)
    }

    /// Whether another backend holds a draw ticket older than `ticket`.
    pub fn older_draw_unlogged(self, slot: u32, ticket: u64) -> bool {
        self.0.older_draw_unlogged(slot, ticket)
    }

    /// Takes table `rel`'s key-drawing lock (creating its slot if needed):
    /// draws and latch publications inside it are totally ordered.
    pub fn lock_draws(self, rel: RelId, owner: u32) -> Result<DrawLock<'t, L>, AcquireError> {
        self.0.lock_draws(rel, owner)
    }

    /// Forgets a table that was disabled or dropped: frees what no snapshot
    /// can need any more, and its slot once nothing is left.
    pub fn purge_table(self, slot: u32, rel: RelId) -> bool {
        self.0.purge_table(slot, rel)
    }

    /// The load of the most crowded range overlapping `span`, for backing off.
    pub fn max_load(self, rel: RelId, span: &Span) -> u32 {
        self.0.max_load(rel, span)
    }

    /// What a writer does when the table is full: reclaims what the horizon
    /// allows, then coalesces tombstones.  Returns the free entries after.
    pub fn relieve_pressure(self, slot: u32) -> u32 {
        self.0.relieve_pressure(slot)
    }

    /// Free entries left.
    pub fn free_entries(self) -> u32 {
        self.0.free_entries()
    }

    /// The split threshold (`pgkvx.range_max_latches`).
    pub fn range_max_latches(self) -> u32 {
        self.0.range_max_latches()
    }

    /// When a maintenance worker last said it was alive (µs).
    pub fn last_beat(self) -> i64 {
        self.0.last_beat()
    }

    /// After making work for the maintainer (releasing latches, crowding a
    /// range): the waker of a maintainer resting meanwhile, taken, for the
    /// caller to wake it (rest.rs).
    pub fn take_waker(self) -> Option<u64> {
        self.0.take_waker()
    }

    /// Whether a maintainer rests: alive, and woken when work comes.
    pub fn maintainer_resting(self) -> bool {
        self.0.resting()
    }

    /// Adds `n` to counter `stat` of backend `slot`.
    pub fn count(self, slot: u32, stat: Stat, n: u64) {
        self.0.count(slot, stat, n)
    }

    /// Publishes one latch without holdings or limits (for the benchmarks).
    #[cfg(feature = "std-locks")]
    pub fn acquire(self, slot: u32, rel: RelId, span: &Span, h: &Holder) -> Result<u32, AcquireError> {
        self.0.acquire(slot, rel, span, h)
    }
}

impl<L: LockSet> Reader<'_, L> {
    /// Reports (through `on_conflict`, possibly more than once per xid)
    /// every holder of a latch overlapping the footprint `fp` that `snap`
    /// saw in flight.  `committed(x)` says whether `x` committed; it is asked
    /// only about xids folded into tombstone summaries.
    pub fn check_footprint(
        self,
        fp: &[(RelId, Span)],
        snap: &ReadSnapshot<'_>,
        committed: &dyn Fn(Xid) -> bool,
        on_conflict: &mut dyn FnMut(Conflict),
    ) -> Check {
        self.0.check_footprint(fp, snap, committed, on_conflict)
    }

    /// [`Self::check_footprint`] over one span.
    pub fn check(
        self,
        rel: RelId,
        span: &Span,
        snap: &ReadSnapshot<'_>,
        committed: &dyn Fn(Xid) -> bool,
        on_conflict: &mut dyn FnMut(Conflict),
    ) -> Check {
        self.0.check(rel, span, snap, committed, on_conflict)
    }

    /// The latches and tombstones of `rel` that overlap `span`, in key order
    /// of their ranges.
    pub fn for_each_latch_of(self, rel: RelId, span: &Span, f: &mut dyn FnMut(&LatchInfo)) {
        self.0.for_each_latch_of(rel, span, f)
    }
}

impl<L: LockSet> Maintainer<'_, L> {
    /// A maintenance worker is alive at `now_us`.
    pub fn beat(self, now_us: i64) {
        self.0.beat(now_us)
    }

    /// Publishes `waker` and checks whether the table is at rest, where
    /// only a writer makes work; withdraws the waker when it is not.
    pub fn rest(self, waker: u64) -> Rest {
        self.0.rest(waker)
    }

    /// Up again: writers need not wake it.
    pub fn stop_resting(self) {
        self.0.stop_resting()
    }

    /// Publishes the xid horizon: tombstones of holders that precede it can
    /// no longer conflict with any snapshot and are reclaimed.
    pub fn set_horizon(self, horizon: Xid) {
        self.0.set_horizon(horizon)
    }

    /// Moves latches released without a lock to their ranges (tombstones)
    /// or frees them (aborted).  Returns how many.
    pub fn drain_released(self, slot: u32) -> u32 {
        self.0.drain_released(slot)
    }

    /// Queues every range that needs attention: crowded, contended, holding
    /// tombstones the horizon has passed, or small enough to merge.
    pub fn sweep(self) -> u32 {
        self.0.sweep()
    }

    /// Frees the slots of tables that hold nothing and took no latch since
    /// the previous call.  Returns how many.
    pub fn gc_idle_tables(self) -> u32 {
        self.0.gc_idle_tables()
    }

    /// How many ranges wait for a worker.
    pub fn queued(self) -> u32 {
        self.0.queued()
    }

    /// The queued range a worker should take next, claimed for it.
    pub fn claim_next(self) -> Option<u32> {
        self.0.claim_next()
    }

    /// Processes range `r`, claimed by [`Self::claim_next`]: reclaims, then
    /// splits, merges or coalesces as its state asks.  Returns what it did,
    /// and whether the range was enqueued meanwhile and is queued again.
    pub fn maintain(self, slot: u32, r: u32) -> (Action, bool) {
        self.0.maintain(slot, r)
    }

    /// Splits range `r` near its median key (for the benchmarks).
    #[cfg(feature = "std-locks")]
    pub fn split(self, slot: u32, r: u32) -> Option<u32> {
        self.0.split(slot, r)
    }

    /// The ranges of `rel` in key order (for the benchmarks).
    #[cfg(feature = "std-locks")]
    pub fn ranges_of(self, rel: RelId) -> Vec<u32> {
        self.0.ranges_of(rel)
    }

    /// Latches plus tombstones in range `r` (for the benchmarks).
    #[cfg(feature = "std-locks")]
    pub fn load(self, r: u32) -> u32 {
        self.0.load(r)
    }
}

impl<L: LockSet> Inspector<'_, L> {
    /// Every latch and tombstone, table by table in key order.
    pub fn for_each_latch(self, f: &mut dyn FnMut(&LatchInfo)) {
        self.0.for_each_latch(f)
    }

    /// The latches and tombstones of `rel` that overlap `span`, in key order
    /// of their ranges.
    pub fn for_each_latch_of(self, rel: RelId, span: &Span, f: &mut dyn FnMut(&LatchInfo)) {
        self.0.for_each_latch_of(rel, span, f)
    }

    /// Every range, table by table in key order.
    pub fn for_each_range(self, f: &mut dyn FnMut(&RangeInfo)) {
        self.0.for_each_range(f)
    }

    /// Entries, ranges and table slots in use, against their maximum.
    pub fn usage(self) -> Usage {
        self.0.usage()
    }

    /// Every counter, summed over all backends.
    pub fn stats(self) -> [u64; NSTATS] {
        self.0.stats()
    }
}
