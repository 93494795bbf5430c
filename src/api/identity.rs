//! Gapless identity keys.
//!
//! An identity column has no DEFAULT to replace with `pgkvx.next_key`: the
//! rewriter puts a `NextValueExpr` for the column's sequence wherever an
//! INSERT (multi-row VALUES, INSERT ... SELECT, ON CONFLICT ... SET id =
//! DEFAULT), an UPDATE's `SET id = DEFAULT` or a MERGE action leaves the
//! key to it, and the executor draws from the sequence with nothing
//! latched.  So every statement that reaches the planner with such an
//! expression for a gapless table's key sequence gets, in its place, the
//! call the serial default would make: `pgkvx.next_key(table)`, which
//! draws and latches in one step.  The planner sees every statement
//! (prepared ones, PL/pgSQL and SQL functions, rule actions, inserts
//! through views), and `enable`/`disable` invalidate the table's relcache
//! entry, which drops every cached plan that writes it — also plans made
//! before `enable`, whose unlatched draws the row trigger would refuse.
//!
//! What does not pass the planner is stopped in ProcessUtility: `COPY
//! FROM` that leaves the key to the identity default (COPY evaluates it
//! itself, unlatched), and DDL that moves a gapless table's key sequence
//! backwards (`ALTER SEQUENCE`/`ALTER TABLE ... ALTER COLUMN` with
//! RESTART, a negative INCREMENT, CYCLE, and
//! `TRUNCATE ... RESTART IDENTITY`), for serial and identity keys alike.
//! `setval` is a plain function call anyone with UPDATE on the sequence
//! can make from anywhere, so it is not hooked: `pgkvx.check()` reports a
//! key sequence that is behind the highest key in its table.

use crate::errors;
use crate::pg::{list_iter, make_list, node_tag, qualified_name, quote_ident, quote_literal, rel_name, OpenRel};
use crate::registry;
use pgrx::pg_sys::{self, Node, Oid};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};

use crate::pg::walk::{expression_tree_mutator, query_tree_mutator};

thread_local! {
    /// Per table: the identity sequence of its gapless key column, or None
    /// when the table is not a gapless identity table.  Dropped with the
    /// table's relcache entry (enable, disable, identity DDL all send one).
    static IDENTITY_SEQUENCES: RefCell<HashMap<Oid, Option<Oid>>> = RefCell::new(HashMap::new());
}

/// Installs the cache's relcache callback; called from `_PG_init`.  The
/// utility checks run from the one ProcessUtility hook (utility.rs).
pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_inval), pg_sys::Datum::from(0)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_inval(_arg: pg_sys::Datum, relid: Oid) {
    // Runs inside invalidation processing: no catalog access here.
    IDENTITY_SEQUENCES.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                c.clear();
            } else {
                c.remove(&relid);
            }
        }
    });
    super::next_key::forget_sequence(relid);
}

/// Whether column `attnum` of `relid` is an identity column.
pub fn is_identity(relid: Oid, attnum: i16) -> bool {
    // SAFETY: a syscache probe, released before returning.
    unsafe {
        let t = pg_sys::SearchSysCache2(
            pg_sys::SysCacheIdentifier::ATTNUM as i32,
            pg_sys::Datum::from(relid),
            pg_sys::Datum::from(attnum),
        );
        if t.is_null() {
            return false;
        }
        let identity = (*(pg_sys::GETSTRUCT(t) as *const pg_sys::FormData_pg_attribute)).attidentity != 0;
        pg_sys::ReleaseSysCache(t);
        identity
    }
}

/// The key column (number, name) of `relid` when it is registered gapless
/// with a one-column key.  Read from its registration, not the registry's
/// lookup, which raises for a table that lost its key index: the hooks
/// asking this run for every write and DDL (a restore copies rows in before
/// it creates the primary key), and must leave those errors to the writes
/// that need the key.
fn gapless_key(relid: Oid) -> Option<(i16, String)> {
    let reg = registry::registration(relid).filter(|r| r.gapless)?;
    let attnum = match reg.key_columns.as_deref() {
        Some(&[attnum]) => attnum,
        Some(_) => return None,
        // Registered through 0.1.0's SQL, whose table has no key_columns.
        None => {
            let rel = OpenRel::try_open(relid, pg_sys::AccessShareLock)?;
            let index = reg.key_index.or_else(|| rel.primary_key_index())?;
            let ir = OpenRel::try_open(index, pg_sys::AccessShareLock)?;
            let ind = ir.index()?;
            if ind.indnkeyatts != 1 {
                return None;
            }
            // SAFETY: indkey holds at least indnkeyatts entries.
            unsafe { ind.indkey.values.as_slice(1)[0] }
        }
    };
    // SAFETY: a syscache lookup; NULL for a missing column.
    let name = unsafe {
        let name = pg_sys::get_attname(relid, attnum, true);
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
    }?;
    Some((attnum, name))
}

