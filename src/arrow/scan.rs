//! `pgkvx.arrow_scan`: the table read directly — key index in order, or the
//! heap in physical order — one batch per call of the set-returning function.
//!
//! On a latched table the scan honours `pgkvx.scan_mode` like a LIMIT scan
//! (read/run.rs): optimistic when `max_rows` is at most
//! `pgkvx.max_optimistic_rows` — the whole result is read and encoded
//! first, the span it touched validated, and only then is the first batch
//! returned — otherwise fenced: the declared span `[lower, upper)` is
//! validated before the first read and the batches stream.  Either way no
//! batch leaves the server that a conflict could take back.
//!
//! Every Postgres resource the scan holds (relation and index locks, the
//! registered snapshots, buffer pins) lives between calls; [`TableStream`]
//! releases them when the stream ends, and on early termination (LIMIT,
//! cursor close) from `Drop`.  After an ERROR the resource owners have already
//! released them, so `Drop` then only frees memory.

use std::collections::VecDeque;
use std::rc::Rc;

use pgrx::{pg_sys, PgMemoryContexts, PgSqlErrorCode};

use super::batch::{BatchWriter, BATCH_BYTE_CAP};
use super::fetch::{self, Deformer, PageFetch};
use super::pg::{self, IndexInfo, OwnerWatch, RegisteredSnapshot, TableSlot};
use super::types::{self, EncoderSettings};
use super::{key_for, StreamArgs};
use crate::errors;
use crate::keys::codec::KeyWriter;
use crate::pg::{in_live_transaction, input_datum, Attr, OpenRel};
use crate::read::run::{self, ReadDecision, ReadStrategy};
use crate::read::snapshot::{self, BaseSnapshot};
use crate::read::span::{self, Declared};
use crate::registry::Latched;
use pgkvx_latch::{Footprint, KeyBuf, RelId};

/// The request, as arrow_scan received it.
pub struct ScanRequest {
    pub rel: pg_sys::Oid,
    pub columns: Option<Vec<String>>,
    pub lower: Option<String>,
    pub upper: Option<String>,
    pub max_rows: Option<i64>,
}

/// A latched table's scan before the read protocol has run (it runs at
/// the first call).
struct PendingProtocol {
    latched: Rc<Latched>,
    strategy: ReadStrategy,
    /// D: `[lower, upper)` in key encoding (read/span.rs, from the same
    /// btree scan keys the index scan uses).
    declared: Declared,
    /// The statement's snapshot, with `after` read at the first call.
    base: BaseSnapshot,
}

enum ScanCursor {
    Index {
        index: OpenRel,
        /// Null until the scan is started (and between restarts).
        scan: pg_sys::IndexScanDesc,
        /// The bounds, kept for restarts (index_rescan copies them).
        keys: Vec<pg_sys::ScanKeyData>,
        /// On heap tables: rows a heap page at a time (fetch.rs), not
        /// through the slot.
        pages: Option<PageFetch>,
    },
    Heap {
        scan: pg_sys::TableScanDesc,
    },
}

struct OpenScan {
    rel: OpenRel,
    cursor: ScanCursor,
    slot: TableSlot,
    /// Deforms the rows `pages` finds (up to the highest projected column).
    deformer: Deformer,
    snapshot: RegisteredSnapshot,
    /// The read protocol's base snapshot, once it has run: the statement's,
    /// or a fresh one it registered (released with the scan).
    base: Option<BaseSnapshot>,
    /// The context the scan was begun in: access methods expect to run in a
    /// context that lives as long as the scan, as the executor's per-query
    /// context does.  Spliced snapshots live here too.
    scan_cx: pg_sys::MemoryContext,
    owner: Box<OwnerWatch>,
}

impl OpenScan {
    /// (Re)starts the index scan, reading at `snap`: the statement's
    /// snapshot, or one the read protocol built from it.
    fn start(&mut self, snap: pg_sys::Snapshot) {
        let heap = self.rel.as_ptr();
        let ScanCursor::Index { index, scan, keys, pages } = &mut self.cursor else {
            unreachable!("heap scans start in open()")
        };
        let old = std::mem::replace(scan, std::ptr::null_mut());
        // SAFETY: relation and index are open and locked; `old` is a scan we
        // began and have not ended; `snap` outlives the scan (the statement
        // snapshot, or a fresh one the read registered, released only when the
        // scan ends); index_rescan copies the keys.  The scan
        // allocates what lives as long as it in scan_cx, which lives as long
        // as the set-returning function's state.
        *scan = unsafe {
            PgMemoryContexts::For(self.scan_cx).switch_to(|_| {
                if !old.is_null() {
                    pg_sys::index_endscan(old);
                }
                let s = crate::pg::compat::index_beginscan(heap, index.as_ptr(), snap, keys.len() as i32, 0);
                pg_sys::index_rescan(s, keys.as_mut_ptr(), keys.len() as i32, std::ptr::null_mut(), 0);
                s
            })
        };
        if fetch::is_heap(heap) {
            match pages {
                Some(p) => p.restart(*scan, snap),
                None => *pages = Some(PageFetch::new(*scan, heap, snap)),
            }
        }
    }

