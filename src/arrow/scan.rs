//! `pgkvx.arrow_scan`: the table read directly — key index in order, or the
//! heap in physical order — one batch per call of the set-returning function.
//!
//! Every Postgres resource the scan holds (relation and index locks, the
//! registered snapshot, buffer pins) lives between calls; [`TableStream`]
//! releases them when the stream ends, and on early termination (LIMIT,
//! cursor close) from `Drop`.  After an ERROR the resource owners have already
//! released them, so `Drop` then only frees memory.

use pgrx::{pg_sys, PgSqlErrorCode};

use super::batch::BatchWriter;
use super::pg::{self, in_live_transaction, IndexInfo, OwnerWatch, RegisteredSnapshot, Rel, Slot};
use super::types::{self, Settings};
use super::{key_index_for, StreamArgs};
use crate::errors;

/// The request, as arrow_scan received it.
pub struct ScanRequest {
    pub rel: pg_sys::Oid,
    pub columns: Option<Vec<String>>,
    pub lower: Option<String>,
    pub upper: Option<String>,
    pub max_rows: Option<i64>,
}

/// Where `pgkvx.scan_mode` will plug in (fenced / optimistic validation of
/// latched tables, not built yet).  The scan loop calls `before_batch` before
/// reading a batch (fenced: wait for conflicting writers) and `after_batch`
/// once the batch is complete but before any byte of it leaves the server
/// (optimistic: validate the touched span; on conflict wait and re-read), so
/// a batch that fails validation is never emitted.
pub trait ScanFence {
    fn before_batch(&mut self) {}
    fn after_batch(&mut self) {}
}

/// Plain Postgres visibility: what every table gets until latching exists.
pub struct NoFence;
impl ScanFence for NoFence {}

enum Cursor {
    Index { index: Rel, scan: pg_sys::IndexScanDesc },
    Heap { scan: pg_sys::TableScanDesc },
}

struct Source {
    rel: Rel,
    cursor: Cursor,
    slot: Slot,
    snapshot: RegisteredSnapshot,
    /// The context the scan was begun in: access methods expect to run in a
    /// context that lives as long as the scan, as the executor's per-query
    /// context does.
    scan_cx: pg_sys::MemoryContext,
    owner: Box<OwnerWatch>,
}

impl Source {
    /// Advances to the next visible tuple; false at the end.
    fn next(&mut self) -> bool {
        // SAFETY: scan, slot and relation were set up together in `open` and
        // are released together in `release`; scan_cx outlives them.
        unsafe {
            let old = pg_sys::CurrentMemoryContext;
            pg_sys::CurrentMemoryContext = self.scan_cx;
            let found = match &self.cursor {
                Cursor::Index { scan, .. } => {
                    pg_sys::index_getnext_slot(*scan, pg_sys::ScanDirection::ForwardScanDirection, self.slot.as_ptr())
                }
                Cursor::Heap { scan } => {
                    let am = (*self.rel.as_ptr()).rd_tableam;
                    ((*am).scan_getnextslot.expect("table AM without scan_getnextslot"))(
                        *scan,
                        pg_sys::ScanDirection::ForwardScanDirection,
                        self.slot.as_ptr(),
                    )
                }
            };
            pg_sys::CurrentMemoryContext = old;
            found
        }
    }

    /// Ends the scan and gives back pins, locks and the snapshot, under the
    /// resource owner that acquired them (the caller's may differ at
    /// ExecutorEnd).  Skipped when Postgres has released them already: after
    /// an ERROR (see module docs), or when that owner was released on its own.
    fn release(self) {
        self.owner.unregister();
        if !in_live_transaction() || self.owner.released() {
            return;
        }
        // SAFETY: the scan descriptors are live (each Source is released at
        // most once, by value) and their resources are still held by
        // `owner`, which has not been released (checked above) and so still
        // exists.
        unsafe {
            let saved = pg_sys::CurrentResourceOwner;
            pg_sys::CurrentResourceOwner = self.owner.owner();
            match self.cursor {
                Cursor::Index { index, scan } => {
                    pg_sys::index_endscan(scan);
                    index.close();
                }
                Cursor::Heap { scan } => {
                    let am = (*self.rel.as_ptr()).rd_tableam;
                    ((*am).scan_end.expect("table AM without scan_end"))(scan);
                }
            }
            self.slot.drop_slot();
            self.snapshot.release();
            self.rel.close();
            pg_sys::CurrentResourceOwner = saved;
        }
    }
}

pub struct TableStream {
    source: Option<Source>,
    out: BatchWriter,
    /// 0-based attribute index of each output column.
    attrs: Vec<usize>,
    /// Deform up to this many attributes (the highest projected one).
    natts: usize,
    remaining: Option<u64>,
    fence: Box<dyn ScanFence>,
    done: bool,
}

fn refuse(code: PgSqlErrorCode, msg: impl Into<String>, hint: &str) -> ! {
    errors::raise_hint(code, msg, hint)
}

impl TableStream {
    pub fn open(req: ScanRequest, args: StreamArgs) -> TableStream {
        if let Some(m) = req.max_rows {
            if m < 0 {
                errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, "max_rows must not be negative");
            }
        }
        let rel = Rel::open(req.rel);
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
        // SAFETY: rd_rel of an open relation.
        if !unsafe { (*(*rel.as_ptr()).rd_rel).relispopulated } {
            refuse(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("materialized view \"{relname}\" has not been populated"),
                "Use the REFRESH MATERIALIZED VIEW command.",
            );
        }

