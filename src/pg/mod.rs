//! Small Postgres chores every part needs, each done one way: opening a
//! relation for a scope, naming and quoting, walking a `List`, reading a
//! varlena, parsing a value from text, telling whether the transaction is
//! still live.

use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::PgSqlErrorCode;
use std::ffi::{CStr, CString};

/// nodes/nodeFuncs.h's tree walkers and mutators, declared with the callback
/// type Postgres calls (pgrx's bindings take an argument-less one).  PG16
/// made the plain names macros over `*_impl` functions with typed callbacks.
/// Call them only through `pg_sys::ffi::pg_guard_ffi_boundary`.
pub mod acl;
pub mod boundary;
pub mod compat;
pub mod index_scan;
pub mod memcx;
pub mod raw;

pub use compat::{
    copy_has_default_marker, copy_path_disabled_nodes, copy_plan_disabled_nodes, executor_run, form_attrs,
    json_result_type, latest_completed_xid, local_xact_id, my_proc_number, ordering_op_properties, pathkey_descending,
    row_compare_lower_bound,
};
use compat::{holds_no_null, lc_collate_is_c};

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

pub mod walk {
    use pgrx::pg_sys::{self, Node};
    use std::ffi::c_void;

    pub use super::raw::{expression_tree_mutator, expression_tree_walker, query_tree_mutator, query_tree_walker};

    /// Whether `visit` answers true for some node of expression `node`,
    /// walked with [`expression_tree_walker`]: `visit` returns the answer
    /// for a node it decides (its subtree is not walked), None to walk on
    /// into it.
    ///
    /// # Safety
    /// `node` is a valid expression (or NULL); `visit` does not panic.
    pub unsafe fn any_node(node: *mut Node, mut visit: impl FnMut(*mut Node) -> Option<bool>) -> bool {
        #[pgrx::pg_guard]
        unsafe extern "C-unwind" fn step(node: *mut Node, cx: *mut c_void) -> bool {
            if node.is_null() {
                return false;
            }
            // SAFETY: `cx` is the visitor below, alive for the walk; the
            // nodes are the valid expression's.
            unsafe {
                let visit = &mut *(cx as *mut &mut dyn FnMut(*mut Node) -> Option<bool>);
                if let Some(answer) = visit(node) {
                    return answer;
                }
                pg_sys::ffi::pg_guard_ffi_boundary(|| expression_tree_walker(node, Some(step), cx))
            }
        }
        let mut visit: &mut dyn FnMut(*mut Node) -> Option<bool> = &mut visit;
        // SAFETY: per contract.
        unsafe { step(node, &mut visit as *mut &mut dyn FnMut(*mut Node) -> Option<bool> as *mut c_void) }
    }
}

/// True while the transaction can still run catalog and buffer-manager code.
/// During abort Postgres releases pins, locks and snapshots through resource
/// owners *before* memory contexts (and with them our Rust state) are freed;
/// cleanup that ran then would release everything a second time.
pub fn in_live_transaction() -> bool {
    // SAFETY: reads backend-local transaction state; callable at any time,
    // cannot raise.
    unsafe { crate::pg::raw::IsTransactionState() }
}

/// A Rust string from a catalog C string, or `None` for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn owned(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: per the contract.
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