/// The identity sequence of column `attnum` of `relid`, or InvalidOid.
///
/// # Safety
/// A transaction is open (catalog and relcache lookups).
#[cfg(any(feature = "pg15", feature = "pg16"))]
unsafe fn identity_sequence(relid: Oid, attnum: i16) -> Oid {
    // SAFETY: per contract.
    unsafe { pg_sys::getIdentitySequence(relid, attnum, true) }
}

/// PG17 takes the relation (and answers for a partition with its root's
/// sequence).  A relcache reference takes no lock, as the oid-only call
/// did: a lock here could be upgraded by the ALTER TABLE that follows.
///
/// # Safety
/// A transaction is open (catalog and relcache lookups).
#[cfg(any(feature = "pg17", feature = "pg18"))]
unsafe fn identity_sequence(relid: Oid, attnum: i16) -> Oid {
    // SAFETY: per contract; the reference is released before returning.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return pg_sys::InvalidOid;
        }
        let seq = pg_sys::getIdentitySequence(rel, attnum, true);
        pg_sys::RelationClose(rel);
        seq
    }
}

/// The identity sequence of `relid`'s key column when `relid` is latched
/// gapless (itself, or as a partition of a latched gapless tree: from
/// PostgreSQL 17 a partition shares its root's identity) and its key is an
/// identity column.
fn gapless_identity_sequence(relid: Oid) -> Option<Oid> {
    if let Some(hit) = IDENTITY_SEQUENCES.with(|c| c.borrow().get(&relid).copied()) {
        return hit;
    }
    let root = registry::latch_root_unlocked(relid);
    let found = gapless_key(root).and_then(|(root_attnum, name)| {
        let attnum = if root == relid {
            root_attnum
        } else {
            let name = std::ffi::CString::new(name).ok()?;
            // SAFETY: a syscache lookup; InvalidAttrNumber (0) when missing.
            unsafe { pg_sys::get_attnum(relid, name.as_ptr()) }
        };
        if attnum <= 0 || !is_identity(relid, attnum) {
            return None;
        }
        // SAFETY: a pg_depend lookup; InvalidOid when there is none.
        let seq = unsafe { identity_sequence(relid, attnum) };
        (seq != pg_sys::InvalidOid).then_some(seq)
    });
    IDENTITY_SEQUENCES.with(|c| c.borrow_mut().insert(relid, found));
    found
}

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
        // SAFETY: per contract; resultRelation indexes the range table.
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
    // SAFETY: per contract.
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
    // SAFETY: per contract; the mutator copies what it changes and the
    // top-level Query is changed in place (QTW_DONT_COPY_QUERY), as the
    // planner itself would.
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

// ---- ProcessUtility: what bypasses the planner ----------------------------

/// The gapless table whose key `seq` feeds, if any: serial sequences are
/// owned by their column (an auto dependency), identity ones internally.
fn gapless_table_of(seq: Oid) -> Option<Oid> {
    let mut table = pg_sys::InvalidOid;
    let mut col = 0i32;
    // SAFETY: pg_depend lookups filling the two out-parameters.
    let owned = unsafe {
        pg_sys::sequenceIsOwned(seq, pg_sys::DependencyType::DEPENDENCY_AUTO as std::ffi::c_char, &mut table, &mut col)
            || pg_sys::sequenceIsOwned(
                seq,
                pg_sys::DependencyType::DEPENDENCY_INTERNAL as std::ffi::c_char,
                &mut table,
                &mut col,
            )
    };
    if !owned {
        return None;
    }
    gapless_key(table).is_some_and(|(attnum, _)| i32::from(attnum) == col).then_some(table)
}

