//! Heap tuples in key order, a heap page at a time, and their deforming.
//!
//! An index scan (`index_getnext_slot`) pays per row for work that belongs
//! to the heap page: a content lock and unlock, a buffer lookup, a second
//! pin for the slot, and — through pgrx — a `sigsetjmp` on every call into
//! Postgres.  arrow_scan only needs the rows' values, so on heap tables it
//! reads the index's TIDs for one heap page at a time (consecutive TIDs on
//! the same page: all of them when the table is clustered on its key, one
//! when it is not), pins and share-locks that page once, finds each visible
//! tuple with `heap_hot_search_buffer` — what `heapam_index_fetch_tuple`
//! does, HOT chains, visibility and serializable predicate locks included —
//! unlocks, and then deforms the tuples straight from the pinned page (a
//! pin keeps them in place, as a slot's does).
//!
//! On a page marked all-visible (and outside SERIALIZABLE, which needs the
//! predicate locks `heap_hot_search_buffer` takes) the visibility checks are
//! skipped, as a sequential scan skips them: the flag is set only when every
//! tuple on the page is visible to every snapshot that can still exist —
//! ours included, since our xmin holds back the horizon VACUUM sets it by —
//! and any change to the page clears it under the exclusive lock our share
//! lock excludes.  Such a page has no dead tuples and no updated ones, so an
//! index entry leads to a normal line pointer, or through one redirect (a
//! pruned HOT chain) to one.  Anything else on it goes the general way.
//!
//! The Postgres calls of one page run inside a single FFI guard
//! ([`pg_guard_ffi_boundary`]): an ERROR in any of them long-jumps back to
//! it, over the frames of `fill_run` and the helpers it calls, which
//! therefore hold only plain data (integers, raw pointers and references,
//! nothing with a destructor) and never panic.
//! That is why those functions are declared here rather than called through
//! pgrx's per-call wrappers.
//!
//! Never holds the heap page's lock while reading the index (the index scan
//! locks its own pages; holding both invites LWLock deadlocks with writers
//! that check uniqueness, which lock the other way round).

use crate::pg::raw;
use pgrx::pg_sys::{self, ffi::pg_guard_ffi_boundary, Datum};

/// Index entries one page can be asked for at a time: more than the tuples
/// an 8 kB heap page holds (MaxHeapTuplesPerPage = 291).  A longer run on
/// one page (only possible through many dead index entries) is simply split.
const RUN_MAX: usize = 320;

fn block_of(tid: &pg_sys::ItemPointerData) -> pg_sys::BlockNumber {
    (u32::from(tid.ip_blkid.bi_hi) << 16) | u32::from(tid.ip_blkid.bi_lo)
}

/// Whether `rel` is stored by the heap access method (whose page layout
/// [`PageFetch`] and [`Deformer`] rely on).
pub fn is_heap(rel: pg_sys::Relation) -> bool {
    // SAFETY: an open relation's table AM pointer, compared by address.
    unsafe { (*rel).rd_tableam == pg_sys::GetHeapamTableAmRoutine() }
}

/// The visible tuples of one heap page reached through the index, in index
/// order, and where the scan stands.
pub struct PageFetch {
    scan: pg_sys::IndexScanDesc,
    heap: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    /// The pinned page the tuples live on (InvalidBuffer before the first).
    buf: pg_sys::Buffer,
    /// The next page, pinned while this one is read so that its first
    /// tuples are on their way from memory by the time they are searched
    /// (InvalidBuffer when none), and its block number.
    ahead: pg_sys::Buffer,
    ahead_block: pg_sys::BlockNumber,
    tids: Box<[pg_sys::ItemPointerData; RUN_MAX]>,
    tuples: Box<[pg_sys::HeapTupleData; RUN_MAX]>,
    /// Visible tuples in `tuples`, and how many were handed out.
    n: usize,
    next: usize,
    /// A TID read from the index that belongs to the next page.
    pending: pg_sys::ItemPointerData,
    has_pending: bool,
    /// The index has no more entries.
    index_done: bool,
}

