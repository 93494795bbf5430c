//! Postgres values into Arrow arrays: one module per Postgres type, all behind
//! [`Encoder`].  The mapping is documented in ../README.md; keep the two in
//! step.
//!
//! Every encoder appends straight into its Arrow buffers from the datum: no
//! per-value Rust object is built, and nothing is copied twice.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_schema::{DataType, Field};
use pgrx::pg_sys;

use super::pg::{self, ServerEncoding};

mod bytes;
mod datetime;
mod fallback;
mod list;
mod numeric;
mod primitive;
mod uuid;

pub use numeric::NumericMode;

/// Appends values of one Postgres type to one Arrow array.
pub trait Encoder {
    /// # Safety
    /// `datum` must be a non-null value of the Postgres type the encoder was
    /// made for.
    unsafe fn push(&mut self, datum: pg_sys::Datum);
    fn push_null(&mut self);
    /// Hands over the array built so far and starts a new one.
    fn finish(&mut self) -> ArrayRef;
    /// Payload bytes appended since the last `finish`, for the batch byte cap.
    fn bytes(&self) -> usize;
}

/// A growable Arrow buffer that, once handed over, reserves the size of the
/// last batch when the next batch starts filling it: batches are usually
/// alike, and growing by doubling would copy each buffer several times and
/// briefly hold it twice.  Reserving lazily (not at hand-over) keeps the
/// finished batch and the next one's buffers from being held at once.
pub(crate) struct SizedVec<T> {
    v: Vec<T>,
    hint: usize,
    /// Offsets buffers start every array with a 0.
    leading_zero: bool,
}

impl<T: Default> SizedVec<T> {
    pub fn new() -> Self {
        SizedVec { v: Vec::new(), hint: 0, leading_zero: false }
    }

    pub fn offsets() -> Self {
        SizedVec { v: vec![T::default()], hint: 0, leading_zero: true }
    }

    #[inline]
    fn prepare(&mut self) {
        if self.v.capacity() < self.hint {
            self.v.reserve_exact(self.hint - self.v.len());
        }
    }

    #[inline]
    pub fn push(&mut self, x: T) {
        self.prepare();
        self.v.push(x);
    }

    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn last(&self) -> Option<&T> {
        self.v.last()
    }

    /// Hands over the buffer and starts an empty one.
    pub fn take(&mut self) -> Vec<T> {
        self.hint = self.v.len();
        let fresh = if self.leading_zero { vec![T::default()] } else { Vec::new() };
        std::mem::replace(&mut self.v, fresh)
    }
}

impl<T: Default + Copy> SizedVec<T> {
    #[inline]
    pub fn extend_from_slice(&mut self, xs: &[T]) {
        self.prepare();
        self.v.extend_from_slice(xs);
    }
}

/// What every encoder needs to know about the session.
#[derive(Clone, Copy, Debug)]
pub struct EncoderSettings {
    pub encoding: ServerEncoding,
    pub numeric: NumericMode,
}

/// One output column: its Arrow field and the encoder that fills it.
pub struct OutputColumn {
    pub field: Field,
    pub encoder: Box<dyn Encoder>,
}

/// The Arrow type and encoder for a column `name` of Postgres type
/// `typid`/`typmod`.
pub fn column(name: &str, typid: pg_sys::Oid, typmod: i32, nullable: bool, s: EncoderSettings) -> OutputColumn {
    let (data_type, encoder) = encoder_for(name, typid, typmod, s);
    OutputColumn { field: Field::new(name, data_type, nullable), encoder }
}

/// Picks the encoder by base type.  Arrays of a natively mapped element type
/// become Lists; every other type goes through its output function as Utf8.
pub fn encoder_for(name: &str, typid: pg_sys::Oid, typmod: i32, s: EncoderSettings) -> (DataType, Box<dyn Encoder>) {
    let (base, typmod) = pg::base_type(typid, typmod);
    if let Some(native) = native(name, base, typmod, s) {
        return native;
    }
    let elem = pg::element_type(base);
    if elem != pg_sys::InvalidOid {
        let (ebase, etypmod) = pg::base_type(elem, typmod);
        if let Some((edt, eenc)) = native(name, ebase, etypmod, s) {
            let item = Arc::new(Field::new("item", edt, true));
            return (DataType::List(item.clone()), Box::new(list::ListEncoder::new(name, elem, item, eenc)));
        }
    }
    (DataType::Utf8, Box::new(fallback::OutputText::new(base, s.encoding)))
}

fn native(name: &str, typid: pg_sys::Oid, typmod: i32, s: EncoderSettings) -> Option<(DataType, Box<dyn Encoder>)> {
    use pg_sys as p;
    let enc: (DataType, Box<dyn Encoder>) = match typid {
        p::INT2OID => (DataType::Int16, Box::new(primitive::int2())),
        p::INT4OID => (DataType::Int32, Box::new(primitive::int4())),
        p::INT8OID => (DataType::Int64, Box::new(primitive::int8())),
        p::FLOAT4OID => (DataType::Float32, Box::new(primitive::float4())),
        p::FLOAT8OID => (DataType::Float64, Box::new(primitive::float8())),
        p::BOOLOID => (DataType::Boolean, Box::new(primitive::BoolEncoder::default())),
        p::TEXTOID | p::VARCHAROID | p::BPCHAROID | p::JSONOID => {
            (DataType::Utf8, Box::new(bytes::VarlenaText::new(s.encoding)))
        }
        p::NAMEOID => (DataType::Utf8, Box::new(bytes::NameText::new(s.encoding))),
        p::JSONBOID => (DataType::Utf8, Box::new(fallback::OutputText::new(typid, s.encoding))),
        p::BYTEAOID => (DataType::Binary, Box::new(bytes::VarlenaBinary::default())),
        p::NUMERICOID => numeric::encoder(name, typmod, s),
        p::DATEOID => (DataType::Date32, Box::new(datetime::DateEncoder::new(name))),
        p::TIMESTAMPOID => (
            DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
            Box::new(datetime::TimestampEncoder::new(name, None)),
        ),
        p::TIMESTAMPTZOID => (
            DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into())),
            Box::new(datetime::TimestampEncoder::new(name, Some("UTC"))),
        ),
        p::TIMEOID => (DataType::Time64(arrow_schema::TimeUnit::Microsecond), Box::new(primitive::time())),
        p::INTERVALOID => (
            DataType::Interval(arrow_schema::IntervalUnit::MonthDayNano),
            Box::new(datetime::IntervalEncoder::new(name)),
        ),
        p::UUIDOID => (DataType::FixedSizeBinary(16), Box::new(uuid::UuidEncoder::default())),
        _ => return None,
    };
    Some(enc)
}
