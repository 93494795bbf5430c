//! The latch table's memory: one fixed-size region holding every structure
//! (headers, tables, ranges, entries, tree nodes, backend slots), addressed
//! by index.
//! Nothing is allocated after `init`, so the region can be Postgres shared
//! memory mapped at different addresses in different processes.
//!
//! What protects what (the child module `guard` alone turns the cells into
//! references, and hands each out under its lock):
//! - `TableData`, `RangeMeta`, `DirCounts`: the Directory lock.
//! - `RangeBody`, the tree nodes its root reaches, and the `EntryData` of
//!   every entry in its tree: the range's lock.
//! - A free tree node, or a free entry's `EntryData`: whoever popped it.
//! - `Entry::holder_next` and `BackendSlot::chain`: the owning backend.
//! - Everything else is atomic.

use super::span::{KeyBuf, Span};
use super::tree::{self, NIL};
use super::xid::Xid;
use std::cell::UnsafeCell;
use std::mem::{align_of, size_of};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};

pub(crate) mod guard;

pub const MAGIC: u64 = 0x706b_7678_6c74_0008; // "pkvxlt" v8

/// Most ranges one table can be split into.
pub const MAX_RANGES_PER_TABLE: usize = 128;

/// Sizing, fixed when the region is created (postmaster GUCs in Postgres).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Config {
    /// Latch entries (live latches plus retained tombstones).
    pub max_entries: u32,
    /// Latch ranges across all tables.
    pub max_ranges: u32,
    /// Latched tables across all databases.
    pub max_tables: u32,
    /// Backend slots (one per PGPROC that can hold latches).
    pub max_backends: u32,
}

impl Config {
    /// Tree nodes in the pool: enough for any placement of `max_entries`
    /// entries in `max_ranges` ranges (tree::pool_size).
    pub fn tree_nodes(&self) -> u32 {
        tree::pool_size(self.max_entries, self.max_ranges)
    }
}

/// A latched relation: database and relation oid packed as `db << 32 | rel`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct RelId(pub u64);

impl RelId {
    pub const EMPTY: RelId = RelId(0);
    pub const DELETED: RelId = RelId(u64::MAX);
    pub fn new(db: u32, rel: u32) -> RelId {
        RelId((u64::from(db) << 32) | u64::from(rel))
    }
    pub fn db(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn rel(self) -> u32 {
        self.0 as u32
    }
}

#[repr(C)]
pub(crate) struct Header {
    pub magic: u64,
    pub cfg: Config,
    /// Publication order of latches; gives `next_key` draws a total order.
    pub seq: AtomicU64,
    /// The next draw ticket, and how many are out (draw_order.rs).
    pub draw_ticket: AtomicU64,
    pub draw_tickets_out: AtomicU32,
    /// Free entry stack, tagged against ABA: `tag << 32 | index`.
    pub free_head: AtomicU64,
    pub free_count: AtomicU32,
    /// Free tree-node stack, tagged like `free_head`; links in `node_next`.
    pub node_free_head: AtomicU64,
    /// Cached global xmin horizon: tombstones of holders before it go.
    pub horizon: AtomicU32,
    /// On a hot standby, every xid below this may hold latches the standby
    /// never replayed (0: none): see [`super::table::LatchTable::set_fog`].
    pub fog: AtomicU32,
    /// Split threshold (mirrors `pgkvx.range_max_latches`).
    pub range_max_latches: AtomicU32,
    /// Table slots the tables of one owner may take (mirrors
    /// `pgkvx.max_tables_per_owner`; 0 = no limit).
    pub max_tables_per_owner: AtomicU32,
    /// Bumped on every directory change (split, merge, new or purged table).
    pub dir_version: AtomicU64,
    /// Ranges in state `Queued`: idle workers look here before scanning.
    pub queued: AtomicU32,
    /// Wall clock (µs) of a maintenance worker's latest tick: writers wait
    /// for splits only while workers run.
    pub worker_beat: AtomicI64,
    /// Latches released (committed or aborted) but not yet moved to their
    /// range's tombstone list or freed: a lock-free stack (see table.rs).
    pub released: AtomicU32,
    pub released_count: AtomicU32,
    /// A resting maintainer's waker plus one (0: none is resting); see
    /// rest.rs.
    pub rest: AtomicU64,
    dir: UnsafeCell<DirCounts>,
}

pub(crate) struct DirCounts {
    pub free_range: u32,
    pub ranges_used: u32,
    pub tables_used: u32,
}

#[repr(C)]
pub(crate) struct TableSlot {
    inner: UnsafeCell<TableData>,
}

#[derive(Clone)]
pub(crate) struct TableData {
    pub rel: RelId,
    /// The table's owner (a role oid), for the per-owner slot bound.
    pub owner: u32,
    pub nranges: u32,
    /// Range ids ordered by their low bound; the first starts at the empty
    /// key, each range ends where the next starts, the last at +∞.
    pub ranges: [u32; MAX_RANGES_PER_TABLE],
    /// `lo.head()` of each range in `ranges`, side by side: finding a key's
    /// range binary-searches these few cache lines instead of one range
    /// record per step.
    pub lo_heads: [u64; MAX_RANGES_PER_TABLE],
    /// Acquisitions counted at the last idle check (maint.rs).
    pub seen_acquires: u64,
}

impl TableData {
    /// Puts range `r`, whose low bound has head `lo_head`, at `pos` in key
    /// order.
    pub fn insert_range(&mut self, pos: usize, r: u32, lo_head: u64) {
        let n = self.nranges as usize;
        self.ranges.copy_within(pos..n, pos + 1);
        self.lo_heads.copy_within(pos..n, pos + 1);
        self.ranges[pos] = r;
        self.lo_heads[pos] = lo_head;
        self.nranges += 1;
    }

