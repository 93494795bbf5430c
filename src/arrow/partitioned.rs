//! `pgkvx.arrow_scan` over a partitioned table.  Its rows live in the
//! partitions, merged in key order: the scan is the query
//! `SELECT <columns> FROM <parent> WHERE <key> >= lower AND <key> < upper
//! ORDER BY <key> LIMIT max_rows`, run as `arrow_query` runs a query --
//! through the executor, where each partition's scan is guarded under the
//! parent's latches (the read protocol, per `pgkvx.scan_mode`, for the
//! whole statement) and privileges are checked as for that SELECT.  Every
//! name in it is qualified and every value a quoted literal cast to the
//! column's type, so neither search_path nor the values can change it.

use super::scan::ScanRequest;
use crate::errors;
use crate::pg::{qualified_name, quote_ident, quote_literal, Attr, OpenRel};
use crate::registry;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::CStr;

fn type_sql(typid: pg_sys::Oid) -> String {
    // SAFETY: returns a palloc'd, schema-qualified type name.
    unsafe { CStr::from_ptr(pg_sys::format_type_be_qualified(typid)) }.to_string_lossy().into_owned()
}

/// The query arrow_scan runs for partitioned table `req.rel`.
pub fn query(req: &ScanRequest) -> String {
    let rel = OpenRel::open(req.rel, pg_sys::AccessShareLock);
    let relname = rel.name();
    let attrs = rel.attrs();
    let live: Vec<_> = attrs.iter().filter(|a| !a.dropped).collect();
    let projected = requested_columns(&live, req.columns.as_ref(), &relname);
    if crate::pg::acl::rls_applies(req.rel) {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("row level security applies to table \"{relname}\"; pgkvx.arrow_scan does not evaluate policies"),
            "Use pgkvx.arrow_query('SELECT ... FROM ... ORDER BY ...'), which applies the table's policies.",
        );
    }
    let key = key_columns(&rel, &live);
    let mut sql = format!(
        "SELECT {} FROM {}",
        projected.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", "),
        qualified_name(req.rel)
    );
    if req.lower.is_some() || req.upper.is_some() {
        sql.push_str(&bounds_sql(req, &key, &relname));
    }
    if !key.is_empty() {
        let order: Vec<String> =
            key.iter().map(|(c, _, desc)| format!("{}{}", quote_ident(c), if *desc { " DESC" } else { "" })).collect();
        sql.push_str(&format!(" ORDER BY {}", order.join(", ")));
    }
    if let Some(m) = req.max_rows {
        sql.push_str(&format!(" LIMIT {m}"));
    }
    sql
}

/// The output columns by name: every live column when `columns` is NULL,
/// else the named ones, each a live column named once.
fn requested_columns(live: &[&Attr], columns: Option<&Vec<String>>, relname: &str) -> Vec<String> {
    let Some(names) = columns else {
        return live.iter().map(|a| a.name.clone()).collect();
    };
    if names.is_empty() {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "columns must name at least one column (or be NULL for all)",
        );
    }
    for (i, n) in names.iter().enumerate() {
        if !live.iter().any(|a| &a.name == n) {
            errors::raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!("column \"{n}\" of relation \"{relname}\" does not exist"),
            );
        }
        if names[..i].contains(n) {
            errors::raise(
                PgSqlErrorCode::ERRCODE_DUPLICATE_COLUMN,
                format!("column \"{n}\" is requested more than once"),
            );
        }
    }
    names.clone()
}

/// The key the rows are ordered by, as (name, type, descending) per
/// column: the latched key (a gapless tail key may be one column of the
/// primary key), else the primary key; none without either.
fn key_columns(rel: &OpenRel, live: &[&Attr]) -> Vec<(String, pg_sys::Oid, bool)> {
    let latched = registry::lookup(rel.oid());
    if let Some(l) = &latched {
        crate::read::admit::warn_if_exposed(l);
    }
    match &latched {
        Some(l) => l.key.cols.iter().map(|c| (c.name.clone(), attr_type(live, &c.name), c.desc)).collect(),
        None => rel
            .primary_key_index()
            .map(|ix| {
                let ir = OpenRel::open(ix, pg_sys::AccessShareLock);
                let ind = ir.index().expect("an index");
                // SAFETY: indkey holds indnkeyatts entries.
                let attnums = unsafe { ind.indkey.values.as_slice(ind.indnkeyatts as usize) }.to_vec();
                attnums
                    .iter()
                    .filter_map(|&n| live.iter().find(|a| a.attnum == n))
                    .map(|a| (a.name.clone(), a.typid, false))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// ` WHERE` and the bounds on the key's one column, each a literal cast to
/// the column's type.
fn bounds_sql(req: &ScanRequest, key: &[(String, pg_sys::Oid, bool)], relname: &str) -> String {
    let [(col, typid, _)] = key else {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("bounds on the multi-column key of \"{relname}\" are not supported"),
            "Pass NULL bounds, or filter with pgkvx.arrow_query.",
        )
    };
    let ty = type_sql(*typid);
    let mut conds = Vec::new();
    if let Some(lo) = &req.lower {
        conds.push(format!("{} OPERATOR(pg_catalog.>=) CAST({} AS {ty})", quote_ident(col), quote_literal(lo)));
    }
    if let Some(hi) = &req.upper {
        conds.push(format!("{} OPERATOR(pg_catalog.<) CAST({} AS {ty})", quote_ident(col), quote_literal(hi)));
    }
    format!(" WHERE {}", conds.join(" AND "))
}

fn attr_type(live: &[&Attr], name: &str) -> pg_sys::Oid {
    live.iter().find(|a| a.name == name).map_or(pg_sys::InvalidOid, |a| a.typid)
}
