//! Locks that hand out what they protect.
//!
//! The Directory lock protects the table slots, the ranges' bounds and the
//! directory's counts.  A range's lock protects its body (tree root, counts,
//! tombstone list, summary), the tree nodes its root reaches and the data of
//! the entries in its tree.  Range locks are taken three ways:
//! - through a shared Directory guard, one at a time (the range guard
//!   borrows the Directory guard mutably), waiting if need be;
//! - through the exclusive Directory guard, one or two at once (split and
//!   merge move entries between two ranges), waiting if need be;
//! - alone, without the Directory lock, only by trying
//!   ([`Locked::try_lock_range_of`]): commit settles its latches this
//!   way, and whoever holds a range lock so waits for nothing.
//!
//! So the only process that can wait for a range lock while holding one is
//! the exclusive Directory holder, and what it waits for is a settler that
//! waits for nobody: lock-order deadlocks cannot happen.  An entry changes
//! range only under the locks of both ranges, which is what lets a settler
//! that took a range lock alone trust the entry's range field.
//!
//! A shared guard gives `&`, an exclusive one also `&mut`, always through
//! `&mut self`, so two live `&mut` to one place cannot be made.  Turning the
//! region's `UnsafeCell`s into references happens in this file only.
//! Free entries belong to whoever popped them from the free list
//! ([`Owned`]); everything else in the region is atomic.

use super::{stack_pop, stack_push, DirCounts, EntryData, RangeBody, RangeMeta, Region, RelId, State, TableData};
use crate::locks::{Held, LockId, LockSet, Mode};
use crate::span::{KeyBuf, Span};
use crate::tree::{self, Keys, Node, Nodes, NodesMut, NIL};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// What every Directory guard lets its holder read.
pub(crate) trait Directory<'t> {
    fn region(&self) -> &'t Region<'t>;

    fn table_data(&self, t: u32) -> &TableData {
        // SAFETY: the Directory lock is held (shared or exclusive); table
        // slots change only through `&mut` of an exclusive guard, which
        // cannot coexist with this `&self` nor with another guard.
        unsafe { &*self.region().tables[t as usize].inner.get() }
    }

    fn meta(&self, r: u32) -> &RangeMeta {
        // SAFETY: as in table_data: range bounds are Directory data.
        unsafe { &*self.region().ranges[r as usize].meta.get() }
    }

    fn counts(&self) -> &DirCounts {
        // SAFETY: as in table_data.
        unsafe { &*self.region().hdr.dir.get() }
    }

    /// The table slot of `rel`, if it has one.
    fn find_table(&self, rel: RelId) -> Option<u32> {
        let n = self.region().tables.len();
        let start = hash_slot(rel, n);
        for k in 0..n {
            let t = ((start + k) % n) as u32;
            let r = self.table_data(t).rel;
            if r == rel {
                return Some(t);
            }
            if r == RelId::EMPTY {
                return None;
            }
        }
        None
    }

    /// Where the ranges of table `t` that overlap `span` sit in its
    /// key-ordered range list ([`Self::range_at`] names them).  Positions,
    /// not a copy: the list cannot change while any Directory guard lives,
    /// and this is on every acquire's and every validation's path.
    fn ranges_over(&self, t: u32, span: &Span) -> std::ops::Range<usize> {
        let td = self.table_data(t);
        let n = td.nranges as usize;
        let (ranges, heads) = (&td.ranges[..n], &td.lo_heads[..n]);
        // Range i's low bound against `k`, by the cached head first.
        let cmp_lo = |i: usize, k: &KeyBuf| match heads[i].cmp(&k.head()) {
            std::cmp::Ordering::Equal => self.meta(ranges[i]).lo.cmp(k),
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
        let mut end = first;
        while end < n && cmp_lo(end, &span.end).is_lt() {
            end += 1;
        }
        first..end
    }

    /// The range at position `i` of table `t`'s key-ordered list.
    fn range_at(&self, t: u32, i: usize) -> u32 {
        self.table_data(t).ranges[i]
    }

    /// Every range of table `t`, in key order.
    fn ranges_of(&self, t: u32) -> RangeList {
        let td = self.table_data(t);
        let mut out = RangeList::default();
        td.ranges[..td.nranges as usize].iter().for_each(|&r| out.push(r));
        out
    }
}