    /// Takes the range at `pos` out of the key order.
    pub fn remove_range(&mut self, pos: usize) {
        let n = self.nranges as usize;
        self.ranges.copy_within(pos + 1..n, pos);
        self.lo_heads.copy_within(pos + 1..n, pos);
        self.nranges -= 1;
        self.ranges[n - 1] = NIL;
    }

    pub fn position(&self, r: u32) -> usize {
        self.ranges[..self.nranges as usize].iter().position(|&x| x == r).expect("range in its table")
    }
}

#[repr(C)]
pub(crate) struct RangeSlot {
    meta: UnsafeCell<RangeMeta>,
    body: UnsafeCell<RangeBody>,
    /// Latches acquired in this range (for the split heuristics and views).
    pub acquires: AtomicU64,
    /// Acquisitions that found the range lock busy.
    pub contended: AtomicU64,
    /// The range's `QueueState` (queue.rs), as a word; 0 is `Idle`.
    pub queue: AtomicU32,
    /// `contended` when a worker last looked: contention since then is what
    /// counts.
    pub contended_seen: AtomicU64,
}

#[derive(Clone, Copy)]
pub(crate) struct RangeMeta {
    pub in_use: bool,
    pub table: u32,
    pub lo: KeyBuf,
    pub hi: KeyBuf,
    /// Next free range (when not in use).
    pub next_free: u32,
}

#[derive(Clone, Copy)]
pub(crate) struct RangeBody {
    /// The range's tree: a node of the pool (not an entry), or NIL.
    pub root: u32,
    pub live: u32,
    pub tombstones: u32,
    /// Released latches in release order, for reclaiming.
    pub fifo_head: u32,
    pub fifo_tail: u32,
    /// Tombstones folded together under pressure.
    pub summary: Summary,
}

/// Many tombstones folded into one: it remembers only the covering span and
/// the xid and publication-order intervals of its holders.  Conflicts it
/// reports are a superset of what the individual tombstones would report.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub count: u32,
    pub span: Span,
    pub xid_lo: Xid,
    pub xid_hi: Xid,
    pub seq_lo: u64,
    pub seq_hi: u64,
}