    /// Advances to the next visible tuple; false at the end.
    fn next(&mut self) -> bool {
        let slot = self.slot.as_ptr();
        let rel = self.rel.as_ptr();
        let cursor = &mut self.cursor;
        // Most rows are on the page read last: no context switch for them.
        if let ScanCursor::Index { pages: Some(p), .. } = cursor {
            if p.next_on_page() {
                return true;
            }
        }
        // SAFETY: scan, slot and relation were set up together in `open` and
        // are released together in `release`; the scan was started; it
        // allocates in scan_cx, as when it began.
        unsafe {
            PgMemoryContexts::For(self.scan_cx).switch_to(|_| match cursor {
                ScanCursor::Index { pages: Some(p), .. } => p.next(),
                ScanCursor::Index { scan, .. } => {
                    pg_sys::index_getnext_slot(*scan, pg_sys::ScanDirection::ForwardScanDirection, slot)
                }
                ScanCursor::Heap { scan } => {
                    let am = (*rel).rd_tableam;
                    ((*am).scan_getnextslot.expect("table AM without scan_getnextslot"))(
                        *scan,
                        pg_sys::ScanDirection::ForwardScanDirection,
                        slot,
                    )
                }
            })
        }
    }

    /// The values and nulls of the row `next` returned last, deformed up to
    /// attribute `natts` (which the deformer was made for).
    ///
    /// # Safety
    /// `next` returned true; the values are used before it is called again.
    #[inline]
    unsafe fn row(&mut self, natts: usize) -> (*const pg_sys::Datum, *const bool) {
        // SAFETY: per the contract: the page of the current tuple is pinned,
        // or the slot holds it.
        unsafe {
            match &self.cursor {
                ScanCursor::Index { pages: Some(p), .. } => self.deformer.deform(p.current()),
                _ => pg::deform(self.slot.as_ptr(), natts),
            }
        }
    }

    /// The key of the row `next` returned last.
    fn current_key(&self, latched: &Latched) -> crate::keys::codec::KeyWriter {
        // SAFETY: the current tuple (on its pinned page, or in the slot) is
        // a row of the latched table.
        unsafe {
            match &self.cursor {
                ScanCursor::Index { pages: Some(p), .. } => {
                    let mut tup = *p.current();
                    latched.key.encode_heap_tuple(&mut tup, (*self.rel.as_ptr()).rd_att)
                }
                _ => latched.key.encode_slot(self.slot.as_ptr()),
            }
        }
    }

    /// Ends the scan and gives back pins, locks and snapshots, under the
    /// resource owner that acquired them (the caller's may differ at
    /// ExecutorEnd).  Skipped when Postgres has released them already: after
    /// an ERROR (see module docs), or when that owner was released on its own.
    fn release(self) {
        self.owner.unregister();
        if !in_live_transaction() || self.owner.released() {
            // Postgres released everything with its owner; closing the
            // relations again would release them twice.
            if let ScanCursor::Index { index, .. } = self.cursor {
                index.forget();
            }
            self.rel.forget();
            return;
        }
        // SAFETY: the scan descriptors are live (each OpenScan is released at
        // most once, by value) and their resources are still held by
        // `owner`, which has not been released (checked above) and so still
        // exists.
        unsafe {
            let saved = pg_sys::CurrentResourceOwner;
            pg_sys::CurrentResourceOwner = self.owner.owner();
            match self.cursor {
                ScanCursor::Index { index, scan, pages, .. } => {
                    for buf in pages.map(|mut p| p.take_buffers()).into_iter().flatten() {
                        if buf != pg_sys::InvalidBuffer as pg_sys::Buffer {
                            pg_sys::ReleaseBuffer(buf);
                        }
                    }
                    if !scan.is_null() {
                        pg_sys::index_endscan(scan);
                    }
                    index.close();
                }
                ScanCursor::Heap { scan } => {
                    let am = (*self.rel.as_ptr()).rd_tableam;
                    ((*am).scan_end.expect("table AM without scan_end"))(scan);
                }
            }
            self.slot.drop_slot();
            if let Some(mut b) = self.base {
                b.release();
            }
            self.snapshot.release();
            self.rel.close();
            pg_sys::CurrentResourceOwner = saved;
        }
    }
}