/// Where table `rel`'s slot search starts among `n` slots.
pub(crate) fn hash_slot(rel: RelId, n: usize) -> usize {
    let h = rel.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (h % n as u64) as usize
}

/// Every range of one table, copied out: purge and the idle sweep change the
/// table's range list while they walk it.  The idle sweep visits every
/// table on each worker tick and most tables have a range or two, so a few
/// are kept inline (and need no allocation); more go to the heap.
pub(crate) struct RangeList {
    len: usize,
    inline: [u32; INLINE_RANGES],
    more: Vec<u32>,
}

const INLINE_RANGES: usize = 4;

impl Default for RangeList {
    fn default() -> Self {
        RangeList { len: 0, inline: [NIL; INLINE_RANGES], more: Vec::new() }
    }
}

impl RangeList {
    fn push(&mut self, r: u32) {
        if self.len < INLINE_RANGES {
            self.inline[self.len] = r;
        } else {
            if self.more.is_empty() {
                self.more.extend_from_slice(&self.inline);
            }
            self.more.push(r);
        }
        self.len += 1;
    }

    pub fn as_slice(&self) -> &[u32] {
        if self.len <= INLINE_RANGES {
            &self.inline[..self.len]
        } else {
            &self.more
        }
    }
}

/// The Directory lock, held shared.
pub(crate) struct DirRead<'t, L: LockSet> {
    region: &'t Region<'t>,
    locks: &'t L,
    _held: Held<'t, L>,
}

/// The Directory lock, held exclusively: no range lock is held anywhere
/// except by settlers, who wait for nothing.
pub(crate) struct DirWrite<'t, L: LockSet> {
    region: &'t Region<'t>,
    locks: &'t L,
    _held: Held<'t, L>,
}

impl<'t, L: LockSet> Directory<'t> for DirRead<'t, L> {
    fn region(&self) -> &'t Region<'t> {
        self.region
    }
}

impl<'t, L: LockSet> Directory<'t> for DirWrite<'t, L> {
    fn region(&self) -> &'t Region<'t> {
        self.region
    }
}

/// The region together with the locks that guard it: the one owner of the
/// region's cells.  The latch table holds one and reaches the region's
/// non-atomic parts only through the guards its methods hand out.
pub(crate) struct Locked<'r, L: LockSet> {
    pub(crate) region: Region<'r>,
    pub(crate) locks: L,
}

impl<'r, L: LockSet> Locked<'r, L> {
    pub(crate) fn new(region: Region<'r>, locks: L) -> Self {
        Locked { region, locks }
    }

    /// Takes the Directory lock shared.
    pub(crate) fn dir_read(&self) -> DirRead<'_, L> {
        let held = Held::new(&self.locks, LockId::Directory, Mode::Shared);
        DirRead { region: &self.region, locks: &self.locks, _held: held }
    }

    /// Takes the Directory lock exclusively.
    pub(crate) fn dir_write(&self) -> DirWrite<'_, L> {
        let held = Held::new(&self.locks, LockId::Directory, Mode::Exclusive);
        DirWrite { region: &self.region, locks: &self.locks, _held: held }
    }

    /// The lock of the range entry `e` is in, exclusive, if it is free right
    /// now; taken without the Directory lock, so the holder must not wait
    /// for any lock until it drops the guard.  None when the lock is busy
    /// or `e` is in no range.
    pub(crate) fn try_lock_range_of(&self, e: u32) -> Option<RangeWrite<'_, L>> {
        let r = self.region.entries[e as usize].range.load(Acquire);
        self.try_lock_range_if_in(r, e)
    }

    /// Range `r`'s lock, as in [`Self::try_lock_range_of`], if `e` is in
    /// `r` once the lock is held.
    pub(crate) fn try_lock_range_if_in(&self, r: u32, e: u32) -> Option<RangeWrite<'_, L>> {
        if r == NIL {
            return None;
        }
        let held = Held::try_new(&self.locks, LockId::Range(r), Mode::Exclusive)?;
        // Without the Directory lock a split or merge may have moved `e`
        // (or reused `r`) since the caller read its range; they move
        // entries only under both ranges' locks, so with `r`'s held the
        // field is settled.
        if self.region.entries[e as usize].range.load(Relaxed) != r {
            return None;
        }
        // SAFETY: range r's lock is held exclusively for the guard's life.
        Some(RangeWrite { range: unsafe { RangeMut::new(&self.region, r) }, _held: held })
    }
}

