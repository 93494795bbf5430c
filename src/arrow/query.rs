//! `pgkvx.arrow_query`: any read-only query through the executor — planned
//! and started once, run a chunk at a time by later calls, each result
//! tuple appended to the Arrow batch by a DestReceiver with no intermediate
//! copy.  Privileges, row level security and the planner apply as for the
//! query itself.
//!
//! The executor (its QueryDesc) is held in the set-returning function's
//! state, as a SQL function holds the queries it runs lazily: there is no
//! portal.  A portal would live in the session's portal table, where user
//! SQL can reach it by name (`pg_cursors` shows it): `CLOSE` it and
//! `DECLARE` another of a different shape under its name and the next call
//! reads tuples of the wrong type (a crash); `MOVE` it and batches go
//! missing.  And PostgreSQL walks that table at `COMMIT`: holding a cursor
//! over arrow_query (`WITH HOLD`, or a procedure's FOR loop that commits)
//! runs arrow_query to its end during the walk, and a portal of ours dropped
//! then was either freed under the walk (a crash) or dropped by it first
//! (the COMMIT failed).  Without a portal there is nothing to reach or walk.

use std::ffi::{CStr, CString};

use pgrx::{pg_guard, pg_sys, PgSqlErrorCode};

use super::batch::{BatchWriter, BATCH_BYTE_CAP};
use super::pg::{self, OwnerWatch};
use super::types::{self, EncoderSettings};
use super::StreamArgs;
use crate::errors;
use crate::pg::{in_live_transaction, list_iter, tupdesc_attrs, Attr};

/// The receiver the executor hands each result tuple to.  `base` must come
/// first: Postgres sees only a `DestReceiver *`.
#[repr(C)]
struct ArrowDest {
    base: pg_sys::DestReceiver,
    out: BatchWriter,
    attrs: Vec<usize>,
    natts: usize,
    /// The batch filled up in the middle of a fetch, which was stopped.
    stopped_full: bool,
}

#[pg_guard]
unsafe extern "C-unwind" fn receive_slot(slot: *mut pg_sys::TupleTableSlot, dest: *mut pg_sys::DestReceiver) -> bool {
    // SAFETY: `dest` is the `base` of a live ArrowDest (repr(C), first
    // field), the receiver of our QueryDesc; the slot holds the current
    // result tuple of the executor's result descriptor, whose attributes
    // `attrs` index.
    unsafe {
        let d = &mut *(dest as *mut ArrowDest);
        let (values, nulls) = pg::deform(slot, d.natts);
        d.out.push_row(values, nulls, &d.attrs);
        // Past the byte cap, stop the executor: however wide the rows,
        // a batch holds at most one row more than its cap.
        if d.out.full() {
            d.stopped_full = true;
            return false;
        }
    }
    true
}

#[pg_guard]
unsafe extern "C-unwind" fn startup(_dest: *mut pg_sys::DestReceiver, _op: i32, _desc: pg_sys::TupleDesc) {}

#[pg_guard]
unsafe extern "C-unwind" fn noop(_dest: *mut pg_sys::DestReceiver) {}

/// The inner query's executor, from ExecutorStart to ExecutorEnd.
///
/// Its memory (the plan, the query text, the QueryDesc and, as children,
/// the executor's own contexts) is a context of its own, a sibling of the
/// set-returning function's multi-call context rather than a child: that
/// context frees its children before it drops the function's state, and
/// ExecutorEnd needs the executor's memory.  When the parent goes first
/// (an aborted statement), a reset callback marks the context gone.
struct QueryExecutor {
    cx: pg_sys::MemoryContext,
    /// Cleared by the reset callback when `cx` is deleted.
    alive: Box<std::cell::Cell<bool>>,
    /// Null until ExecutorStart has returned, and after ExecutorEnd.
    qd: *mut pg_sys::QueryDesc,
    /// The resource owner the executor's pins, locks and snapshot belong to
    /// (the caller's portal's, current at the first call).
    owner: Option<Box<OwnerWatch>>,
}

/// Makes a memory context current until dropped — also when an ERROR
/// unwinds through, so that the context is never left current when its
/// owner deletes it.
struct InContext(pg_sys::MemoryContext);

impl InContext {
    /// # Safety
    /// `cx` is a live memory context.
    unsafe fn switch_to(cx: pg_sys::MemoryContext) -> InContext {
        // SAFETY: `cx` is a live memory context (the caller's contract); the old one
        // comes back when the guard drops.
        InContext(unsafe { pg_sys::MemoryContextSwitchTo(cx) })
    }
}

