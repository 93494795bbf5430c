//! The planner's rewrite of identity draws: every `NextValueExpr` for a
//! gapless table's identity sequence becomes `pgkvx.next_key(table)`.

use super::sequence::gapless_identity_sequence;
use crate::errors;
use crate::pg::walk::{expression_tree_mutator, query_tree_mutator};
use crate::pg::{make_list, node_tag};
use pgrx::pg_sys::{self, Node, Oid};
use pgrx::prelude::*;
use std::ffi::{c_void, CStr};

/// `pgkvx.next_key(regclass)`, found in pgkvx's own schema (which only the
/// extension's owner can create objects in), never through search_path.
fn next_key_oid() -> Oid {
    // SAFETY: builds a qualified name list and looks it up in the catalog.
    unsafe {
        let names = make_list([
            pg_sys::makeString(pg_sys::pstrdup(c"pgkvx".as_ptr())) as *mut Node,
            pg_sys::makeString(pg_sys::pstrdup(c"next_key".as_ptr())) as *mut Node,
        ]);
        let argtypes = [pg_sys::REGCLASSOID];
        let oid = pg_sys::LookupFuncName(names, 1, argtypes.as_ptr(), true);
        if oid == pg_sys::InvalidOid {
            errors::raise_hint(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                "function pgkvx.next_key(regclass) does not exist",
                "ALTER EXTENSION pgkvx UPDATE;",
            );
        }
        oid
    }
}

/// What the mutator carries: the gapless identity tables met so far, by
/// their sequence, and the function that draws for them.
struct Rewrite {
    tables: Vec<(Oid, Oid)>,
    next_key: Option<Oid>,
}

impl Rewrite {
    /// Notes the result relation of `q` when it is a gapless identity table.
    ///
    /// # Safety
    /// `q` is a valid Query.
    unsafe fn note_target(&mut self, q: *mut pg_sys::Query) {
        // SAFETY: the caller passes a valid Query, whose rtable holds only RangeTblEntry nodes
        // (parsenodes.h); list_nth checks the 1-based resultRelation against the table's length.
        unsafe {
            let q = &*q;
            if !matches!(
                q.commandType,
                pg_sys::CmdType::CMD_INSERT | pg_sys::CmdType::CMD_UPDATE | pg_sys::CmdType::CMD_MERGE
            ) || q.resultRelation <= 0
            {
                return;
            }
            let Some(rte) = crate::pg::list_nth::<pg_sys::RangeTblEntry>(q.rtable, q.resultRelation as usize - 1)
            else {
                return;
            };
            if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION {
                return;
            }
            let relid = (*rte).relid;
            if let Some(seq) = gapless_identity_sequence(relid) {
                if !self.tables.iter().any(|&(s, _)| s == seq) {
                    self.tables.push((seq, relid));
                }
            }
        }
    }
}

/// Whether `q` (or a data-modifying CTE of it) may write a gapless
/// identity table: the cheap test every planned statement passes.
///
/// # Safety
/// `q` is a valid Query.
unsafe fn may_draw_identity(q: *mut pg_sys::Query) -> bool {
    // SAFETY: the caller passes a valid Query; only its flags and its result relation's range table entry
    // are read (note_target).
    unsafe {
        if (*q).hasModifyingCTE {
            return true;
        }
        let mut r = Rewrite { tables: Vec::new(), next_key: None };
        r.note_target(q);
        !r.tables.is_empty()
    }
}

