//! `pgkvx.wait_for(rel, after, timeout)`: a consumer at the head of a tail
//! sleeps until a row past its cursor is committed, woken by the writer's
//! commit through shared memory (src/shmem/wakeups.rs), not by polling and
//! not by NOTIFY.  Plus `pgkvx.wait_stats()` and the `pgkvx.waiters` view.
//!
//! The loop it serves:
//!
//! ```sql
//! SELECT * FROM ev WHERE id > $cursor ORDER BY id LIMIT 100;   -- nothing?
//! SELECT pgkvx.wait_for('ev', $cursor::text, '5s');            -- then read again
//! ```
//!
//! A tail read in reverse key order (`WHERE id < $cursor ORDER BY id DESC`)
//! passes `before => $cursor` instead: it waits for a key before its
//! cursor, and the look goes backward from it.
//!
//! A commit between the empty read and the call is not lost: the call looks
//! for a committed key past `after` with a fresh snapshot *after* it
//! registered its cursor, so such a commit is either seen by that look
//! (true at once) or sets the latch the sleep that follows waits on.  Only
//! commits that wrote a key past the cursor wake it.
//!
//! While it sleeps the session holds no snapshot when the call is a
//! transaction of its own (`SELECT pgkvx.wait_for(...)` outside a
//! transaction block, READ COMMITTED, no other portal open, no snapshot
//! exported): it drops its xmin, so it holds back neither vacuum nor a
//! standby.  Called inside a larger query, a function or a transaction
//! block, another snapshot of the transaction (the statement's, a cursor's,
//! a large object's, an exported one) may still be read after the call
//! returns, so it is kept (backend_xmin stays set while waiting).

use super::cursor::{self, After};
use crate::args::Regclass;
use crate::errors;
use crate::guc::{self, ScanMode};
use crate::pg::acl;
use crate::pg::{rel_name, OpenRel};
use crate::registry;
use crate::shmem::backend;
use crate::shmem::wakeups::{self, Outcome, Pass, Waiting};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

#[pg_extern(volatile, parallel_unsafe, schema = "pgkvx")]
fn wait_for(
    rel: Option<Regclass>,
    after: default!(Option<&str>, "NULL"),
    timeout: default!(Option<Interval>, "'10 seconds'"),
    before: default!(Option<&str>, "NULL"),
    fcinfo: pg_sys::FunctionCallInfo,
) -> bool {
    let relid = crate::args::required(rel, "rel");
    if after.is_some() && before.is_some() {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "pgkvx.wait_for() takes a cursor after which or before which to wait, not both",
            "A tail read in key order passes after; one in reverse key order (ORDER BY the key DESC) passes before.",
        );
    }
    if guc::SCAN_MODE.get() == ScanMode::Off {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pgkvx.wait_for() needs protected reads, but pgkvx.scan_mode is off",
            "With scan_mode off the read after the wait can skip rows committed late; SET pgkvx.scan_mode = optimistic (or fenced).",
        );
    }
    if !acl::may(relid, pg_sys::ACL_SELECT) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", rel_name(relid)),
        );
    }
    // Resolved once; every step below is handed it.
    let table = registry::Table::require(relid);
    // With row_security off Postgres raises its own 42501 here, as for a
    // query.
    if acl::rls_applies(relid) {
        // The look past the cursor reads the index without policies: it
        // would answer for rows the caller may not see, and a consumer that
        // cannot see them would be woken to nothing, again and again.
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("pgkvx.wait_for() does not support \"{}\": row level security applies to you", table.name()),
            "Wait as a role that row level security does not filter (the owner, or BYPASSRLS), or poll.",
        );
    }
    // SAFETY: plain reads of backend globals.
    if crate::read::snapshot::fixed_snapshot() && unsafe { pg_sys::IsTransactionBlock() } {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "pgkvx.wait_for() cannot run in a REPEATABLE READ or SERIALIZABLE transaction block",
            "Its snapshot would never show what the wait waited for; call it in READ COMMITTED or outside the transaction.",
        );
    }
    if backend::my_xid_if_any().is_valid() && crate::shmem::table().writer().holds_any(backend::my_slot()) {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pgkvx.wait_for() cannot wait while this transaction holds pgkvx latches",
            "Readers wait for this transaction's latches; commit (or roll back) before waiting.",
        );
    }
    let timeout_us = match timeout {
        None => None,
        Some(iv) => {
            let us = iv.as_micros();
            if us < 0 {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    "pgkvx.wait_for(): timeout must not be negative",
                );
            }
            Some(i64::try_from(us).unwrap_or(i64::MAX))
        }
    };
    // A tail read in reverse key order waits for keys before its cursor.
    let backward = before.is_some();
    let cursor = after.or(before);
    // Checked now; parsed again at every look, with the key as it is then.
    if let Some(t) = cursor {
        cursor::parse_after(table.key(), t);
    }
    // SAFETY: a function call's FunctionCallInfo has its FmgrInfo.
    let fn_oid = unsafe {
        if fcinfo.is_null() || (*fcinfo).flinfo.is_null() {
            pg_sys::InvalidOid
        } else {
            (*(*fcinfo).flinfo).fn_oid
        }
    };
    let may_drop_xmin = sole_statement(fn_oid);
    refuse_holding_locks(&table, may_drop_xmin);
    wait(&table, cursor, backward, timeout_us, may_drop_xmin)
}

