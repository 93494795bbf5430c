//! date, timestamp, timestamptz, interval.  Postgres counts from 2000-01-01,
//! Arrow from 1970-01-01: a date or timestamp is the raw value plus a constant.
//!
//! ±infinity has no Arrow representation that every reader understands (a
//! sentinel would show up as a real date or, in pandas, as NaT — a NULL).  So
//! it raises 22008 naming the column instead of sending a wrong value; the
//! hint shows how to filter or convert it in `pgkvx.arrow_query`.

use std::sync::Arc;

use arrow_array::types::{Date32Type, IntervalMonthDayNanoType, TimestampMicrosecondType};
use arrow_array::{ArrayRef, PrimitiveArray};
use arrow_buffer::{IntervalMonthDayNano, NullBufferBuilder, ScalarBuffer};
use pgrx::{pg_sys, PgSqlErrorCode};

use super::Encoder;
use crate::errors;

/// Days from 1970-01-01 to 2000-01-01.
pub const EPOCH_SHIFT_DAYS: i32 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
pub const EPOCH_SHIFT_USECS: i64 = 946_684_800_000_000;

fn infinite(column: &str, what: &str) -> ! {
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
        format!("column \"{column}\" holds {what}, which Arrow cannot represent"),
        Some("pgkvx never sends a sentinel or NULL in place of ±infinity."),
        Some(format!(
            "Filter it out or convert it in pgkvx.arrow_query, e.g. CASE WHEN isfinite({column}) THEN {column} END or {column}::text."
        )),
    )
}

pub struct DateEncoder {
    column: String,
    values: super::SizedVec<i32>,
    nulls: NullBufferBuilder,
}

impl DateEncoder {
    pub fn new(column: &str) -> Self {
        DateEncoder { column: column.into(), values: super::SizedVec::new(), nulls: NullBufferBuilder::new(0) }
    }
}

/// Converts a Postgres date (days since 2000-01-01) to Arrow Date32.  Finite
/// dates span 4713 BC .. 5874897 AD and never overflow after the shift.
pub fn date32(days: i32) -> Option<i32> {
    if days == i32::MIN || days == i32::MAX {
        None
    } else {
        Some(days + EPOCH_SHIFT_DAYS)
    }
}

/// Converts a Postgres timestamp (µs since 2000-01-01) to µs since 1970.
/// None for ±infinity; finite values after 294246 AD overflow and are also None.
pub fn timestamp_us(us: i64) -> Option<i64> {
    if us == i64::MIN || us == i64::MAX {
        None
    } else {
        us.checked_add(EPOCH_SHIFT_USECS)
    }
}

impl Encoder for DateEncoder {
    #[inline]
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        match date32(datum.value() as i32) {
            Some(v) => self.values.push(v),
            None => infinite(&self.column, "an infinite date"),
        }
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        self.values.push(0);
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(PrimitiveArray::<Date32Type>::new(ScalarBuffer::from(self.values.take()), self.nulls.finish()))
    }
    fn bytes(&self) -> usize {
        self.values.len() * 4
    }
}

/// timestamp and timestamptz: the same µs value; the Arrow field carries the
/// "UTC" zone for timestamptz.
pub struct TimestampEncoder {
    column: String,
    zone: Option<&'static str>,
    values: super::SizedVec<i64>,
    nulls: NullBufferBuilder,
}

impl TimestampEncoder {
    pub fn new(column: &str, zone: Option<&'static str>) -> Self {
        TimestampEncoder {
            column: column.into(),
            zone,
            values: super::SizedVec::new(),
            nulls: NullBufferBuilder::new(0),
        }
    }
}

impl Encoder for TimestampEncoder {
    #[inline]
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        match timestamp_us(datum.value() as i64) {
            Some(v) => self.values.push(v),
            None => infinite(&self.column, "an infinite or out-of-range timestamp"),
        }
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        self.values.push(0);
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        // The zone lives in the schema's field; the array must carry the same type.
        let a = PrimitiveArray::<TimestampMicrosecondType>::new(
            ScalarBuffer::from(self.values.take()),
            self.nulls.finish(),
        );
        Arc::new(match self.zone {
            Some(z) => a.with_timezone(z),
            None => a,
        })
    }
    fn bytes(&self) -> usize {
        self.values.len() * 8
    }
}

/// interval → MonthDayNano: Postgres keeps months, days and µs apart, exactly
/// Arrow's three fields (µs × 1000; beyond ±106,751 days of µs that overflows
/// and raises 22008).
pub struct IntervalEncoder {
    column: String,
    values: super::SizedVec<IntervalMonthDayNano>,
    nulls: NullBufferBuilder,
}

impl IntervalEncoder {
    pub fn new(column: &str) -> Self {
        IntervalEncoder { column: column.into(), values: super::SizedVec::new(), nulls: NullBufferBuilder::new(0) }
    }
}

impl Encoder for IntervalEncoder {
    unsafe fn push(&mut self, datum: pg_sys::Datum) {
        // SAFETY: an interval datum points at a pg_sys::Interval.
        let iv = unsafe { &*datum.cast_mut_ptr::<pg_sys::Interval>() };
        let Some(nanos) = iv.time.checked_mul(1000) else {
            errors::raise(
                PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
                format!("interval in column \"{}\" is too long for Arrow nanoseconds", self.column),
            )
        };
        self.values.push(IntervalMonthDayNano::new(iv.month, iv.day, nanos));
        self.nulls.append_non_null();
    }
    fn push_null(&mut self) {
        self.values.push(IntervalMonthDayNano::new(0, 0, 0));
        self.nulls.append_null();
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(PrimitiveArray::<IntervalMonthDayNanoType>::new(
            ScalarBuffer::from(self.values.take()),
            self.nulls.finish(),
        ))
    }
    fn bytes(&self) -> usize {
        self.values.len() * 16
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn epoch_shift_and_infinity() {
        assert_eq!(date32(0), Some(10_957));
        assert_eq!(date32(i32::MIN), None);
        assert_eq!(date32(i32::MAX), None);
        assert_eq!(timestamp_us(0), Some(946_684_800_000_000));
        assert_eq!(timestamp_us(i64::MAX), None);
        assert_eq!(timestamp_us(i64::MIN), None);
        assert_eq!(timestamp_us(i64::MAX - 1), None);
    }
}
