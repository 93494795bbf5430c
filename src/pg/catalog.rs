//! Catalog rows read through the syscache, by attribute number where
//! pgrx has no struct for the catalog.

use pgrx::pg_sys::{self, Oid};

/// pg_aggregate's support functions, by attribute number (PostgreSQL 15
/// to 18): aggtransfn, aggfinalfn, aggcombinefn, aggserialfn,
/// aggdeserialfn, aggmtransfn, aggminvtransfn, aggmfinalfn.
pub const AGGREGATE_FUNCTIONS: std::ops::RangeInclusive<i16> = 4..=11;

/// pg_aggregate.aggsortop's attribute number (PostgreSQL 15 to 18).
pub const AGGREGATE_SORT_OPERATOR: i16 = 16;

/// The oid columns `attnos` of aggregate `aggfnoid`'s pg_aggregate row
/// (InvalidOid where NULL), or None when it has none.
pub fn aggregate_oids(aggfnoid: Oid, attnos: impl IntoIterator<Item = i16>) -> Option<Vec<Oid>> {
    let cache = pg_sys::SysCacheIdentifier::AGGFNOID as i32;
    // SAFETY: a syscache lookup, released before returning; the attributes
    // read are oid (regproc, regoperator) columns, by value.
    unsafe {
        let tup = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(aggfnoid));
        if tup.is_null() {
            return None;
        }
        let oids = attnos
            .into_iter()
            .map(|attno| {
                let mut isnull = false;
                let d = pg_sys::SysCacheGetAttr(cache, tup, attno, &mut isnull);
                if isnull {
                    pg_sys::InvalidOid
                } else {
                    Oid::from(d.value() as u32)
                }
            })
            .collect();
        pg_sys::ReleaseSysCache(tup);
        Some(oids)
    }
}
