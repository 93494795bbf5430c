//! The four faces of the latch table: each caller takes the one that holds
//! the verbs it needs, and sees nothing else of the table (README.md,
//! "Faces").  A face is a copyable borrow of the table; its methods forward
//! to the table's crate-private ones, where the work and its documentation
//! live.

use super::holdings::{Holdings, Latched, Limits};
use super::inspect::{LatchInfo, RangeInfo, Usage};
use super::locks::LockSet;
use super::queue::Action;
use super::region::RelId;
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
    /// See [`LatchTable::latch`].
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

    /// See [`LatchTable::enforce_limits`].
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

    /// See [`LatchTable::release_all`].
    pub fn release_all(self, slot: u32, end: TxEnd) -> u32 {
        self.0.release_all(slot, end)
    }

    /// See [`LatchTable::release_subxact`].
    pub fn release_subxact(self, slot: u32, held: &mut Holdings, sub: u32) -> u32 {
        self.0.release_subxact(slot, held, sub)
    }

    /// See [`LatchTable::holds_any`].
    pub fn holds_any(self, slot: u32) -> bool {
        self.0.holds_any(slot)
    }

    /// See [`LatchTable::lock_draws`].
    pub fn lock_draws(self, rel: RelId, owner: u32) -> Result<DrawLock<'t, L>, AcquireError> {
        self.0.lock_draws(rel, owner)
    }

    /// See [`LatchTable::purge_table`].
    pub fn purge_table(self, slot: u32, rel: RelId) -> bool {
        self.0.purge_table(slot, rel)
    }

    /// See [`LatchTable::max_load`].
    pub fn max_load(self, rel: RelId, span: &Span) -> u32 {
        self.0.max_load(rel, span)
    }

    /// See [`LatchTable::relieve_pressure`].
    pub fn relieve_pressure(self, slot: u32) -> u32 {
        self.0.relieve_pressure(slot)
    }

    /// See [`LatchTable::free_entries`].
    pub fn free_entries(self) -> u32 {
        self.0.free_entries()
    }

    /// See [`LatchTable::range_max_latches`].
    pub fn range_max_latches(self) -> u32 {
        self.0.range_max_latches()
    }

    /// See [`LatchTable::last_beat`].
    pub fn last_beat(self) -> i64 {
        self.0.last_beat()
    }

    /// See [`LatchTable::count`].
    pub fn count(self, slot: u32, stat: Stat, n: u64) {
        self.0.count(slot, stat, n)
    }

    /// One latch without holdings or limits, for the benchmarks: see
    /// [`LatchTable::acquire`].
    #[cfg(feature = "std-locks")]
    pub fn acquire(self, slot: u32, rel: RelId, span: &Span, h: &Holder) -> Result<u32, AcquireError> {
        self.0.acquire(slot, rel, span, h)
    }
}

impl<L: LockSet> Reader<'_, L> {
    /// See [`LatchTable::check_footprint`].
    pub fn check_footprint(
        self,
        fp: &[(RelId, Span)],
        snap: &ReadSnapshot<'_>,
        committed: &dyn Fn(Xid) -> bool,
        on_conflict: &mut dyn FnMut(Conflict),
    ) -> Check {
        self.0.check_footprint(fp, snap, committed, on_conflict)
    }

    /// See [`LatchTable::check`].
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

    /// See [`LatchTable::for_each_latch_of`].
    pub fn for_each_latch_of(self, rel: RelId, span: &Span, f: &mut dyn FnMut(&LatchInfo)) {
        self.0.for_each_latch_of(rel, span, f)
    }
}

impl<L: LockSet> Maintainer<'_, L> {
    /// See [`LatchTable::beat`].
    pub fn beat(self, now_us: i64) {
        self.0.beat(now_us)
    }

    /// See [`LatchTable::set_horizon`].
    pub fn set_horizon(self, horizon: Xid) {
        self.0.set_horizon(horizon)
    }

    /// See [`LatchTable::drain_released`].
    pub fn drain_released(self, slot: u32) -> u32 {
        self.0.drain_released(slot)
    }

    /// See [`LatchTable::sweep`].
    pub fn sweep(self) -> u32 {
        self.0.sweep()
    }

    /// See [`LatchTable::gc_idle_tables`].
    pub fn gc_idle_tables(self) -> u32 {
        self.0.gc_idle_tables()
    }

    /// See [`LatchTable::claim_next`].
    pub fn claim_next(self) -> Option<u32> {
        self.0.claim_next()
    }

    /// See [`LatchTable::maintain`].
    pub fn maintain(self, slot: u32, r: u32) -> (Action, bool) {
        self.0.maintain(slot, r)
    }

    /// Splits range `r`, for the benchmarks: see [`LatchTable::split`].
    #[cfg(feature = "std-locks")]
    pub fn split(self, slot: u32, r: u32) -> Option<u32> {
        self.0.split(slot, r)
    }

    /// Table `rel`'s ranges, for the benchmarks: see [`LatchTable::ranges_of`].
    #[cfg(feature = "std-locks")]
    pub fn ranges_of(self, rel: RelId) -> Vec<u32> {
        self.0.ranges_of(rel)
    }

    /// Range `r`'s load, for the benchmarks: see [`LatchTable::load`].
    #[cfg(feature = "std-locks")]
    pub fn load(self, r: u32) -> u32 {
        self.0.load(r)
    }
}

impl<L: LockSet> Inspector<'_, L> {
    /// See [`LatchTable::for_each_latch`].
    pub fn for_each_latch(self, f: &mut dyn FnMut(&LatchInfo)) {
        self.0.for_each_latch(f)
    }

    /// See [`LatchTable::for_each_latch_of`].
    pub fn for_each_latch_of(self, rel: RelId, span: &Span, f: &mut dyn FnMut(&LatchInfo)) {
        self.0.for_each_latch_of(rel, span, f)
    }

    /// See [`LatchTable::for_each_range`].
    pub fn for_each_range(self, f: &mut dyn FnMut(&RangeInfo)) {
        self.0.for_each_range(f)
    }

    /// See [`LatchTable::usage`].
    pub fn usage(self) -> Usage {
        self.0.usage()
    }

    /// See [`LatchTable::stats`].
    pub fn stats(self) -> [u64; NSTATS] {
        self.0.stats()
    }
}
