//! numeric.  numeric(p, s) with p ≤ 38 and 0 ≤ s ≤ p becomes Decimal128(p, s),
//! built from the base-10000 digit groups straight into an i128 — no text
//! round trip.  Unconstrained and wider numerics follow `pgkvx.arrow_numeric`:
//! Utf8 through numeric_out (default, lossless), Float64, or
//! Decimal128(38, pgkvx.arrow_numeric_scale) rounded half away from zero like
//! a cast.
//!
//! NaN and ±Infinity have no Decimal128 value: they raise 22003 naming the
//! column.  In Utf8 they travel as "NaN"/"Infinity"/"-Infinity", in Float64 as
//! the IEEE values.

use std::sync::Arc;

use arrow_array::types::Decimal128Type;
use arrow_array::{ArrayRef, Float64Array, PrimitiveArray};
use arrow_buffer::{NullBufferBuilder, ScalarBuffer};
use arrow_schema::DataType;
use pgrx::{pg_sys, PgSqlErrorCode};

use super::{fallback::OutputText, Encoder, EncoderSettings};
use crate::errors;

/// How numerics without a Decimal128-sized typmod are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumericMode {
    Text,
    Float64,
    Decimal128 { scale: i8 },
}

pub fn encoder(name: &str, typmod: i32, s: EncoderSettings) -> (DataType, Box<dyn Encoder>) {
    if let Some((p, sc)) = decimal_typmod(typmod) {
        return (DataType::Decimal128(p, sc), Box::new(DecimalEncoder::new(name, p, sc)));
    }
    match s.numeric {
        NumericMode::Text => (DataType::Utf8, Box::new(OutputText::new(pg_sys::NUMERICOID, s.encoding))),
        NumericMode::Float64 => (DataType::Float64, Box::new(FloatEncoder::default())),
        NumericMode::Decimal128 { scale } => {
            (DataType::Decimal128(38, scale), Box::new(DecimalEncoder::new(name, 38, scale)))
        }
    }
}

/// (precision, scale) when a numeric typmod fits Decimal128 exactly.
pub fn decimal_typmod(typmod: i32) -> Option<(u8, i8)> {
    if typmod < 4 {
        return None;
    }
    let t = typmod - 4;
    let p = (t >> 16) & 0xffff;
    // Postgres 15 allows scales from -1000 to 1000, stored in 11 bits.
    let s = ((t & 0x7ff) ^ 1024) - 1024;
    (p <= 38 && (0..=p).contains(&s)).then_some((p as u8, s as i8))
}

/// A numeric value as stored: sign, weight of the first base-10000 group and
/// the groups themselves — or one of the special values.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodedNumeric<'a> {
    Finite { negative: bool, weight: i32, digits: NumericDigits<'a> },
    NaN,
    PosInf,
    NegInf,
}

/// Base-10000 digit groups in native byte order.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct NumericDigits<'a>(pub &'a [u8]);

impl NumericDigits<'_> {
    fn len(&self) -> usize {
        self.0.len() / 2
    }
    fn get(&self, i: usize) -> i128 {
        i16::from_ne_bytes([self.0[2 * i], self.0[2 * i + 1]]) as i128
    }
}

/// Reads the numeric header (src/backend/utils/adt/numeric.c: short and long
/// formats, special values in the sign bits).
pub fn decode(payload: &[u8]) -> DecodedNumeric<'_> {
    let h = u16::from_ne_bytes([payload[0], payload[1]]);
    match h & 0xC000 {
        0xC000 => match h & 0xF000 {
            0xD000 => DecodedNumeric::PosInf,
            0xF000 => DecodedNumeric::NegInf,
            _ => DecodedNumeric::NaN,
        },
        0x8000 => {
            let w = (h & 0x3F) as i32;
            let weight = if h & 0x40 != 0 { w | !0x3F } else { w };
            DecodedNumeric::Finite { negative: h & 0x2000 != 0, weight, digits: NumericDigits(&payload[2..]) }
        }
        flag => {
            let weight = i16::from_ne_bytes([payload[2], payload[3]]) as i32;
            DecodedNumeric::Finite { negative: flag == 0x4000, weight, digits: NumericDigits(&payload[4..]) }
        }
    }
}