        let all = rel.attrs();
        let live: Vec<&pg::Attr> = all.iter().filter(|a| !a.dropped).collect();
        let projected: Vec<&pg::Attr> = match &req.columns {
            None => live.clone(),
            Some(names) => {
                if names.is_empty() {
                    errors::raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        "columns must name at least one column (or be NULL for all)",
                    );
                }
                let mut out: Vec<&pg::Attr> = Vec::with_capacity(names.len());
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
            errors::raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("table \"{relname}\" has no columns"),
            );
        }

        let index = key_index_for(&rel).map(|oid| {
            let ix = Rel::open(oid);
            let info = IndexInfo::of(&ix);
            if !info.is_btree {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!("the key index of \"{relname}\" is not a btree index"),
                );
            }
            (ix, info)
        });
        if index.is_none() && (req.lower.is_some() || req.upper.is_some()) {
            refuse(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("table \"{relname}\" has no key, so lower and upper bounds cannot apply"),
                "arrow_scan reads tables without a primary key in physical order; filter with pgkvx.arrow_query.",
            );
        }

        // Privileges as for SELECT <columns> FROM rel ORDER BY <key> with the
        // bounds in WHERE: the table, or every column that query would name.
        if !pg::may_select_table(rel.oid()) {
            let key_cols: Vec<i16> = index.as_ref().map(|(_, i)| i.heap_attnums.clone()).unwrap_or_default();
            let needed = projected.iter().map(|a| a.attnum).chain(key_cols);
            for attnum in needed {
                if !pg::may_select_column(rel.oid(), attnum) {
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
        if pg::rls_applies(rel.oid()) {
            refuse(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!(
                    "row level security applies to table \"{relname}\"; pgkvx.arrow_scan does not evaluate policies"
                ),
                "Use pgkvx.arrow_query('SELECT ... FROM ... ORDER BY ...'), which applies the table's policies.",
            );
        }

        let mut keys: Vec<pg_sys::ScanKeyData> = Vec::new();
        if let Some((_, info)) = &index {
            if req.lower.is_some() || req.upper.is_some() {
                if info.heap_attnums.len() != 1 {
                    refuse(
                        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                        format!("bounds on the multi-column key of \"{relname}\" are not supported"),
                        "Pass NULL bounds, or filter with pgkvx.arrow_query.",
                    );
                }
                let key_attr = all
                    .iter()
                    .find(|a| a.attnum == info.heap_attnums[0])
                    .expect("key column of the primary key exists");
                if let Some(lo) = &req.lower {
                    let v = pg::parse_value(lo, key_attr.typid, key_attr.typmod);
                    keys.push(pg::btree_key(info, pg_sys::BTGreaterEqualStrategyNumber, v));
                }
                if let Some(hi) = &req.upper {
                    let v = pg::parse_value(hi, key_attr.typid, key_attr.typmod);
                    keys.push(pg::btree_key(info, pg_sys::BTLessStrategyNumber, v));
                }
            }
        }

        let settings = Settings { encoding: pg::server_encoding(), numeric: super::numeric_mode() };
        let columns =
            projected.iter().map(|a| types::column(&a.name, a.typid, a.typmod, !a.notnull, settings)).collect();
        let attrs: Vec<usize> = projected.iter().map(|a| a.attnum as usize - 1).collect();
        let natts = attrs.iter().max().map_or(0, |m| m + 1);

        let snapshot = RegisteredSnapshot::active();
        let slot = Slot::for_rel(&rel);
        // SAFETY: relation (and index) are open and locked; keys live until
        // index_rescan has copied them into the scan descriptor.
        let cursor = unsafe {
            match index {
                Some((ix, _)) => {
                    let scan =
                        pg_sys::index_beginscan(rel.as_ptr(), ix.as_ptr(), snapshot.as_ptr(), keys.len() as i32, 0);
                    pg_sys::index_rescan(scan, keys.as_mut_ptr(), keys.len() as i32, std::ptr::null_mut(), 0);
                    Cursor::Index { index: ix, scan }
                }
                None => {
                    let am = (*rel.as_ptr()).rd_tableam;
                    // No synchronized scan: "physical order" should start at
                    // block 0 every time.
                    let flags = pg_sys::ScanOptions::SO_TYPE_SEQSCAN
                        | pg_sys::ScanOptions::SO_ALLOW_STRAT
                        | pg_sys::ScanOptions::SO_ALLOW_PAGEMODE;
                    let scan = ((*am).scan_begin.expect("table AM without scan_begin"))(
                        rel.as_ptr(),
                        snapshot.as_ptr(),
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        flags,
                    );
                    Cursor::Heap { scan }
                }
            }
        };
        // SAFETY: a plain read of a backend global.
        let scan_cx = unsafe { pg_sys::CurrentMemoryContext };
        let owner = OwnerWatch::new();
        TableStream {
            source: Some(Source { rel, cursor, slot, snapshot, scan_cx, owner }),
            out: BatchWriter::new(columns, args.batch_rows),
            attrs,
            natts,
            remaining: req.max_rows.map(|m| m as u64),
            fence: Box::new(NoFence),
            done: false,
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
            // SAFETY: `next` just stored a tuple of `rel` in the slot, and
            // attrs are attribute indexes below natts of that relation.
            unsafe {
                let (values, nulls) = pg::deform(src.slot.as_ptr(), self.natts);
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
        if self.done {
            return None;
        }
        self.fence.before_batch();
        let exhausted = self.read_batch();
        self.fence.after_batch();
        if exhausted {
            self.release();
            self.done = true;
        }
        Some(self.out.flush(exhausted))
    }
}

impl Drop for TableStream {
    fn drop(&mut self) {
        self.release();
    }
}
