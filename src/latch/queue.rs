//! The maintenance queue: which latch ranges need a worker, and the rule
//! that no range is processed twice at once.
//!
//! Each range carries a [`QueueState`], kept in an atomic word:
//!
//! ```text
//! Idle ──enqueue──► Queued ──claim──► Processing ──finish──► Idle
//!                                        │  ▲
//!                                enqueue │  │ finish: re-evaluate
//!                                        ▼  │ (back to Queued)
//!                                     Requeued
//! ```
//!
//! A range enqueued while a worker processes it is marked and, when that
//! worker finishes, queued again to be re-evaluated with fresh priority —
//! never processed by a second worker at the same time.  Workers pick the
//! queued range of highest priority; there are `pgkvx.maintenance_concurrency`
//! workers, each processing one range at a time, so at most that many ranges
//! are processed at once.

use super::locks::LockSet;
use super::region::guard::{DirRead, Directory, RangeAccess};
use super::table::LatchTable;
use std::sync::atomic::Ordering::{self, AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Where a range stands in the maintenance queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum QueueState {
    /// Needs no worker.
    Idle = 0,
    /// Waits for a worker.
    Queued = 1,
    /// A worker has it.
    Processing = 2,
    /// A worker has it, and it was enqueued meanwhile: it is queued again
    /// when the worker finishes.
    Requeued = 6,
}

impl QueueState {
    /// The state a range's atomic word holds (only this file writes it, so
    /// it always holds one).
    pub(crate) fn load(word: &AtomicU32, order: Ordering) -> QueueState {
        Self::from_word(word.load(order)).unwrap_or(QueueState::Idle)
    }

    fn from_word(w: u32) -> Option<QueueState> {
        [QueueState::Idle, QueueState::Queued, QueueState::Processing, QueueState::Requeued]
            .into_iter()
            .find(|&s| s as u32 == w)
    }
}

// region.rs starts every range's word at 0.
const _: () = assert!(QueueState::Idle as u32 == 0);

/// Asks for a worker; true when this call queued an idle range.
pub(crate) fn enqueue(state: &AtomicU32) -> bool {
    let mut s = state.load(Acquire);
    loop {
        let next = match QueueState::from_word(s) {
            Some(QueueState::Idle) => QueueState::Queued,
            Some(QueueState::Processing) => QueueState::Requeued,
            _ => return false, // already queued or already marked
        };
        match state.compare_exchange_weak(s, next as u32, AcqRel, Acquire) {
            Ok(_) => return next == QueueState::Queued,
            Err(now) => s = now,
        }
    }
}

/// Takes a queued range for processing; false when someone else did.
pub(crate) fn claim(state: &AtomicU32) -> bool {
    let (from, to) = (QueueState::Queued as u32, QueueState::Processing as u32);
    state.compare_exchange(from, to, AcqRel, Acquire).is_ok()
}

/// Ends processing; true when the range was enqueued meanwhile and is
/// queued again.
pub(crate) fn finish(state: &AtomicU32) -> bool {
    let mut s = state.load(Acquire);
    loop {
        let now = QueueState::from_word(s);
        debug_assert!(matches!(now, Some(QueueState::Processing | QueueState::Requeued)), "finish without claim");
        let next = if now == Some(QueueState::Requeued) { QueueState::Queued } else { QueueState::Idle };
        match state.compare_exchange_weak(s, next as u32, AcqRel, Acquire) {
            Ok(_) => return next == QueueState::Queued,
            Err(now) => s = now,
        }
    }
}

/// What processing did to a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed: the range waits for its holders or the horizon.
    Nothing,
    /// Tombstones the horizon had passed were freed, and nothing else.
    Reclaimed,
    Split,
    Merged,
    Coalesced,
}

/// How crowded or busy a range is; higher goes first.
fn priority(load: u32, limit: u32, contended: u64) -> u64 {
    u64::from(load.saturating_sub(limit / 2)) + contended.min(1 << 20) * 4
}