pub struct TableStream {
    source: Option<OpenScan>,
    out: BatchWriter,
    /// 0-based attribute index of each output column.
    attrs: Vec<usize>,
    /// Deform up to this many attributes (the highest projected one).
    natts: usize,
    max_rows: Option<u64>,
    remaining: Option<u64>,
    /// Set on a latched table under `pgkvx.scan_mode` until the first call
    /// runs the read protocol.
    pending_protocol: Option<PendingProtocol>,
    /// Batches read, encoded and validated before the first was returned
    /// (optimistic mode), waiting to be returned.
    ready: VecDeque<Vec<u8>>,
    done: bool,
    /// The read stops before this key (the protocol's cut), read with the
    /// latched table's key.
    cut: Option<(KeyBuf, Rc<Latched>)>,
    /// Set while an optimistic attempt reads: the key of the last row read,
    /// for where a scan that ran out of rows stopped looking.
    track_last: Option<(Option<KeyWriter>, Rc<Latched>)>,
}

fn refuse(code: PgSqlErrorCode, msg: impl Into<String>, hint: &str) -> ! {
    errors::raise_hint(code, msg, hint)
}

impl TableStream {
    /// Opens the scan: checks the request the way the equivalent SELECT
    /// would be checked, then sets up every resource the stream holds
    /// between calls.  The order of the checks is the order of the errors
    /// a caller sees.
    pub fn open(req: ScanRequest, args: StreamArgs) -> TableStream {
        if let Some(m) = req.max_rows {
            if m < 0 {
                errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, "max_rows must not be negative");
            }
        }
        let (rel, relname) = open_table(req.rel);
        let all = rel.attrs();
        let projected = projection(&all, req.columns.as_deref(), &relname);
        let (latched, key_index) = key_for(&rel);
        let index = key_index.map(|oid| open_key_index(oid, &relname));
        if index.is_none() && (req.lower.is_some() || req.upper.is_some()) {
            refuse(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("table \"{relname}\" has no key, so lower and upper bounds cannot apply"),
                "arrow_scan reads tables without a primary key in physical order; filter with pgkvx.arrow_query.",
            );
        }
        check_select_privilege(&rel, &all, &projected, index.as_ref().map(|(_, i)| i), &relname);
        refuse_row_security(&rel, &relname);
        let keys = bound_keys(&req, index.as_ref().map(|(_, i)| i), &all, &relname);

        let settings = EncoderSettings { encoding: pg::server_encoding(), numeric: super::numeric_mode() };
        let columns =
            projected.iter().map(|a| types::column(&a.name, a.typid, a.typmod, !a.notnull, settings)).collect();
        let attrs: Vec<usize> = projected.iter().map(|a| a.attnum as usize - 1).collect();
        let natts = attrs.iter().max().map_or(0, |m| m + 1);