impl PageFetch {
    /// Fetches through `scan` (begun on `heap` with `snapshot`, an MVCC
    /// snapshot that outlives it).
    pub fn new(scan: pg_sys::IndexScanDesc, heap: pg_sys::Relation, snapshot: pg_sys::Snapshot) -> PageFetch {
        PageFetch {
            scan,
            heap,
            snapshot,
            buf: pg_sys::InvalidBuffer as pg_sys::Buffer,
            ahead: pg_sys::InvalidBuffer as pg_sys::Buffer,
            ahead_block: pg_sys::InvalidBlockNumber,
            tids: Box::new([pg_sys::ItemPointerData::default(); RUN_MAX]),
            tuples: Box::new([pg_sys::HeapTupleData::default(); RUN_MAX]),
            n: 0,
            next: 0,
            pending: pg_sys::ItemPointerData::default(),
            has_pending: false,
            index_done: false,
        }
    }

    /// Reads from a new index scan (a restart): the page pin is kept,
    /// everything read ahead is forgotten.
    pub fn restart(&mut self, scan: pg_sys::IndexScanDesc, snapshot: pg_sys::Snapshot) {
        self.scan = scan;
        self.snapshot = snapshot;
        self.n = 0;
        self.next = 0;
        self.has_pending = false;
        self.index_done = false;
    }

    /// Advances to the next visible tuple of the page already read, if
    /// there is one: no call into Postgres, so no memory context needed.
    #[inline(always)]
    pub fn next_on_page(&mut self) -> bool {
        if self.next < self.n {
            self.next += 1;
            return true;
        }
        false
    }

    /// Advances to the next visible tuple; false at the end of the index.
    ///
    /// # Safety
    /// The scan, relation and snapshot given are still open and valid.
    #[inline]
    pub unsafe fn next(&mut self) -> bool {
        while !self.next_on_page() {
            if self.index_done && !self.has_pending {
                return false;
            }
            let f: *mut PageFetch = self;
            // SAFETY: `f` is this fetch, exclusively borrowed for the call;
            // fill_run and its helpers hold no value with a destructor and
            // cannot panic, so an ERROR may long-jump over them (module docs).
            unsafe { pg_guard_ffi_boundary(|| fill_run(f)) };
        }
        true
    }

    /// The tuple `next` returned last.
    pub fn current(&self) -> &pg_sys::HeapTupleData {
        &self.tuples[self.next - 1]
    }

    /// The pinned pages, for the caller to release (InvalidBuffer if none).
    pub fn take_buffers(&mut self) -> [pg_sys::Buffer; 2] {
        let none = pg_sys::InvalidBuffer as pg_sys::Buffer;
        [std::mem::replace(&mut self.buf, none), std::mem::replace(&mut self.ahead, none)]
    }
}

/// Reads the TIDs of the next heap page from the index and keeps the tuples
/// of that page visible to the snapshot.
///
/// # Safety
/// `f` points to a live PageFetch whose scan, relation and snapshot are
/// valid.  Runs inside `pg_guard_ffi_boundary`: only plain data in this
/// frame and the frames of the helpers it calls, no panics (so no
/// bounds-checked indexing: the loops stay below RUN_MAX by construction).
unsafe fn fill_run(f: *mut PageFetch) {
    // SAFETY: per the contract, `f` is live and exclusively ours for the
    // call; each helper's contract is this function's.
    unsafe {
        let f = &mut *f;
        f.n = 0;
        f.next = 0;
        let count = read_run(f);
        if count == 0 {
            return;
        }
        let block = block_of(&*f.tids.as_ptr());
        pin_page(f, block);
        f.n = search_page(f, block, count);
        if f.has_pending {
            pin_next_page(f);
        }
    }
}

/// Reads into `f.tids` the index's next TIDs that point into one heap page
/// (at most RUN_MAX of them), keeping the first TID of the next page in
/// `f.pending`; returns how many it read (0 at the end of the index).
///
/// # Safety
/// As `fill_run`'s, whose guard it runs under.
unsafe fn read_run(f: &mut PageFetch) -> usize {
    // SAFETY: per the contract.  The TID index_getnext_tid returns points
    // into the scan and is copied before the next call; writes to `tids`
    // stay below RUN_MAX.
    unsafe {
        let Some(first) = first_tid(f) else {
            return 0;
        };
        let tids = f.tids.as_mut_ptr();
        *tids = first;
        let block = block_of(&first);
        let mut count = 1usize;
        while count < RUN_MAX && !f.index_done {
            let t = raw::index_getnext_tid(f.scan, pg_sys::ScanDirection::ForwardScanDirection);
            if t.is_null() {
                f.index_done = true;
            } else if block_of(&*t) != block {
                f.pending = *t;
                f.has_pending = true;
                break;
            } else {
                *tids.add(count) = *t;
                count += 1;
            }
        }
        count
    }
}

