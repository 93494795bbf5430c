//! Columnar projection to Arrow: `pgkvx.arrow_scan` and `pgkvx.arrow_query`
//! return one Arrow IPC stream split over `bytea` rows (see README.md here).
//!
//! Both are value-per-call set-returning functions: each call reads one batch
//! and returns it, so memory is bounded by one batch whatever the table size.
//! `SELECT pgkvx.arrow_scan(...)` streams batches to the client as they are
//! made; `SELECT * FROM pgkvx.arrow_scan(...)` makes Postgres collect them all
//! in a tuplestore first.
//!
//! Neither function resolves a name through `search_path`: the table is a
//! regclass, columns are matched against its attributes, types and functions
//! are used by OID.  arrow_query's own query text is, by design, parsed under
//! the caller's search_path, as if the caller had run it.

use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

mod batch;
mod fetch;
mod partitioned;
mod pg;
mod query;
mod scan;
mod types;

use crate::errors;
use crate::guc::{self, ArrowNumeric};
use crate::pg::OpenRel;
use crate::registry::{self, Latched};
use std::rc::Rc;
use types::NumericMode;

fn numeric_mode() -> NumericMode {
    match guc::ARROW_NUMERIC.get() {
        ArrowNumeric::Text => NumericMode::Text,
        ArrowNumeric::Float64 => NumericMode::Float64,
        ArrowNumeric::Decimal128 => NumericMode::Decimal128 { scale: guc::ARROW_NUMERIC_SCALE.get() as i8 },
    }
}

/// The key arrow_scan orders by, and whose first column the bounds apply
/// to: on a latched table its latched key index (and the table's latching,
/// under which the scan honours `pgkvx.scan_mode`), else the primary key.
fn key_for(rel: &OpenRel) -> (Option<Rc<Latched>>, Option<pg_sys::Oid>) {
    let latched = registry::lookup(rel.oid());
    if let Some(l) = &latched {
        crate::read::admit::warn_if_exposed(l);
    }
    let index = latched.as_ref().map(|l| l.key.index).or_else(|| rel.primary_key_index());
    (latched, index)
}

/// Settings common to both functions.
#[derive(Clone, Copy)]
pub struct StreamArgs {
    pub batch_rows: usize,
}

fn stream_args(batch_rows: i32) -> StreamArgs {
    if batch_rows < 1 {
        errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, "batch_rows must be at least 1");
    }
    StreamArgs { batch_rows: batch_rows as usize }
}

/// The requested columns of `rel`, in key order, for keys in
/// `[lower, upper)`, at most `max_rows` rows, as one Arrow IPC stream over
/// the returned values.
#[pg_extern(volatile, parallel_unsafe, schema = "pgkvx")]
fn arrow_scan(
    rel: Option<crate::args::Regclass>,
    columns: default!(Option<Vec<Option<String>>>, "NULL"),
    lower: default!(Option<String>, "NULL"),
    upper: default!(Option<String>, "NULL"),
    max_rows: default!(Option<i64>, "NULL"),
    batch_rows: default!(Option<i32>, 65536),
) -> SetOfIterator<'static, Vec<u8>> {
    let args = stream_args(crate::args::required_value(batch_rows, "batch_rows"));
    let columns = columns.map(|cols| {
        cols.into_iter()
            .map(|c| {
                c.unwrap_or_else(|| {
                    errors::raise(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "columns must not contain NULL")
                })
            })
            .collect()
    });
    let oid = crate::args::required(rel, "rel");
    let req = scan::ScanRequest { rel: oid, columns, lower, upper, max_rows };
    if let Some(m) = req.max_rows {
        if m < 0 {
            errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, "max_rows must not be negative");
        }
    }
    // SAFETY: a syscache probe.
    if unsafe { pg_sys::get_rel_relkind(oid) } as u8 == pg_sys::RELKIND_PARTITIONED_TABLE {
        // The partitions merged in key order, through the executor.
        let stream: Box<dyn Iterator<Item = Vec<u8>>> =
            Box::new(query::QueryStream::open(&partitioned::query(&req), args));
        return SetOfIterator::new(stream);
    }
    SetOfIterator::new(Box::new(scan::TableStream::open(req, args)) as Box<dyn Iterator<Item = Vec<u8>>>)
}

/// The result of a read-only query as one Arrow IPC stream over the returned
/// values, fetched batch by batch through a cursor.
#[pg_extern(volatile, parallel_unsafe, schema = "pgkvx")]
fn arrow_query(query: Option<&str>, batch_rows: default!(Option<i32>, 65536)) -> SetOfIterator<'static, Vec<u8>> {
    let query = crate::args::required_value(query, "query");
    let args = stream_args(crate::args::required_value(batch_rows, "batch_rows"));
    SetOfIterator::new(query::QueryStream::open(query, args))
}