        let snapshot = RegisteredSnapshot::active();
        // `after` for the statement's snapshot (read/snapshot.rs): read as
        // soon after it as we can, which only errs on the safe side.
        let after = snapshot::after_for_statement();
        let slot = TableSlot::for_rel(&rel);
        let pending_protocol = match (&latched, &index) {
            (Some(l), Some(_)) => pending_protocol(l, req.max_rows, &keys, &snapshot, after),
            _ => None,
        };
        let cursor = match index {
            Some((index, _)) => ScanCursor::Index { index, scan: std::ptr::null_mut(), keys, pages: None },
            None => begin_heap_scan(&rel, &snapshot),
        };
        // SAFETY: a plain read of a backend global.
        let scan_cx = unsafe { pg_sys::CurrentMemoryContext };
        let owner = OwnerWatch::new();
        let deformer = Deformer::new(rel.as_ptr(), &attrs);
        let mut source = OpenScan { rel, cursor, slot, deformer, snapshot, base: None, scan_cx, owner };
        if pending_protocol.is_none() && matches!(source.cursor, ScanCursor::Index { .. }) {
            // Plain Postgres visibility: read at the statement's snapshot.
            let snap = source.snapshot.as_ptr();
            source.start(snap);
        }
        TableStream {
            source: Some(source),
            out: BatchWriter::new(columns, args.batch_rows),
            attrs,
            natts,
            max_rows: req.max_rows.map(|m| m as u64),
            remaining: req.max_rows.map(|m| m as u64),
            pending_protocol,
            ready: VecDeque::new(),
            done: false,
            cut: None,
            track_last: None,
        }
    }

    /// Runs the read protocol of a latched table (read/run.rs): when it
    /// returns, either the whole validated result waits in `ready`
    /// (optimistic), or the index scan is started at a snapshot for which
    /// the declared span is clean (fenced).
    fn validate(&mut self, l: PendingProtocol) {
        let rel = l.latched.latch_id();
        let mut reader = OptimisticAttempt { stream: self, latched: &l.latched, declared: l.declared.clone(), rel };
        let declared: Footprint = l.declared.spans.iter().map(|s| (rel, *s)).collect();
        let result = run::run_protocol(&mut reader, l.base, &mut || declared.clone(), l.strategy, "arrow_scan");
        let latched = l.latched.clone();
        let src = self.source.as_mut().expect("source");
        match result.decision {
            ReadDecision::Emit => {
                src.base = Some(result.base);
                self.release();
                self.done = true;
            }
            ReadDecision::Stream { cut } => {
                self.cut = cut_key(&cut, &latched);
                // Fenced from the start, or fallen back to it after
                // optimistic attempts: forget what those read.
                self.ready.clear();
                self.out.restart();
                self.remaining = self.max_rows;
                let snap = result.base.snap;
                src.base = Some(result.base);
                src.start(snap);
            }
        }
    }

    /// Reads rows into the batch until it is full; true when the scan is
    /// exhausted (or max_rows reached).
    fn read_batch(&mut self) -> bool {
        let Some(src) = self.source.as_mut() else {
            return true;
        };
        let mut n = 0u32;
        while !self.out.full() {
            if self.remaining == Some(0) {
                return true;
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(1024) {
                pgrx::check_for_interrupts!();
            }
            if !src.next() {
                return true;
            }
            if let Some((c, latched)) = &self.cut {
                if KeyBuf::floor(src.current_key(latched).bytes()) >= *c {
                    return true;
                }
            }
            if let Some((last, latched)) = &mut self.track_last {
                *last = Some(src.current_key(latched));
            }
            // SAFETY: `next` just found a row of `rel`, and attrs are
            // attribute indexes below natts of that relation.
            unsafe {
                let (values, nulls) = src.row(self.natts);
                self.out.push_row(values, nulls, &self.attrs);
            }
            if let Some(r) = self.remaining.as_mut() {
                *r -= 1;
            }
        }
        false
    }

    fn release(&mut self) {
        if let Some(src) = self.source.take() {
            src.release();
        }
    }
}

impl Iterator for TableStream {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if let Some(l) = self.pending_protocol.take() {
            self.validate(l);
        }
        if let Some(b) = self.ready.pop_front() {
            return Some(b);
        }
        if self.done {
            return None;
        }
        let exhausted = self.read_batch();
        if exhausted {
            self.release();
            self.done = true;
        }
        Some(self.out.flush(exhausted))
    }
}

/// An optimistic attempt: reads and encodes the whole (bounded) result into
/// `ready`, and says which span it touched.
struct OptimisticAttempt<'a> {
    stream: &'a mut TableStream,
    latched: &'a Rc<Latched>,
    declared: Declared,
    rel: RelId,
}

