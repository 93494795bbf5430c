//! Small Postgres chores every part needs, each done one way: opening a
//! relation for a scope, naming a relation, telling whether the
//! transaction is still live.

use pgrx::pg_sys::{self, Oid};
use std::ffi::CStr;

/// True while the transaction can still run catalog and buffer-manager code.
/// During abort Postgres releases pins, locks and snapshots through resource
/// owners *before* memory contexts (and with them our Rust state) are freed;
/// cleanup that ran then would release everything a second time.
pub fn in_live_transaction() -> bool {
    // SAFETY: reads backend-local transaction state; callable at any time.
    unsafe { pg_sys::IsTransactionState() }
}

/// A relation's name, or its oid when it has none (dropped).
pub fn rel_name(relid: Oid) -> String {
    // SAFETY: returns a palloc'd copy or NULL.
    let p = unsafe { pg_sys::get_rel_name(relid) };
    if p.is_null() {
        relid.to_u32().to_string()
    } else {
        // SAFETY: NUL-terminated catalog string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A relation opened with a lock, closed when dropped (also on unwind).
pub struct OpenRel {
    rel: pg_sys::Relation,
    lock: pg_sys::LOCKMODE,
}

impl OpenRel {
    /// Opens `relid`, or None when it does not exist.
    pub fn try_open(relid: Oid, lock: pg_sys::LOCKMODE) -> Option<OpenRel> {
        // SAFETY: try_relation_open returns NULL for a relation that is gone.
        let rel = unsafe { pg_sys::try_relation_open(relid, lock) };
        (!rel.is_null()).then_some(OpenRel { rel, lock })
    }

    /// Opens `relid`, raising Postgres's own error when it does not exist.
    pub fn open(relid: Oid, lock: pg_sys::LOCKMODE) -> OpenRel {
        // SAFETY: relation_open raises a proper ERROR for a missing relation.
        OpenRel { rel: unsafe { pg_sys::relation_open(relid, lock) }, lock }
    }

    pub fn as_ptr(&self) -> pg_sys::Relation {
        self.rel
    }

    pub fn get(&self) -> &pg_sys::RelationData {
        // SAFETY: an open relation's descriptor stays valid until closed.
        unsafe { &*self.rel }
    }
}

impl Drop for OpenRel {
    fn drop(&mut self) {
        // SAFETY: opened with this lock mode and not closed yet.  After an
        // ERROR the resource owner has released it: skip.
        if in_live_transaction() {
            unsafe { pg_sys::relation_close(self.rel, self.lock) }
        }
    }
}

/// `s` quoted as an SQL identifier, when it needs quoting.
pub fn quote_ident(s: &str) -> String {
    let c = std::ffi::CString::new(s).expect("identifiers have no NUL");
    // SAFETY: returns its argument or a palloc'd quoted copy.
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())) }.to_string_lossy().into_owned()
}

/// `s` as an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
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
                pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {} does not exist", relid.to_u32()),
            );
        }
        CStr::from_ptr(pg_sys::quote_qualified_identifier(nsp, rel)).to_string_lossy().into_owned()
    }
}

/// Runs `f` (which runs SQL of ours) with `search_path` set to
/// `pg_catalog, pg_temp` and `row_security` on, whatever the caller set:
/// no object or operator the caller planted can stand in for ours, and no
/// internal statement fails because the caller turned row security off.
/// The settings come back when `f` returns; after an ERROR the transaction
/// abort restores them.
pub fn with_pinned_settings<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: the GUC nest-level protocol, as SECURITY DEFINER functions
    // with SET clauses use it.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for (name, value) in [(c"search_path", c"pg_catalog, pg_temp"), (c"row_security", c"on")] {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let r = f();
        pg_sys::AtEOXact_GUC(true, level);
        r
    }
}
