//! Relations opened for a scope (`OpenRel`) and their tuple descriptors.

use pgrx::pg_sys::{self, Oid};
use std::ffi::CStr;

use super::compat::{self, form_attrs, holds_no_null};
use super::list::list_oids;
use super::xact::in_live_transaction;

/// An attribute of a tuple descriptor, copied out so that callers need no
/// pointer into the descriptor.
#[derive(Clone, Debug)]
pub struct Attr {
    pub attnum: i16,
    pub name: String,
    pub typid: Oid,
    pub typmod: i32,
    pub notnull: bool,
    pub dropped: bool,
    /// `attidentity`: 0, or 'a'/'d' for an identity column.
    pub identity: u8,
    /// `attgenerated`: 0, or 's' for a stored generated column.
    pub generated: u8,
}

/// Every attribute of `tupdesc`, dropped ones included (so that index i is
/// attribute number i + 1).
///
/// # Safety
/// `tupdesc` is a valid tuple descriptor.
pub unsafe fn tupdesc_attrs(tupdesc: pg_sys::TupleDesc) -> Vec<Attr> {
    // SAFETY: per the contract; attrs is a flexible array of natts entries,
    // and each name a NUL-terminated NameData.
    unsafe {
        form_attrs(tupdesc)
            .iter()
            .enumerate()
            .map(|(i, a)| Attr {
                attnum: a.attnum,
                name: CStr::from_ptr(a.attname.data.as_ptr()).to_string_lossy().into_owned(),
                typid: a.atttypid,
                typmod: a.atttypmod,
                notnull: holds_no_null(tupdesc, i, a),
                dropped: a.attisdropped,
                identity: a.attidentity as u8,
                generated: a.attgenerated as u8,
            })
            .collect()
    }
}

/// A relation (table, index, sequence) opened with a lock, closed when
/// dropped, also on unwind.  The one way pgkvx opens relations.
///
/// Closing releases the lock it was opened with, unless
/// [`OpenRel::keeping_lock`] asked to keep it to the end of the transaction.
/// After an ERROR the resource owner has released the relation already, so
/// closing is skipped; where a resource owner may have been released while
/// the transaction lives on (a subtransaction abort), the owner of the
/// handle says so with [`OpenRel::forget`].
pub struct OpenRel {
    rel: pg_sys::Relation,
    /// The lock to release on close: the one taken, or NoLock.
    release: pg_sys::LOCKMODE,
}

impl OpenRel {
    /// Opens `relid`, raising Postgres's own error when it does not exist.
    pub fn open(relid: Oid, lock: u32) -> OpenRel {
        let lock = lock as pg_sys::LOCKMODE;
        // SAFETY: relation_open raises a proper ERROR for a missing
        // relation; the descriptor stays valid until relation_close.
        OpenRel { rel: unsafe { pg_sys::relation_open(relid, lock) }, release: lock }
    }

    /// Opens `relid`, or None when it does not exist.
    pub fn try_open(relid: Oid, lock: u32) -> Option<OpenRel> {
        let lock = lock as pg_sys::LOCKMODE;
        // SAFETY: try_relation_open returns NULL for a relation that is
        // gone, else a descriptor valid until relation_close.
        let rel = unsafe { pg_sys::try_relation_open(relid, lock) };
        // Lazily: a handle made for NULL would close NULL when dropped.
        (!rel.is_null()).then(|| OpenRel { rel, release: lock })
    }

    /// [`OpenRel::try_open`] without waiting for the lock: None as well when
    /// someone holds a conflicting lock (monitoring must never queue behind
    /// the DDL it is there to show).
    pub fn try_open_nowait(relid: Oid, lock: u32) -> Option<OpenRel> {
        let lock = lock as pg_sys::LOCKMODE;
        // SAFETY: a lock on the oid, taken only when free; the relation is
        // then opened under it (NULL when it is gone, and the lock goes).
        unsafe {
            if !pg_sys::ConditionalLockRelationOid(relid, lock) {
                return None;
            }
            let rel = pg_sys::try_relation_open(relid, pg_sys::NoLock as pg_sys::LOCKMODE);
            if rel.is_null() {
                pg_sys::UnlockRelationOid(relid, lock);
                return None;
            }
            Some(OpenRel { rel, release: lock })
        }
    }