/// The first TID of the next run: the one the last run read past its page,
/// else the index's next; None at the end of the index.
///
/// # Safety
/// As `fill_run`'s, whose guard it runs under.
unsafe fn first_tid(f: &mut PageFetch) -> Option<pg_sys::ItemPointerData> {
    if f.has_pending {
        f.has_pending = false;
        return Some(f.pending);
    }
    if f.index_done {
        return None;
    }
    // SAFETY: per the contract; the returned TID points into the scan and
    // is copied at once.
    unsafe {
        let t = raw::index_getnext_tid(f.scan, pg_sys::ScanDirection::ForwardScanDirection);
        if t.is_null() {
            f.index_done = true;
            None
        } else {
            Some(*t)
        }
    }
}

/// Makes `block` the pinned page `f.buf`: the page pinned ahead when it is
/// that one (releasing the page before), else read now.
///
/// # Safety
/// As `fill_run`'s, whose guard it runs under.
unsafe fn pin_page(f: &mut PageFetch, block: pg_sys::BlockNumber) {
    let none = pg_sys::InvalidBuffer as pg_sys::Buffer;
    let prev = f.buf;
    // SAFETY: per the contract; `buf` and `ahead` are pins of ours (or
    // InvalidBuffer), each released once as it is replaced.
    unsafe {
        if f.ahead != none && f.ahead_block == block {
            f.buf = f.ahead;
            f.ahead = none;
            if prev != none {
                raw::ReleaseBuffer(prev);
            }
        } else {
            // (the first page, or a page pinned ahead of a restarted scan)
            if f.ahead != none {
                raw::ReleaseBuffer(f.ahead);
                f.ahead = none;
            }
            f.buf = raw::ReleaseAndReadBuffer(f.buf, f.heap, block);
        }
        if f.buf != prev {
            // As heapam_index_fetch_tuple does on reaching a new page.
            raw::heap_page_prune_opt(f.heap, f.buf);
        }
    }
}

/// Finds the tuples the first `count` TIDs of `f.tids` lead to on pinned
/// page `block` that are visible to the snapshot, into `f.tuples`, under
/// one share lock; returns how many.
///
/// # Safety
/// As `fill_run`'s, whose guard it runs under; `f.buf` is the pinned page
/// `block` and `count` is at most RUN_MAX.
unsafe fn search_page(f: &mut PageFetch, block: pg_sys::BlockNumber, count: usize) -> usize {
    // SAFETY: per the contract: the page is pinned before it is locked and
    // searched, and unlocked before return; reads of `tids` and writes of
    // `tuples` stay below `count` <= RUN_MAX.
    unsafe {
        let tids = f.tids.as_ptr();
        let page = pg_sys::BufferGetPage(f.buf) as *const u8;
        for i in 0..count.min(PREFETCH_AHEAD) {
            prefetch_tuple(page, &*tids.add(i));
        }
        raw::LockBuffer(f.buf, pg_sys::BUFFER_LOCK_SHARE as i32);
        let all_visible = page_all_visible(page)
            && !(*f.snapshot).takenDuringRecovery
            && pg_sys::XactIsoLevel != pg_sys::XACT_SERIALIZABLE as i32;
        let relid = (*f.heap).rd_id;
        let tuples = f.tuples.as_mut_ptr();
        let mut n = 0usize;
        for i in 0..count {
            if i + PREFETCH_AHEAD < count {
                prefetch_tuple(page, &*tids.add(i + PREFETCH_AHEAD));
            }
            let mut tid = *tids.add(i);
            let found = match all_visible.then(|| visible_tuple(page, block, relid, &tid, &mut *tuples.add(n))) {
                Some(Some(found)) => found,
                // heap_hot_search_buffer follows the HOT chain from the
                // entry's TID and fills the tuple (t_data points into the page).
                _ => raw::heap_hot_search_buffer(
                    &mut tid,
                    f.heap,
                    f.buf,
                    f.snapshot,
                    tuples.add(n),
                    std::ptr::null_mut(),
                    true,
                ),
            };
            if found {
                n += 1;
            }
        }
        raw::LockBuffer(f.buf, pg_sys::BUFFER_LOCK_UNLOCK as i32);
        n
    }
}