impl Drop for InContext {
    fn drop(&mut self) {
        // SAFETY: the context that was current before, which outlives the
        // short stretch this guard covers.
        unsafe { pg_sys::MemoryContextSwitchTo(self.0) };
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn executor_cx_deleted(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the `alive` cell of the QueryExecutor that owns the
    // context; the executor deletes its context in Drop (which runs this
    // callback) before the cell is freed.
    unsafe { (*(arg as *const std::cell::Cell<bool>)).set(false) };
}

impl QueryExecutor {
    /// A new, empty context for the executor, under `parent`.
    fn new(parent: pg_sys::MemoryContext) -> QueryExecutor {
        let alive = Box::new(std::cell::Cell::new(true));
        // SAFETY: creating a context under a live parent; the callback
        // struct is allocated in the context itself, so it lives exactly as
        // long as the registration, and its argument (the boxed cell) lives
        // until Drop deletes the context.
        let cx = unsafe {
            let cx = pg_sys::AllocSetContextCreateInternal(
                parent,
                c"pgkvx arrow_query".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            let alive_at = &*alive as *const std::cell::Cell<bool> as *mut std::ffi::c_void;
            crate::pg::memcx::on_reset(cx, executor_cx_deleted, alive_at);
            cx
        };
        QueryExecutor { cx, alive, qd: std::ptr::null_mut(), owner: None }
    }

    /// A copy of `stmt` in the executor's context.
    ///
    /// # Safety
    /// `stmt` is a valid PlannedStmt.
    unsafe fn keep_plan(&self, stmt: *mut pg_sys::PlannedStmt) -> *mut pg_sys::PlannedStmt {
        // SAFETY: per the contract; copyObject allocates in the current
        // context, ours (alive: created just before, in this call).
        unsafe {
            let _in = InContext::switch_to(self.cx);
            pg_sys::copyObjectImpl(stmt as *const std::ffi::c_void) as *mut pg_sys::PlannedStmt
        }
    }

    /// Starts the executor for `stmt` (kept by `keep_plan`) at the active
    /// snapshot, sending its tuples to `dest`.
    ///
    /// # Safety
    /// `stmt` came from `keep_plan`; `dest` outlives the executor.
    unsafe fn start(&mut self, stmt: *mut pg_sys::PlannedStmt, text: &CStr, dest: *mut pg_sys::DestReceiver) {
        // SAFETY: per the contract.  The QueryDesc, and the executor state
        // ExecutorStart makes under the current context, live in our
        // context.  A read-only query reads at the caller's snapshot, as
        // SPI's read-only cursors and SQL functions do; ExecutorStart
        // registers it for as long as the executor runs.  On an ERROR in
        // ExecutorStart `qd` stays null and Drop only frees the memory.
        unsafe {
            let in_cx = InContext::switch_to(self.cx);
            let source = pg_sys::pstrdup(text.as_ptr());
            let qd = pg_sys::CreateQueryDesc(
                stmt,
                source,
                pg_sys::GetActiveSnapshot(),
                std::ptr::null_mut(),
                dest,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
            pg_sys::ExecutorStart(qd, 0);
            drop(in_cx);
            self.qd = qd;
        }
        self.owner = Some(OwnerWatch::new());
    }

    /// The started executor and its resource owner, or an error when the
    /// executor's resources are gone (its statement failed or ended).
    fn live(&self) -> (*mut pg_sys::QueryDesc, pg_sys::ResourceOwner) {
        match &self.owner {
            Some(o) if !self.qd.is_null() && self.alive.get() && !o.released() && in_live_transaction() => {
                (self.qd, o.owner())
            }
            _ => errors::raise(
                PgSqlErrorCode::ERRCODE_INVALID_CURSOR_STATE,
                "the query of pgkvx.arrow_query is no longer running",
            ),
        }
    }

    /// The result columns the executor sends.
    fn result_desc(&self) -> pg_sys::TupleDesc {
        let (qd, _) = self.live();
        // SAFETY: a started QueryDesc has its result descriptor.
        unsafe { (*qd).tupDesc }
    }

    /// Runs the executor forward for at most `count` tuples (it stops
    /// earlier when the receiver says so).
    fn run(&mut self, count: u64) {
        let (qd, owner) = self.live();
        // SAFETY: a started executor whose resources are still held by
        // `owner` (checked by `live`), run under that owner so that what it
        // acquires now is released with the rest, and with its snapshot
        // active for the functions it calls, as PortalRunSelect does.  An
        // ERROR skips the restores: transaction or subtransaction abort
        // resets the current owner and the active snapshot stack.
        unsafe {
            let saved = pg_sys::CurrentResourceOwner;
            pg_sys::CurrentResourceOwner = owner;
            pg_sys::PushActiveSnapshot((*qd).snapshot);
            crate::pg::executor_run(qd, count);
            pg_sys::PopActiveSnapshot();
            pg_sys::CurrentResourceOwner = saved;
        }
    }

    /// Ends the executor, if it is still running and its resources are
    /// still ours to release, and frees its memory.
    fn end(&mut self) {
        let qd = std::mem::replace(&mut self.qd, std::ptr::null_mut());
        let owner = self.owner.take();
        if let Some(o) = &owner {
            o.unregister();
        }
        if !self.alive.get() {
            return;
        }
        if let Some(o) = owner.filter(|o| !qd.is_null() && !o.released() && in_live_transaction()) {
            // SAFETY: a started executor, ended once (qd was taken), under
            // the owner that holds its resources, as PortalCleanup does.
            unsafe {
                let saved = pg_sys::CurrentResourceOwner;
                pg_sys::CurrentResourceOwner = o.owner();
                pg_sys::ExecutorFinish(qd);
                pg_sys::ExecutorEnd(qd);
                pg_sys::FreeQueryDesc(qd);
                pg_sys::CurrentResourceOwner = saved;
            }
        }
        // SAFETY: our context, still alive; its callback clears `alive`.
        // After an ERROR (or with the owner released) the executor's
        // resources went with its owner and only its memory is left.
        unsafe { pg_sys::MemoryContextDelete(self.cx) };
    }
}

impl Drop for QueryExecutor {
    fn drop(&mut self) {
        self.end();
    }
}

pub struct QueryStream {
    exec: QueryExecutor,
    dest: Box<ArrowDest>,
    batch_rows: usize,
    done: bool,
}

fn refuse_not_read_only() -> ! {
    errors::raise_hint(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "pgkvx.arrow_query accepts a single read-only SELECT",
        "No data-modifying statements, data-modifying WITH, SELECT ... FOR UPDATE/SHARE, or utility commands.",
    )
}

impl QueryStream {
    /// Plans `query`, refusing anything but one read-only SELECT, and starts
    /// its executor with a receiver that appends each result row to the
    /// batch.
    pub fn open(query: &str, args: StreamArgs) -> QueryStream {
        let cquery = CString::new(query).unwrap_or_else(|_| {
            errors::raise(PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE, "query contains a NUL character")
        });
        let mut exec = QueryExecutor::new(executor_parent());
        let (stmt, attrs) = plan_read_only(&exec, &cquery);
        // Encoders cache function lookups in the current context: built only
        // now, after SPI_finish has restored the multi-call context.
        let mut dest = arrow_dest(&attrs, args.batch_rows);
        let natts = dest.natts;
        // SAFETY: the plan was kept by `keep_plan`; the boxed receiver moves
        // into the stream with the executor and is dropped after it.
        unsafe { exec.start(stmt, &cquery, &mut dest.base) };
        // SAFETY: a started executor's result descriptor.
        let sent = unsafe { (*exec.result_desc()).natts } as usize;
        if sent < natts {
            errors::raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "pgkvx.arrow_query: the executor's result has fewer columns than the query",
            );
        }
        QueryStream { exec, dest, batch_rows: args.batch_rows, done: false }
    }

    /// Runs the executor until the batch is full; true when the query is
    /// exhausted.
    fn read_batch(&mut self) -> bool {
        loop {
            if self.dest.out.full() {
                return false;
            }
            let out = &self.dest.out;
            let rows_left = self.batch_rows - out.rows();
            // Ask for the rows that would fill the batch at the row size so
            // far (the receiver stops the executor at the byte cap anyway).
            let want = if out.rows() == 0 {
                rows_left.min(1024)
            } else {
                let per_row = (out.bytes() / out.rows()).max(1);
                rows_left.min((BATCH_BYTE_CAP.saturating_sub(out.bytes()) / per_row).max(1))
            };
            let before = out.rows();
            self.dest.stopped_full = false;
            self.exec.run(want as u64);
            if self.dest.stopped_full {
                // The receiver kept the row it stopped on; the executor
                // goes on after it next time.
                return false;
            }
            // The executor stops early only at the end of the result.
            if self.dest.out.rows() - before < want {
                return true;
            }
        }
    }
}

/// The context the executor's goes under: the parent of the function's
/// multi-call context, which is current (see QueryExecutor).
fn executor_parent() -> pg_sys::MemoryContext {
    // SAFETY: reads a backend global and the parent link of a live context.
    unsafe {
        let cur = pg_sys::CurrentMemoryContext;
        if (*cur).parent.is_null() {
            cur
        } else {
            (*cur).parent
        }
    }
}

/// Plans `query` through SPI and returns its one SELECT, kept in the
/// executor's context, and its result columns; refuses anything that is
/// not a single read-only SELECT.
fn plan_read_only(exec: &QueryExecutor, query: &CStr) -> (*mut pg_sys::PlannedStmt, Vec<Attr>) {
    // SAFETY: SPI calls bracketed by SPI_connect/SPI_finish; an ERROR in
    // between is cleaned up by SPI's own abort handling.  What is kept
    // past SPI_finish is copied: the plan into the executor's context,
    // the result columns into Rust.
    unsafe {
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
        }
        let plan = pg_sys::SPI_prepare(query.as_ptr(), 0, std::ptr::null_mut());
        if plan.is_null() {
            errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "SPI_prepare failed");
        }
        if !pg_sys::SPI_is_cursor_plan(plan) {
            refuse_not_read_only();
        }
        let result_desc = read_only_result(plan);
        let cplan = pg_sys::SPI_plan_get_cached_plan(plan);
        if cplan.is_null() {
            errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "SPI_plan_get_cached_plan failed");
        }
        let stmts: Vec<*mut pg_sys::PlannedStmt> = list_iter((*cplan).stmt_list).collect();
        // One SELECT (a cursor plan has one statement), without row
        // locks (those taken in a subquery show only once planned).
        let stmt = match stmts[..] {
            [p] if (*p).commandType == pg_sys::CmdType::CMD_SELECT
                && (*p).rowMarks.is_null()
                && !result_desc.is_null() =>
            {
                exec.keep_plan(p)
            }
            _ => std::ptr::null_mut(),
        };
        // An unsaved SPI plan's cached plan has no resource owner.
        pg_sys::ReleaseCachedPlan(cplan, std::ptr::null_mut());
        if stmt.is_null() {
            refuse_not_read_only();
        }
        let attrs = tupdesc_attrs(result_desc);
        pg_sys::SPI_finish();
        (stmt, attrs)
    }
}