/// Where a sequence stands: the last value it handed out (or one step
/// before the value it hands out next) and its start value.
struct Position {
    last: i64,
    start: i64,
    increment: i64,
}

/// Reads `seq`'s position straight from the sequence, as its owner's DDL
/// is about to change it (no SELECT privilege needed).
fn position(seq: Oid) -> Option<Position> {
    let rel = OpenRel::try_open(seq, pg_sys::AccessShareLock)?;
    // SAFETY: a sequence holds one tuple (last_value int8, log_cnt int8,
    // is_called bool), read through a catalog-style scan ended before the
    // relation closes; pg_sequence's syscache row gives start and step.
    unsafe {
        let scan = pg_sys::systable_beginscan(
            rel.as_ptr(),
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        let tup = pg_sys::systable_getnext(scan);
        let state = (!tup.is_null()).then(|| {
            let desc = rel.get().rd_att;
            let mut isnull = false;
            let last = pg_sys::heap_getattr(tup, 1, desc, &mut isnull).value() as i64;
            let called = pg_sys::heap_getattr(tup, 3, desc, &mut isnull).value() != 0;
            (last, called)
        });
        pg_sys::systable_endscan(scan);
        let (last, called) = state?;
        let t = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::SEQRELID as i32, pg_sys::Datum::from(seq));
        if t.is_null() {
            return None;
        }
        // pg_sequence: seqstart and seqincrement are its 3rd and 4th columns.
        let attr = |n: i16| {
            let mut isnull = false;
            let d = pg_sys::SysCacheGetAttr(pg_sys::SysCacheIdentifier::SEQRELID as i32, t, n, &mut isnull);
            (!isnull).then(|| d.value() as i64)
        };
        let (start, increment) = (attr(3).unwrap_or(1), attr(4).unwrap_or(1));
        pg_sys::ReleaseSysCache(t);
        // Not yet called: `last` is what it hands out next.
        Some(Position { last: if called { last } else { last.saturating_sub(increment.signum()) }, start, increment })
    }
}

fn refuse_move(table: Oid, seq: Oid, what: String) -> ! {
    let name = quote_literal(&crate::pg::regclass_text(table));
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("cannot {what} of sequence {}: it feeds the key of gapless table \"{}\"", qualified_name(seq), rel_name(table)),
        Some(
            "A key sequence moved backwards draws keys behind consumers' cursors, and consumers never see those rows."
                .to_string(),
        ),
        Some(format!(
            "Only RESTART WITH a value past the last key drawn is allowed; to reset the key space, SELECT pgkvx.disable({name}) first and pgkvx.enable({name}, gapless => true) after."
        )),
    )
}

/// Refuses a change to which sequence feeds gapless table `table`'s key.
fn refuse_key_sequence_change(table: Oid, what: &str) -> ! {
    let name = quote_literal(&crate::pg::regclass_text(table));
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("cannot {what} of gapless table \"{}\"", rel_name(table)),
        Some("Another sequence for the key, or one no longer tied to it, can draw keys behind consumers' cursors, and consumers never see those rows.".to_string()),
        Some(format!("SELECT pgkvx.disable({name}) first and pgkvx.enable({name}, gapless => true) after.")),
    )
}

/// The OWNED BY option of a sequence statement's options, if any.
///
/// # Safety
/// `options` is a List of DefElem.
unsafe fn owned_by(options: *mut pg_sys::List) -> Option<*mut pg_sys::List> {
    // SAFETY: per contract; OWNED BY's argument is a List of names.
    unsafe {
        list_iter::<pg_sys::DefElem>(options)
            .find(|&d| CStr::from_ptr((*d).defname).to_bytes() == b"owned_by")
            .map(|d| (*d).arg as *mut pg_sys::List)
    }
}

