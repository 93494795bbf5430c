//! Every difference between the PostgreSQL majors pgkvx builds for, each
//! one function (or type) here, gated by the range names `build.rs`
//! defines (`pg16_up`, `pg17_up`, `pg18_up`, `pre_pg16`, `pre_pg17`,
//! `pre_pg18`).  Only this file and the C declarations of `raw.rs` name a
//! major; callers anywhere else call these (most through `pg::`), and
//! `scripts/layers` refuses a major named elsewhere.  Supporting a new
//! major means reading this file, top to bottom.

use pgrx::pg_sys::{self, Oid, QueryDesc};

// ---- backends and transactions ----------------------------------------------

/// This backend's PGPROC number, or `None` without a PGPROC.
#[cfg(pre_pg17)]
pub fn my_proc_number() -> Option<i32> {
    // SAFETY: plain read of a backend global; checked for NULL.
    Some(unsafe { pg_sys::MyProc.as_ref() }?.pgprocno)
}

/// This backend's PGPROC number, or `None` without a PGPROC.  PG17 dropped
/// PGPROC.pgprocno for the MyProcNumber global (the same index).
#[cfg(pg17_up)]
pub fn my_proc_number() -> Option<i32> {
    // SAFETY: plain reads of backend globals, set together.
    unsafe { pg_sys::MyProc.as_ref() }?;
    Some(unsafe { pg_sys::MyProcNumber })
}

/// Whether this backend holds a lock on `tag` in a mode a standby query
/// can take (ACCESS SHARE to ROW EXCLUSIVE).
#[cfg(pre_pg17)]
pub fn holds_lock(tag: &pg_sys::LOCKTAG) -> bool {
    // SAFETY: a lookup in this backend's own lock table.
    (1..=pg_sys::RowExclusiveLock as pg_sys::LOCKMODE).any(|m| unsafe { pg_sys::LockHeldByMe(tag, m) })
}

/// Whether this backend holds a lock on `tag` in a mode a standby query
/// can take (ACCESS SHARE or stronger).  PG17 added `orstronger`.
#[cfg(pg17_up)]
pub fn holds_lock(tag: &pg_sys::LOCKTAG) -> bool {
    // SAFETY: a lookup in this backend's own lock table.
    unsafe { pg_sys::LockHeldByMe(tag, pg_sys::AccessShareLock as pg_sys::LOCKMODE, true) }
}

/// get_ordering_op_properties: the btree family, input type and strategy
/// number (BTLessStrategyNumber or BTGreaterStrategyNumber) of ordering
/// operator `op`, or None when it is none.  PG18 answers with a CompareType,
/// whose COMPARE_LT..COMPARE_GT equal the btree strategy numbers.
///
/// # Safety
/// A transaction is open (a syscache lookup).
#[allow(clippy::unnecessary_cast)]
pub unsafe fn ordering_op_properties(op: Oid) -> Option<(Oid, Oid, u32)> {
    let (mut family, mut intype) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    #[cfg(pre_pg18)]
    let mut strategy = 0i16;
    #[cfg(pg18_up)]
    let mut strategy = pg_sys::CompareType::COMPARE_INVALID;
    // SAFETY: a syscache lookup inside the transaction the caller keeps open; the three out-arguments
    // are locals that outlive the call.
    let known = unsafe { pg_sys::get_ordering_op_properties(op, &mut family, &mut intype, &mut strategy) };
    known.then_some((family, intype, strategy as u32))
}

/// Whether pathkey `pk` sorts descending (by its btree strategy; PG18
/// names it a CompareType, whose COMPARE_GT equals BTGreaterStrategyNumber).
///
/// # Safety
/// `pk` is a valid PathKey.
pub unsafe fn pathkey_descending(pk: *const pg_sys::PathKey) -> bool {
    // SAFETY: the caller passes a valid PathKey; only its strategy (PG18: compare type) field is read.
    unsafe {
        #[cfg(pre_pg18)]
        return (*pk).pk_strategy as u32 == pg_sys::BTGreaterStrategyNumber;
        #[cfg(pg18_up)]
        return (*pk).pk_cmptype == pg_sys::CompareType::COMPARE_GT;
    }
}

