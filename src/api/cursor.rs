//! The cursor of `wait_for` and `head_blockers`: a key (or a prefix of the
//! leading key columns) given as text, and the btree scan keys for "past
//! the cursor", which both scan the key index with (`pg::index_scan`) to
//! look at committed rows without waiting for writers.

use crate::errors;
use crate::keys::KeyDesc;
use crate::pg::OpenRel;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// btree support function 1, the three-way comparison (access/nbtree.h).
const BTORDER_PROC: i16 = 1;

/// The cursor: a key (or a prefix of the leading key columns), as text
/// fields and as its encoding.
pub struct After {
    pub fields: Vec<String>,
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

pub fn parse_after(key: &KeyDesc, text: &str) -> After {
    let (w, n) = key.parse_bound(text, "after");
    let fields = if key.cols.len() == 1 {
        vec![text.to_string()]
    } else {
        // parse_bound accepted it, so it is a row literal of n non-NULL fields.
        crate::keys::datum::parse_row_literal(text).unwrap_or_default().into_iter().flatten().collect()
    };
    debug_assert_eq!(fields.len(), n);
    After { fields, bytes: w.bytes().to_vec(), truncated: w.truncated() }
}

/// Scan keys for "past `after`" in key order: a row comparison over the
/// leading cursor columns that share the first column's direction, strict
/// when that is all of them (`exact`: every row the scan returns is past
/// the cursor), inclusive otherwise (rows are then checked by their
/// encoding).  `inclusive` asks for the inclusive form always ("from
/// `after` on"); `before` mirrors it all ("before `after`").  The row
/// members are returned too: the header points at them.
pub fn scan_keys(
    key: &KeyDesc,
    index: &OpenRel,
    after: Option<&After>,
    inclusive: bool,
    before: bool,
) -> (Vec<pg_sys::ScanKeyData>, Box<[pg_sys::ScanKeyData]>, bool) {
    let Some(a) = after else { return (Vec::new(), Box::new([]), true) };
    let m = a.fields.len();
    let desc = key.cols[0].desc;
    let k = key.cols[..m].iter().take_while(|c| c.desc == desc).count();
    let exact = k == m && !a.truncated && !inclusive;
    let strategy = match (desc != before, exact) {
        (false, true) => pg_sys::BTGreaterStrategyNumber,
        (false, false) => pg_sys::BTGreaterEqualStrategyNumber,
        (true, true) => pg_sys::BTLessStrategyNumber,
        (true, false) => pg_sys::BTLessEqualStrategyNumber,
    } as u16;
    let r = index.get();
    let mut members: Vec<pg_sys::ScanKeyData> = Vec::with_capacity(k);
    for i in 0..k {
        let c = &key.cols[i];
        let value = crate::pg::input_datum(c.typid, -1, &a.fields[i]);
        // SAFETY: the index's per-column arrays have one entry per key
        // column; catalog lookups; ScanKeyEntryInitialize only fills the
        // struct.
        unsafe {
            let opfamily = *r.rd_opfamily.add(i);
            let opcintype = *r.rd_opcintype.add(i);
            let collation = *r.rd_indcollation.add(i);
            let proc = if k == 1 {
                let op = pg_sys::get_opfamily_member(opfamily, opcintype, opcintype, strategy as i16);
                pg_sys::get_opcode(op)
            } else {
                pg_sys::get_opfamily_proc(opfamily, opcintype, opcintype, BTORDER_PROC)
            };
            if proc == pg_sys::InvalidOid {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                    format!("the key index of \"{}\" has no comparison for its own type", key.relname),
                );
            }
            let mut sk = pg_sys::ScanKeyData::default();
            let flags =
                if k == 1 { 0 } else { pg_sys::SK_ROW_MEMBER | if i + 1 == k { pg_sys::SK_ROW_END } else { 0 } };
            pg_sys::ScanKeyEntryInitialize(
                &mut sk,
                flags as i32,
                (i + 1) as pg_sys::AttrNumber,
                strategy,
                opcintype,
                collation,
                proc,
                value,
            );
            members.push(sk);
        }
    }
    if k == 1 {
        return (members, Box::new([]), exact);
    }
    let members = members.into_boxed_slice();
    let mut header = pg_sys::ScanKeyData::default();
    // SAFETY: fills the struct; the members live as long as the header
    // (returned together).
    unsafe {
        pg_sys::ScanKeyEntryInitialize(
            &mut header,
            pg_sys::SK_ROW_HEADER as i32,
            1,
            strategy,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::Datum::from(members.as_ptr()),
        );
    }
    (vec![header], members, exact)
}
