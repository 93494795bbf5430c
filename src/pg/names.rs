//! Naming and quoting: relation names for messages and for SQL of ours,
//! identifiers and literals quoted, a relation a RangeVar names.

use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::PgSqlErrorCode;
use std::ffi::{CStr, CString};

/// A Rust string from a catalog C string, or `None` for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(super) unsafe fn owned(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: `p` is NULL (checked) or a NUL-terminated string (the caller's
    // contract), read before anything frees it.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A relation's name, or its oid when it has none (dropped).
pub fn rel_name(relid: Oid) -> String {
    // SAFETY: get_rel_name returns a palloc'd copy or NULL.
    unsafe { owned(pg_sys::get_rel_name(relid)) }.unwrap_or_else(|| relid.to_u32().to_string())
}

/// A relation's name as `regclass` prints it: quoted as needed, and
/// schema-qualified when the search_path would not find it.  For SQL shown
/// to the user (hints), which runs in the user's session.
pub fn regclass_text(relid: Oid) -> String {
    // SAFETY: regclassout accepts any oid (printing a missing one as a
    // number) and returns a palloc'd string.
    unsafe {
        let out = pg_sys::OidOutputFunctionCall(pg_sys::F_REGCLASSOUT.into(), Datum::from(relid));
        owned(out).unwrap_or_default()
    }
}

/// `s` quoted as an SQL identifier, when it needs quoting.
pub fn quote_ident(s: &str) -> String {
    let c = cstring(s);
    // SAFETY: returns its argument or a palloc'd quoted copy.
    unsafe { owned(pg_sys::quote_identifier(c.as_ptr())) }.unwrap_or_default()
}

/// `s` as an SQL string literal, valid whatever
/// `standard_conforming_strings` says (backslashes make it an E'' string).
pub fn quote_literal(s: &str) -> String {
    let c = cstring(s);
    // SAFETY: returns a palloc'd quoted copy.
    unsafe { owned(pg_sys::quote_literal_cstr(c.as_ptr())) }.unwrap_or_default()
}

/// `schema.relation`, each part quoted as needed: a name that resolves to
/// `relid` whatever the search_path.
pub fn qualified_name(relid: Oid) -> String {
    // SAFETY: catalog lookups; both names exist for a relation that does.
    unsafe {
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let rel = pg_sys::get_rel_name(relid);
        if nsp.is_null() || rel.is_null() {
            crate::errors::raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {} does not exist", relid.to_u32()),
            );
        }
        owned(pg_sys::quote_qualified_identifier(nsp, rel)).unwrap_or_default()
    }
}

pub(super) fn cstring(s: &str) -> CString {
    CString::new(s).unwrap_or_else(|_| {
        crate::errors::raise(PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE, "text contains a NUL character")
    })
}

/// The relation `rv` names, if it exists: looked up without a lock, as a
/// statement about to run will resolve and lock it again itself (what a
/// hook checks beforehand is the kind of change, not privileges).
///
/// # Safety
/// `rv` is a valid RangeVar or null.
pub unsafe fn relation_named(rv: *mut pg_sys::RangeVar) -> Option<Oid> {
    if rv.is_null() {
        return None;
    }
    // SAFETY: a name lookup that returns InvalidOid when missing.
    let oid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            rv,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}