/// lc_collate_is_c as PG17 had it: false for InvalidOid (where
/// pg_newlocale_from_collation raises), else the locale's flag.
#[cfg(pg18_up)]
pub(super) unsafe fn lc_collate_is_c(collation: Oid) -> bool {
    if collation == pg_sys::InvalidOid {
        return false;
    }
    // SAFETY: a valid collation oid; the locale is cached for the backend.
    unsafe { (*super::raw::pg_newlocale_from_collation(collation)).collate_is_c }
}

#[cfg(pre_pg18)]
pub(super) use super::raw::lc_collate_is_c;

/// The type a SQL/JSON query function (JSON_VALUE, JSON_QUERY, a typed
/// JSON_TABLE column) coerces its result to.  From PostgreSQL 17 that
/// coercion, a domain's CHECK included, runs inside the JsonExpr at run
/// time: the tree holds no CoerceToDomain node for it.
///
/// # Safety
/// `node` is a valid expression node.
#[cfg(pg17_up)]
pub unsafe fn json_result_type(node: *mut pg_sys::Node) -> Option<Oid> {
    // SAFETY: the caller passes a valid expression node; it is cast to JsonExpr only after its tag
    // says so, and `returning` is checked for NULL before it is read.
    unsafe {
        if super::list::node_tag(node) != pg_sys::NodeTag::T_JsonExpr {
            return None;
        }
        let returning = (*(node as *mut pg_sys::JsonExpr)).returning;
        (!returning.is_null()).then(|| (*returning).typid)
    }
}

/// Before PostgreSQL 17, SQL/JSON results are coerced by expressions the
/// tree shows.
///
/// # Safety
/// None: nothing is read.
#[cfg(pre_pg17)]
pub unsafe fn json_result_type(_node: *mut pg_sys::Node) -> Option<Oid> {
    None
}

/// Whether a COPY's options name a DEFAULT marker (`WITH (DEFAULT '\D')`,
/// PostgreSQL 16 on): a field holding it takes the column's default, even
/// in a column the COPY lists.
///
/// # Safety
/// `options` is a COPY statement's option list (DefElem nodes), or NIL.
#[cfg(pg16_up)]
pub unsafe fn copy_has_default_marker(options: *mut pg_sys::List) -> bool {
    // SAFETY: the caller passes a COPY option list, which holds only DefElem nodes (NIL yields none);
    // `defname` is checked for NULL before it is read as a C string.
    unsafe {
        super::list::list_iter::<pg_sys::DefElem>(options)
            .any(|d| !(*d).defname.is_null() && std::ffi::CStr::from_ptr((*d).defname).to_bytes() == b"default")
    }
}

/// PostgreSQL 15's COPY has no DEFAULT option (it refuses the name itself).
///
/// # Safety
/// None: nothing is read.
#[cfg(pre_pg16)]
pub unsafe fn copy_has_default_marker(_options: *mut pg_sys::List) -> bool {
    false
}

/// Carries how many disabled plan nodes (`enable_* = off`) a path holds to
/// the path that wraps it: PostgreSQL 18 compares that count before cost,
/// so a wrapper without it would win over the plans the user asked for.
/// Before 18 a disabled node is part of the cost, which wrappers copy.
pub fn copy_path_disabled_nodes(to: &mut pg_sys::Path, from: &pg_sys::Path) {
    #[cfg(pg18_up)]
    {
        to.disabled_nodes = from.disabled_nodes;
    }
    #[cfg(pre_pg18)]
    let _ = (to, from);
}

/// As [`copy_path_disabled_nodes`], for a plan node that wraps another
/// (EXPLAIN shows the count on 18).
pub fn copy_plan_disabled_nodes(to: &mut pg_sys::Plan, from: &pg_sys::Plan) {
    #[cfg(pg18_up)]
    {
        to.disabled_nodes = from.disabled_nodes;
    }
    #[cfg(pre_pg18)]
    let _ = (to, from);
}

/// The xid after the latest completed one, as the horizon computation
/// starts from it (PG17 renamed ShmemVariableCache to TransamVariables).
///
/// # Safety
/// The caller holds ProcArrayLock, under which the value is stable.
pub unsafe fn latest_completed_xid() -> u32 {
    // SAFETY: the caller holds ProcArrayLock, under which latestCompletedXid is stable; the variable
    // cache is set up in shared memory at startup and never moves.
    unsafe {
        #[cfg(pre_pg17)]
        return (*pg_sys::ShmemVariableCache).latestCompletedXid.value as u32;
        #[cfg(pg17_up)]
        return (*pg_sys::TransamVariables).latestCompletedXid.value as u32;
    }
}

