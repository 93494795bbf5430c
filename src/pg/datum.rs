//! Values: reading a varlena, parsing a value from text, times as shared
//! memory keeps them, whether a collation orders by bytes.

use pgrx::pg_sys::{self, Datum, Oid};

use super::compat::lc_collate_is_c;
use super::names::cstring;

/// A `timestamptz` from microseconds since the PostgreSQL epoch, as
/// shared memory keeps times.
pub fn timestamptz(us: i64) -> Option<pgrx::datum::TimestampWithTimeZone> {
    use pgrx::FromDatum;
    // SAFETY: TimestampTz is a plain i64.
    unsafe { pgrx::datum::TimestampWithTimeZone::from_datum(pg_sys::Datum::from(us), false) }
}

/// Whether `coll` orders strings by their bytes ("C", "POSIX", ucs_basic, or
/// a database default of C).
pub fn collation_is_bytewise(coll: Oid) -> bool {
    // SAFETY: lc_collate_is_c accepts any collation oid and may ereport;
    // the boundary guard turns that into a Rust unwind.
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| lc_collate_is_c(coll)) }
}

/// A value of type `typid` (with `typmod`, -1 for none) read from text by
/// the type's input function, as a cast from text would: bad input raises
/// the type's own error (e.g. 22P02).
pub fn input_datum(typid: Oid, typmod: i32, text: &str) -> Datum {
    let c = cstring(text);
    let (mut func, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    // SAFETY: catalog lookup of an existing type and a call of its input
    // function, which raises a proper ERROR on bad input.
    unsafe {
        pg_sys::getTypeInputInfo(typid, &mut func, &mut ioparam);
        pg_sys::OidInputFunctionCall(func, c.as_ptr() as *mut _, ioparam, typmod)
    }
}

/// The payload of a varlena datum, detoasted (and decompressed) only when it
/// is not already inline and plain: per-row paths read most values in place.
/// A detoasted copy lives in the current memory context.
///
/// # Safety
/// `datum` is a non-null datum of a varlena type.
#[inline]
pub unsafe fn varlena_bytes<'a>(datum: Datum) -> &'a [u8] {
    // SAFETY: per the caller.  pg_detoast_datum_packed returns its argument
    // unless the value is external or compressed; short (1-byte header)
    // varlenas are read in place.  The header tests are postgres.h's
    // VARATT_IS_* for little-endian machines.
    unsafe {
        let mut p = datum.cast_mut_ptr::<pg_sys::varlena>();
        let first = *(p as *const u8);
        let is_short = first & 0x01 == 0x01;
        let is_external = first == 0x01;
        let is_compressed = !is_short && (first & 0x03) == 0x02;
        if is_external || is_compressed {
            p = pg_sys::pg_detoast_datum_packed(p);
        }
        let first = *(p as *const u8);
        if first & 0x01 == 0x01 {
            // 1-byte header: the total length in its upper 7 bits.
            let len = (first >> 1) as usize;
            std::slice::from_raw_parts((p as *const u8).add(1), len - 1)
        } else {
            let len = (std::ptr::read_unaligned(p as *const u32) >> 2) as usize;
            std::slice::from_raw_parts((p as *const u8).add(4), len - 4)
        }
    }
}