const POW10: [i128; 5] = [1, 10, 100, 1000, 10000];

/// The value × 10^scale as an i128, rounded half away from zero, or None when
/// it has more than 38 digits.
pub fn scaled(negative: bool, weight: i32, digits: NumericDigits<'_>, scale: i32) -> Option<i128> {
    let group = |p: i32| -> i128 {
        let i = weight - p;
        if i >= 0 && (i as usize) < digits.len() {
            digits.get(i as usize)
        } else {
            0
        }
    };
    // `last` is the group holding the scale-th fractional digit; `keep` how
    // many of its 4 digits are inside the scale.
    let (last, keep) = if scale == 0 { (0, 4) } else { (-((scale + 3) / 4), scale - 4 * ((scale + 3) / 4 - 1)) };
    let mut acc: i128 = 0;
    let mut p = weight;
    while p > last {
        acc = acc.checked_mul(10_000)?.checked_add(group(p))?;
        p -= 1;
    }
    let cut = POW10[(4 - keep) as usize];
    let dl = group(last);
    acc = acc.checked_mul(POW10[keep as usize])?.checked_add(dl / cut)?;
    // Digits beyond the next group cannot change a half-up decision at this
    // resolution: the threshold is an integer there.
    if 2 * ((dl % cut) * 10_000 + group(last - 1)) >= cut * 10_000 {
        acc += 1;
    }
    if acc >= 10i128.pow(38) {
        return None;
    }
    Some(if negative { -acc } else { acc })
}

pub struct DecimalEncoder {
    column: String,
    precision: u8,
    scale: i8,
    values: super::SizedVec<i128>,
    nulls: NullBufferBuilder,
}

impl DecimalEncoder {
    fn new(column: &str, precision: u8, scale: i8) -> Self {
        DecimalEncoder {
            column: column.into(),
            precision,
            scale,
            values: super::SizedVec::new(),
            nulls: NullBufferBuilder::new(0),
        }
    }

    fn refuse(&self, what: &str) -> ! {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!(
                "column \"{}\" holds {what}, which Arrow Decimal128({}, {}) cannot represent",
                self.column, self.precision, self.scale
            ),
            format!(
                "Filter it out, or send it as text or float8 through pgkvx.arrow_query (e.g. {}::text).",
                self.column
            ),
        )
    }
}

impl Encoder for DecimalEncoder {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: the caller passes a non-null numeric varlena.
        let payload = unsafe { crate::pg::varlena_bytes(datum) };
        let v = match decode(payload) {
            DecodedNumeric::Finite { negative, weight, digits } => {
                match scaled(negative, weight, digits, self.scale as i32) {
                    Some(v) if v.unsigned_abs() < 10u128.pow(self.precision as u32) => v,
                    _ => self.refuse("a value with too many digits"),
                }
            }
            DecodedNumeric::NaN => self.refuse("NaN"),
            DecodedNumeric::PosInf => self.refuse("Infinity"),
            DecodedNumeric::NegInf => self.refuse("-Infinity"),
        };
        self.values.push(v);
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        self.values.push(0);
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        let a = PrimitiveArray::<Decimal128Type>::new(ScalarBuffer::from(self.values.take()), self.nulls.finish())
            .with_precision_and_scale(self.precision, self.scale)
            .expect("precision and scale validated by decimal_typmod");
        Arc::new(a)
    }
    fn bytes(&self) -> usize {
        self.values.len() * 16
    }
}

/// Float64 through Postgres's own numeric → float8 conversion (correctly
/// rounded; NaN and ±Infinity map to the IEEE values).
pub struct FloatEncoder {
    values: super::SizedVec<f64>,
    nulls: NullBufferBuilder,
}