/// This backend's local transaction id (PG17 moved it into PGPROC.vxid).
pub fn local_xact_id() -> u32 {
    // SAFETY: MyProc is set in every backend that runs SQL.
    unsafe {
        #[cfg(pre_pg17)]
        return (*pg_sys::MyProc).lxid;
        #[cfg(pg17_up)]
        return (*pg_sys::MyProc).vxid.lxid;
    }
}

/// ExecutorRun forward for `count` rows (0: all).  PG18 dropped the
/// execute_once argument; earlier majors are told the portal may run again.
///
/// # Safety
/// As ExecutorRun: `qd` started, its snapshot active.
pub unsafe fn executor_run(qd: *mut pg_sys::QueryDesc, count: u64) {
    // SAFETY: the caller's `qd` has been started by ExecutorStart and its snapshot is active, which
    // is what ExecutorRun asks of its arguments.
    unsafe {
        #[cfg(pre_pg18)]
        pg_sys::ExecutorRun(qd, pg_sys::ScanDirection::ForwardScanDirection, count, false);
        #[cfg(pg18_up)]
        pg_sys::ExecutorRun(qd, pg_sys::ScanDirection::ForwardScanDirection, count);
    }
}

/// Whether a row comparison bounds from below (`>`, `>=`: Some(true)) or
/// from above (`<`, `<=`: Some(false)); None for `=`, `<>`.  PG18 replaced
/// RowCompareType (rctype) with CompareType (cmptype).
pub fn row_compare_lower_bound(rc: &pg_sys::RowCompareExpr) -> Option<bool> {
    #[cfg(pre_pg18)]
    {
        use pg_sys::RowCompareType::*;
        match rc.rctype {
            ROWCOMPARE_GT | ROWCOMPARE_GE => Some(true),
            ROWCOMPARE_LT | ROWCOMPARE_LE => Some(false),
            _ => None,
        }
    }
    #[cfg(pg18_up)]
    {
        use pg_sys::CompareType::*;
        match rc.cmptype {
            COMPARE_GT | COMPARE_GE => Some(true),
            COMPARE_LT | COMPARE_LE => Some(false),
            _ => None,
        }
    }
}