/// Pins the page of `f.pending` (the next run's) and starts loading the
/// tuples its first TID and the slots after it hold (where a clustered
/// table's next rows are; elsewhere the hint is merely useless).
///
/// # Safety
/// As `fill_run`'s, whose guard it runs under; `f.ahead` holds no pin.
unsafe fn pin_next_page(f: &mut PageFetch) {
    // SAFETY: per the contract; the page is pinned before it is read, and
    // prefetching only hints at addresses on it.
    unsafe {
        let next = block_of(&f.pending);
        f.ahead = raw::ReadBuffer(f.heap, next);
        f.ahead_block = next;
        let page = pg_sys::BufferGetPage(f.ahead) as *const u8;
        let mut tid = f.pending;
        for _ in 0..PREFETCH_AHEAD {
            prefetch_tuple(page, &tid);
            tid.ip_posid = tid.ip_posid.wrapping_add(1);
        }
    }
}

/// Where a page's line pointer array starts.
const PAGE_HEADER: usize = std::mem::offset_of!(pg_sys::PageHeaderData, pd_linp);

/// A decoded line pointer (ItemIdData: lp_off 15 bits, lp_flags 2, lp_len 15).
#[derive(Clone, Copy)]
struct ItemId {
    off: u32,
    flags: u32,
    len: u32,
}

impl ItemId {
    #[inline(always)]
    fn decode(lp: u32) -> ItemId {
        ItemId { off: lp & 0x7fff, flags: (lp >> 15) & 0x3, len: lp >> 17 }
    }
}

/// The line pointer at 1-based `item` of `page`, or None past the page's last.
///
/// # Safety
/// `page` is a pinned, share-locked heap page.
#[inline(always)]
unsafe fn line_pointer(page: *const u8, item: u16) -> Option<ItemId> {
    // SAFETY: per the contract; pd_lower bounds the line pointer array.
    unsafe {
        let lower = usize::from((*(page as *const pg_sys::PageHeaderData)).pd_lower);
        let items = lower.saturating_sub(PAGE_HEADER) / 4;
        if item == 0 || usize::from(item) > items {
            return None;
        }
        Some(ItemId::decode(*(page.add(PAGE_HEADER) as *const u32).add(usize::from(item) - 1)))
    }
}

/// # Safety
/// `page` is a pinned, share-locked heap page.
#[inline(always)]
unsafe fn page_all_visible(page: *const u8) -> bool {
    // SAFETY: `page` is a pinned, share-locked heap page (the caller's contract), so
    // its header, where pd_flags lives, is readable and stable.
    u32::from(unsafe { (*(page as *const pg_sys::PageHeaderData)).pd_flags }) & pg_sys::PD_ALL_VISIBLE != 0
}

/// `heap_hot_search_buffer` for a page known to be all-visible: the tuple
/// the index entry `tid` leads to, written to `out`.  Some(false) when the
/// entry leads to nothing (an unused or dead slot), None for anything an
/// all-visible page should not hold (then the general search decides).
///
/// # Safety
/// `page` is the pinned, share-locked, all-visible heap page `block` of
/// relation `relid`.
#[inline(always)]
unsafe fn visible_tuple(
    page: *const u8,
    block: pg_sys::BlockNumber,
    relid: pg_sys::Oid,
    tid: &pg_sys::ItemPointerData,
    out: &mut pg_sys::HeapTupleData,
) -> Option<bool> {
    // SAFETY: per the contract; offsets come from the page's own line
    // pointers, which the share lock keeps still.
    unsafe {
        let mut item = tid.ip_posid;
        let mut at_chain_start = true;
        loop {
            let Some(ItemId { off, flags, len }) = line_pointer(page, item) else {
                return Some(false);
            };
            match flags {
                pg_sys::LP_REDIRECT if at_chain_start => {
                    item = off as u16;
                    at_chain_start = false;
                }
                pg_sys::LP_NORMAL => {
                    let data = page.add(off as usize) as *mut pg_sys::HeapTupleHeaderData;
                    let mask2 = u32::from((*data).t_infomask2);
                    // An entry leads straight to a heap-only tuple only when
                    // its slot was reused: not this entry's row (as in
                    // heap_hot_search_buffer).  An updated tuple would not be
                    // on an all-visible page.
                    if at_chain_start && mask2 & pg_sys::HEAP_ONLY_TUPLE != 0 {
                        return Some(false);
                    }
                    if mask2 & pg_sys::HEAP_HOT_UPDATED != 0 {
                        return None;
                    }
                    out.t_len = len;
                    out.t_self = pg_sys::ItemPointerData {
                        ip_blkid: pg_sys::BlockIdData { bi_hi: (block >> 16) as u16, bi_lo: block as u16 },
                        ip_posid: item,
                    };
                    out.t_tableOid = relid;
                    out.t_data = data;
                    return Some(true);
                }
                pg_sys::LP_REDIRECT | pg_sys::LP_UNUSED | pg_sys::LP_DEAD => return Some(false),
                _ => return None,
            }
        }
    }
}