/// Refuses OWNED BY naming a gapless table's key column: a second sequence
/// tied to the key (or one swapped in for it) is one consumers' cursors do
/// not follow.
///
/// # Safety
/// `options` is a List of DefElem.
unsafe fn refuse_owned_by_gapless_key(options: *mut pg_sys::List) {
    // SAFETY: per contract; the names are String nodes, the last the column.
    unsafe {
        let Some(names) = owned_by(options) else { return };
        let n = pg_sys::list_length(names);
        if n < 2 {
            return; // OWNED BY NONE
        }
        let col = pg_sys::list_nth(names, n - 1) as *mut pg_sys::String;
        let Ok(col) = CStr::from_ptr((*col).sval).to_str() else { return };
        let table = pg_sys::list_truncate(pg_sys::list_copy(names), n - 1);
        let Some(relid) = crate::pg::relation_named(pg_sys::makeRangeVarFromNameList(table)) else { return };
        if gapless_key(relid).is_some_and(|(_, key)| key == col) {
            refuse_key_sequence_change(relid, "tie another sequence (OWNED BY) to the key");
        }
    }
}

/// Refuses sequence options that move `seq` (the key sequence of gapless
/// table `table`) backwards, now or later: RESTART at or below the last
/// value handed out, a negative INCREMENT and CYCLE.  (A CACHE other than 1
/// is refused where keys are drawn, by next_key.)
///
/// # Safety
/// `options` is a List of DefElem.
unsafe fn check_sequence_options(table: Oid, seq: Oid, options: *mut pg_sys::List) {
    // SAFETY: per contract; the defGet* helpers raise Postgres's own
    // errors for malformed values, as the statement would.
    unsafe {
        let defs: Vec<*mut pg_sys::DefElem> = list_iter(options).collect();
        let name = |d: *mut pg_sys::DefElem| CStr::from_ptr((*d).defname).to_bytes();
        let mut restart = None;
        let mut new_start = None;
        for &d in &defs {
            match name(d) {
                b"restart" => restart = Some(d),
                b"start" => new_start = Some(pg_sys::defGetInt64(d)),
                b"increment" if pg_sys::defGetInt64(d) < 0 => {
                    refuse_move(table, seq, "set a negative INCREMENT".into())
                }
                b"cycle" if pg_sys::defGetBoolean(d) => refuse_move(table, seq, "set CYCLE".into()),
                _ => {}
            }
        }
        let Some(restart) = restart else { return };
        // Its lock first (what the DDL takes, before its own checks): no
        // draw moves the position between this check and the change.
        pg_sys::LockRelationOid(seq, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE);
        let Some(pos) = position(seq) else { return };
        let to = if (*restart).arg.is_null() { new_start.unwrap_or(pos.start) } else { pg_sys::defGetInt64(restart) };
        let forward = if pos.increment >= 0 { to > pos.last } else { to < pos.last };
        if !forward {
            refuse_move(table, seq, format!("RESTART at {to}, not past the last value handed out ({})", pos.last));
        }
    }
}