impl<L: LockSet> DirRead<'_, L> {
    /// Range `r`'s lock, shared.
    pub fn range_read(&mut self, r: u32) -> RangeRead<'_, L> {
        let held = Held::new(self.locks, LockId::Range(r), Mode::Shared);
        // SAFETY: range r's lock is held (shared) for the guard's life.
        RangeRead { range: unsafe { RangeRef::new(self.region, r) }, _held: held }
    }

    /// Range `r`'s lock, exclusive, and whether taking it had to wait.
    pub fn range_write_counting(&mut self, r: u32) -> (RangeWrite<'_, L>, bool) {
        let (held, waited) = Held::new_counting(self.locks, LockId::Range(r), Mode::Exclusive);
        // SAFETY: range r's lock is held exclusively for the guard's life.
        (RangeWrite { range: unsafe { RangeMut::new(self.region, r) }, _held: held }, waited)
    }

    pub fn range_write(&mut self, r: u32) -> RangeWrite<'_, L> {
        self.range_write_counting(r).0
    }
}

impl<L: LockSet> DirWrite<'_, L> {
    pub fn table_data_mut(&mut self, t: u32) -> &mut TableData {
        // SAFETY: the Directory lock is held exclusively and `&mut self`
        // makes this the only reference handed out from it.
        unsafe { &mut *self.region.tables[t as usize].inner.get() }
    }

    pub fn meta_mut(&mut self, r: u32) -> &mut RangeMeta {
        // SAFETY: as in table_data_mut.
        unsafe { &mut *self.region.ranges[r as usize].meta.get() }
    }

    pub fn counts_mut(&mut self) -> &mut DirCounts {
        // SAFETY: as in table_data_mut.
        unsafe { &mut *self.region.hdr.dir.get() }
    }

    /// Range `r`'s lock, exclusive.  Waiting here cannot deadlock: the
    /// only other holders are settlers, who wait for nothing.
    pub fn range_write(&mut self, r: u32) -> RangeWrite<'_, L> {
        let held = Held::new(self.locks, LockId::Range(r), Mode::Exclusive);
        // SAFETY: range r's lock is held exclusively for the guard's life,
        // and `&mut self` makes this the only range handed out.
        RangeWrite { range: unsafe { RangeMut::new(self.region, r) }, _held: held }
    }

    /// Two distinct ranges' locks, to move entries between them.
    pub fn two_ranges_write(&mut self, a: u32, b: u32) -> (RangeWrite<'_, L>, RangeWrite<'_, L>) {
        assert_ne!(a, b, "two distinct ranges");
        let (ha, hb) = (
            Held::new(self.locks, LockId::Range(a), Mode::Exclusive),
            Held::new(self.locks, LockId::Range(b), Mode::Exclusive),
        );
        // SAFETY: both locks are held exclusively for the guards' life;
        // distinct ranges have disjoint bodies, trees and entries.
        unsafe {
            (
                RangeWrite { range: RangeMut::new(self.region, a), _held: ha },
                RangeWrite { range: RangeMut::new(self.region, b), _held: hb },
            )
        }
    }
}

/// A range's lock held shared: its contents, read-only.
pub(crate) struct RangeRead<'g, L: LockSet> {
    range: RangeRef<'g>,
    _held: Held<'g, L>,
}

/// A range's lock held exclusively: its contents, writable.
pub(crate) struct RangeWrite<'g, L: LockSet> {
    range: RangeMut<'g>,
    _held: Held<'g, L>,
}