    /// Keeps the lock to the end of the transaction when closed, as the
    /// executor does, so the relation cannot change under the transaction.
    pub fn keeping_lock(mut self) -> OpenRel {
        self.release = pg_sys::NoLock as pg_sys::LOCKMODE;
        self
    }

    /// Closes now (what dropping does), under the current resource owner.
    pub fn close(self) {
        drop(self);
    }

    /// Gives the handle up without closing: its resource owner has released
    /// the relation already.
    pub fn forget(self) {
        std::mem::forget(self);
    }

    pub fn as_ptr(&self) -> pg_sys::Relation {
        self.rel
    }

    pub fn get(&self) -> &pg_sys::RelationData {
        // SAFETY: an open relation's descriptor stays valid until closed.
        unsafe { &*self.rel }
    }

    /// The relation's pg_class row.
    pub fn form(&self) -> &pg_sys::FormData_pg_class {
        // SAFETY: rd_rel is set for every open relation.
        unsafe { &*self.get().rd_rel }
    }

    /// The pg_index row, when the relation is an index.
    pub fn index(&self) -> Option<&pg_sys::FormData_pg_index> {
        // SAFETY: rd_index is NULL or the index's row, valid while open.
        unsafe { self.get().rd_index.as_ref() }
    }

    pub fn oid(&self) -> Oid {
        self.get().rd_id
    }

    pub fn name(&self) -> String {
        // SAFETY: relname is a NUL-terminated NameData.
        unsafe { CStr::from_ptr(self.form().relname.data.as_ptr()) }.to_string_lossy().into_owned()
    }

    pub fn relkind(&self) -> u8 {
        self.form().relkind as u8
    }

    /// A temp table of another session: its pages live in that backend's
    /// local buffers, so reading them here would return garbage.
    pub fn is_other_temp(&self) -> bool {
        self.form().relpersistence as u8 == pg_sys::RELPERSISTENCE_TEMP && !self.get().rd_islocaltemp
    }

    pub fn attrs(&self) -> Vec<Attr> {
        // SAFETY: an open relation's rd_att is a valid descriptor.
        unsafe { tupdesc_attrs(self.get().rd_att) }
    }

    pub fn primary_key_index(&self) -> Option<Oid> {
        // SAFETY: an open relation.
        let oid = unsafe { compat::primary_key_index(self.rel) };
        (oid != pg_sys::InvalidOid).then_some(oid)
    }

    /// The oids of the relation's indexes.
    pub fn index_oids(&self) -> Vec<Oid> {
        // SAFETY: an open relation; RelationGetIndexList returns a fresh
        // OidList, read and freed here.
        unsafe {
            let list = pg_sys::RelationGetIndexList(self.rel);
            let oids = list_oids(list).collect();
            pg_sys::list_free(list);
            oids
        }
    }

    /// `tgenabled` of the relation's trigger `name`, if it has one: 'O'
    /// fires in origin and local mode, 'R' only as a replica, 'A' always,
    /// 'D' never.
    pub fn trigger_enabled(&self, name: &str) -> Option<u8> {
        let td = self.get().trigdesc;
        if td.is_null() {
            return None;
        }
        // SAFETY: the relcache's trigger descriptor of an open relation:
        // `triggers` holds `numtriggers` entries with NUL-terminated names.
        unsafe {
            std::slice::from_raw_parts((*td).triggers, (*td).numtriggers as usize)
                .iter()
                .find(|t| CStr::from_ptr(t.tgname).to_bytes() == name.as_bytes())
                .map(|t| t.tgenabled as u8)
        }
    }
}

impl Drop for OpenRel {
    fn drop(&mut self) {
        // After an ERROR the resource owner has released the relation.
        if in_live_transaction() {
            // SAFETY: opened by `open`/`try_open` and not closed yet: close
            // and forget consume the handle.
            unsafe { pg_sys::relation_close(self.rel, self.release) }
        }
    }
}