impl Summary {
    pub const EMPTY: Summary = Summary {
        count: 0,
        span: Span { start: KeyBuf::INFINITE, end: KeyBuf::EMPTY },
        xid_lo: Xid::INVALID,
        xid_hi: Xid::INVALID,
        seq_lo: u64::MAX,
        seq_hi: 0,
    };

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Folds in a tombstone that published from `seq_lo` to `seq_hi`.
    pub fn absorb(&mut self, span: &Span, xid: Xid, seq_lo: u64, seq_hi: u64) {
        if self.count == 0 {
            *self = Summary { count: 1, span: *span, xid_lo: xid, xid_hi: xid, seq_lo, seq_hi };
            return;
        }
        self.count += 1;
        self.span = self.span.union(span);
        self.xid_lo = self.xid_lo.min(xid);
        self.xid_hi = self.xid_hi.max(xid);
        self.seq_lo = self.seq_lo.min(seq_lo);
        self.seq_hi = self.seq_hi.max(seq_hi);
    }

    pub fn merge(&mut self, other: &Summary) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        self.count += other.count;
        self.span = self.span.union(&other.span);
        self.xid_lo = self.xid_lo.min(other.xid_lo);
        self.xid_hi = self.xid_hi.max(other.xid_hi);
        self.seq_lo = self.seq_lo.min(other.seq_lo);
        self.seq_hi = self.seq_hi.max(other.seq_hi);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum State {
    Free = 0,
    /// Held by a running transaction.
    Live = 1,
    /// Released at commit; kept while a snapshot may still see the holder as
    /// in progress.
    Tombstone = 2,
    /// Released at abort: conflicts with nobody, removed when drained.
    Dead = 3,
}

impl State {
    pub fn from_u8(v: u8) -> State {
        match v {
            1 => State::Live,
            2 => State::Tombstone,
            3 => State::Dead,
            _ => State::Free,
        }
    }
}

#[repr(C)]
pub(crate) struct Entry {
    data: UnsafeCell<EntryData>,
    pub range: AtomicU32,
    pub holder_next: AtomicU32,
    /// Free-list link while free; released-list link once released.
    pub free_next: AtomicU32,
    /// A State, atomic so that releasing needs no lock: readers holding
    /// the range lock see Live, Tombstone or Dead, all of them safe.
    pub state: AtomicU8,
    /// The last publication this latch stands for.  A point latch stands
    /// for one write: its own `seq`.  A span latch (explicit, TRUNCATE, or
    /// escalated) also covers writes its holder makes later without a new
    /// latch, so it is [`OPEN`] while live and set to the publication
    /// counter when released (before the state changes).  Readers use it
    /// only for holders that have ended.
    pub seq_hi: AtomicU64,
}

/// `seq_hi` of a live span latch: its holder may still write under it.
pub const OPEN: u64 = u64::MAX;

#[repr(C)]
pub(crate) struct TreeNode(UnsafeCell<tree::Node>);

#[derive(Clone, Copy)]
pub(crate) struct EntryData {
    pub span: Span,
    pub xid: Xid,
    /// Publication order: the earliest write this latch stands for.
    pub seq: u64,
    pub pid: i32,
    /// Microseconds since the Unix epoch, for the latches view's age.
    pub acquired_at: i64,
    pub fifo_next: u32,
    /// On its range's tombstone list (drained), not pending release.
    pub in_fifo: bool,
}

#[repr(C)]
pub(crate) struct BackendSlot {
    /// Head of this backend's live latches (linked by `Entry::holder_next`).
    pub chain: AtomicU32,
    /// The role whose transaction holds them, and how many entries: the
    /// per-role budget sums these.
    pub role: AtomicU32,
    pub live: AtomicU32,
    pub stats: [AtomicU64; super::stats::NSTATS],
    /// The draw ticket of a drawn latch this backend has not logged yet
    /// (0: none; draw_order.rs).
    pub unlogged_draw: AtomicU64,
}

// SAFETY: every field is atomic or behind an UnsafeCell whose access rules
// (module comment) are upheld by the locks the table code takes; the region
// is designed to be shared between processes and threads.
unsafe impl Sync for Header {}
unsafe impl Sync for TableSlot {}
unsafe impl Sync for RangeSlot {}
unsafe impl Sync for Entry {}
unsafe impl Sync for TreeNode {}

/// Byte offsets of each array in the region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub tables: usize,
    pub ranges: usize,
    pub entries: usize,
    pub nodes: usize,
    pub node_next: usize,
    pub backends: usize,
    pub size: usize,
}