impl run::Reader for OptimisticAttempt<'_> {
    /// A tail read through `arrow_scan` -- from `lower` up, open above, at
    /// most `max_rows` rows -- may stop before a writer's key and read it
    /// next time; a range read whole may not.
    fn cut(&mut self, conflicts: &[pgkvx_latch::Conflict]) -> Option<Footprint> {
        (self.declared.open_above && self.stream.max_rows.is_some()).then(|| run::cut_upward(conflicts))
    }

    fn read_buffered(&mut self, base: &BaseSnapshot, cut: &Footprint) -> Option<Footprint> {
        let latched = self.latched.clone();
        let st = &mut *self.stream;
        st.cut = cut_key(cut, &latched);
        st.ready.clear();
        st.out.restart();
        st.remaining = st.max_rows;
        st.track_last = Some((None, latched.clone()));
        let src = st.source.as_mut().expect("source");
        src.start(base.snap);
        // Held back until valid: past one batch's worth of bytes the read
        // goes fenced and streams instead.
        let mut held = 0usize;
        loop {
            let exhausted = st.read_batch();
            let batch = st.out.flush(exhausted);
            held += batch.len();
            st.ready.push_back(batch);
            if exhausted {
                break;
            }
            if held > BATCH_BYTE_CAP {
                st.track_last = None;
                return None;
            }
        }
        let (last, _) = st.track_last.take().expect("tracked");
        let spans: span::Spans = match st.max_rows {
            // Asked for nothing, read nothing.
            Some(0) => span::Spans::new(),
            // Stopped at max_rows: the scan looked at D up to the last key.
            Some(_) if st.remaining == Some(0) => {
                let key = st.source.as_ref().expect("source").current_key(self.latched);
                self.declared.within(&span::up_to(&key, true)).collect()
            }
            // Ran out of rows: up to `upper`, or with none up to the last
            // key it read, as a LIMIT scan's (read/span.rs).
            _ => self.declared.ran_out(last.as_ref(), true),
        };
        Some(spans.into_iter().map(|s| (self.rel, s)).collect())
    }
}

/// Opens `oid` for reading, its lock kept to the end of the transaction as
/// a SELECT keeps it, and refuses what arrow_scan cannot read directly.
/// Returns the relation and its name (for messages).
fn open_table(oid: pg_sys::Oid) -> (OpenRel, String) {
    let rel = OpenRel::open(oid, pg_sys::AccessShareLock).keeping_lock();
    let relname = rel.name();
    match rel.relkind() {
        k if k == pg_sys::RELKIND_RELATION || k == pg_sys::RELKIND_MATVIEW => {}
        _ => refuse(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("\"{relname}\" is not a table or materialized view"),
            "pgkvx.arrow_scan reads tables directly; use pgkvx.arrow_query for views, partitioned and foreign tables.",
        ),
    }
    if rel.is_other_temp() {
        errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "cannot access temporary tables of other sessions",
        );
    }
    if !rel.form().relispopulated {
        refuse(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("materialized view \"{relname}\" has not been populated"),
            "Use the REFRESH MATERIALIZED VIEW command.",
        );
    }
    (rel, relname)
}

/// The output columns, in output order: every live column when `columns`
/// is NULL, else the named ones, each named once.
fn projection<'a>(all: &'a [Attr], columns: Option<&[String]>, relname: &str) -> Vec<&'a Attr> {
    let live: Vec<&Attr> = all.iter().filter(|a| !a.dropped).collect();
    let projected: Vec<&Attr> = match columns {
        None => live,
        Some(names) => {
            if names.is_empty() {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    "columns must name at least one column (or be NULL for all)",
                );
            }
            let mut out: Vec<&Attr> = Vec::with_capacity(names.len());
            for n in names {
                let Some(a) = live.iter().find(|a| &a.name == n) else {
                    errors::raise(
                        PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                        format!("column \"{n}\" of relation \"{relname}\" does not exist"),
                    )
                };
                if out.iter().any(|o| o.attnum == a.attnum) {
                    errors::raise(
                        PgSqlErrorCode::ERRCODE_DUPLICATE_COLUMN,
                        format!("column \"{n}\" is requested more than once"),
                    );
                }
                out.push(a);
            }
            out
        }
    };
    if projected.is_empty() {
        errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("table \"{relname}\" has no columns"));
    }
    projected
}

/// Opens the key index the scan orders by (locked as the table is); only a
/// btree gives the key order and the bounds their meaning.
fn open_key_index(oid: pg_sys::Oid, relname: &str) -> (OpenRel, IndexInfo) {
    let ix = OpenRel::open(oid, pg_sys::AccessShareLock).keeping_lock();
    let info = IndexInfo::of(&ix);
    if !info.is_btree {
        errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the key index of \"{relname}\" is not a btree index"),
        );
    }
    (ix, info)
}

/// Privileges as for SELECT <columns> FROM rel ORDER BY <key> with the
/// bounds in WHERE: the table, or every column that query would name.
fn check_select_privilege(rel: &OpenRel, all: &[Attr], projected: &[&Attr], key: Option<&IndexInfo>, relname: &str) {
    if crate::pg::acl::may(rel.oid(), pg_sys::ACL_SELECT) {
        return;
    }
    let key_cols: Vec<i16> = key.map(|i| i.heap_attnums.clone()).unwrap_or_default();
    let needed = projected.iter().map(|a| a.attnum).chain(key_cols);
    for attnum in needed {
        if !crate::pg::acl::may_column(rel.oid(), attnum, pg_sys::ACL_SELECT) {
            let col = all.iter().find(|a| a.attnum == attnum).map(|a| a.name.clone()).unwrap_or_default();
            errors::raise_full(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied for table {relname}"),
                Some(format!(
                    "SELECT on column \"{col}\" is required (arrow_scan orders by and bounds on the key columns)."
                )),
                None::<String>,
            );
        }
    }
}

