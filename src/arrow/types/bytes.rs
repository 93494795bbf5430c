//! Variable-length payloads: text/varchar/bpchar/json and name → Utf8,
//! bytea → Binary.  The varlena payload is copied once, straight into the
//! Arrow values buffer; values are detoasted only when stored out of line or
//! compressed.

use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, StringArray};
use arrow_buffer::{Buffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use pgrx::{pg_sys, PgSqlErrorCode};

use super::Encoder;
use crate::arrow::pg::{self, ServerEncoding};
use crate::errors;

/// Offsets, values and validity of a Utf8 or Binary array under construction.
pub struct VarBytes {
    offsets: super::SizedVec<i32>,
    values: super::SizedVec<u8>,
    nulls: NullBufferBuilder,
}

impl Default for VarBytes {
    fn default() -> Self {
        VarBytes {
            offsets: super::SizedVec::offsets(),
            values: super::SizedVec::new(),
            nulls: NullBufferBuilder::new(0),
        }
    }
}

impl VarBytes {
    #[inline]
    pub fn push(&mut self, bytes: &[u8]) {
        self.values.extend_from_slice(bytes);
        self.push_offset();
        self.nulls.append_non_null();
    }
    #[inline]
    pub fn push_null(&mut self) {
        self.push_offset();
        self.nulls.append_null();
    }
    #[inline]
    fn push_offset(&mut self) {
        // The batch byte cap keeps arrays far below 2 GiB; one value alone
        // (at most 1 GB in Postgres) cannot overflow either.
        let end = i32::try_from(self.values.len()).unwrap_or_else(|_| {
            errors::raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                "Arrow array exceeds 2 GiB; use a smaller batch_rows",
            )
        });
        self.offsets.push(end);
    }
    pub fn bytes(&self) -> usize {
        self.values.len() + self.offsets.len() * 4
    }
    fn take(&mut self) -> (OffsetBuffer<i32>, Buffer, Option<arrow_buffer::NullBuffer>) {
        let offsets = self.offsets.take();
        let values = self.values.take();
        // SAFETY-free: offsets start at 0 and never decrease (push_offset
        // appends the running length), which OffsetBuffer::new checks anyway.
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        (offsets, Buffer::from_vec(values), self.nulls.finish())
    }
    pub fn finish_utf8(&mut self) -> ArrayRef {
        let (o, v, n) = self.take();
        // SAFETY: every value pushed is valid UTF-8: Postgres verifies text in
        // a UTF8 database on input, and other encodings are converted or
        // checked by `pg::with_utf8` before they are pushed.
        Arc::new(unsafe { StringArray::new_unchecked(o, v, n) })
    }
    pub fn finish_binary(&mut self) -> ArrayRef {
        let (o, v, n) = self.take();
        Arc::new(BinaryArray::new(o, v, n))
    }
}

/// text, varchar, bpchar (blank-padded as stored, like its output) and json
/// (stored as its text).
pub struct VarlenaText {
    out: VarBytes,
    encoding: ServerEncoding,
}

impl VarlenaText {
    pub fn new(encoding: ServerEncoding) -> Self {
        VarlenaText { out: VarBytes::default(), encoding }
    }
}

impl Encoder for VarlenaText {
    #[inline]
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: the caller passes a non-null varlena of a text-like type.
        let bytes = unsafe { crate::pg::varlena_bytes(datum) };
        let out = &mut self.out;
        pg::with_utf8(bytes, self.encoding, |b| out.push(b));
    }
    fn push_null(&mut self) {
        self.out.push_null();
    }
    fn finish(&mut self) -> ArrayRef {
        self.out.finish_utf8()
    }
    fn bytes(&self) -> usize {
        self.out.bytes()
    }
}

/// name: a fixed 64-byte, NUL-padded by-reference value.
pub struct NameText {
    out: VarBytes,
    encoding: ServerEncoding,
}

impl NameText {
    pub fn new(encoding: ServerEncoding) -> Self {
        NameText { out: VarBytes::default(), encoding }
    }
}

impl Encoder for NameText {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: a name datum points at NAMEDATALEN bytes.
        let raw = unsafe { std::slice::from_raw_parts(datum.cast_mut_ptr::<u8>(), pg_sys::NAMEDATALEN as usize) };
        let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let out = &mut self.out;
        pg::with_utf8(&raw[..len], self.encoding, |b| out.push(b));
    }
    fn push_null(&mut self) {
        self.out.push_null();
    }
    fn finish(&mut self) -> ArrayRef {
        self.out.finish_utf8()
    }
    fn bytes(&self) -> usize {
        self.out.bytes()
    }
}

#[derive(Default)]
pub struct VarlenaBinary {
    out: VarBytes,
}

impl Encoder for VarlenaBinary {
    #[inline]
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: the caller passes a non-null bytea.
        self.out.push(unsafe { crate::pg::varlena_bytes(datum) });
    }
    fn push_null(&mut self) {
        self.out.push_null();
    }
    fn finish(&mut self) -> ArrayRef {
        self.out.finish_binary()
    }
    fn bytes(&self) -> usize {
        self.out.bytes()
    }
}