fn align_up(off: usize, align: usize) -> usize {
    off.div_ceil(align) * align
}

impl Layout {
    pub fn of(cfg: &Config) -> Layout {
        let mut off = size_of::<Header>();
        off = align_up(off, align_of::<TableSlot>());
        let tables = off;
        off += size_of::<TableSlot>() * cfg.max_tables as usize;
        off = align_up(off, align_of::<RangeSlot>());
        let ranges = off;
        off += size_of::<RangeSlot>() * cfg.max_ranges as usize;
        off = align_up(off, align_of::<Entry>());
        let entries = off;
        off += size_of::<Entry>() * cfg.max_entries as usize;
        off = align_up(off, REGION_ALIGN);
        let nodes = off;
        off += size_of::<TreeNode>() * cfg.tree_nodes() as usize;
        let node_next = off;
        off += size_of::<AtomicU32>() * cfg.tree_nodes() as usize;
        off = align_up(off, align_of::<BackendSlot>());
        let backends = off;
        off += size_of::<BackendSlot>() * cfg.max_backends as usize;
        // Slack for aligning a base address that is only 8-byte aligned.
        Layout { tables, ranges, entries, nodes, node_next, backends, size: off + REGION_ALIGN }
    }
}

/// The alignment the region is laid out for (a cache line, for the node
/// array); [`init`] and [`attach`] round the address they are given up to it.
const REGION_ALIGN: usize = 64;

/// The region's start inside the memory handed to us.  Every process maps
/// the segment at an address with the same offset from a page boundary, so
/// all of them round to the same place.
fn aligned(mem: *mut u8) -> *mut u8 {
    mem.wrapping_add(mem.align_offset(REGION_ALIGN))
}

pub(crate) struct Region<'r> {
    pub hdr: &'r Header,
    pub tables: &'r [TableSlot],
    pub ranges: &'r [RangeSlot],
    pub entries: &'r [Entry],
    pub nodes: &'r [TreeNode],
    pub node_next: &'r [AtomicU32],
    pub backends: &'r [BackendSlot],
}

/// Writes a fresh, empty table into `mem`.
///
/// # Safety
/// `mem` must point to `Layout::of(cfg).size` writable bytes aligned to
/// 8, not in use by anyone else during the call.
pub(crate) unsafe fn init<'r>(mem: *mut u8, cfg: &Config) -> Region<'r> {
    assert!(cfg.max_entries > 0 && cfg.max_entries < NIL);
    assert!(cfg.max_ranges > 0 && cfg.max_tables > 0 && cfg.max_backends > 0);
    assert_eq!(mem as usize % 8, 0, "latch region misaligned");
    let lay = Layout::of(cfg);
    let mem = aligned(mem);
    // SAFETY: offsets come from Layout::of, so each array handed to a step
    // is inside the region, aligned for its type and as long as `cfg` says;
    // the region is ours alone (the contract).
    unsafe {
        write_header(mem as *mut Header, cfg);
        write_tables(mem.add(lay.tables) as *mut TableSlot, cfg);
        write_ranges(mem.add(lay.ranges) as *mut RangeSlot, cfg);
        write_entries(mem.add(lay.entries) as *mut Entry, cfg);
        write_tree_pool(mem.add(lay.nodes) as *mut TreeNode, mem.add(lay.node_next) as *mut AtomicU32, cfg);
        write_backends(mem.add(lay.backends) as *mut BackendSlot, cfg);
        attach(mem)
    }
}

