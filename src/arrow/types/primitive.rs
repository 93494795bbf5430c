//! Fixed-width by-value types: int2/4/8, float4/8, time, bool.  The datum
//! already holds the value; appending is a shift or a bit cast.

use std::sync::Arc;

use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Time64MicrosecondType,
};
use arrow_array::{ArrayRef, BooleanArray, PrimitiveArray};
use arrow_buffer::{BooleanBufferBuilder, NullBufferBuilder, ScalarBuffer};
use pgrx::pg_sys;

use super::Encoder;

/// Values of `T` read from the datum by `read`.
pub struct PrimitiveEncoder<T: ArrowPrimitiveType> {
    values: super::SizedVec<T::Native>,
    nulls: NullBufferBuilder,
    read: fn(pg_sys::Datum) -> T::Native,
}

impl<T: ArrowPrimitiveType> PrimitiveEncoder<T> {
    pub fn new(read: fn(pg_sys::Datum) -> T::Native) -> Self {
        PrimitiveEncoder { values: super::SizedVec::new(), nulls: NullBufferBuilder::new(0), read }
    }
}

impl<T: ArrowPrimitiveType> Encoder for PrimitiveEncoder<T> {
    #[inline]
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        self.values.push((self.read)(datum));
        self.nulls.append_non_null();
    }
    #[inline]
    fn push_null(&mut self) {
        self.values.push(T::Native::default());
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        let values = ScalarBuffer::from(self.values.take());
        let nulls = self.nulls.finish();
        Arc::new(PrimitiveArray::<T>::new(values, nulls))
    }
    fn bytes(&self) -> usize {
        self.values.len() * std::mem::size_of::<T::Native>()
    }
}

// By-value datums: the value sits in the low bits of the Datum word
// (float4 as its bit pattern, float8 as its 64-bit pattern on 64-bit hosts).
pub fn int2() -> PrimitiveEncoder<Int16Type> {
    PrimitiveEncoder::new(|d| d.value() as i16)
}
pub fn int4() -> PrimitiveEncoder<Int32Type> {
    PrimitiveEncoder::new(|d| d.value() as i32)
}
pub fn int8() -> PrimitiveEncoder<Int64Type> {
    PrimitiveEncoder::new(|d| d.value() as i64)
}
pub fn float4() -> PrimitiveEncoder<Float32Type> {
    PrimitiveEncoder::new(|d| f32::from_bits(d.value() as u32))
}
pub fn float8() -> PrimitiveEncoder<Float64Type> {
    PrimitiveEncoder::new(|d| f64::from_bits(d.value() as u64))
}
/// time: microseconds since midnight, as Arrow Time64(µs).  24:00:00, which
/// Postgres accepts, arrives as 86,400,000,000 (exact; some readers refuse it).
pub fn time() -> PrimitiveEncoder<Time64MicrosecondType> {
    PrimitiveEncoder::new(|d| d.value() as i64)
}

#[derive(Default)]
pub struct BoolEncoder {
    values: Option<BooleanBufferBuilder>,
    nulls: Option<NullBufferBuilder>,
    len: usize,
}

impl BoolEncoder {
    fn parts(&mut self) -> (&mut BooleanBufferBuilder, &mut NullBufferBuilder) {
        (
            self.values.get_or_insert_with(|| BooleanBufferBuilder::new(1024)),
            self.nulls.get_or_insert_with(|| NullBufferBuilder::new(1024)),
        )
    }
}

impl Encoder for BoolEncoder {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        let (v, n) = self.parts();
        v.append(datum.value() & 0xff != 0);
        n.append_non_null();
        self.len += 1;
    }
    fn push_null(&mut self) {
        let (v, n) = self.parts();
        v.append(false);
        n.append_null();
        self.len += 1;
    }
    fn finish(&mut self) -> ArrayRef {
        let (v, n) = self.parts();
        let array = BooleanArray::new(v.finish(), n.finish());
        self.len = 0;
        Arc::new(array)
    }
    fn bytes(&self) -> usize {
        self.len.div_ceil(8)
    }
}