/// How many tuples ahead of the one being searched [`prefetch_tuple`] runs:
/// enough to cover a memory access while searching, few enough that the
/// prefetches do not queue behind each other (a CPU tracks about ten
/// outstanding misses per core).
const PREFETCH_AHEAD: usize = 6;

/// Starts loading the first cache lines of the tuple `tid` points to, so
/// that the misses of a page's tuples overlap instead of stalling one after
/// another in the visibility checks and deforming (a table larger than the
/// CPU caches comes from memory page by page).  Only a hint: it reads the
/// page's line pointer without the content lock (the pin keeps the page in
/// place; at worst it prefetches a stale address inside the page) and
/// touches no memory outside the page.
///
/// # Safety
/// `page` is a pinned buffer page.
#[inline(always)]
unsafe fn prefetch_tuple(page: *const u8, tid: &pg_sys::ItemPointerData) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: per the contract; the line pointer read stays inside the
    // page (its index checked against the page size), prefetches never fault.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64;
        let page_size = pg_sys::BLCKSZ as usize;
        let item = usize::from(tid.ip_posid);
        if item == 0 || item > (page_size - PAGE_HEADER) / 4 {
            return;
        }
        let lp = ItemId::decode(std::ptr::read_volatile((page.add(PAGE_HEADER) as *const u32).add(item - 1)));
        let (off, len) = (lp.off as usize, lp.len as usize);
        let end = (off + len.min(3 * LINE)).min(page_size);
        let mut at = off;
        while at < end {
            _mm_prefetch::<_MM_HINT_T0>(page.add(at) as *const i8);
            at += LINE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (page, tid);
}

/// One attribute's storage, copied out of the tuple descriptor.
#[derive(Clone, Copy)]
struct AttrLayout {
    len: i16,
    align: usize,
    byval: bool,
    /// Offset in every tuple without NULLs before it (Postgres's
    /// attcacheoff rule), or -1.
    cacheoff: i32,
}

fn align_nominal(off: usize, align: usize) -> usize {
    (off + align - 1) & !(align - 1)
}

/// The value of attribute `a` stored at `p` (fetch_att).
///
/// # Safety
/// `p` points at a stored value of that attribute.
#[inline(always)]
unsafe fn fetch_att(a: AttrLayout, p: *const u8) -> Datum {
    // SAFETY: per the contract; by-value attributes are 1, 2, 4 or 8 bytes.
    unsafe {
        if a.byval {
            match a.len {
                1 => Datum::from(*(p as *const i8)),
                2 => Datum::from(std::ptr::read_unaligned(p as *const i16)),
                4 => Datum::from(std::ptr::read_unaligned(p as *const i32)),
                _ => Datum::from(std::ptr::read_unaligned(p as *const i64)),
            }
        } else {
            Datum::from(p)
        }
    }
}

/// Deforms heap tuples of one relation into arrays it owns —
/// `slot_deform_heap_tuple` without the slot — filling in the projected
/// attributes.
///
/// Fast path: when every projected attribute sits at a fixed offset
/// (fixed-width attributes before it, and the first varlena) and the tuple
/// has no NULL up to the last of them, the projected values are read at
/// those offsets directly, without walking the attributes in between.
pub struct Deformer {
    rel: pg_sys::Relation,
    atts: Vec<AttrLayout>,
    /// Projected attribute indexes, sorted and unique.
    projected: Vec<usize>,
    /// All of them have a fixed offset.
    fixed: bool,
    values: Vec<Datum>,
    nulls: Vec<bool>,
}