/// Refuses a plan any of whose rewritten queries is not a SELECT, locks
/// rows (at its top level: the plan shows the rest) or has a data-modifying
/// WITH; returns the result columns of its last plan source.
///
/// # Safety
/// `plan` is a live SPI plan.
unsafe fn read_only_result(plan: pg_sys::SPIPlanPtr) -> pg_sys::TupleDesc {
    let mut result_desc: pg_sys::TupleDesc = std::ptr::null_mut();
    // SAFETY: per the contract: its plan sources and their query lists
    // are valid while it lives.
    unsafe {
        for src in list_iter::<pg_sys::CachedPlanSource>(pg_sys::SPI_plan_get_plan_sources(plan)) {
            for q in list_iter::<pg_sys::Query>((*src).query_list) {
                if (*q).commandType != pg_sys::CmdType::CMD_SELECT || !(*q).rowMarks.is_null() || (*q).hasModifyingCTE {
                    refuse_not_read_only();
                }
            }
            result_desc = (*src).resultDesc;
        }
    }
    result_desc
}

/// The receiver that encodes the live columns of `attrs` (the result
/// columns) into batches of `batch_rows`.
fn arrow_dest(attrs: &[Attr], batch_rows: usize) -> Box<ArrowDest> {
    let settings = EncoderSettings { encoding: pg::server_encoding(), numeric: super::numeric_mode() };
    let live: Vec<&Attr> = attrs.iter().filter(|a| !a.dropped).collect();
    let columns = live.iter().map(|a| types::column(&a.name, a.typid, a.typmod, true, settings)).collect();
    let idx: Vec<usize> = live.iter().map(|a| a.attnum as usize - 1).collect();
    let natts = idx.iter().max().map_or(0, |m| m + 1);
    Box::new(ArrowDest {
        base: pg_sys::DestReceiver {
            receiveSlot: Some(receive_slot),
            rStartup: Some(startup),
            rShutdown: Some(noop),
            rDestroy: Some(noop),
            mydest: pg_sys::CommandDest::DestNone,
        },
        out: BatchWriter::new(columns, batch_rows),
        attrs: idx,
        natts,
        stopped_full: false,
    })
}

impl Iterator for QueryStream {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let exhausted = self.read_batch();
        if exhausted {
            self.exec.end();
            self.done = true;
        }
        Some(self.dest.out.flush(exhausted))
    }
}