// The steps of `init`.  Each writes one part of a fresh region.
//
// # Safety (every step)
// Its pointers are aligned for their types, valid for writes of the number
// of items `cfg` gives that part, and nobody else uses them meanwhile.

/// An empty header: everything free, nothing queued.
unsafe fn write_header(at: *mut Header, cfg: &Config) {
    let hdr = Header {
        magic: MAGIC,
        cfg: *cfg,
        seq: AtomicU64::new(1),
        draw_ticket: AtomicU64::new(1),
        draw_tickets_out: AtomicU32::new(0),
        free_head: AtomicU64::new(0),
        free_count: AtomicU32::new(cfg.max_entries),
        node_free_head: AtomicU64::new(0),
        horizon: AtomicU32::new(0),
        fog: AtomicU32::new(0),
        range_max_latches: AtomicU32::new(1024),
        max_tables_per_owner: AtomicU32::new(0),
        dir_version: AtomicU64::new(1),
        queued: AtomicU32::new(0),
        worker_beat: AtomicI64::new(0),
        released: AtomicU32::new(NIL),
        released_count: AtomicU32::new(0),
        rest: AtomicU64::new(0),
        dir: UnsafeCell::new(DirCounts { free_range: 0, ranges_used: 0, tables_used: 0 }),
    };
    // SAFETY: per the steps' contract.
    unsafe { std::ptr::write(at, hdr) };
}

/// Every table slot empty.
unsafe fn write_tables(at: *mut TableSlot, cfg: &Config) {
    for i in 0..cfg.max_tables as usize {
        let slot = TableSlot {
            inner: UnsafeCell::new(TableData {
                rel: RelId::EMPTY,
                owner: 0,
                nranges: 0,
                ranges: [NIL; MAX_RANGES_PER_TABLE],
                lo_heads: [0; MAX_RANGES_PER_TABLE],
                seen_acquires: 0,
            }),
        };
        // SAFETY: per the steps' contract; i < max_tables.
        unsafe { std::ptr::write(at.add(i), slot) };
    }
}

/// Every range free, linked into the free-range list in index order.
unsafe fn write_ranges(at: *mut RangeSlot, cfg: &Config) {
    for i in 0..cfg.max_ranges {
        let next_free = if i + 1 < cfg.max_ranges { i + 1 } else { NIL };
        let slot = RangeSlot {
            meta: UnsafeCell::new(RangeMeta {
                in_use: false,
                table: NIL,
                lo: KeyBuf::EMPTY,
                hi: KeyBuf::INFINITE,
                next_free,
            }),
            body: UnsafeCell::new(RangeBody::EMPTY),
            acquires: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            queue: AtomicU32::new(0),
            contended_seen: AtomicU64::new(0),
        };
        // SAFETY: per the steps' contract; i < max_ranges.
        unsafe { std::ptr::write(at.add(i as usize), slot) };
    }
}

/// Every entry free, linked into the free stack in index order.
unsafe fn write_entries(at: *mut Entry, cfg: &Config) {
    for i in 0..cfg.max_entries {
        let next = if i + 1 < cfg.max_entries { i + 1 } else { NIL };
        let entry = Entry {
            data: UnsafeCell::new(EntryData::FREE),
            range: AtomicU32::new(NIL),
            holder_next: AtomicU32::new(NIL),
            free_next: AtomicU32::new(next),
            state: AtomicU8::new(State::Free as u8),
            seq_hi: AtomicU64::new(0),
        };
        // SAFETY: per the steps' contract; i < max_entries.
        unsafe { std::ptr::write(at.add(i as usize), entry) };
    }
}

/// Every tree node empty, linked into the node free stack in index order.
unsafe fn write_tree_pool(nodes: *mut TreeNode, node_next: *mut AtomicU32, cfg: &Config) {
    let pool = cfg.tree_nodes();
    for i in 0..pool {
        let next = if i + 1 < pool { i + 1 } else { NIL };
        // SAFETY: per the steps' contract; i < tree_nodes().
        unsafe {
            std::ptr::write(nodes.add(i as usize), TreeNode(UnsafeCell::new(tree::Node::EMPTY)));
            std::ptr::write(node_next.add(i as usize), AtomicU32::new(next));
        }
    }
}