impl<'g, L: LockSet> Deref for RangeRead<'g, L> {
    type Target = RangeRef<'g>;
    fn deref(&self) -> &RangeRef<'g> {
        &self.range
    }
}

impl<'g, L: LockSet> Deref for RangeWrite<'g, L> {
    type Target = RangeMut<'g>;
    fn deref(&self) -> &RangeMut<'g> {
        &self.range
    }
}

impl<'g, L: LockSet> DerefMut for RangeWrite<'g, L> {
    fn deref_mut(&mut self) -> &mut RangeMut<'g> {
        &mut self.range
    }
}

/// The entries' keys, as the tree reads them.
struct EntryKeys<'a> {
    region: &'a Region<'a>,
}

impl Keys for EntryKeys<'_> {
    #[inline(always)]
    fn start(&self, e: u32) -> &KeyBuf {
        // SAFETY: see entry_data(): `e` is in the tree of a range the caller
        // holds, and keys do not change while an entry is in a tree.
        unsafe { &(*entry_data(self.region, e)).span.start }
    }

    #[inline(always)]
    fn end(&self, e: u32) -> &KeyBuf {
        // SAFETY: as in start().
        unsafe { &(*entry_data(self.region, e)).span.end }
    }
}

/// Entry `e`'s data cell.  Tree slots only ever hold ids of entries of this
/// region (written from alloc() results), so `e` is in bounds; skipping the
/// check matters in the tree's inner loops.
#[inline(always)]
fn entry_data(region: &Region<'_>, e: u32) -> *mut EntryData {
    debug_assert!((e as usize) < region.entries.len());
    // SAFETY: in bounds, as said above.
    unsafe { region.entries.get_unchecked(e as usize) }.data.get()
}

/// The nodes of one tree, read-only.
struct TreeNodes<'a> {
    region: &'a Region<'a>,
}

/// The nodes of one tree, writable: made only inside a `&mut self` method
/// of a [`RangeMut`], and dropped before it returns.
struct TreeNodesMut<'a> {
    region: &'a Region<'a>,
}

#[inline(always)]
fn node_cell(region: &Region<'_>, n: u32) -> *mut Node {
    debug_assert!((n as usize) < region.nodes.len());
    // SAFETY: node links only hold ids the pool handed out, which are in
    // bounds.
    unsafe { region.nodes.get_unchecked(n as usize) }.0.get()
}

#[inline(always)]
fn prefetch_node(region: &Region<'_>, n: u32) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = node_cell(region, n) as *const i8;
        // SAFETY: `n` is a pool index; prefetches are hints that never
        // fault.  A descent reads bytes 0..352 (start heads, kids, end
        // heads); the sixth line only holds the end heads of slots 13+,
        // and prefetching it too measured no different.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            for line in 0..5 {
                _mm_prefetch::<_MM_HINT_T0>(p.add(64 * line));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (region, n);
}

impl Nodes for TreeNodes<'_> {
    #[inline(always)]
    fn node(&self, n: u32) -> &Node {
        // SAFETY: `n` is in the tree of a range the caller holds (at least
        // shared), under which nobody modifies it.
        unsafe { &*node_cell(self.region, n) }
    }

    #[inline(always)]
    fn prefetch(&self, n: u32) {
        prefetch_node(self.region, n)
    }
}

impl Nodes for TreeNodesMut<'_> {
    #[inline(always)]
    fn node(&self, n: u32) -> &Node {
        // SAFETY: `n` is in the tree of the range held exclusively by the
        // RangeMut this was made from (or fresh from the pool, hence ours);
        // `&self` excludes the `&mut` handed out below.
        unsafe { &*node_cell(self.region, n) }
    }

    #[inline(always)]
    fn prefetch(&self, n: u32) {
        prefetch_node(self.region, n)
    }
}