fn cstring(s: &str) -> CString {
    CString::new(s).unwrap_or_else(|_| {
        crate::errors::raise(PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE, "text contains a NUL character")
    })
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

/// The elements of a pointer `List` (NIL has none), in order, as `*mut T`.
///
/// # Safety
/// `list` is NIL or a valid `List` of pointers to `T`, neither changed nor
/// freed while the iterator is in use.
pub unsafe fn list_iter<T>(list: *mut pg_sys::List) -> impl Iterator<Item = *mut T> {
    // SAFETY: per the contract; the elements array holds `length` cells.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_List) };
    // SAFETY: the cells of a pointer List hold pointers.
    cells.iter().map(|c| unsafe { c.ptr_value } as *mut T)
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

/// Element `n` (0-based) of a pointer `List`, if it has one.
///
/// # Safety
/// As for [`list_iter`].
pub unsafe fn list_nth<T>(list: *mut pg_sys::List, n: usize) -> Option<*mut T> {
    // SAFETY: per the contract; the elements array holds `length` cells.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_List) };
    // SAFETY: the cells of a pointer List hold pointers.
    cells.get(n).map(|c| unsafe { c.ptr_value } as *mut T)
}

/// How many elements a `List` has (NIL has none).
///
/// # Safety
/// `list` is NIL or a valid `List`.
pub unsafe fn list_len(list: *mut pg_sys::List) -> usize {
    // SAFETY: per the contract.
    if list.is_null() {
        0
    } else {
        unsafe { (*list).length as usize }
    }
}

/// The oids of an `OidList` (NIL has none), in order.
///
/// # Safety
/// `list` is NIL or a valid `OidList`, neither changed nor freed while the
/// iterator is in use.
pub unsafe fn list_oids(list: *mut pg_sys::List) -> impl Iterator<Item = Oid> {
    // SAFETY: per the contract.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_OidList) };
    // SAFETY: the cells of an OidList hold oids.
    cells.iter().map(|c| unsafe { c.oid_value })
}

/// The integers of an `IntList` (NIL has none), in order.
///
/// # Safety
/// `list` is NIL or a valid `IntList`, neither changed nor freed while the
/// iterator is in use.
pub unsafe fn list_ints(list: *mut pg_sys::List) -> impl Iterator<Item = i32> {
    // SAFETY: per the contract.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_IntList) };
    // SAFETY: the cells of an IntList hold ints.
    cells.iter().map(|c| unsafe { c.int_value })
}

/// The members of a `Bitmapset` (NULL has none), in increasing order.
///
/// # Safety
/// `set` is NULL or a valid Bitmapset, neither changed nor freed while the
/// iterator is in use.
pub unsafe fn bitmapset_members(set: *mut pg_sys::Bitmapset) -> impl Iterator<Item = i32> {
    let mut prev = -1;
    std::iter::from_fn(move || {
        // SAFETY: per the contract; bms_next_member reads only.
        let next = unsafe { pg_sys::bms_next_member(set, prev) };
        (next >= 0).then(|| {
            prev = next;
            next
        })
    })
}

/// # Safety
/// As for [`list_iter`]; `tag` is the kind of List expected.
unsafe fn list_cells<'a>(list: *mut pg_sys::List, tag: pg_sys::NodeTag) -> &'a [pg_sys::ListCell] {
    if list.is_null() {
        return &[];
    }
    // SAFETY: per the contract: a valid List whose `elements` holds
    // `length` cells.  A List of another kind would be misread.
    unsafe {
        assert_eq!((*list).type_, tag, "a List of another kind");
        std::slice::from_raw_parts((*list).elements, (*list).length as usize)
    }
}

/// A new pointer `List` of `items`, allocated in the current memory context.
pub fn make_list<T>(items: impl IntoIterator<Item = *mut T>) -> *mut pg_sys::List {
    items.into_iter().fold(std::ptr::null_mut(), |list, item| {
        // SAFETY: lappend extends NIL or a List it made, in the current
        // memory context.
        unsafe { pg_sys::lappend(list, item as *mut std::ffi::c_void) }
    })
}

/// The tag of a node (plan, plan state, expression, path, ...).
///
/// # Safety
/// `n` points to a Postgres node: every node starts with its tag.
pub unsafe fn node_tag<T>(n: *const T) -> pg_sys::NodeTag {
    // SAFETY: per the contract.
    unsafe { (*(n as *const pg_sys::Node)).type_ }
}

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

/// Runs `f` (which runs SQL of ours) with `search_path` set to
/// `pg_catalog, pg_temp` and `row_security` on, whatever the caller set:
/// no object or operator the caller planted can stand in for ours, and no
/// internal statement fails because the caller turned row security off.
/// The settings come back when `f` returns; after an ERROR the transaction
/// abort restores them.
pub fn with_pinned_settings<R>(f: impl FnOnce() -> R) -> R {
    with_settings(&[(c"search_path", c"pg_catalog, pg_temp"), (c"row_security", c"on")], f)
}

/// Runs `f` with `settings` set for its duration, as a function's SET
/// clauses are; they come back when `f` returns, and after an ERROR the
/// transaction abort restores them.
pub fn with_settings<R>(settings: &[(&CStr, &CStr)], f: impl FnOnce() -> R) -> R {
    // SAFETY: the GUC nest-level protocol, as SECURITY DEFINER functions
    // with SET clauses use it.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        for (name, value) in settings {
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

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    const AWKWARD: &[&str] = &["plain", "Mixed Case", "with \"quotes\"", "select", "it's", "back\\slash", "é", ""];

    #[pg_test]
    fn quoted_names_and_literals_read_back_as_themselves() {
        for &s in AWKWARD {
            let back = Spi::get_one::<String>(&format!("SELECT {}", quote_literal(s))).unwrap();
            assert_eq!(back.as_deref(), Some(s), "literal {}", quote_literal(s));
            if s.is_empty() {
                continue; // no identifier is empty
            }
            Spi::run(&format!("CREATE TEMP TABLE quoting ({} int)", quote_ident(s))).unwrap();
            let name = Spi::get_one::<String>(
                "SELECT attname::text FROM pg_catalog.pg_attribute WHERE attrelid = 'quoting'::pg_catalog.regclass AND attnum = 1",
            )
            .unwrap();
            assert_eq!(name.as_deref(), Some(s), "identifier {}", quote_ident(s));
            Spi::run("DROP TABLE quoting").unwrap();
        }
        // Backslashes make an E'' literal, right whatever standard_conforming_strings says.
        Spi::run("SET LOCAL standard_conforming_strings = off").unwrap();
        let back = Spi::get_one::<String>(&format!("SELECT {}", quote_literal("back\\slash"))).unwrap();
        assert_eq!(back.as_deref(), Some("back\\slash"));
    }

    #[pg_test]
    fn relation_names_for_messages_and_for_sql() {
        Spi::run("CREATE SCHEMA \"Other Schema\"; CREATE TABLE \"Other Schema\".\"My Table\" (k int)").unwrap();
        let oid = Spi::get_one::<Oid>("SELECT '\"Other Schema\".\"My Table\"'::pg_catalog.regclass::pg_catalog.oid")
            .unwrap()
            .unwrap();
        assert_eq!(rel_name(oid), "My Table");
        assert_eq!(qualified_name(oid), "\"Other Schema\".\"My Table\"");
        // Not on the search_path: qualified; on it: the bare (quoted) name.
        assert_eq!(regclass_text(oid), "\"Other Schema\".\"My Table\"");
        Spi::run("SET LOCAL search_path = \"Other Schema\", public").unwrap();
        assert_eq!(regclass_text(oid), "\"My Table\"");
        let gone = Oid::from(4_000_000_000);
        assert_eq!(rel_name(gone), "4000000000");
    }

    #[pg_test]
    fn input_datum_applies_the_type_and_its_typmod() {
        assert_eq!(input_datum(pg_sys::INT4OID, -1, "-42").value() as i32, -42);
        // char(4): the input function pads to the typmod's length.
        let d = input_datum(pg_sys::BPCHAROID, 4 + pg_sys::VARHDRSZ as i32, "ab");
        // SAFETY: a non-null bpchar datum.
        assert_eq!(unsafe { varlena_bytes(d) }, b"ab  ");
    }

    #[pg_test(error = "invalid input syntax for type integer: \"forty-two\"")]
    fn input_datum_raises_the_types_own_error() {
        input_datum(pg_sys::INT4OID, -1, "forty-two");
    }

    /// Varlenas come short (1-byte header), plain, compressed inline and
    /// toasted out of line; each reads back as the bytes stored.
    #[pg_test]
    fn varlena_bytes_reads_every_storage_form() {
        let long: String = (0..20_000u32).map(|i| char::from(b'a' + (i.wrapping_mul(7919) % 26) as u8)).collect();
        let values = ["short".to_string(), "p".repeat(500), "ab".repeat(3000), long];
        Spi::run("CREATE TABLE vb (id int, v text)").unwrap();
        for (id, v) in values.iter().enumerate() {
            // Storage applies to values as they are written.
            let storage = ["MAIN", "MAIN", "MAIN", "EXTERNAL"][id];
            Spi::run(&format!("ALTER TABLE vb ALTER COLUMN v SET STORAGE {storage}")).unwrap();
            Spi::run_with_args("INSERT INTO vb VALUES ($1, $2)", &[(id as i32).into(), v.clone().into()]).unwrap();
        }
        let mut forms = Vec::new();
        Spi::connect(|c| {
            let mut rows = c.select("SELECT v FROM vb ORDER BY id", None, &[]).unwrap();
            let mut id = 0;
            while rows.next().is_some() {
                let d = rows.get_datum_by_ordinal(1).unwrap().unwrap();
                // SAFETY: a non-null text datum of the result; its first
                // byte is the varlena header.
                let (header, bytes) = unsafe { (*d.cast_mut_ptr::<u8>(), varlena_bytes(d)) };
                forms.push(match header {
                    0x01 => "external",
                    h if h & 0x01 == 0x01 => "short",
                    h if h & 0x03 == 0x02 => "compressed",
                    _ => "plain",
                });
                assert_eq!(bytes, values[id].as_bytes(), "value {id} ({})", forms[id]);
                id += 1;
            }
        });
        assert_eq!(forms, ["short", "plain", "compressed", "external"]);
    }

    #[pg_test]
    fn lists_are_walked_and_built_in_order() {
        // SAFETY: makeInteger pallocs a node.
        let nodes: Vec<*mut pg_sys::Node> = (1..=5).map(|i| unsafe { pg_sys::makeInteger(i) } as *mut _).collect();
        let list = make_list(nodes.iter().copied());
        // SAFETY: a List we just built, and NIL.
        unsafe {
            assert_eq!((*list).length, 5);
            assert_eq!(list_iter::<pg_sys::Node>(list).collect::<Vec<_>>(), nodes);
            assert_eq!(list_nth::<pg_sys::Node>(list, 4), Some(nodes[4]));
            assert_eq!(list_nth::<pg_sys::Node>(list, 5), None);
            assert_eq!(list_iter::<pg_sys::Node>(std::ptr::null_mut()).count(), 0);
            assert!(make_list::<pg_sys::Node>([]).is_null(), "an empty List is NIL");
        }
        let oids = [Oid::from(7), Oid::from(9), Oid::from(4_000_000_000)];
        // SAFETY: lappend_oid builds an OidList in the current context.
        let list = oids.iter().fold(std::ptr::null_mut(), |l, &o| unsafe { pg_sys::lappend_oid(l, o) });
        // SAFETY: the OidList just built.
        assert_eq!(unsafe { list_oids(list) }.collect::<Vec<_>>(), oids);
    }

    /// Whether this backend holds `mode` on `relid`.
    fn holds(relid: Oid, mode: &str) -> bool {
        Spi::get_one_with_args::<bool>(
            "SELECT count(*) > 0 FROM pg_catalog.pg_locks
              WHERE locktype = 'relation' AND relation = $1 AND mode = $2 AND pid = pg_catalog.pg_backend_pid()",
            &[relid.into(), mode.into()],
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn open_rel_releases_its_lock_unless_asked_to_keep_it() {
        // A catalog nothing else in this transaction touches.
        let relid = Spi::get_one::<Oid>("SELECT 'pg_catalog.pg_seclabel'::pg_catalog.regclass::pg_catalog.oid")
            .unwrap()
            .unwrap();
        assert!(!holds(relid, "RowShareLock"));
        {
            let rel = OpenRel::open(relid, pg_sys::RowShareLock);
            assert_eq!((rel.oid(), rel.name(), rel.relkind()), (relid, "pg_seclabel".to_string(), b'r'));
            assert!(rel.index().is_none());
            assert!(!rel.index_oids().is_empty());
            assert!(holds(relid, "RowShareLock"));
        }
        assert!(!holds(relid, "RowShareLock"), "dropping the handle released the lock");
        OpenRel::open(relid, pg_sys::RowShareLock).keeping_lock().close();
        assert!(holds(relid, "RowShareLock"), "kept to the end of the transaction");
        assert!(OpenRel::try_open(Oid::from(4_000_000_000), pg_sys::AccessShareLock).is_none());
        let index =
            OpenRel::open(OpenRel::open(relid, pg_sys::AccessShareLock).index_oids()[0], pg_sys::AccessShareLock);
        assert_eq!(index.index().map(|i| i.indrelid), Some(relid));
    }
}