/// Refuses to sleep in a transaction that holds what a writer may wait for:
/// a row it locked or wrote (it has an xid), a table lock that blocks
/// writers (LOCK TABLE in SHARE mode or stronger), or any lock on the
/// table waited on or its partitions (DDL queued behind it blocks the
/// producers).  The writer would wait for this transaction while it
/// sleeps waiting for a commit -- a deadlock no detector sees, since the
/// sleep is not a lock wait.  A bare `SELECT pgkvx.wait_for(...)` outside a
/// transaction block (`sole`) holds nothing of the kind (it takes no lock
/// on the table across the sleep); anything else (a transaction block, a
/// function, a DO block) is looked at in pg_locks.  Advisory locks are the
/// application's own protocol, and not looked at.
fn refuse_holding_locks(table: &registry::Table, sole: bool) {
    let holds = backend::my_xid_if_any().is_valid()
        || !sole
            && {
                let mut tables = registry::partitions::members(table.relid);
                tables.push(table.relid);
                let list = tables.iter().map(|o| o.to_u32().to_string()).collect::<Vec<_>>().join(",");
                // The oids are numbers we print ourselves: nothing of the caller's
                // reaches the text.  A read-only query: Spi::get_one would give the
                // transaction an xid (refused on a standby, and a lock of its own
                // the next call would find).
                Spi::connect(|c| c.select(&format!(
            "SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 FROM pg_catalog.pg_locks l
              WHERE l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() AND l.granted
                AND l.locktype OPERATOR(pg_catalog.=) 'relation'
                AND (l.mode OPERATOR(pg_catalog.=) ANY ('{{ShareLock,ShareRowExclusiveLock,ExclusiveLock,AccessExclusiveLock}}'::pg_catalog.text[])
                     OR (l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                              WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                         AND l.relation OPERATOR(pg_catalog.=) ANY ('{{{list}}}'::pg_catalog.oid[])))"
        ), Some(1), &[])?.first().get_one::<bool>())
        .ok()
        .flatten()
        .unwrap_or(true)
            };
    if holds {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pgkvx.wait_for() cannot wait in a transaction that holds row or table locks",
            "A writer could be waiting for those locks (or DDL queued behind them) while this session waits for its commit, a deadlock nothing would detect; commit (or roll back) first, or wait outside the transaction block.",
        );
    }
}