/// A range is contended enough to split when this many acquisitions found
/// its lock busy since the last look.  Every range is looked at by every
/// sweep (the worker's SWEEP interval), so this is a rate, not a total:
/// a range that waits now and then never accumulates its way to a split.
const CONTENTION_SPLIT: u64 = 128;
/// Two cold neighbours merge only when they waited less than this, together,
/// since the last look: a range split because it was contended stays split
/// while the contention lasts, instead of merging back at the next sweep
/// (its halves are small) and splitting again.
const CONTENTION_MERGE: u64 = CONTENTION_SPLIT / 4;
/// Fewer latches than limit / MERGE_DIVISOR in two neighbours: merge them.
const MERGE_DIVISOR: u32 = 8;

impl<L: LockSet> LatchTable<'_, L> {
    pub(crate) fn queue_state(&self, r: u32) -> &AtomicU32 {
        &self.mem.region.ranges[r as usize].queue
    }

    fn contended_since(&self, r: u32) -> (u64, &AtomicU64) {
        let s = &self.mem.region.ranges[r as usize];
        (s.contended.load(Relaxed).saturating_sub(s.contended_seen.load(Relaxed)), &s.contended_seen)
    }

    /// Queues range `r` for a worker.
    pub(crate) fn enqueue(&self, r: u32) -> bool {
        let queued = enqueue(self.queue_state(r));
        if queued {
            self.mem.region.hdr.queued.fetch_add(1, Relaxed);
        }
        queued
    }

    /// Ranges waiting for a worker.
    pub(crate) fn queued(&self) -> u32 {
        self.mem.region.hdr.queued.load(Relaxed)
    }

    fn claim_counted(&self, r: u32) -> bool {
        let ok = claim(self.queue_state(r));
        if ok {
            self.mem.region.hdr.queued.fetch_sub(1, Relaxed);
        }
        ok
    }

    fn take_counted(&self, r: u32) -> bool {
        let state = self.queue_state(r);
        let (from, to) = (QueueState::Idle as u32, QueueState::Processing as u32);
        state.compare_exchange(from, to, AcqRel, Acquire).is_ok() || self.claim_counted(r)
    }

    fn finish_counted(&self, r: u32) -> bool {
        let again = finish(self.queue_state(r));
        if again {
            self.mem.region.hdr.queued.fetch_add(1, Relaxed);
        }
        again
    }

    /// Starts a fresh range out of the queue.
    pub(crate) fn queue_reset(&self, r: u32) {
        self.queue_state(r).store(QueueState::Idle as u32, Relaxed);
    }

    /// Forgets the queue state of a range being freed.
    pub(crate) fn dequeue_freed(&self, r: u32) {
        if self.queue_state(r).swap(QueueState::Idle as u32, AcqRel) == QueueState::Queued as u32 {
            self.mem.region.hdr.queued.fetch_sub(1, Relaxed);
        }
    }

    /// Latches plus tombstones in range `r`.
    pub(crate) fn load(&self, r: u32) -> u32 {
        let mut d = self.mem.dir_read();
        let g = d.range_read(r);
        g.body().live + g.body().tombstones
    }

    /// The queued range a worker should take next, claimed for it.
    pub(crate) fn claim_next(&self) -> Option<u32> {
        loop {
            if self.queued() == 0 {
                return None;
            }
            let limit = self.range_max_latches();
            let mut best: Option<(u64, u32)> = None;
            {
                let mut d = self.mem.dir_read();
                for r in 0..self.config().max_ranges {
                    if !d.meta(r).in_use || QueueState::load(self.queue_state(r), Relaxed) != QueueState::Queued {
                        continue;
                    }
                    let load = {
                        let g = d.range_read(r);
                        g.body().live + g.body().tombstones
                    };
                    let p = priority(load, limit, self.contended_since(r).0);
                    if best.is_none_or(|(bp, _)| p > bp) {
                        best = Some((p, r));
                    }
                }
            }
            let (_, r) = best?;
            if self.claim_counted(r) {
                return Some(r);
            }
        }
    }

    /// Queues every range that needs attention: crowded, contended, holding
    /// tombstones the horizon has passed, or small enough to merge.
    pub(crate) fn sweep(&self) -> u32 {
        self.drain_released(u32::MAX);
        let limit = self.range_max_latches();
        let mut queued = 0;
        let mut d = self.mem.dir_read();
        for r in 0..self.config().max_ranges {
            if !d.meta(r).in_use {
                continue;
            }
            let (contended, seen) = self.contended_since(r);
            if self.needs_attention(&mut d, r, limit, contended) {
                queued += u32::from(self.enqueue(r));
            } else {
                // Looked at: the next sweep counts waits from here.
                seen.fetch_add(contended, Relaxed);
            }
        }
        queued
    }

    /// Whether any range in use needs a worker (what [`Self::sweep`] would
    /// queue), without queueing it.
    pub(crate) fn any_needs_attention(&self) -> bool {
        let limit = self.range_max_latches();
        let mut d = self.mem.dir_read();
        (0..self.config().max_ranges)
            .any(|r| d.meta(r).in_use && self.needs_attention(&mut d, r, limit, self.contended_since(r).0))
    }

    /// The sweep's rule: range `r` (in use) is crowded, contended, holds
    /// tombstones, or could merge: it and a neighbour are both small (a
    /// small range between big ones stays until one thins out, and is no
    /// work meanwhile).
    fn needs_attention(&self, d: &mut DirRead<'_, L>, r: u32, limit: u32, contended: u64) -> bool {
        let (tombstones, load) = {
            let g = d.range_read(r);
            let b = g.body();
            (b.tombstones + b.summary.count, b.live + b.tombstones)
        };
        let small = |d: &mut DirRead<'_, L>, n: u32| {
            let g = d.range_read(n);
            g.body().live + g.body().tombstones < limit / MERGE_DIVISOR
        };
        // Both stay queued (and their contention counted) until they merge.
        let mergeable = load < limit / MERGE_DIVISOR && neighbours(d, r).into_iter().flatten().any(|n| small(d, n));
        load > limit || tombstones > 0 || contended >= CONTENTION_SPLIT || mergeable
    }

    /// Processes one claimed range: reclaim, then split, merge or coalesce
    /// as its state asks.  Finishes the claim; returns what it did and
    /// whether the range must be looked at again.
    pub(crate) fn maintain(&self, slot: u32, r: u32) -> (Action, bool) {
        let limit = self.range_max_latches();
        let reclaimed = {
            let mut d = self.mem.dir_read();
            let mut g = d.range_write(r);
            self.reclaim(&mut g, slot, u32::MAX)
        };
        let (contended, seen) = self.contended_since(r);
        seen.fetch_add(contended, Relaxed);
        let load = self.load(r);
        let action = if load > limit || (contended >= CONTENTION_SPLIT && load >= 32) {
            if self.split(slot, r).is_some() {
                Action::Split
            } else if load > limit && self.coalesce(slot, r) > 0 {
                // Cannot split (a wide latch spans it, or no free range):
                // keep its size in check by folding tombstones.
                Action::Coalesced
            } else {
                Action::Nothing
            }
        } else if load < limit / MERGE_DIVISOR && contended < CONTENTION_MERGE {
            // The neighbour must not be in another worker's hands: take it
            // (idle or queued) for the merge, which frees it.
            let cold = |n: u32| {
                self.load(n) < limit / MERGE_DIVISOR && contended + self.contended_since(n).0 < CONTENTION_MERGE
            };
            match self.right_neighbour(r) {
                Some(n) if cold(n) && self.take_counted(n) => {
                    if self.merge(slot, r, n) {
                        Action::Merged
                    } else {
                        self.finish_counted(n);
                        Action::Nothing
                    }
                }
                _ => Action::Nothing,
            }
        } else {
            Action::Nothing
        };
        let action = match action {
            Action::Nothing if reclaimed > 0 => Action::Reclaimed,
            a => a,
        };
        let again = self.finish_counted(r);
        (action, again)
    }

    /// The range right of `r` in the same table, if any.
    fn right_neighbour(&self, r: u32) -> Option<u32> {
        neighbours(&self.mem.dir_read(), r)[1]
    }
}

