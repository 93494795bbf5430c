//! uuid → FixedSizeBinary(16), the 16 bytes in their stored (big-endian,
//! RFC 4122) order.  No `arrow.uuid` extension metadata: polars rejects it.

use std::sync::Arc;

use arrow_array::{ArrayRef, FixedSizeBinaryArray};
use arrow_buffer::{Buffer, NullBufferBuilder};
use pgrx::pg_sys;

use super::Encoder;

pub struct UuidEncoder {
    values: super::SizedVec<u8>,
    nulls: NullBufferBuilder,
}

impl Default for UuidEncoder {
    fn default() -> Self {
        UuidEncoder { values: super::SizedVec::new(), nulls: NullBufferBuilder::new(0) }
    }
}

impl Encoder for UuidEncoder {
    #[inline]
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: a uuid datum points at its 16 bytes (pg_uuid_t).
        let raw = unsafe { std::slice::from_raw_parts(datum.cast_mut_ptr::<u8>(), 16) };
        self.values.extend_from_slice(raw);
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        self.values.extend_from_slice(&[0u8; 16]);
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        let values = Buffer::from_vec(self.values.take());
        Arc::new(FixedSizeBinaryArray::new(16, values, self.nulls.finish()))
    }
    fn bytes(&self) -> usize {
        self.values.len()
    }
}