fn now_us() -> i64 {
    // SAFETY: reading the clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Registers, then looks and sleeps until a key past `cursor` is
/// committed or the time is up.
fn wait(
    table: &registry::Table,
    cursor: Option<&str>,
    backward: bool,
    timeout_us: Option<i64>,
    may_drop_xmin: bool,
) -> bool {
    let start = now_us();
    let deadline = timeout_us.map(|t| start.saturating_add(t));
    // Only commits past the cursor wake us: the cursor as the key is now
    // (a key changed by disable and enable wakes every waiter anyway).
    let pass = match cursor {
        None => Pass::Any,
        Some(t) => {
            let a = cursor::parse_after(table.key(), t);
            Pass::of_cursor(&a.bytes, a.truncated, backward)
        }
    };
    // Writers of a partition are noted under its latched parent.
    let waiting = Waiting::register(table.latch_id, pass);
    let mut spurious = 0u64;
    let mut slept = false;
    let mut woken = false;
    let outcome = loop {
        // Reset before the look: a commit the look does not see sets the
        // latch after this, and the sleep below returns at once.
        // SAFETY: our own latch.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        // An interrupt that set the latch before the reset is served now.
        pgrx::check_for_interrupts!();
        if look(table, cursor, backward) {
            break if slept { Outcome::Woken } else { Outcome::Immediate };
        }
        if woken {
            spurious += 1;
        }
        let remaining_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d - now_us();
                if left <= 0 {
                    break Outcome::Timeout;
                }
                (left.saturating_add(999) / 1000).min(i64::from(i32::MAX))
            }
        };
        if may_drop_xmin {
            drop_xmin();
        }
        let events = pg_sys::WL_LATCH_SET as i32
            | pg_sys::WL_EXIT_ON_PM_DEATH as i32
            | if remaining_ms >= 0 { pg_sys::WL_TIMEOUT as i32 } else { 0 };
        // SAFETY: our own latch; the wait holds no lock.  Cancel,
        // statement_timeout and termination set the latch too, and are
        // served at the top of the loop.
        let rc = unsafe {
            pg_sys::WaitLatch(pg_sys::MyLatch, events, remaining_ms as std::ffi::c_long, pg_sys::PG_WAIT_EXTENSION)
        };
        slept = true;
        woken = rc & pg_sys::WL_LATCH_SET as i32 != 0;
        if woken {
            waiting.woken();
        }
    };
    let elapsed = u64::try_from(now_us() - start).unwrap_or(0);
    waiting.finish(outcome, elapsed, spurious);
    outcome != Outcome::Timeout
}

/// Forgets this backend's xmin while it sleeps: the catalog snapshot goes,
/// and the statement's snapshot is never read again (see
/// [`sole_statement`]).  The next snapshot taken sets a new xmin.
fn drop_xmin() {
    // SAFETY: InvalidateCatalogSnapshot is always safe; clearing our own
    // PGPROC's xmin without a lock is what SnapshotResetXmin does (setting
    // it to invalid needs none).
    unsafe {
        pg_sys::InvalidateCatalogSnapshot();
        std::ptr::write_volatile(&raw mut (*pg_sys::MyProc).xmin, pg_sys::InvalidTransactionId);
    }
}