impl NodesMut for TreeNodesMut<'_> {
    #[inline(always)]
    fn node_mut(&mut self, n: u32) -> &mut Node {
        // SAFETY: as in node(), and `&mut self` makes this the only
        // reference to a node of this tree.
        unsafe { &mut *node_cell(self.region, n) }
    }

    fn two_mut(&mut self, a: u32, b: u32) -> (&mut Node, &mut Node) {
        assert_ne!(a, b, "two distinct nodes");
        // SAFETY: as in node_mut; distinct nodes do not overlap.
        unsafe { (&mut *node_cell(self.region, a), &mut *node_cell(self.region, b)) }
    }

    fn alloc_node(&mut self) -> u32 {
        let r = self.region;
        stack_pop(&r.hdr.node_free_head, |n| &r.node_next[n as usize]).unwrap_or(NIL)
    }

    fn free_node(&mut self, n: u32) {
        stack_push(&self.region.hdr.node_free_head, n, &self.region.node_next[n as usize]);
    }
}

/// One range's contents, read-only.
pub(crate) struct RangeRef<'g> {
    region: &'g Region<'g>,
    r: u32,
    body: &'g RangeBody,
}

impl<'g> RangeRef<'g> {
    /// # Safety
    /// Range `r`'s lock is held for `'g`.
    unsafe fn new(region: &'g Region<'g>, r: u32) -> Self {
        // SAFETY: per the contract nobody writes the body meanwhile.
        RangeRef { region, r, body: unsafe { &*region.ranges[r as usize].body.get() } }
    }
}

/// One range's contents, writable.
pub(crate) struct RangeMut<'g> {
    region: &'g Region<'g>,
    r: u32,
    body: &'g mut RangeBody,
}

impl<'g> RangeMut<'g> {
    /// # Safety
    /// Range `r`'s lock is held exclusively for `'g`, and no other
    /// `RangeMut` of it exists.
    unsafe fn new(region: &'g Region<'g>, r: u32) -> Self {
        // SAFETY: per the contract this is the only reference to the body.
        RangeMut { region, r, body: unsafe { &mut *region.ranges[r as usize].body.get() } }
    }

    pub fn body_mut(&mut self) -> &mut RangeBody {
        self.body
    }

    /// The range, read-only, for code that reads either kind.
    pub fn as_ref(&self) -> RangeRef<'_> {
        RangeRef { region: self.region, r: self.r, body: self.body }
    }

    /// Entry `e`'s data; `e` is in this range's tree.
    pub fn data_mut(&mut self, e: u32) -> &mut EntryData {
        debug_assert_eq!(self.region.entries[e as usize].range.load(Relaxed), self.r, "entry {e} in range {}", self.r);
        // SAFETY: `e` is in this range, held exclusively, and `&mut self`
        // makes this the only reference to its data.
        unsafe { &mut *entry_data(self.region, e) }
    }

    /// Enters entry `e` (fresh from the free list, or taken out of another
    /// range) in this range's tree.
    pub fn insert(&mut self, e: Owned) {
        let keys = EntryKeys { region: self.region };
        let mut nodes = TreeNodesMut { region: self.region };
        self.body.root = tree::insert(&mut nodes, &keys, self.body.root, e.0);
        self.region.entries[e.0 as usize].range.store(self.r, Release);
    }

    /// Takes entry `e` out of this range's tree; the caller now owns it
    /// (to free it, or to insert it into another range).
    pub fn remove(&mut self, e: u32) -> Owned {
        let keys = EntryKeys { region: self.region };
        let mut nodes = TreeNodesMut { region: self.region };
        self.body.root = tree::remove(&mut nodes, &keys, self.body.root, e);
        Owned(e)
    }

    /// Appends tombstone `e` (in this range) to the tombstone list.
    pub fn fifo_push(&mut self, e: u32) {
        let d = self.data_mut(e);
        d.fifo_next = NIL;
        d.in_fifo = true;
        let tail = self.body.fifo_tail;
        if tail == NIL {
            self.body.fifo_head = e;
        } else {
            self.data_mut(tail).fifo_next = e;
        }
        self.body.fifo_tail = e;
    }
}

