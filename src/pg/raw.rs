//! Postgres's own functions, declared without pgrx's error guard: an ERROR
//! inside them longjmps to whatever jump buffer is current -- [`pass`](super::boundary::pass)'s, or
//! the caller's when there is no Rust state to unwind.
//! Many are not about errors at all: they are declared here only to avoid
//! pgrx's per-call guard; [`super::boundary`] says when that is safe.

use pgrx::pg_sys;
extern "C-unwind" {
    pub fn pg_re_throw() -> !;
    pub fn ReThrowError(edata: *mut pg_sys::ErrorData) -> !;
    // Reads of backend state that cannot raise, asked by every guarded
    // statement: without pgrx's guard they cost no jump buffer.
    pub fn GetUserId() -> pg_sys::Oid;
    pub fn GetOuterUserId() -> pg_sys::Oid;
    pub fn GetCurrentTimestamp() -> pg_sys::TimestampTz;
    pub fn RecoveryInProgress() -> bool;
    pub fn IsTransactionState() -> bool;
    pub fn GetTopTransactionIdIfAny() -> pg_sys::TransactionId;
    pub fn ReadNextFullTransactionId() -> pg_sys::FullTransactionId;
    pub fn ExecGetResultSlotOps(
        planstate: *mut pg_sys::PlanState,
        isfixed: *mut bool,
    ) -> *const pg_sys::TupleTableSlotOps;
    pub fn MemoryContextRegisterResetCallback(context: pg_sys::MemoryContext, cb: *mut pg_sys::MemoryContextCallback);
    // Raise only on a misuse: releasing a lock not held, or taking one
    // with MAX_SIMUL_LWLOCKS (200) held.  Ours pair every acquire with
    // a release and hold at most two at once, taken where Postgres
    // holds none; ReadNextFullTransactionId takes XidGenLock the same
    // way.  So these never longjmp over the Rust frames above them.
    pub fn LWLockAcquire(lock: *mut pg_sys::LWLock, mode: pg_sys::LWLockMode::Type) -> bool;
    pub fn LWLockRelease(lock: *mut pg_sys::LWLock);
    pub fn palloc0(size: usize) -> *mut std::ffi::c_void;
    pub fn standard_ExecutorStart(qd: *mut pg_sys::QueryDesc, eflags: i32);
    #[cfg(pre_pg18)]
    pub fn standard_ExecutorRun(
        qd: *mut pg_sys::QueryDesc,
        dir: pg_sys::ScanDirection::Type,
        count: u64,
        execute_once: bool,
    );
    // PG18 dropped execute_once: see standard_ExecutorRun below.
    #[cfg(pg18_up)]
    #[link_name = "standard_ExecutorRun"]
    fn standard_ExecutorRun_pg18(qd: *mut pg_sys::QueryDesc, dir: pg_sys::ScanDirection::Type, count: u64);
    pub fn standard_ExecutorFinish(qd: *mut pg_sys::QueryDesc);
    #[allow(clippy::too_many_arguments)]
    pub fn standard_ProcessUtility(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
    pub fn standard_ExecutorEnd(qd: *mut pg_sys::QueryDesc);
    pub fn standard_planner(
        parse: *mut pg_sys::Query,
        query_string: *const std::ffi::c_char,
        cursor_options: i32,
        params: pg_sys::ParamListInfo,
    ) -> *mut pg_sys::PlannedStmt;
    pub fn ExecInitNode(plan: *mut pg_sys::Plan, estate: *mut pg_sys::EState, eflags: i32) -> *mut pg_sys::PlanState;
    pub fn ExecEndNode(node: *mut pg_sys::PlanState);
    pub fn ExecReScan(node: *mut pg_sys::PlanState);
    pub fn ExecMarkPos(node: *mut pg_sys::PlanState);
    pub fn ExecRestrPos(node: *mut pg_sys::PlanState);
    pub fn ExecStoreMinimalTuple(
        tuple: pg_sys::MinimalTuple,
        slot: *mut pg_sys::TupleTableSlot,
        should_free: bool,
    ) -> *mut pg_sys::TupleTableSlot;
    // commands/sequence.h; not in pgrx's bindings.  Called only through
    // pgrx's FFI boundary guard (next_key).
    pub fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
    // catalog/partition.h; not in pgrx's bindings.  Called only through
    // pgrx's FFI boundary guard (registry/partitions.rs).
    pub fn get_partition_parent(relid: pg_sys::Oid, even_if_detached: bool) -> pg_sys::Oid;
    // catalog/pg_inherits.h; as above.
    pub fn find_all_inheritors(
        parent: pg_sys::Oid,
        lockmode: pg_sys::LOCKMODE,
        numparents: *mut *mut pg_sys::List,
    ) -> *mut pg_sys::List;
    // nodes/nodeFuncs.h: from PostgreSQL 16 the walkers are macros over
    // these `_impl` functions.
    #[cfg_attr(pg16_up, link_name = "query_tree_walker_impl")]
    pub fn query_tree_walker(
        query: *mut pg_sys::Query,
        walker: Option<unsafe extern "C-unwind" fn(*mut pg_sys::Node, *mut std::ffi::c_void) -> bool>,
        context: *mut std::ffi::c_void,
        flags: i32,
    ) -> bool;
    #[cfg_attr(pg16_up, link_name = "expression_tree_walker_impl")]
    pub fn expression_tree_walker(
        node: *mut pg_sys::Node,
        walker: Option<unsafe extern "C-unwind" fn(*mut pg_sys::Node, *mut std::ffi::c_void) -> bool>,
        context: *mut std::ffi::c_void,
    ) -> bool;
    #[cfg_attr(pg16_up, link_name = "query_tree_mutator_impl")]
    pub fn query_tree_mutator(
        query: *mut pg_sys::Query,
        mutator: Option<unsafe extern "C-unwind" fn(*mut pg_sys::Node, *mut std::ffi::c_void) -> *mut pg_sys::Node>,
        context: *mut std::ffi::c_void,
        flags: i32,
    ) -> *mut pg_sys::Query;
    #[cfg_attr(pg16_up, link_name = "expression_tree_mutator_impl")]
    pub fn expression_tree_mutator(
        node: *mut pg_sys::Node,
        mutator: Option<unsafe extern "C-unwind" fn(*mut pg_sys::Node, *mut std::ffi::c_void) -> *mut pg_sys::Node>,
        context: *mut std::ffi::c_void,
    ) -> *mut pg_sys::Node;
    // access/xloginsert.h: a record of ours is assembled and inserted
    // inside one `pg_guard_ffi_boundary` (wal.rs), not one guard per call.
    pub fn XLogBeginInsert();
    pub fn XLogSetRecordFlags(flags: u8);
    #[cfg(pre_pg16)]
    pub fn XLogRegisterData(data: *mut std::ffi::c_char, len: std::ffi::c_int);
    #[cfg(all(pg16_up, pre_pg18))]
    pub fn XLogRegisterData(data: *mut std::ffi::c_char, len: u32);
    #[cfg(pg18_up)]
    pub fn XLogRegisterData(data: *const std::ffi::c_void, len: u32);
    pub fn XLogInsert(rmid: pg_sys::RmgrId, info: u8) -> pg_sys::XLogRecPtr;
    // The heap page fetch of arrow/fetch.rs, run inside one
    // `pg_guard_ffi_boundary` per page rather than one guard per call.
    pub fn index_getnext_tid(
        scan: pg_sys::IndexScanDesc,
        direction: pg_sys::ScanDirection::Type,
    ) -> pg_sys::ItemPointer;
    pub fn ReleaseAndReadBuffer(
        buffer: pg_sys::Buffer,
        relation: pg_sys::Relation,
        block: pg_sys::BlockNumber,
    ) -> pg_sys::Buffer;
    pub fn ReadBuffer(relation: pg_sys::Relation, block: pg_sys::BlockNumber) -> pg_sys::Buffer;
    pub fn ReleaseBuffer(buffer: pg_sys::Buffer);
    pub fn heap_page_prune_opt(relation: pg_sys::Relation, buffer: pg_sys::Buffer);
    pub fn LockBuffer(buffer: pg_sys::Buffer, mode: std::ffi::c_int);
    pub fn heap_hot_search_buffer(
        tid: pg_sys::ItemPointer,
        relation: pg_sys::Relation,
        buffer: pg_sys::Buffer,
        snapshot: pg_sys::Snapshot,
        heap_tuple: pg_sys::HeapTuple,
        all_dead: *mut bool,
        first_call: bool,
    ) -> bool;
    // utils/pg_locale.h; not in pgrx's bindings.  Called through
    // `pg::collation_is_bytewise`, which guards the FFI boundary.
    #[cfg(pre_pg18)]
    pub fn lc_collate_is_c(collation: pg_sys::Oid) -> bool;
    // PG18 dropped lc_collate_is_c: the answer is a flag of the collation's
    // pg_locale_t.
    #[cfg(pg18_up)]
    pub fn pg_newlocale_from_collation(collid: pg_sys::Oid) -> *const Pg18LocaleHead;
}

/// PG18's standard_ExecutorRun under the older signature: the executor
/// now decides on its own whether a plan may run in parallel, so
/// `execute_once` has nowhere to go.
///
/// # Safety
/// As standard_ExecutorRun.
#[cfg(pg18_up)]
#[inline(always)]
#[allow(non_snake_case)]
pub unsafe fn standard_ExecutorRun(
    qd: *mut pg_sys::QueryDesc,
    dir: pg_sys::ScanDirection::Type,
    count: u64,
    _execute_once: bool,
) {
    // SAFETY: the caller passes standard_ExecutorRun's own arguments; PG18's takes the same ones less
    // `execute_once`.
    unsafe { standard_ExecutorRun_pg18(qd, dir, count) }
}

/// `ExecEvalExprSwitchContext` (an inline function in C) as a plain C
/// call of the expression's own evaluation function.
///
/// # Safety
/// `state` was built by ExecInitExpr; `econtext` is live.
pub unsafe fn eval_expr(
    state: *mut pg_sys::ExprState,
    econtext: *mut pg_sys::ExprContext,
    isnull: &mut bool,
) -> pg_sys::Datum {
    // SAFETY: `state` was built by ExecInitExpr, which always sets evalfunc, and `econtext` is live (the
    // caller's contract); as ExecEvalExprSwitchContext, it evaluates in the per-tuple context and restores.
    unsafe {
        let old = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = (*econtext).ecxt_per_tuple_memory;
        let eval = (*state).evalfunc.unwrap_unchecked();
        let v = eval(state, econtext, isnull);
        pg_sys::CurrentMemoryContext = old;
        v
    }
}

/// The head of PG18's `struct pg_locale_struct` (utils/pg_locale.h), up to
/// the flag read here; not in pgrx's bindings.
#[cfg(pg18_up)]
#[repr(C)]
pub struct Pg18LocaleHead {
    pub provider: std::ffi::c_char,
    pub deterministic: bool,
    pub collate_is_c: bool,
}
