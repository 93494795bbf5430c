//! One-dimensional arrays of a natively mapped element type → List.  An empty
//! array is an empty list; lower bounds other than 1 are not kept (Arrow
//! lists have none).  Arrays of two or more dimensions raise 0A000: a List of
//! Lists would need the dimensionality in the schema, before any row is seen.

use std::sync::Arc;

use arrow_array::{ArrayRef, ListArray};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::FieldRef;
use pgrx::{pg_sys, PgSqlErrorCode};

use super::Encoder;
use crate::arrow::pg;
use crate::errors;

pub struct ListEncoder {
    column: String,
    elem: pg_sys::Oid,
    elem_len: i16,
    elem_byval: bool,
    elem_align: i8,
    item: FieldRef,
    inner: Box<dyn Encoder>,
    offsets: super::SizedVec<i32>,
    nulls: NullBufferBuilder,
}

impl ListEncoder {
    pub fn new(column: &str, elem: pg_sys::Oid, item: FieldRef, inner: Box<dyn Encoder>) -> Self {
        let (elem_len, elem_byval, elem_align) = pg::typlenbyvalalign(elem);
        ListEncoder {
            column: column.into(),
            elem,
            elem_len,
            elem_byval,
            elem_align,
            item,
            inner,
            offsets: super::SizedVec::offsets(),
            nulls: NullBufferBuilder::new(0),
        }
    }
}

impl Encoder for ListEncoder {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: the caller passes a non-null array of `elem`;
        // pg_detoast_datum yields a plain ArrayType and deconstruct_array
        // returns `n` element datums and flags, palloc'd in the row context.
        unsafe {
            let arr = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
            let ndim = (*arr).ndim;
            if ndim > 1 {
                errors::raise_hint(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!(
                        "column \"{}\" holds a {ndim}-dimensional array; Arrow lists are one-dimensional",
                        self.column
                    ),
                    format!("Convert it in pgkvx.arrow_query, e.g. {}::text.", self.column),
                );
            }
            let mut values: *mut pg_sys::Datum = std::ptr::null_mut();
            let mut isnull: *mut bool = std::ptr::null_mut();
            let mut n: i32 = 0;
            if ndim == 1 {
                pg_sys::deconstruct_array(
                    arr,
                    self.elem,
                    self.elem_len as i32,
                    self.elem_byval,
                    self.elem_align as std::ffi::c_char,
                    &mut values,
                    &mut isnull,
                    &mut n,
                );
            }
            for i in 0..n as usize {
                if *isnull.add(i) {
                    self.inner.push_null();
                } else {
                    self.inner.push(*values.add(i));
                }
            }
            let last = *self.offsets.last().unwrap_or(&0);
            self.offsets.push(last + n);
        }
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        let last = *self.offsets.last().unwrap_or(&0);
        self.offsets.push(last);
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets.take()));
        let values = self.inner.finish();
        Arc::new(ListArray::new(self.item.clone(), offsets, values, self.nulls.finish()))
    }
    fn bytes(&self) -> usize {
        self.offsets.len() * 4 + self.inner.bytes()
    }
}