/// The `pg_attribute` rows of `tupdesc`, as the C macro TupleDescAttr
/// reaches them.
///
/// # Safety
/// `tupdesc` is a valid tuple descriptor that stays valid and unchanged for `'a`.
pub unsafe fn form_attrs<'a>(tupdesc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    // SAFETY: the caller passes a valid descriptor, alive for `'a`, with natts attributes; PG18 keeps
    // natts CompactAttributes first and the FormData_pg_attribute array right after them (TupleDescAttr).
    unsafe {
        let natts = (*tupdesc).natts as usize;
        #[cfg(pre_pg18)]
        return (*tupdesc).attrs.as_slice(natts);
        #[cfg(pg18_up)]
        return std::slice::from_raw_parts(
            (*tupdesc).compact_attrs.as_ptr().add(natts).cast::<pg_sys::FormData_pg_attribute>(),
            natts,
        );
    }
}

/// Whether attribute `i` of `tupdesc` can hold no NULL.
///
/// # Safety
/// `a` is attribute `i` of the valid tuple descriptor `tupdesc`.
#[cfg(pre_pg18)]
pub(super) unsafe fn holds_no_null(_tupdesc: pg_sys::TupleDesc, _i: usize, a: &pg_sys::FormData_pg_attribute) -> bool {
    a.attnotnull
}

/// PG18 sets attnotnull for a NOT VALID not-null constraint too, under
/// which old rows may still be NULL: only a validated one counts.  The
/// relcache resolves the constraint's validity into the compact attribute;
/// a descriptor that left it unknown counts as nullable.
///
/// # Safety
/// `a` is attribute `i` of the valid tuple descriptor `tupdesc`.
#[cfg(pg18_up)]
pub(super) unsafe fn holds_no_null(tupdesc: pg_sys::TupleDesc, i: usize, a: &pg_sys::FormData_pg_attribute) -> bool {
    // SAFETY: the caller passes a valid descriptor; its compact_attrs array holds natts entries, and
    // indexing the slice checks `i` against them.
    a.attnotnull
        && unsafe { (*tupdesc).compact_attrs.as_slice((*tupdesc).natts as usize)[i].attnullability }
            == pg_sys::ATTNULLABLE_VALID as std::ffi::c_char
}

/// `index_beginscan` without instrumentation (PG18 added the
/// `IndexScanInstrumentation *` argument before the key counts).
///
/// # Safety
/// As `index_beginscan`: open, locked relations and a registered snapshot.
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snap: pg_sys::Snapshot,
    nkeys: i32,
    norderbys: i32,
) -> pg_sys::IndexScanDesc {
    // SAFETY: the caller passes open, locked relations and a registered snapshot, as index_beginscan
    // requires; PG18's instrumentation argument may be NULL.
    unsafe {
        #[cfg(pre_pg18)]
        return pg_sys::index_beginscan(heap, index, snap, nkeys, norderbys);
        #[cfg(pg18_up)]
        return pg_sys::index_beginscan(heap, index, snap, std::ptr::null_mut(), nkeys, norderbys);
    }
}

/// The identity sequence of column `attnum` of `relid`, or InvalidOid.
///
/// # Safety
/// A transaction is open (catalog and relcache lookups).
#[cfg(pre_pg17)]
pub unsafe fn identity_sequence(relid: Oid, attnum: i16) -> Oid {
    // SAFETY: a catalog lookup inside the transaction the caller keeps open; missing_ok gives
    // InvalidOid for a column without an identity sequence.
    unsafe { pg_sys::getIdentitySequence(relid, attnum, true) }
}

/// PG17 takes the relation (and answers for a partition with its root's
/// sequence).  A relcache reference takes no lock, as the oid-only call
/// did: a lock here could be upgraded by the ALTER TABLE that follows.
///
/// # Safety
/// A transaction is open (catalog and relcache lookups).
#[cfg(pg17_up)]
pub unsafe fn identity_sequence(relid: Oid, attnum: i16) -> Oid {
    // SAFETY: relcache and catalog lookups inside the caller's open transaction; the relcache
    // reference is checked for NULL and released by RelationClose before returning.
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

/// Whether `role` owns relation `relid` (PG16 folded pg_class_ownercheck
/// into object_ownercheck).
///
/// # Safety
/// A transaction is open (a syscache lookup; raises for a missing relation).
pub unsafe fn class_ownercheck(relid: Oid, role: Oid) -> bool {
    // SAFETY: a syscache lookup inside the transaction the caller keeps open; a missing relation
    // raises an ERROR.
    unsafe {
        #[cfg(pre_pg16)]
        return pg_sys::pg_class_ownercheck(relid, role);
        #[cfg(pg16_up)]
        return pg_sys::object_ownercheck(pg_sys::RelationRelationId, relid, role);
    }
}

/// The relation's primary key index, or InvalidOid.  PG18 also tracks a
/// deferrable primary key; before it rd_pkindex never named one, so ask
/// for immediate ones only.
///
/// # Safety
/// `rel` is an open relation (the call fills its index list).
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> Oid {
    // SAFETY: the caller passes an open relation, whose relcache entry RelationGetPrimaryKeyIndex may
    // fill in (its index list).
    unsafe {
        #[cfg(pre_pg18)]
        return pg_sys::RelationGetPrimaryKeyIndex(rel);
        #[cfg(pg18_up)]
        return pg_sys::RelationGetPrimaryKeyIndex(rel, false);
    }
}

/// The members of equivalence class `ec` that belong to child relation
/// `relid` (a partition, an inheritance child), kept apart from
/// `ec_members` from PG18 on; NULL before (they are in `ec_members`).
///
/// # Safety
/// `ec` is a valid EquivalenceClass of the current planning step.
pub unsafe fn ec_child_members(ec: *mut pg_sys::EquivalenceClass, relid: u32) -> *mut pg_sys::List {
    #[cfg(pg18_up)]
    // SAFETY: the caller passes a valid EquivalenceClass of this planning step; its ec_childmembers
    // array holds ec_childmembers_size lists, and `relid` is checked against that size first.
    unsafe {
        if !(*ec).ec_childmembers.is_null() && (relid as i32) < (*ec).ec_childmembers_size {
            return *(*ec).ec_childmembers.add(relid as usize);
        }
    }
    let _ = (ec, relid);
    std::ptr::null_mut()
}

// ---- the executor's run hook ---------------------------------------------------

/// The executor's run hook as this major declares it: PG18's has no
/// `execute_once` (the executor decides parallelism itself).
#[cfg(pre_pg18)]
pub type ExecutorRunHook = unsafe extern "C-unwind" fn(*mut QueryDesc, pg_sys::ScanDirection::Type, u64, bool);
#[cfg(pg18_up)]
pub type ExecutorRunHook = unsafe extern "C-unwind" fn(*mut QueryDesc, pg_sys::ScanDirection::Type, u64);

/// What an ExecutorRun hook does, whatever the major's signature:
/// [`executor_run_hook`] is the hook that calls it.
pub trait ExecutorRun {
    /// The arguments of ExecutorRun; `once` is true on majors without it.
    ///
    /// # Safety
    /// Called as the executor calls its run hook.
    unsafe fn run(qd: *mut QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64, once: bool);
}

/// The ExecutorRun hook of this major that calls `R::run`.  Not
/// `#[pg_guard]`: a plain C frame around the call, which keeps no state.
///
/// # Safety
/// Called by the executor as its run hook.
#[cfg(pre_pg18)]
pub unsafe extern "C-unwind" fn executor_run_hook<R: ExecutorRun>(
    qd: *mut QueryDesc,
    dir: pg_sys::ScanDirection::Type,
    count: u64,
    once: bool,
) {
    // SAFETY: the executor's arguments, passed on unchanged.
    unsafe { R::run(qd, dir, count, once) }
}

