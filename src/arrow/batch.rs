//! Rows in, Arrow IPC stream bytes out: the schema message with the first
//! value, one record batch per value, the end-of-stream marker with the last.

use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Schema, SchemaRef};
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
    /// Bytes every row adds to the fixed-width columns together: their size
    /// is known from the row count, so the byte cap can be checked after
    /// every row without asking each of them.
    fixed_row_bytes: usize,
    /// The other columns (variable width), whose sizes are summed after
    /// every row.
    sized: Vec<usize>,
    row_cx: RowContext,
}

/// Bytes per row of a column whose every value has the same size (the
/// values buffer; validity bits are not counted, as `Encoder::bytes`
/// does not count them).
fn fixed_width(t: &DataType) -> Option<usize> {
    match t {
        DataType::FixedSizeBinary(n) => usize::try_from(*n).ok(),
        t => t.primitive_width(),
    }
}

impl BatchWriter {
    pub fn new(columns: Vec<OutputColumn>, batch_rows: usize) -> Self {
        let schema = Arc::new(Schema::new(columns.iter().map(|c| c.field.clone()).collect::<Vec<_>>()));
        let writer = StreamWriter::try_new(Vec::new(), &schema).unwrap_or_else(|e| ipc_error(e));
        let widths: Vec<Option<usize>> = columns.iter().map(|c| fixed_width(c.field.data_type())).collect();
        let fixed_row_bytes = widths.iter().flatten().sum();
        let sized = widths.iter().enumerate().filter(|(_, w)| w.is_none()).map(|(i, _)| i).collect();
        BatchWriter { schema, columns, writer, rows: 0, batch_rows, fixed_row_bytes, sized, row_cx: RowContext::new() }
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

    /// Whether the batch is full: `batch_rows` rows, or buffers at or past
    /// the byte cap.  Checked after every row, so a batch passes the cap by
    /// one row at most, however wide that row and however narrow the rows
    /// before it.
    #[inline]
    pub fn full(&self) -> bool {
        if self.rows >= self.batch_rows {
            return true;
        }
        let mut bytes = self.rows * self.fixed_row_bytes;
        for &i in &self.sized {
            bytes += self.columns[i].encoder.bytes();
        }
        bytes >= BATCH_BYTE_CAP
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
