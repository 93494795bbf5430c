//! Rows in, Arrow IPC stream bytes out: the schema message with the first
//! value, one record batch per value, the end-of-stream marker with the last.

use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{Schema, SchemaRef};
use pgrx::{pg_sys, PgSqlErrorCode};

use super::pg::RowContext;
use super::types::OutputColumn;
use crate::errors;

/// A batch closes at `batch_rows` rows or once its buffers pass this many
/// bytes, so a value stays far below the 1 GB bytea limit (one row over the
/// cap at most; a single row cannot exceed what Postgres can store).
pub const BATCH_BYTE_CAP: usize = 64 * 1024 * 1024;

pub struct BatchWriter {
    schema: SchemaRef,
    columns: Vec<OutputColumn>,
    writer: StreamWriter<Vec<u8>>,
    rows: usize,
    batch_rows: usize,
    /// Row count at which to look at the byte size again: summing every
    /// column's size after every row would cost more than appending the row.
    next_size_check: usize,
    row_cx: RowContext,
}

impl BatchWriter {
    pub fn new(columns: Vec<OutputColumn>, batch_rows: usize) -> Self {
        let schema = Arc::new(Schema::new(columns.iter().map(|c| c.field.clone()).collect::<Vec<_>>()));
        let writer = StreamWriter::try_new(Vec::new(), &schema).unwrap_or_else(|e| ipc_error(e));
        BatchWriter { schema, columns, writer, rows: 0, batch_rows, next_size_check: 1, row_cx: RowContext::new() }
    }

    /// Drops whatever was written so far and starts the stream again (the
    /// schema message comes first again): for a read that is redone before
    /// any of it was returned.
    pub fn restart(&mut self) {
        for c in &mut self.columns {
            c.encoder.finish();
        }
        self.writer = StreamWriter::try_new(Vec::new(), &self.schema).unwrap_or_else(|e| ipc_error(e));
        self.rows = 0;
        self.next_size_check = 1;
    }

    /// Appends one row.  `attrs[i]` is the 0-based position in `values` and
    /// `nulls` of output column `i`.
    ///
    /// # Safety
    /// `values`/`nulls` must hold valid datums (of the column types) at every
    /// position named in `attrs`.
    #[inline]
    pub unsafe fn push_row(&mut self, values: *const pg_sys::Datum, nulls: *const bool, attrs: &[usize]) {
        let columns = &mut self.columns;
        self.row_cx.run(|| {
            for (col, &a) in columns.iter_mut().zip(attrs) {
                // SAFETY: per the caller.
                unsafe {
                    if *nulls.add(a) {
                        col.encoder.push_null();
                    } else {
                        col.encoder.push(*values.add(a));
                    }
                }
            }
        });
        self.rows += 1;
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn bytes(&self) -> usize {
        self.columns.iter().map(|c| c.encoder.bytes()).sum()
    }

    pub fn full(&mut self) -> bool {
        if self.rows >= self.batch_rows {
            return true;
        }
        if self.rows < self.next_size_check {
            return false;
        }
        let bytes = self.bytes();
        if bytes >= BATCH_BYTE_CAP {
            return true;
        }
        // Look again after half the rows that would fill the cap at the
        // average row size so far, and at least every 64 rows, so a run of
        // rows much wider than the ones before overshoots by 64 rows at most.
        let per_row = (bytes / self.rows.max(1)).max(1);
        self.next_size_check = self.rows + ((BATCH_BYTE_CAP - bytes) / per_row / 2).clamp(1, 64);
        false
    }

    /// Encodes the rows collected so far (if any) as one record batch, and
    /// the end-of-stream marker when `last`; returns every byte not yet
    /// handed out (the schema message included, the first time).
    pub fn flush(&mut self, last: bool) -> Vec<u8> {
        if self.rows > 0 {
            // The message is the buffers plus padding and a small header:
            // reserve it at once rather than growing (and copying) by doubling.
            let estimate = self.bytes() + 64 * (self.columns.len() + 1) * 3 + 4096;
            self.writer.get_mut().reserve(estimate);
            let arrays = self.columns.iter_mut().map(|c| c.encoder.finish()).collect();
            let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
            let batch = RecordBatch::try_new_with_options(self.schema.clone(), arrays, &options)
                .unwrap_or_else(|e| ipc_error(e));
            self.writer.write(&batch).unwrap_or_else(|e| ipc_error(e));
            self.rows = 0;
            self.next_size_check = 1;
        }
        if last {
            self.writer.finish().unwrap_or_else(|e| ipc_error(e));
        }
        let out = std::mem::take(self.writer.get_mut());
        if out.len() > 0x3fff_ffff - 4 {
            errors::raise_hint(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("one Arrow batch grew to {} bytes, more than a bytea can hold", out.len()),
                "Use a smaller batch_rows.",
            );
        }
        out
    }
}

fn ipc_error(e: arrow_schema::ArrowError) -> ! {
    errors::raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("Arrow IPC encoding failed: {e}"))
}