/// The ExecutorRun hook of this major that calls `R::run`.
///
/// # Safety
/// Called by the executor as its run hook.
#[cfg(pg18_up)]
pub unsafe extern "C-unwind" fn executor_run_hook<R: ExecutorRun>(
    qd: *mut QueryDesc,
    dir: pg_sys::ScanDirection::Type,
    count: u64,
) {
    // SAFETY: the executor's arguments, passed on unchanged.
    unsafe { R::run(qd, dir, count, true) }
}

/// Calls run hook `f` with ExecutorRun's arguments (`once` is dropped on
/// PG18).
///
/// # Safety
/// The arguments of ExecutorRun; `f` is a run hook.
pub unsafe fn call_run_hook(
    f: ExecutorRunHook,
    qd: *mut QueryDesc,
    dir: pg_sys::ScanDirection::Type,
    count: u64,
    once: bool,
) {
    // SAFETY: the caller passes ExecutorRun's own arguments and a run hook `f`: this is the call the
    // executor itself makes (PG18's hook has no `once`).
    unsafe {
        #[cfg(pre_pg18)]
        f(qd, dir, count, once);
        #[cfg(pg18_up)]
        {
            let _ = once;
            f(qd, dir, count);
        }
    }
}

// ---- WAL ---------------------------------------------------------------------

/// Adds `data` to the WAL record being assembled (XLogRegisterData: PG16
/// made its length unsigned, PG18 its data pointer const).
///
/// # Safety
/// Between XLogBeginInsert and XLogInsert, inside an FFI guard (a plain
/// C call: it raises only past the record's room for pieces); `data`
/// lives until XLogInsert.
#[allow(clippy::unnecessary_cast)]
pub unsafe fn xlog_register_data(data: &[u8]) {
    // SAFETY: per the caller's contract; XLogInsert only reads the bytes.
    unsafe {
        #[cfg(pre_pg16)]
        super::raw::XLogRegisterData(data.as_ptr() as *mut std::ffi::c_char, data.len() as i32);
        #[cfg(all(pg16_up, pre_pg18))]
        super::raw::XLogRegisterData(data.as_ptr() as *mut std::ffi::c_char, data.len() as u32);
        #[cfg(pg18_up)]
        super::raw::XLogRegisterData(data.as_ptr() as *const std::ffi::c_void, data.len() as u32);
    }
}

/// Leaves the condition variable this backend prepared to sleep on
/// (PG16 made ConditionVariableCancelSleep say whether it was signalled).
pub fn condition_variable_cancel_sleep() {
    // SAFETY: harmless when not prepared to sleep; cannot raise.
    unsafe {
        #[cfg(pre_pg16)]
        pg_sys::ConditionVariableCancelSleep();
        #[cfg(pg16_up)]
        let _ = pg_sys::ConditionVariableCancelSleep();
    }
}