/// Refuses, before Postgres runs it, a utility statement that would draw a
/// gapless key unlatched or move a gapless key sequence backwards.
///
/// # Safety
/// `pstmt` is the PlannedStmt handed to ProcessUtility.
#[pg_guard]
pub unsafe extern "C-unwind" fn check_utility(pstmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: per contract; nodes are checked by tag before each cast.
    unsafe {
        if pstmt.is_null() || !crate::pg::in_live_transaction() {
            return;
        }
        let stmt = (*pstmt).utilityStmt;
        if stmt.is_null() {
            return;
        }
        match node_tag(stmt) {
            pg_sys::NodeTag::T_CopyStmt => check_copy(&*(stmt as *mut pg_sys::CopyStmt)),
            pg_sys::NodeTag::T_AlterSeqStmt => {
                let s = &*(stmt as *mut pg_sys::AlterSeqStmt);
                let Some(seq) = crate::pg::relation_named(s.sequence) else { return };
                if !crate::pg::owns_relation(seq, pg_sys::GetUserId()) {
                    return; // Postgres refuses it
                }
                if let Some(table) = gapless_table_of(seq) {
                    if owned_by(s.options).is_some() {
                        // Moved off the key, the sequence could be restarted
                        // (and moved back) unchecked.
                        refuse_key_sequence_change(table, "change OWNED BY of the key sequence");
                    }
                    check_sequence_options(table, seq, s.options);
                }
                refuse_owned_by_gapless_key(s.options);
            }
            pg_sys::NodeTag::T_CreateSeqStmt => {
                let s = &*(stmt as *mut pg_sys::CreateSeqStmt);
                refuse_owned_by_gapless_key(s.options);
            }
            pg_sys::NodeTag::T_AlterTableStmt => {
                let s = &*(stmt as *mut pg_sys::AlterTableStmt);
                let Some(relid) = crate::pg::relation_named(s.relation) else { return };
                // Only identity options name the key's sequence here.
                let touches_identity = list_iter::<pg_sys::AlterTableCmd>(s.cmds).any(|c| {
                    matches!(
                        (*c).subtype,
                        pg_sys::AlterTableType::AT_SetIdentity
                            | pg_sys::AlterTableType::AT_DropIdentity
                            | pg_sys::AlterTableType::AT_AddIdentity
                    )
                });
                if !touches_identity || !crate::pg::owns_relation(relid, pg_sys::GetUserId()) {
                    return;
                }
                let Some((attnum, key)) = gapless_key(relid) else { return };
                for cmd in list_iter::<pg_sys::AlterTableCmd>(s.cmds) {
                    let c = &*cmd;
                    if c.name.is_null() || CStr::from_ptr(c.name).to_str() != Ok(key.as_str()) {
                        continue;
                    }
                    if matches!(
                        c.subtype,
                        pg_sys::AlterTableType::AT_DropIdentity | pg_sys::AlterTableType::AT_AddIdentity
                    ) {
                        // A new identity starts a new sequence at its start
                        // value: keys behind every consumer's cursor.
                        refuse_key_sequence_change(relid, "drop or add the identity of the key");
                    }
                    if c.subtype != pg_sys::AlterTableType::AT_SetIdentity {
                        continue;
                    }
                    let seq = identity_sequence(relid, attnum);
                    if seq != pg_sys::InvalidOid {
                        check_sequence_options(relid, seq, c.def as *mut pg_sys::List);
                    }
                }
            }
            pg_sys::NodeTag::T_TruncateStmt => {
                let s = &*(stmt as *mut pg_sys::TruncateStmt);
                if !s.restart_seqs {
                    return;
                }
                for relid in truncated_relations(s) {
                    if registry::registration(relid).is_some_and(|r| r.gapless) {
                        let name = quote_literal(&crate::pg::regclass_text(relid));
                        errors::raise_full(
                            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                            format!("cannot TRUNCATE gapless table \"{}\" with RESTART IDENTITY", rel_name(relid)),
                            Some("Restarting its key sequence draws keys behind consumers' cursors, and consumers never see those rows."),
                            Some(format!(
                                "TRUNCATE it with CONTINUE IDENTITY; to reset the key space, SELECT pgkvx.disable({name}) first and pgkvx.enable({name}, gapless => true) after."
                            )),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

/// Every table a TRUNCATE restarts the sequences of, as ExecuteTruncate
/// collects them: the named ones, their inheritance children and
/// partitions (unless ONLY), and with CASCADE every table referencing one
/// of them by a foreign key, until no new one turns up.  A gapless table
/// reached any of these ways would have its key sequence restarted.
///
/// # Safety
/// `s` is a valid TruncateStmt.
unsafe fn truncated_relations(s: &pg_sys::TruncateStmt) -> Vec<Oid> {
    let mut out: Vec<Oid> = Vec::new();
    let add = |out: &mut Vec<Oid>, relid: Oid, inh: bool| {
        if !out.contains(&relid) {
            out.push(relid);
        }
        if inh {
            for m in registry::partitions::members(relid) {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
    };
    // SAFETY: per contract; RangeVars of the statement.
    unsafe {
        for rv in list_iter::<pg_sys::RangeVar>(s.relations) {
            if let Some(relid) = crate::pg::relation_named(rv) {
                add(&mut out, relid, (*rv).inh);
            }
        }
    }
    if s.behavior == pg_sys::DropBehavior::DROP_CASCADE {
        loop {
            let before = out.len();
            let list = out.iter().fold(std::ptr::null_mut(), |l, &o| {
                // SAFETY: appends to a fresh OidList.
                unsafe { pg_sys::lappend_oid(l, o) }
            });
            // SAFETY: a pg_constraint scan returning a fresh OidList.
            let referencing: Vec<Oid> = unsafe { crate::pg::list_oids(pg_sys::heap_truncate_find_FKs(list)).collect() };
            for relid in referencing {
                add(&mut out, relid, true);
            }
            if out.len() == before {
                break;
            }
        }
    }
    out
}

/// `COPY FROM` evaluates column defaults itself, without the planner: an
/// identity key left to its default would be drawn unlatched.  Refused up
/// front (the row trigger would refuse the first row anyway, with a less
/// helpful message).  COPY with the key column given is hand-drawn keys,
/// which the row trigger refuses unless this transaction drew them with
/// `pgkvx.next_key`.
///
/// # Safety
/// `s` is a valid CopyStmt.
unsafe fn check_copy(s: &pg_sys::CopyStmt) {
    if !s.is_from {
        return;
    }
    // SAFETY: per contract.
    let Some(relid) = (unsafe { crate::pg::relation_named(s.relation) }) else { return };
    if gapless_identity_sequence(relid).is_none() {
        return;
    }
    let Some((_, key)) = gapless_key(relid) else { return };
    // SAFETY: attlist is a List of String nodes.
    let listed = s.attlist.is_null()
        || unsafe {
            list_iter::<pg_sys::String>(s.attlist).any(|n| CStr::from_ptr((*n).sval).to_str() == Ok(key.as_str()))
        };
    if listed {
        return;
    }
    let name = crate::pg::regclass_text(relid);
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("COPY into gapless table \"{}\" cannot draw its identity key {}", rel_name(relid), quote_ident(&key)),
        Some("COPY draws identity values without the planner, so the keys it draws would not be latched."),
        Some(format!(
            "COPY into a staging table and INSERT INTO {name} (...) SELECT ... FROM it, or list {} in COPY with keys drawn by pgkvx.next_key({}) in the same transaction.",
            quote_ident(&key),
            quote_literal(&name)
        )),
    )
}

// ---- check(): a key sequence behind its table -----------------------------

/// For `pgkvx.check()`: the key sequence of gapless table `relid` stands
/// at or below a key already in the table (setval, or an identity added
/// anew), so the keys it draws next lie behind consumers' cursors.  Said
/// only to a role that may SELECT the table without row level security (it
/// names key values); the highest key is the key index's last entry.
/// Rows deleted since (an outbox emptied behind its consumers) are not
/// seen: a sequence moved back past them is not reported.
pub fn sequence_behind(relid: Oid) -> Option<String> {
    // check() must also get through tables whose key index is gone (which
    // it reports).
    let (attnum, col) = gapless_key(relid)?;
    let seq = crate::pg::with_pinned_settings(|| {
        Spi::get_one_with_args::<Oid>(
            "SELECT pg_catalog.pg_get_serial_sequence($1, $2)::pg_catalog.regclass::pg_catalog.oid",
            &[qualified_name(relid).into(), col.clone().into()],
        )
    })
    .ok()
    .flatten()?;
    if !crate::read::admit::may_see(relid, &[attnum]).1 {
        return None;
    }
    let col = &col;
    // A plain read: check() reports, it does not wait for writers.
    let max = with_plain_reads(|| {
        Spi::get_one::<i64>(&format!(
            "SELECT pg_catalog.max({})::pg_catalog.int8 FROM ONLY {}",
            quote_ident(col),
            qualified_name(relid)
        ))
    })
    .ok()
    .flatten()?;
    let pos = position(seq)?;
    if pos.increment <= 0 || pos.last >= max {
        return None;
    }
    Some(format!(
        "key sequence {} of gapless column {} stands at {}, behind key {max} in the table: the keys it draws next commit behind consumers' cursors; move it past the highest key: SELECT pg_catalog.setval({}, {max})",
        qualified_name(seq),
        quote_ident(col),
        pos.last,
        quote_literal(&qualified_name(seq))
    ))
}

/// Runs `f` (SQL of ours) with pinned settings and pgkvx's read protection
/// off: it reads a latched table in key order and must neither wait for
/// its writers nor warn that it did not.  The settings come back when `f`
/// returns; after an ERROR the transaction abort restores them.
fn with_plain_reads<R>(f: impl FnOnce() -> R) -> R {
    crate::pg::with_settings(&[(c"pgkvx.scan_mode", c"off"), (c"pgkvx.unprotected_reads", c"allow")], || {
        crate::pg::with_pinned_settings(f)
    })
}

/// What differs between majors in identity keys.
#[cfg(all(feature = "pg_test", any(feature = "pg17", feature = "pg18")))]
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