/// Whether the running statement is exactly `SELECT pgkvx.wait_for(...)`
/// in READ COMMITTED, the only statement of its transaction (no
/// transaction block, explicit or of a multi-statement query), with no
/// other portal open and no snapshot exported: then nothing reads at its
/// snapshot after the call returns (the arguments were evaluated before),
/// and no other snapshot of the transaction -- a large object opened for
/// reading, an exported snapshot, a cursor -- needs our xmin.
fn sole_statement(fn_oid: Oid) -> bool {
    if fn_oid == pg_sys::InvalidOid || crate::read::snapshot::fixed_snapshot() {
        return false;
    }
    // SAFETY: plain reads of transaction state.
    if unsafe { pg_sys::IsTransactionBlock() || pg_sys::XactHasExportedSnapshots() } {
        return false;
    }
    // SAFETY: reads of the active portal and its planned statement, which
    // live while the statement runs; every pointer is checked and every
    // node's tag is checked before the cast.
    unsafe {
        let portal = pg_sys::ActivePortal;
        if portal.is_null() || crate::pg::list_len((*portal).stmts) != 1 {
            return false;
        }
        let Some(stmt) = crate::pg::list_nth::<pg_sys::PlannedStmt>((*portal).stmts, 0) else { return false };
        if crate::pg::node_tag(stmt) != pg_sys::NodeTag::T_PlannedStmt
            || (*stmt).commandType != pg_sys::CmdType::CMD_SELECT
            || !(*stmt).utilityStmt.is_null()
        {
            return false;
        }
        let plan = (*stmt).planTree;
        if plan.is_null()
            || crate::pg::node_tag(plan) != pg_sys::NodeTag::T_Result
            || !(*plan).lefttree.is_null()
            || !(*plan).righttree.is_null()
            || crate::pg::list_len((*plan).targetlist) != 1
        {
            return false;
        }
        let Some(te) = crate::pg::list_nth::<pg_sys::TargetEntry>((*plan).targetlist, 0) else { return false };
        let expr = (*te).expr;
        if expr.is_null()
            || crate::pg::node_tag(expr) != pg_sys::NodeTag::T_FuncExpr
            || (*(expr as *mut pg_sys::FuncExpr)).funcid != fn_oid
        {
            return false;
        }
        // No other portal (an open cursor's snapshot needs our xmin): the
        // portals' contexts are the children of TopPortalContext.
        let cx = (*portal).portalContext;
        if cx.is_null() || (*cx).parent.is_null() {
            return false;
        }
        let mut children = 0;
        let mut c = (*(*cx).parent).firstchild;
        while !c.is_null() {
            children += 1;
            c = (*c).nextchild;
        }
        children == 1
    }
}

/// One look for a committed key past `cursor` in the table waited on, as
/// it is now -- the one step that asks the registry again, since the call
/// sleeps between looks: a table dropped, disabled or no longer in a
/// database with pgkvx ends the wait with its error (their commits wake
/// the waiters), and a key changed by disable and enable is parsed anew.
fn look(table: &registry::Table, cursor: Option<&str>, backward: bool) -> bool {
    let Some(heap) = OpenRel::try_open(table.relid, pg_sys::AccessShareLock) else {
        errors::raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation with OID {} was dropped while pgkvx.wait_for() waited on it", table.relid.to_u32()),
        )
    };
    let now = table.now();
    let after = cursor.map(|t| cursor::parse_after(now.key(), t));
    committed_past(heap, &now.latched, after.as_ref(), backward)
}

/// Whether a row with a key past `after` (before it when `backward`; any
/// row when None) is visible to a fresh snapshot: one index probe of the
/// key index (of each leaf, for a partitioned table).
fn committed_past(heap: OpenRel, latched: &registry::Latched, after: Option<&After>, backward: bool) -> bool {
    let relid = heap.oid();
    if heap.relkind() == pg_sys::RELKIND_PARTITIONED_TABLE {
        // One probe per leaf partition; a partition dropped or detached
        // since the list was read is no longer the table's.
        drop(heap);
        return registry::partitions::members(relid).into_iter().any(|m| {
            // SAFETY: a syscache probe.
            let leaf = unsafe { pg_sys::get_rel_relkind(m) as u8 == pg_sys::RELKIND_RELATION };
            leaf && OpenRel::try_open(m, pg_sys::AccessShareLock)
                .and_then(|h| registry::lookup(m).map(|leaf| (h, leaf)))
                .is_some_and(|(h, leaf)| committed_past(h, &leaf, after, backward))
        });
    }
    let key = &latched.key;
    if key.index == pg_sys::InvalidOid {
        // A partition without an index on the key cannot be probed: say
        // yes, and the caller reads.
        return true;
    }
    let index = OpenRel::open(key.index, pg_sys::AccessShareLock);
    let (mut keys, _subkeys, exact) = cursor::scan_keys(key, &index, after, false, backward);
    // Backward from the cursor: the first row is the nearest before it.
    let direction = if backward {
        pg_sys::ScanDirection::BackwardScanDirection
    } else {
        pg_sys::ScanDirection::ForwardScanDirection
    };
    let mut found = false;
    crate::pg::index_scan::scan_fresh(&heap, &index, &mut keys, direction, |slot| {
        let Some(a) = after else {
            found = true;
            return false;
        };
        if exact {
            found = true;
            return false;
        }
        // SAFETY: the scan's slot holds a row of the keyed table.
        let k = unsafe { key.encode_slot(slot) };
        let (kb, ab) = (k.bytes(), a.bytes.as_slice());
        // A key that starts with the cursor's encoding is the cursor
        // itself or, for a prefix cursor `(3)`, one of the keys it
        // stands for; a truncated key that ties with it cannot be
        // ordered (the next one can).
        let tie = kb.starts_with(ab) || ((k.truncated() || a.truncated) && ab.starts_with(kb));
        found = (if backward { kb < ab } else { kb > ab }) && !tie;
        !found
    });
    found
}