/// The ranges left and right of range `r` in the same table (none for a
/// range not in use).
fn neighbours<'t>(d: &impl Directory<'t>, r: u32) -> [Option<u32>; 2] {
    if !d.meta(r).in_use {
        return [None, None];
    }
    let ranges = d.ranges_of(d.meta(r).table);
    let ranges = ranges.as_slice();
    let Some(p) = ranges.iter().position(|&x| x == r) else { return [None, None] };
    [p.checked_sub(1).map(|p| ranges[p]), ranges.get(p + 1).copied()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::heap_table;
    use crate::{Config, Holder, RelId, Span, TxEnd, Xid};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn state_machine_transitions() {
        let s = AtomicU32::new(QueueState::Idle as u32);
        assert!(enqueue(&s), "idle -> queued");
        assert!(!enqueue(&s), "queued twice is one entry");
        assert!(claim(&s));
        assert!(!claim(&s), "nobody claims a range being processed");
        assert!(!enqueue(&s), "re-enqueued while processing: marked");
        assert_eq!(QueueState::load(&s, Relaxed), QueueState::Requeued);
        assert!(finish(&s), "marked: queued again for re-evaluation");
        assert_eq!(QueueState::load(&s, Relaxed), QueueState::Queued);
        assert!(claim(&s));
        assert!(!finish(&s), "unmarked: idle");
        assert_eq!(QueueState::load(&s, Relaxed), QueueState::Idle);
    }

    #[test]
    fn concurrent_workers_never_share_a_range() {
        let states: Arc<Vec<AtomicU32>> = Arc::new((0..8).map(|_| AtomicU32::new(QueueState::Idle as u32)).collect());
        let busy: Arc<Vec<AtomicBool>> = Arc::new((0..8).map(|_| AtomicBool::new(false)).collect());
        let mut handles = Vec::new();
        for w in 0..4u64 {
            let (states, busy) = (states.clone(), busy.clone());
            handles.push(std::thread::spawn(move || {
                let mut processed = 0u64;
                let mut x = w + 1;
                for _ in 0..20_000 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let r = (x >> 33) as usize % 8;
                    if x & 1 == 0 {
                        enqueue(&states[r]);
                    } else if claim(&states[r]) {
                        assert!(!busy[r].swap(true, Relaxed), "range {r} processed twice at once");
                        std::hint::spin_loop();
                        busy[r].store(false, Relaxed);
                        finish(&states[r]);
                        processed += 1;
                    }
                }
                processed
            }));
        }
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(total > 1000);
    }

    const REL: RelId = RelId(0x0000_0001_0000_7000);

    #[test]
    fn workers_split_crowded_ranges_and_merge_cold_ones() {
        let t = heap_table(Config { max_entries: 4096, max_ranges: 64, max_tables: 4, max_backends: 4 });
        t.set_range_max_latches(64);
        // Four writers, interleaved in key order.
        for i in 0..500u64 {
            let h = Holder { xid: Xid(100 + (i % 4) as u32), pid: 1, now_us: 0, owner: 0, role: 0 };
            t.acquire((i % 4) as u32, REL, &Span::point(&i.to_be_bytes()), &h).unwrap();
        }
        let mut actions = work(t, 50);
        let split = t.ranges_of(REL).len();
        assert!(split >= 8, "500 latches over a limit of 64 need several ranges, got {split}");
        assert!(t.ranges_of(REL).iter().all(|&r| t.load(r) <= 64));
        // The writers commit; once the horizon passes, tombstones go and
        // cold neighbours merge back.
        for slot in 0..4 {
            t.release_all(slot, TxEnd::Committed);
        }
        t.set_horizon(Xid(200));
        actions.extend(work(t, 50));
        assert!(actions.contains(&Action::Split) && actions.contains(&Action::Merged), "{actions:?}");
        assert_eq!(t.ranges_of(REL).len(), 1, "empty ranges merge back into one");
        assert_eq!(t.usage().entries_used, 0);
    }

    #[test]
    fn a_small_range_beside_a_big_one_is_no_work() {
        let t = heap_table(Config { max_entries: 4096, max_ranges: 64, max_tables: 4, max_backends: 4 });
        t.set_range_max_latches(64);
        for i in 0..120u64 {
            let slot = u32::from(i >= 60);
            let h = Holder { xid: Xid(100 + slot), pid: 1, now_us: 0, owner: 0, role: 0 };
            t.acquire(slot, REL, &Span::point(&i.to_be_bytes()), &h).unwrap();
        }
        work(t, 5);
        assert!(t.ranges_of(REL).len() > 1);
        // The second writer rolls back: its ranges thin out, and merge
        // while a neighbour is small too; the rest stays as it is.
        t.release_all(1, TxEnd::Aborted);
        work(t, 20);
        let loads: Vec<u32> = t.ranges_of(REL).iter().map(|&r| t.load(r)).collect();
        assert!(
            loads.len() > 1 && loads.windows(2).all(|w| w[0] >= 64 / MERGE_DIVISOR || w[1] >= 64 / MERGE_DIVISOR),
            "no two small neighbours are left: {loads:?}"
        );
        assert!(loads.iter().any(|&l| l < 64 / MERGE_DIVISOR), "a small range is left beside a big one: {loads:?}");
        assert_eq!(t.sweep(), 0, "it needs no worker");
        assert!(!t.any_needs_attention());
        assert!(work(t, 3).iter().all(|&a| a == Action::Nothing));
        t.release_all(0, TxEnd::Aborted);
    }

    /// Sweeps and lets one worker process everything queued, `rounds` times.
    fn work(t: &LatchTable<'_, impl LockSet>, rounds: usize) -> Vec<Action> {
        let mut actions = Vec::new();
        for _ in 0..rounds {
            t.sweep();
            while let Some(r) = t.claim_next() {
                actions.push(t.maintain(3, r).0);
            }
        }
        actions
    }

    /// Lock waits on every range of REL, as acquirers would count them.
    fn wait_on_every_range(t: &LatchTable<'_, impl LockSet>, waits: u64) {
        for r in t.ranges_of(REL) {
            t.mem.region.ranges[r as usize].contended.fetch_add(waits, Relaxed);
        }
    }

    #[test]
    fn contention_splits_as_a_rate_and_split_ranges_stay_split_while_it_lasts() {
        let t = heap_table(Config { max_entries: 4096, max_ranges: 64, max_tables: 4, max_backends: 4 });
        t.set_range_max_latches(1024);
        let h = Holder { xid: Xid(100), pid: 1, now_us: 0, owner: 0, role: 0 };
        for i in 0..40u64 {
            t.acquire(0, REL, &Span::point(&(i * 1000).to_be_bytes()), &h).unwrap();
        }
        // Waits below the rate, sweep after sweep, add up to far more than
        // the threshold: no split.
        for _ in 0..20 {
            wait_on_every_range(t, CONTENTION_SPLIT - 1);
            work(t, 1);
        }
        assert_eq!(t.ranges_of(REL).len(), 1, "a steady trickle of waits must not split a range");
        wait_on_every_range(t, CONTENTION_SPLIT);
        assert!(work(t, 1).contains(&Action::Split));
        assert_eq!(t.ranges_of(REL).len(), 2);
        // The halves are small and would merge at once; while they keep
        // waiting, they stay apart.
        t.release_all(0, TxEnd::Committed);
        t.set_horizon(Xid(200));
        for _ in 0..20 {
            wait_on_every_range(t, CONTENTION_MERGE / 2);
            let actions = work(t, 1);
            assert!(!actions.contains(&Action::Merged), "{actions:?}");
        }
        assert_eq!(t.ranges_of(REL).len(), 2);
        // Contention over: they merge.
        assert!(work(t, 3).contains(&Action::Merged));
        assert_eq!(t.ranges_of(REL).len(), 1);
        assert_eq!(t.usage().entries_used, 0);
    }
}