/// Called by the planner hook before planning: `parse` with every
/// identity draw for a gapless table's key replaced by `pgkvx.next_key`.
///
/// # Safety
/// `parse` is the Query about to be planned, which the planner may change.
pub unsafe fn draw_through_next_key(parse: *mut pg_sys::Query) -> *mut pg_sys::Query {
    // SAFETY: the caller passes the Query about to be planned, which the planner may change; the mutator
    // copies what it changes below the top, and changes the top-level Query in place
    // (QTW_DONT_COPY_QUERY), as the planner itself would.
    unsafe {
        if parse.is_null() || (*parse).commandType == pg_sys::CmdType::CMD_UTILITY || !may_draw_identity(parse) {
            return parse;
        }
        let mut r = Rewrite { tables: Vec::new(), next_key: None };
        r.note_target(parse);
        let cx = &mut r as *mut Rewrite as *mut c_void;
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            query_tree_mutator(parse, Some(mutate), cx, pg_sys::QTW_DONT_COPY_QUERY as i32)
        })
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn mutate(node: *mut Node, cx: *mut c_void) -> *mut Node {
    if node.is_null() {
        return node;
    }
    // SAFETY: nodes of a valid tree, cast after their tag is checked; `cx`
    // is the Rewrite of draw_through_next_key, alive for the whole walk.
    unsafe {
        let r = &mut *(cx as *mut Rewrite);
        match node_tag(node) {
            pg_sys::NodeTag::T_Query => {
                // A data-modifying CTE (or a subquery) with its own target.
                r.note_target(node as *mut pg_sys::Query);
                pg_sys::ffi::pg_guard_ffi_boundary(|| {
                    query_tree_mutator(node as *mut pg_sys::Query, Some(mutate), cx, 0) as *mut Node
                })
            }
            pg_sys::NodeTag::T_NextValueExpr => {
                let nv = &*(node as *mut pg_sys::NextValueExpr);
                match r.tables.iter().find(|&&(seq, _)| seq == nv.seqid) {
                    Some(&(_, relid)) => {
                        let funcid = *r.next_key.get_or_insert_with(next_key_oid);
                        next_key_call(funcid, relid, nv.typeId)
                    }
                    None => node,
                }
            }
            _ => pg_sys::ffi::pg_guard_ffi_boundary(|| expression_tree_mutator(node, Some(mutate), cx)),
        }
    }
}

/// `pgkvx.next_key(relid)` as an expression of type `typid` (the key
/// column's: int2, int4 or int8).
///
/// # Safety
/// Called while planning, in the planner's memory context.
unsafe fn next_key_call(funcid: Oid, relid: Oid, typid: Oid) -> *mut Node {
    // SAFETY: node constructors; the cast is an ordinary assignment
    // coercion between integer types.
    unsafe {
        let arg =
            pg_sys::makeConst(pg_sys::REGCLASSOID, -1, pg_sys::InvalidOid, 4, pg_sys::Datum::from(relid), false, true);
        let call = pg_sys::makeFuncExpr(
            funcid,
            pg_sys::INT8OID,
            make_list([arg as *mut Node]),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        ) as *mut Node;
        if typid == pg_sys::INT8OID {
            return call;
        }
        let cast = pg_sys::coerce_to_target_type(
            std::ptr::null_mut(),
            call,
            pg_sys::INT8OID,
            typid,
            -1,
            pg_sys::CoercionContext::COERCION_ASSIGNMENT,
            pg_sys::CoercionForm::COERCE_IMPLICIT_CAST,
            -1,
        );
        if cast.is_null() {
            errors::raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!(
                    "cannot draw a gapless key of type {}",
                    CStr::from_ptr(pg_sys::format_type_be(typid)).to_string_lossy()
                ),
            );
        }
        cast
    }
}

/// What differs between majors in identity keys.
#[cfg(all(feature = "pg_test", identity_shared_with_partitions))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// From PostgreSQL 17 a partition shares its root's identity: an INSERT
    /// straight into a partition of a gapless identity tree draws through
    /// `next_key` as one into the root does.
    #[pg_test]
    fn inserts_into_a_partition_draw_the_roots_gapless_identity() {
        Spi::run(
            "CREATE TABLE pi (id bigint GENERATED ALWAYS AS IDENTITY, r int NOT NULL, v text, PRIMARY KEY (id, r))
                 PARTITION BY LIST (r);
             CREATE TABLE pi1 PARTITION OF pi FOR VALUES IN (1);
             SELECT pgkvx.enable('pi', gapless => true);
             INSERT INTO pi (r, v) VALUES (1, 'through the root');
             INSERT INTO pi1 (r, v) VALUES (1, 'straight into the partition');
             INSERT INTO pi (r, v) VALUES (1, 'through the root again')",
        )
        .unwrap();
        let ids = Spi::get_one::<String>("SELECT string_agg(id::text, ',' ORDER BY id) FROM pi").unwrap();
        assert_eq!(ids.as_deref(), Some("1,2,3"), "the keys of a gapless tree have no gaps");
    }
}
