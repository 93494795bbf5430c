//! A latched table's key, read from its key index, and the rules for which
//! keys pgkvx accepts.
//!
//! The codec must order keys exactly as the index does.  Anything it cannot
//! reproduce — an expression or partial index, a nullable column, a type
//! without a codec, text under a collation that does not sort in byte order,
//! a non-default operator class — is refused here with an error that names
//! the column and says how to fix it.  Accepting it would mean wrong spans,
//! and wrong spans mean skipped rows.

use super::codec::KeyKind;
use crate::errors;
use crate::pg::{quote_ident, quote_literal, regclass_text, rel_name, Attr, OpenRel};
use pgrx::pg_sys::{self, Oid};
use pgrx::PgSqlErrorCode;
use std::ffi::CStr;

/// One key column, in index order.
#[derive(Clone, Debug)]
pub struct KeyCol {
    pub attnum: i16,
    pub name: String,
    /// The column's type (domains resolved to their base type).
    pub typid: Oid,
    pub kind: KeyKind,
    pub desc: bool,
    /// The key index's btree operator family for the column: the operators
    /// whose quals bound a declared span.
    pub opfamily: Oid,
    /// The key index's collation for the column (InvalidOid when the type
    /// has none).
    pub collation: Oid,
}

impl KeyCol {
    /// Whether a comparison under `collation` orders this column as the
    /// key does: always for types without collations and for pattern
    /// operators, which compare bytes; otherwise only byte-order
    /// collations.
    pub fn orders_like_key(&self, collation: Oid) -> bool {
        self.collation == pg_sys::InvalidOid
            || is_pattern_family(self.opfamily)
            || collation == self.collation
            || (collation != pg_sys::InvalidOid && crate::pg::collation_is_bytewise(collation))
    }
}

fn is_pattern_family(family: Oid) -> bool {
    family == pg_sys::TEXT_PATTERN_BTREE_FAM_OID || family == pg_sys::BPCHAR_PATTERN_BTREE_FAM_OID
}

/// The key of a latched table.
#[derive(Clone, Debug)]
pub struct KeyDesc {
    pub relid: Oid,
    pub relname: String,
    pub index: Oid,
    pub index_name: String,
    pub cols: Vec<KeyCol>,
}

fn type_name(typid: Oid) -> String {
    // SAFETY: format_type_be always returns a palloc'd string.
    unsafe { CStr::from_ptr(pg_sys::format_type_be(typid)) }.to_string_lossy().into_owned()
}

fn collation_name(coll: Oid) -> String {
    // SAFETY: returns a palloc'd name or NULL.
    let p = unsafe { pg_sys::get_collation_name(coll) };
    if p.is_null() {
        "default".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The codec for a (base) type, if there is one.
pub fn kind_of(typid: Oid) -> Option<KeyKind> {
    Some(match typid {
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => KeyKind::Int,
        pg_sys::BOOLOID => KeyKind::Bool,
        pg_sys::UUIDOID => KeyKind::Uuid,
        pg_sys::BYTEAOID => KeyKind::Bytes,
        pg_sys::TEXTOID | pg_sys::VARCHAROID => KeyKind::Text,
        pg_sys::BPCHAROID => KeyKind::BpChar,
        pg_sys::DATEOID => KeyKind::Date,
        pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => KeyKind::Timestamp,
        _ => return None,
    })
}

impl KeyDesc {
    /// Resolves and validates the key of `relid`: `index`, or the primary
    /// key when `None`.  Raises a clear ERROR when pgkvx cannot latch it.
    pub fn resolve(relid: Oid, index: Option<Oid>) -> KeyDesc {
        let rel = OpenRel::open(relid, pg_sys::AccessShareLock);
        let relname = rel_name(relid);
        check_latchable_table(&rel, &relname);
        let index = index.unwrap_or_else(|| primary_key_or_refuse(&rel, relid, &relname));
        let idx = OpenRel::open(index, pg_sys::AccessShareLock);
        let index_name = rel_name(index);
        let ind = check_key_index(&idx, relid, &relname, &index_name);
        let nkeys = ind.indnkeyatts as usize;
        // SAFETY: indkey holds indnatts >= indnkeyatts entries.
        let attnums = unsafe { ind.indkey.values.as_slice(nkeys) }.to_vec();
        let attrs = rel.attrs();
        // How the user's session names the table, for suggested DDL.
        let table_sql = regclass_text(relid);
        let mut cols = Vec::with_capacity(nkeys);
        for (i, &attnum) in attnums.iter().enumerate() {
            // Expression columns (attnum 0) were refused above.
            let att = &attrs[attnum as usize - 1];
            cols.push(key_col(&idx, i, attnum, att, &relname, &table_sql));
        }
        KeyDesc { relid, relname, index, index_name, cols }
    }
}

/// Refuses a relation pgkvx cannot latch: anything but an ordinary or
/// partitioned table, and another session's temporary table.
fn check_latchable_table(rel: &OpenRel, relname: &str) {
    match rel.relkind() {
        // A partitioned table is latched as one: its partitions latch
        // under it (registry/partitions.rs).
        b'r' | b'p' => {}
        _ => errors::raise(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("pgkvx can latch only ordinary and partitioned tables; \"{relname}\" is not one"),
        ),
    }
    if rel.is_other_temp() {
        errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("cannot latch temporary table \"{relname}\" of another session"),
        );
    }
}

/// The table's primary key index, the key when none is named.
fn primary_key_or_refuse(rel: &OpenRel, relid: Oid, relname: &str) -> Oid {
    rel.primary_key_index().unwrap_or_else(|| {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INVALID_TABLE_DEFINITION,
            format!("table \"{relname}\" has no primary key to latch"),
            format!(
                "Add a primary key, or name a unique index: SELECT pgkvx.enable({}, 'the_index');",
                quote_literal(&regclass_text(relid))
            ),
        )
    })
}