impl Default for FloatEncoder {
    fn default() -> Self {
        FloatEncoder { values: super::SizedVec::new(), nulls: NullBufferBuilder::new(0) }
    }
}

impl Encoder for FloatEncoder {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: numeric_float8 takes one non-null numeric argument.
        let v =
            unsafe { pgrx::direct_function_call::<f64>(pg_sys::numeric_float8, &[Some(datum)]).unwrap_or(f64::NAN) };
        self.values.push(v);
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        self.values.push(0.0);
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(Float64Array::new(ScalarBuffer::from(self.values.take()), self.nulls.finish()))
    }
    fn bytes(&self) -> usize {
        self.values.len() * 8
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn groups(g: &[i16]) -> Vec<u8> {
        g.iter().flat_map(|d| d.to_ne_bytes()).collect()
    }

    fn sc(neg: bool, weight: i32, g: &[i16], scale: i32) -> Option<i128> {
        let b = groups(g);
        scaled(neg, weight, NumericDigits(&b), scale)
    }

    #[test]
    fn scaled_values() {
        // 12345.6789 = groups [1, 2345, 6789], weight 1
        assert_eq!(sc(false, 1, &[1, 2345, 6789], 4), Some(123_456_789));
        assert_eq!(sc(false, 1, &[1, 2345, 6789], 2), Some(1_234_568));
        assert_eq!(sc(true, 1, &[1, 2345, 6789], 0), Some(-12_346));
        assert_eq!(sc(false, 1, &[1, 2345, 6789], 6), Some(12_345_678_900));
        // 0.5 rounds away from zero at scale 0; 0.49999 does not
        assert_eq!(sc(false, -1, &[5000], 0), Some(1));
        assert_eq!(sc(false, -1, &[4999, 9999], 0), Some(0));
        // 0.00005 at scale 4 → 1 (half up from the next group)
        assert_eq!(sc(false, -2, &[5000], 4), Some(1));
        // zero: no groups
        assert_eq!(sc(false, 0, &[], 10), Some(0));
        // 38 nines fits, 10^38 does not
        let mut nines = vec![99i16];
        nines.extend(std::iter::repeat_n(9999i16, 9));
        assert_eq!(sc(false, 9, &nines, 0), Some(10i128.pow(38) - 1));
        assert_eq!(sc(false, 9, &[100], 0), None);
        assert_eq!(sc(false, 200, &[1], 0), None);
    }

    #[test]
    fn typmods() {
        let tm = |p: i32, s: i32| ((p << 16) | (s & 0x7ff)) + 4;
        assert_eq!(decimal_typmod(tm(38, 10)), Some((38, 10)));
        assert_eq!(decimal_typmod(tm(39, 0)), None);
        assert_eq!(decimal_typmod(tm(5, -2)), None);
        assert_eq!(decimal_typmod(tm(2, 5)), None);
        assert_eq!(decimal_typmod(-1), None);
    }

    #[test]
    fn headers() {
        // long format, negative, weight 0, one group 7
        let mut b = vec![];
        b.extend((0x4000u16 | 2).to_ne_bytes());
        b.extend(0i16.to_ne_bytes());
        b.extend(7i16.to_ne_bytes());
        assert_eq!(decode(&b), DecodedNumeric::Finite { negative: true, weight: 0, digits: NumericDigits(&b[4..]) });
        assert_eq!(decode(&0xC000u16.to_ne_bytes()), DecodedNumeric::NaN);
        assert_eq!(decode(&0xD000u16.to_ne_bytes()), DecodedNumeric::PosInf);
        assert_eq!(decode(&0xF000u16.to_ne_bytes()), DecodedNumeric::NegInf);
        // short format, weight -1 (sign-extended 6 bits)
        let h = 0x8000u16 | 0x40 | 0x3F;
        assert!(matches!(decode(&h.to_ne_bytes()), DecodedNumeric::Finite { weight: -1, negative: false, .. }));
    }
}