/// Read access shared by both kinds of range access.
pub(crate) trait RangeAccess {
    fn parts(&self) -> (&Region<'_>, u32, &RangeBody);

    fn id(&self) -> u32 {
        self.parts().1
    }

    fn body(&self) -> &RangeBody {
        self.parts().2
    }

    /// Entry `e`'s data; `e` is in this range's tree.
    fn data(&self, e: u32) -> &EntryData {
        let (region, r, _) = self.parts();
        debug_assert_eq!(region.entries[e as usize].range.load(Relaxed), r, "entry {e} in range {r}");
        // SAFETY: `e` is in this range, whose lock is held; writers need
        // `&mut` of the same access, excluded by `&self`.
        unsafe { &*entry_data(region, e) }
    }

    /// Every entry overlapping `q`, in start order, until `f` says stop.
    fn for_each_overlap(&self, q: &Span, f: &mut dyn FnMut(u32) -> bool) -> bool {
        let (region, _, body) = self.parts();
        tree::for_each_overlap(&TreeNodes { region }, &EntryKeys { region }, body.root, q, f)
    }

    /// Every entry, in start order.
    fn for_each(&self, f: &mut dyn FnMut(u32)) {
        let (region, _, body) = self.parts();
        tree::for_each(&TreeNodes { region }, body.root, f)
    }

    /// The entry with the least start, or NIL.
    fn first(&self) -> u32 {
        let (region, _, body) = self.parts();
        tree::first(&TreeNodes { region }, body.root)
    }

    /// The entry with the greatest start, or NIL.
    fn last(&self) -> u32 {
        let (region, _, body) = self.parts();
        tree::last(&TreeNodes { region }, body.root)
    }

    /// The range entry `e` is in (an atomic: readable without a lock).
    fn range_of(&self, e: u32) -> u32 {
        self.parts().0.entries[e as usize].range.load(Relaxed)
    }

    /// Entry `e`'s start key.
    fn start(&self, e: u32) -> &KeyBuf {
        &self.data(e).span.start
    }

    /// Checks the tree's invariants; returns its entry count.
    #[cfg(test)]
    fn check_tree(&self) -> usize {
        let (region, _, body) = self.parts();
        tree::check(&TreeNodes { region }, &EntryKeys { region }, body.root)
    }
}

impl RangeAccess for RangeRef<'_> {
    fn parts(&self) -> (&Region<'_>, u32, &RangeBody) {
        (self.region, self.r, self.body)
    }
}

impl RangeAccess for RangeMut<'_> {
    fn parts(&self) -> (&Region<'_>, u32, &RangeBody) {
        (self.region, self.r, self.body)
    }
}

/// An entry no tree, chain or stack holds: fresh from the free list, or
/// just taken out of a range.  Its owner may write its data.
#[must_use = "an owned entry must be inserted somewhere or freed"]
pub(crate) struct Owned(u32);

impl Owned {
    pub fn id(&self) -> u32 {
        self.0
    }
}

impl<L: LockSet> Locked<'_, L> {
    /// Pops a free entry.
    pub(crate) fn alloc(&self) -> Option<Owned> {
        let region = &self.region;
        let idx = stack_pop(&region.hdr.free_head, |i| &region.entries[i as usize].free_next)?;
        region.hdr.free_count.fetch_sub(1, Relaxed);
        Some(Owned(idx))
    }

    /// The data of an entry the caller owns.
    pub(crate) fn owned_data<'a>(&'a self, e: &'a mut Owned) -> &'a mut EntryData {
        // SAFETY: nobody else can reach an owned entry, and `&mut e` makes
        // this the only reference.
        unsafe { &mut *entry_data(&self.region, e.0) }
    }

    /// Returns an entry to the free list.
    pub(crate) fn free(&self, mut e: Owned) {
        *self.owned_data(&mut e) = EntryData::FREE;
        let ent = &self.region.entries[e.0 as usize];
        ent.state.store(State::Free as u8, Release);
        ent.range.store(NIL, Release);
        stack_push(&self.region.hdr.free_head, e.0, &ent.free_next);
        self.region.hdr.free_count.fetch_add(1, Relaxed);
    }
}