/// Every backend slot holding nothing, its counters at zero.
unsafe fn write_backends(at: *mut BackendSlot, cfg: &Config) {
    for i in 0..cfg.max_backends as usize {
        let slot = BackendSlot {
            chain: AtomicU32::new(NIL),
            role: AtomicU32::new(0),
            live: AtomicU32::new(0),
            stats: std::array::from_fn(|_| AtomicU64::new(0)),
            unlogged_draw: AtomicU64::new(0),
        };
        // SAFETY: per the steps' contract; i < max_backends.
        unsafe { std::ptr::write(at.add(i), slot) };
    }
}

/// Views an initialised region.
///
/// # Safety
/// `mem` must point to a region written by [`init`] (in this or another
/// process) that stays mapped for `'r`.
pub(crate) unsafe fn attach<'r>(mem: *mut u8) -> Region<'r> {
    let mem = aligned(mem);
    // SAFETY: per the contract the header is initialised; the arrays follow
    // at the offsets Layout::of computes from the config stored in it.
    unsafe {
        let hdr = &*(mem as *const Header);
        assert_eq!(hdr.magic, MAGIC, "latch region has the wrong layout version");
        let cfg = hdr.cfg;
        let lay = Layout::of(&cfg);
        Region {
            hdr,
            tables: std::slice::from_raw_parts(mem.add(lay.tables) as *const TableSlot, cfg.max_tables as usize),
            ranges: std::slice::from_raw_parts(mem.add(lay.ranges) as *const RangeSlot, cfg.max_ranges as usize),
            entries: std::slice::from_raw_parts(mem.add(lay.entries) as *const Entry, cfg.max_entries as usize),
            nodes: std::slice::from_raw_parts(mem.add(lay.nodes) as *const TreeNode, cfg.tree_nodes() as usize),
            node_next: std::slice::from_raw_parts(
                mem.add(lay.node_next) as *const AtomicU32,
                cfg.tree_nodes() as usize,
            ),
            backends: std::slice::from_raw_parts(
                mem.add(lay.backends) as *const BackendSlot,
                cfg.max_backends as usize,
            ),
        }
    }
}

impl RangeBody {
    pub const EMPTY: RangeBody =
        RangeBody { root: NIL, live: 0, tombstones: 0, fifo_head: NIL, fifo_tail: NIL, summary: Summary::EMPTY };
}

impl EntryData {
    pub const FREE: EntryData = EntryData {
        span: Span { start: KeyBuf::EMPTY, end: KeyBuf::EMPTY },
        xid: Xid::INVALID,
        seq: 0,
        pid: 0,
        acquired_at: 0,
        fifo_next: NIL,
        in_fifo: false,
    };
}

/// Pops the top index of a lock-free stack whose head is `tag << 32 |
/// index` (the tag, bumped on every change, defeats ABA); `link(i)` is
/// index `i`'s successor.  None when empty.  Entries and tree nodes each
/// keep their free list this way.
pub(crate) fn stack_pop<'a>(head: &AtomicU64, link: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
    let mut h = head.load(Ordering::Acquire);
    loop {
        let top = h as u32;
        if top == NIL {
            return None;
        }
        let next = link(top).load(Ordering::Relaxed);
        let new = (((h >> 32) + 1) << 32) | u64::from(next);
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(top),
            Err(cur) => h = cur,
        }
    }
}

/// Pushes `i`, whose successor link is `link`, onto the stack at `head`
/// (see [`stack_pop`]).
pub(crate) fn stack_push(head: &AtomicU64, i: u32, link: &AtomicU32) {
    let mut h = head.load(Ordering::Acquire);
    loop {
        link.store(h as u32, Ordering::Relaxed);
        let new = (((h >> 32) + 1) << 32) | u64::from(i);
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(cur) => h = cur,
        }
    }
}

/// Relaxed is enough for statistics counters.
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