/// Checks that `idx` is an index of `relid` whose order the codec can
/// reproduce as a whole (per column: `key_col`), and returns its row.
fn check_key_index<'a>(idx: &'a OpenRel, relid: Oid, relname: &str, index_name: &str) -> &'a pg_sys::FormData_pg_index {
    let Some(ind) = idx.index() else {
        errors::raise(PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE, format!("\"{index_name}\" is not an index"));
    };
    if ind.indrelid != relid {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("index \"{index_name}\" does not belong to table \"{relname}\""),
        );
    }
    let refuse = |why: &str| -> ! {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INVALID_TABLE_DEFINITION,
            format!("index \"{index_name}\" cannot be the key of \"{relname}\": {why}"),
            "Use the primary key or a unique, non-partial btree index on plain NOT NULL columns.",
        )
    };
    if idx.form().relam != pg_sys::BTREE_AM_OID {
        refuse("it is not a btree index");
    }
    if !ind.indisunique {
        refuse("it is not unique");
    }
    if !ind.indisvalid {
        refuse("it is not valid (a failed CREATE INDEX CONCURRENTLY?)");
    }
    // SAFETY: relcache helpers on an open index.
    if !unsafe { pg_sys::RelationGetIndexPredicate(idx.as_ptr()) }.is_null() {
        refuse("it is partial");
    }
    // SAFETY: as above.
    if !unsafe { pg_sys::RelationGetIndexExpressions(idx.as_ptr()) }.is_null() {
        refuse("it has expression columns");
    }
    ind
}

/// Key column `i` of index `idx` (table column `att`), once the codec is
/// known to order it exactly as the index does.
fn key_col(idx: &OpenRel, i: usize, attnum: i16, att: &Attr, relname: &str, table_sql: &str) -> KeyCol {
    let name = att.name.clone();
    check_plain_not_null(att, &name, relname, table_sql);
    // SAFETY: plain catalog lookup.
    let base = unsafe { pg_sys::getBaseType(att.typid) };
    let Some(kind) = kind_of(base) else {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "key column \"{name}\" of \"{relname}\" has type {}, which pgkvx cannot encode in index order",
                type_name(att.typid)
            ),
            "Supported key types: smallint, integer, bigint, boolean, uuid, bytea, text, varchar, char, date, timestamp, timestamptz.",
        );
    };
    // SAFETY: per-column index metadata arrays have nkeys > i entries.
    let (family, option, coll) = unsafe {
        let r = idx.get();
        (*r.rd_opfamily.add(i), *r.rd_indoption.add(i), *r.rd_indcollation.add(i))
    };
    let pattern_ops = is_pattern_family(family);
    if family != default_btree_family(base) && !pattern_ops {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("key column \"{name}\" of \"{relname}\" uses a non-default operator class"),
            "Index the column with its default btree operator class (or text_pattern_ops).",
        );
    }
    if matches!(kind, KeyKind::Text | KeyKind::BpChar) && !pattern_ops && !crate::pg::collation_is_bytewise(coll) {
        refuse_collation(att, &name, coll, relname, table_sql);
    }
    KeyCol {
        attnum,
        name,
        typid: base,
        kind,
        desc: option & pg_sys::INDOPTION_DESC as i16 != 0,
        opfamily: family,
        collation: coll,
    }
}

/// Refuses a key column whose value the latch trigger cannot see (stored
/// generated) or that can be NULL (which no key encoding holds).
fn check_plain_not_null(att: &Attr, name: &str, relname: &str, table_sql: &str) {
    if att.generated != 0 {
        // Stored generated columns are computed after BEFORE ROW
        // triggers: the latch trigger would see the old key.
        errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("key column \"{name}\" of \"{relname}\" is a generated column, which pgkvx cannot latch"),
        );
    }
    if !att.notnull {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INVALID_TABLE_DEFINITION,
            format!("key column \"{name}\" of \"{relname}\" may be NULL"),
            format!("ALTER TABLE {table_sql} ALTER COLUMN {} SET NOT NULL;", quote_ident(name)),
        );
    }
}

/// The operator family of `typid`'s default btree operator class
/// (InvalidOid when it has none): the order the codec reproduces.
fn default_btree_family(typid: Oid) -> Oid {
    // SAFETY: catalog lookups.
    unsafe {
        let opc = pg_sys::GetDefaultOpClass(typid, pg_sys::BTREE_AM_OID);
        if opc == pg_sys::InvalidOid {
            pg_sys::InvalidOid
        } else {
            pg_sys::get_opclass_family(opc)
        }
    }
}

/// Refuses a text key column indexed under a collation that does not sort
/// in byte order, with the DDL that fixes it.
fn refuse_collation(att: &Attr, name: &str, coll: Oid, relname: &str, table_sql: &str) -> ! {
    errors::raise_hint(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "key column \"{name}\" of \"{relname}\" ({}, collation \"{}\") does not sort in byte order",
            type_name(att.typid),
            collation_name(coll)
        ),
        format!(
            "pgkvx needs its key index to order by bytes. Use COLLATE \"C\": ALTER TABLE {table_sql} ALTER COLUMN {} TYPE {} COLLATE \"C\";",
            quote_ident(name),
            type_name(att.typid)
        ),
    )
}
