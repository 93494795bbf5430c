//! Every type without a native Arrow mapping (and jsonb, whose binary form
//! is not text): Utf8 through the type's own output function, so the client
//! sees exactly what psql would show.

use arrow_array::ArrayRef;
use pgrx::pg_sys;

use super::bytes::VarBytes;
use super::Encoder;
use crate::arrow::pg::{self, OutputFn, ServerEncoding};

pub struct OutputText {
    func: OutputFn,
    out: VarBytes,
    encoding: ServerEncoding,
}

impl OutputText {
    pub fn new(typid: pg_sys::Oid, encoding: ServerEncoding) -> Self {
        OutputText { func: OutputFn::new(typid), out: VarBytes::default(), encoding }
    }
}

impl Encoder for OutputText {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: the caller passes a non-null value of the type.
        let text = unsafe { self.func.call(datum) };
        let out = &mut self.out;
        pg::with_utf8(text, self.encoding, |b| out.push(b));
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