/// Whether the caller may see that `relid` is waited on (from the catalog
/// alone: it never waits for a table lock).
pub(super) fn visible(relid: Oid) -> bool {
    registry::visibility(relid).latches
}

/// Per-table wait statistics since the server started, for tables of this
/// database the caller may see; `relid` NULL sums the tables that found no
/// wait slot of their own (pgkvx.max_tables).
#[pg_extern(volatile, parallel_safe, schema = "pgkvx")]
#[allow(clippy::type_complexity)]
fn wait_stats() -> TableIterator<
    'static,
    (
        name!(relid, Option<Oid>),
        name!(waiting, i32),
        name!(calls, i64),
        name!(immediate, i64),
        name!(woken, i64),
        name!(timeouts, i64),
        name!(wait_micros, i64),
        name!(broadcasts, i64),
        name!(spurious_wakeups, i64),
        name!(read_waits, i64),
        name!(read_wait_micros, i64),
    ),
> {
    let (tables, shared) = wakeups::per_table();
    let db = backend::my_db();
    let mut rows: Vec<_> = tables
        .into_iter()
        .filter(|t| t.rel.db() == db && visible(Oid::from(t.rel.rel())))
        .map(|t| (Some(Oid::from(t.rel.rel())), t))
        .collect();
    if shared.stats.calls > 0 || shared.stats.read_waits > 0 {
        rows.push((None, shared));
    }
    TableIterator::new(rows.into_iter().map(|(relid, t)| {
        let s = t.stats;
        (
            relid,
            t.waiting as i32,
            s.calls as i64,
            s.immediate as i64,
            s.woken as i64,
            s.timeouts as i64,
            s.wait_us as i64,
            s.broadcasts as i64,
            s.spurious as i64,
            s.read_waits as i64,
            s.read_wait_us as i64,
        )
    }))
}

/// Sessions waiting in `pgkvx.wait_for` now, on tables of this database the
/// caller may see.
#[pg_extern(volatile, parallel_safe, schema = "pgkvx")]
#[allow(clippy::type_complexity)]
fn wait_list() -> TableIterator<
    'static,
    (name!(pid, i32), name!(relid, Oid), name!(waiting_since, Option<TimestampWithTimeZone>), name!(wakeups, i32)),
> {
    let db = backend::my_db();
    let rows: Vec<_> = wakeups::waiters()
        .into_iter()
        .filter(|w| w.rel.db() == db && visible(Oid::from(w.rel.rel())))
        .map(|w| (w.pid, Oid::from(w.rel.rel()), crate::pg::timestamptz(w.since_us), w.wakeups as i32))
        .collect();
    TableIterator::new(rows)
}

extension_sql!(
    r#"
CREATE VIEW pgkvx.waiters AS
    SELECT pid, relid::regclass AS relid, waiting_since,
           pg_catalog.clock_timestamp() - waiting_since AS age, wakeups
      FROM pgkvx.wait_list();
COMMENT ON VIEW pgkvx.waiters IS 'Sessions waiting in pgkvx.wait_for() on tables you may SELECT (all with pg_monitor)';
GRANT SELECT ON pgkvx.waiters TO PUBLIC;
"#,
    name = "waiters_view",
    requires = [wait_list],
);
