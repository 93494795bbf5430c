//! `pgkvx.arrow_query`: any read-only query through the executor — a cursor
//! (portal) opened once, fetched in chunks by later calls, each fetched tuple
//! appended to the Arrow batch by a DestReceiver with no intermediate copy.
//! Privileges, row level security and the planner apply as for the query
//! itself.  No SPI connection stays open across calls: the portal outlives
//! SPI_finish, and is looked up by name each time it is used.

use std::ffi::{CStr, CString};

use pgrx::{pg_guard, pg_sys, PgSqlErrorCode};

use super::batch::{BatchWriter, BATCH_BYTE_CAP};
use super::pg;
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
    // field), passed by `fetch`; the slot holds the current result tuple of
    // the portal's descriptor, whose attributes `attrs` index.
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

pub struct QueryStream {
    portal: CString,
    dest: Box<ArrowDest>,
    batch_rows: usize,
    open: bool,
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
    pub fn open(query: &str, args: StreamArgs) -> QueryStream {
        let cquery = CString::new(query).unwrap_or_else(|_| {
            errors::raise(PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE, "query contains a NUL character")
        });
        // SAFETY: SPI calls bracketed by SPI_connect/SPI_finish; an ERROR in
        // between is cleaned up by SPI's own abort handling.  Everything kept
        // past SPI_finish (attribute list, portal name) is copied into Rust.
        let (portal, attrs) = unsafe {
            if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
                errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
            }
            let plan = pg_sys::SPI_prepare(cquery.as_ptr(), 0, std::ptr::null_mut());
            if plan.is_null() {
                errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "SPI_prepare failed");
            }
            if !pg_sys::SPI_is_cursor_plan(plan) {
                refuse_not_read_only();
            }
            for src in list_iter::<pg_sys::CachedPlanSource>(pg_sys::SPI_plan_get_plan_sources(plan)) {
                for q in list_iter::<pg_sys::Query>((*src).query_list) {
                    if (*q).commandType != pg_sys::CmdType::CMD_SELECT
                        || !(*q).rowMarks.is_null()
                        || (*q).hasModifyingCTE
                    {
                        refuse_not_read_only();
                    }
                }
            }
            // Row locks taken in a subquery show only once planned.
            let cplan = pg_sys::SPI_plan_get_cached_plan(plan);
            if !cplan.is_null() {
                let locks = list_iter::<pg_sys::PlannedStmt>((*cplan).stmt_list).any(|p| !(*p).rowMarks.is_null());
                // An unsaved SPI plan's cached plan has no resource owner.
                pg_sys::ReleaseCachedPlan(cplan, std::ptr::null_mut());
                if locks {
                    refuse_not_read_only();
                }
            }
            let portal = pg_sys::SPI_cursor_open(std::ptr::null(), plan, std::ptr::null_mut(), std::ptr::null(), true);
            let name = CStr::from_ptr((*portal).name).to_owned();
            let attrs = tupdesc_attrs((*portal).tupDesc);
            pg_sys::SPI_finish();
            (name, attrs)
        };
        // Encoders cache function lookups in the current context: built only
        // now, after SPI_finish has restored the multi-call context.
        let settings = EncoderSettings { encoding: pg::server_encoding(), numeric: super::numeric_mode() };
        let live: Vec<&Attr> = attrs.iter().filter(|a| !a.dropped).collect();
        let columns = live.iter().map(|a| types::column(&a.name, a.typid, a.typmod, true, settings)).collect();
        let idx: Vec<usize> = live.iter().map(|a| a.attnum as usize - 1).collect();
        let natts = idx.iter().max().map_or(0, |m| m + 1);
        let dest = Box::new(ArrowDest {
            base: pg_sys::DestReceiver {
                receiveSlot: Some(receive_slot),
                rStartup: Some(startup),
                rShutdown: Some(noop),
                rDestroy: Some(noop),
                mydest: pg_sys::CommandDest::DestNone,
            },
            out: BatchWriter::new(columns, args.batch_rows),
            attrs: idx,
            natts,
            stopped_full: false,
        });
        QueryStream { portal, dest, batch_rows: args.batch_rows, open: true, done: false }
    }

    fn find_portal(&self) -> pg_sys::Portal {
        // SAFETY: looks the portal up by name in the backend's portal table.
        let p = unsafe { pg_sys::SPI_cursor_find(self.portal.as_ptr()) };
        if p.is_null() {
            errors::raise(
                PgSqlErrorCode::ERRCODE_INVALID_CURSOR_STATE,
                "the cursor of pgkvx.arrow_query was closed while it was being read",
            );
        }
        p
    }

    /// Fetches until the batch is full; true when the query is exhausted.
    fn read_batch(&mut self) -> bool {
        loop {
            if self.dest.out.full() {
                return false;
            }
            let out = &self.dest.out;
            let rows_left = self.batch_rows - out.rows();
            // Size chunks so that the byte cap is overshot by little.
            let want = if out.rows() == 0 {
                rows_left.min(1024)
            } else {
                let per_row = (out.bytes() / out.rows()).max(1);
                rows_left.min(((BATCH_BYTE_CAP - out.bytes()) / per_row).max(1))
            };
            let portal = self.find_portal();
            self.dest.stopped_full = false;
            // SAFETY: the portal is ready (opened by SPI_cursor_open, not
            // active); `dest` points to our boxed receiver, which outlives
            // the call.
            let got = unsafe {
                pg_sys::PortalRunFetch(
                    portal,
                    pg_sys::FetchDirection::FETCH_FORWARD,
                    want as std::ffi::c_long,
                    &mut self.dest.base,
                )
            };
            if self.dest.stopped_full {
                // The receiver took the row it stopped on, but a stopped
                // run counts it neither as fetched nor leaves the cursor
                // open: it marks the portal at its end.  It is not; say so.
                // SAFETY: our own portal, not running now.
                unsafe {
                    (*portal).atEnd = false;
                    (*portal).atStart = false;
                    (*portal).portalPos += 1;
                }
                return false;
            }
            if (got as usize) < want {
                return true;
            }
        }
    }

    fn close(&mut self) {
        if !self.open {
            return;
        }
        self.open = false;
        if in_live_transaction() {
            // SAFETY: the portal, if still there, is ours and not running.
            unsafe {
                let p = pg_sys::SPI_cursor_find(self.portal.as_ptr());
                if !p.is_null() {
                    pg_sys::SPI_cursor_close(p);
                }
            }
        }
    }
}

impl Iterator for QueryStream {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let exhausted = self.read_batch();
        if exhausted {
            self.close();
            self.done = true;
        }
        Some(self.dest.out.flush(exhausted))
    }
}

impl Drop for QueryStream {
    fn drop(&mut self) {
        self.close();
    }
}