impl Deformer {
    /// For the 0-based attributes `projected` of `rel` (open while this is
    /// used).
    pub fn new(rel: pg_sys::Relation, projected: &[usize]) -> Deformer {
        let mut projected = projected.to_vec();
        projected.sort_unstable();
        projected.dedup();
        let natts = projected.last().map_or(0, |m| m + 1);
        // SAFETY: an open relation's descriptor has the projected attributes.
        let attrs = unsafe { &crate::pg::form_attrs((*rel).rd_att)[..natts] };
        let mut atts = Vec::with_capacity(natts);
        let mut off = Some(0usize);
        for a in attrs {
            let align = match a.attalign as u8 {
                b'd' => 8,
                b'i' => 4,
                b's' => 2,
                _ => 1,
            };
            let len = a.attlen;
            let cacheoff = match off {
                Some(o) if len > 0 || len == -2 => Some(align_nominal(o, align)),
                Some(o) if len == -1 && o == align_nominal(o, align) => Some(o),
                _ => None,
            };
            off = match cacheoff {
                Some(o) if len > 0 => Some(o + len as usize),
                _ => None,
            };
            atts.push(AttrLayout { len, align, byval: a.attbyval, cacheoff: cacheoff.map_or(-1, |o| o as i32) });
        }
        let fixed = projected.iter().all(|&i| atts[i].cacheoff >= 0);
        Deformer { rel, atts, projected, fixed, values: vec![Datum::from(0usize); natts], nulls: vec![true; natts] }
    }

    /// Deforms `tup` and returns its value and null arrays, valid at the
    /// projected attributes.  By-reference values point into the tuple.
    ///
    /// # Safety
    /// `tup` is a valid tuple of the relation, on a page pinned while the
    /// values are used.
    #[inline]
    pub unsafe fn deform(&mut self, tup: &pg_sys::HeapTupleData) -> (*const Datum, *const bool) {
        let natts = self.atts.len();
        // SAFETY: per the contract; the reads follow the tuple's own header,
        // null bitmap and the attributes' lengths and alignments exactly as
        // heaptuple.c does.
        unsafe {
            let t = tup.t_data;
            let hasnulls = u32::from((*t).t_infomask) & pg_sys::HEAP_HASNULL != 0;
            let stored = (u32::from((*t).t_infomask2) & pg_sys::HEAP_NATTS_MASK) as usize;
            let bits = (*t).t_bits.as_ptr();
            let tp = (t as *const u8).add(usize::from((*t).t_hoff));
            let (values, nulls) = (self.values.as_mut_ptr(), self.nulls.as_mut_ptr());
            let isnull = |i: usize| hasnulls && *bits.add(i >> 3) & (1 << (i & 7)) == 0;
            if self.fixed && stored >= natts && !(0..natts).any(isnull) {
                for &i in &self.projected {
                    let a = *self.atts.get_unchecked(i);
                    *values.add(i) = fetch_att(a, tp.add(a.cacheoff as usize));
                    *nulls.add(i) = false;
                }
                return (values, nulls);
            }
            let n = natts.min(stored);
            let mut off = 0usize;
            let mut slow = false;
            for i in 0..n {
                let a = *self.atts.get_unchecked(i);
                if isnull(i) {
                    *values.add(i) = Datum::from(0usize);
                    *nulls.add(i) = true;
                    slow = true;
                    continue;
                }
                *nulls.add(i) = false;
                if !slow && a.cacheoff >= 0 {
                    off = a.cacheoff as usize;
                } else if a.len == -1 {
                    // A varlena starts unaligned when it has a 1-byte header
                    // (its first byte is not a pad byte, which is 0).
                    if *tp.add(off) == 0 {
                        off = align_nominal(off, a.align);
                    }
                } else {
                    off = align_nominal(off, a.align);
                }
                let p = tp.add(off);
                *values.add(i) = fetch_att(a, p);
                off += match a.len {
                    -1 => pgrx::varlena::varsize_any(p as *const pg_sys::varlena),
                    -2 => std::ffi::CStr::from_ptr(p as *const std::ffi::c_char).to_bytes_with_nul().len(),
                    l => l as usize,
                };
                if a.len <= 0 {
                    slow = true;
                }
            }
            // Attributes added after this tuple was written: their default
            // as stored for it (ALTER TABLE ... ADD COLUMN ... DEFAULT), or NULL.
            for i in n..natts {
                let mut isnull = false;
                *values.add(i) = pg_sys::getmissingattr((*self.rel).rd_att, i as i32 + 1, &mut isnull);
                *nulls.add(i) = isnull;
            }
            (values, nulls)
        }
    }
}