/// arrow_scan reads the table itself, not through a query the policies
/// could be added to: with row level security in force it must refuse.
fn refuse_row_security(rel: &OpenRel, relname: &str) {
    if crate::pg::acl::rls_applies(rel.oid()) {
        refuse(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("row level security applies to table \"{relname}\"; pgkvx.arrow_scan does not evaluate policies"),
            "Use pgkvx.arrow_query('SELECT ... FROM ... ORDER BY ...'), which applies the table's policies.",
        );
    }
}

/// The btree scan keys for `[lower, upper)` on the key's one column (none
/// without bounds); the values are read by the key column's input function.
fn bound_keys(req: &ScanRequest, key: Option<&IndexInfo>, all: &[Attr], relname: &str) -> Vec<pg_sys::ScanKeyData> {
    let mut keys: Vec<pg_sys::ScanKeyData> = Vec::new();
    let Some(info) = key else {
        return keys;
    };
    if req.lower.is_none() && req.upper.is_none() {
        return keys;
    }
    if info.heap_attnums.len() != 1 {
        refuse(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("bounds on the multi-column key of \"{relname}\" are not supported"),
            "Pass NULL bounds, or filter with pgkvx.arrow_query.",
        );
    }
    let key_attr = all.iter().find(|a| a.attnum == info.heap_attnums[0]).expect("key column of the primary key exists");
    if let Some(lo) = &req.lower {
        let v = input_datum(key_attr.typid, key_attr.typmod, lo);
        keys.push(pg::btree_key(info, pg_sys::BTGreaterEqualStrategyNumber, v));
    }
    if let Some(hi) = &req.upper {
        let v = input_datum(key_attr.typid, key_attr.typmod, hi);
        keys.push(pg::btree_key(info, pg_sys::BTLessStrategyNumber, v));
    }
    keys
}

/// On a latched table under `pgkvx.scan_mode`, the read protocol the first
/// call runs (None when the mode is off): its span D is `[lower, upper)`
/// from the same scan keys the index scan uses, and its base snapshot the
/// statement's.
fn pending_protocol(
    latched: &Rc<Latched>,
    max_rows: Option<i64>,
    keys: &[pg_sys::ScanKeyData],
    snapshot: &RegisteredSnapshot,
    after: pgkvx_latch::Xid,
) -> Option<PendingProtocol> {
    run::choose_mode(max_rows.map(|m| m as u64)).map(|strategy| {
        PendingProtocol {
            latched: latched.clone(),
            strategy,
            declared: span::declared(&latched.key, span::scan_key_quals(keys, Some)),
            // SAFETY: the snapshot is registered until the scan ends,
            // and `after` was read after it was taken.
            base: unsafe { BaseSnapshot::of(snapshot.as_ptr(), after) },
        }
    })
}

/// A sequential scan of a table without a key, begun at `snapshot`.
fn begin_heap_scan(rel: &OpenRel, snapshot: &RegisteredSnapshot) -> ScanCursor {
    // No synchronized scan: "physical order" should start at block 0 every
    // time.
    let flags = pg_sys::ScanOptions::SO_TYPE_SEQSCAN
        | pg_sys::ScanOptions::SO_ALLOW_STRAT
        | pg_sys::ScanOptions::SO_ALLOW_PAGEMODE;
    // SAFETY: the relation is open and locked, the snapshot registered.
    let scan = unsafe {
        let am = (*rel.as_ptr()).rd_tableam;
        ((*am).scan_begin.expect("table AM without scan_begin"))(
            rel.as_ptr(),
            snapshot.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            flags,
        )
    };
    ScanCursor::Heap { scan }
}

/// The first key `cut` leaves out, with the key to read rows' keys by.
fn cut_key(cut: &Footprint, latched: &Rc<Latched>) -> Option<(KeyBuf, Rc<Latched>)> {
    cut.iter().map(|(_, s)| s.start).min().map(|c| (c, latched.clone()))
}

impl Drop for TableStream {
    fn drop(&mut self) {
        self.release();
    }
}
