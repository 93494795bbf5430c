//! Partitions created or attached under a latched partitioned table after
//! `enable`: PostgreSQL clones the row latch trigger onto them itself, but
//! not the TRUNCATE trigger (statement triggers are not cloned, and a
//! partition's TRUNCATE fires only its own).  An event trigger at the end
//! of every CREATE TABLE and ALTER TABLE (ATTACH PARTITION) gives the new
//! leaves theirs, in the same transaction, so no partition is ever
//! truncated unlatched.  A table detached keeps it, as a no-op (the trigger
//! latches nothing on a table that is not latched).

use crate::args::Regclass;
use crate::errors;
use crate::pg::{rel_name, OpenRel};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

thread_local! {
    /// Tables an ALTER TABLE ... ATTACH PARTITION of this backend is
    /// attaching to a latched tree (recorded at its start, used at its end).
    static ATTACHING: std::cell::RefCell<Vec<Oid>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Set while our own DDL runs (it fires the event trigger again).
    static REPAIRING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives the partitions this statement added to a latched tree the
/// triggers they lack: `rel`, when it is a partition of a latched table
/// created in this transaction (CREATE TABLE ... PARTITION OF), and the
/// tables an ATTACH of this statement attached.  Nothing else is touched:
/// a partition whose trigger its owner disabled stays disabled (check()
/// reports it), another role's partitions are left alone, and a restore,
/// which creates the triggers itself after the data, is not raced.
/// Called by the event trigger below, with each table the DDL named.
#[pg_extern(volatile, parallel_unsafe, strict, name = "_enable_partitions", schema = "pgkvx")]
fn enable_partitions(rel: Regclass) {
    if REPAIRING.with(|r| r.get()) {
        return;
    }
    let relid = rel.0;
    let mut fresh: Vec<Oid> = ATTACHING.with(|a| std::mem::take(&mut *a.borrow_mut()));
    // Registrations only, never the registry's lookup, which raises for a
    // table whose key is not there yet (a restore adds it later).
    let latched_tree = |t: Oid| {
        crate::registry::partitions::ancestors(t).into_iter().any(|a| crate::registry::registration(a).is_some())
    };
    if latched_tree(relid) && created_in_this_transaction(relid) {
        fresh.push(relid);
    }
    let mut tables = Vec::new();
    for t in fresh {
        tables.push(t);
        tables.extend(crate::registry::partitions::members(t));
    }
    // SAFETY: an ownership probe of an existing relation.
    tables.retain(|&t| latched_tree(t) && crate::pg::acl::is_owner(t));
    tables.dedup();
    REPAIRING.with(|r| r.set(true));
    pgrx::PgTryBuilder::new(|| super::enable::enable_new_members(&tables))
        .finally(|| REPAIRING.with(|r| r.set(false)))
        .execute();
}

/// Whether `relid`'s pg_class row was written by this transaction.
fn created_in_this_transaction(relid: Oid) -> bool {
    // SAFETY: a syscache probe; the tuple is released before returning.
    unsafe {
        let t = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(relid));
        if t.is_null() {
            return false;
        }
        let xmin = (*(*t).t_data).t_choice.t_heap.t_xmin;
        pg_sys::ReleaseSysCache(t);
        pg_sys::TransactionIdIsCurrentTransactionId(xmin)
    }
}

extension_sql!(
    r#"
-- Partitions created or attached under a latched partitioned table get
-- its TRUNCATE latch trigger (the row trigger PostgreSQL clones itself).
CREATE FUNCTION pgkvx._on_ddl_end() RETURNS event_trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT c.objid AS relid
               FROM pg_catalog.pg_event_trigger_ddl_commands() c,
                    LATERAL pg_catalog.pg_partition_ancestors(c.objid) a,
                    pgkvx.tables u
              WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.objsubid = 0
                AND u.relid = a.relid
    LOOP
        PERFORM pgkvx._enable_partitions(r.relid);
    END LOOP;
END $$;
CREATE EVENT TRIGGER pgkvx_ddl_end ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE') EXECUTE FUNCTION pgkvx._on_ddl_end();
"#,
    name = "partition_ddl",
    requires = ["catalog", enable_partitions],
);

#[no_mangle]
pub extern "C" fn pg_finfo_pgkvx_on_alter_table() -> &'static pg_sys::Pg_finfo_record {
    static V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `ddl_command_start` event trigger for ALTER TABLE: ATTACH PARTITION into
/// a latched partition tree takes ACCESS EXCLUSIVE on its root first, as
/// CREATE TABLE ... PARTITION OF and DETACH do.  PostgreSQL's own ATTACH
/// takes only SHARE UPDATE EXCLUSIVE on the parent, so a tail planned
/// before it commits keeps reading the old set of partitions; a writer in
/// flight at the tail's snapshot could then commit into the new partition a
/// key the tail, after waiting for other writers and reading again, moves
/// past.  With the root locked, no tail runs across the ATTACH.
///
/// # Safety
/// Called by the function manager as an event trigger.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn pgkvx_on_alter_table(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the event trigger protocol: context is EventTriggerData and
    // its parse tree is checked by tag before each cast.
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_EventTriggerData {
            return pg_sys::Datum::from(0);
        }
        // Not preloaded, no read is protected: nothing to lock for.
        if !crate::shmem::preloaded() {
            return pg_sys::Datum::from(0);
        }
        let tree = (*(ctx as *mut pg_sys::EventTriggerData)).parsetree;
        if tree.is_null() || (*tree).type_ != pg_sys::NodeTag::T_AlterTableStmt {
            return pg_sys::Datum::from(0);
        }
        let stmt = &*(tree as *mut pg_sys::AlterTableStmt);
        let attaches = crate::pg::list_iter::<pg_sys::AlterTableCmd>(stmt.cmds).any(|c| {
            (*c).type_ == pg_sys::NodeTag::T_AlterTableCmd && (*c).subtype == pg_sys::AlterTableType::AT_AttachPartition
        });
        if !attaches || stmt.relation.is_null() {
            return pg_sys::Datum::from(0);
        }
        // Resolved without a lock, as the ALTER itself will resolve it.
        let Some(relid) = crate::pg::relation_named(stmt.relation) else { return pg_sys::Datum::from(0) };
        let root = crate::registry::lookup(relid).map_or(relid, |l| l.root);
        let latched = crate::registry::registration(root).is_some();
        // Only for the table's owner (whom the ALTER requires): no one
        // else may make a latched table wait by trying.
        if latched && crate::pg::acl::is_owner(relid) {
            pg_sys::LockRelationOid(root, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE);
            if crate::registry::registration(root).is_some_and(|r| r.gapless) {
                for c in crate::pg::list_iter::<pg_sys::AlterTableCmd>(stmt.cmds) {
                    if (*c).subtype == pg_sys::AlterTableType::AT_AttachPartition && !(*c).def.is_null() {
                        refuse_attaching_rows(root, (*((*c).def as *mut pg_sys::PartitionCmd)).name);
                    }
                }
            }
            for c in crate::pg::list_iter::<pg_sys::AlterTableCmd>(stmt.cmds) {
                if (*c).subtype == pg_sys::AlterTableType::AT_AttachPartition && !(*c).def.is_null() {
                    let rv = (*((*c).def as *mut pg_sys::PartitionCmd)).name;
                    if let Some(part) = crate::pg::relation_named(rv) {
                        ATTACHING.with(|a| a.borrow_mut().push(part));
                    }
                }
            }
        }
        pg_sys::Datum::from(0)
    }
}

/// Refuses to attach a table holding rows into the gapless tree of `root`.
/// Its keys were not drawn by the tree's `next_key`: they may repeat keys
/// the tree has or will draw (its primary key holds the partition key, so
/// nothing else stops a repeat), and a consumer whose cursor stands on one
/// of two equal keys skips the other.
///
/// # Safety
/// `rv` is the ATTACH's partition name, or null.
unsafe fn refuse_attaching_rows(root: Oid, rv: *mut pg_sys::RangeVar) {
    // SAFETY: the caller passes the ATTACH's partition name (a valid RangeVar of the parsed statement)
    // or null, which is what relation_named accepts.
    let Some(part) = (unsafe { crate::pg::relation_named(rv) }) else { return };
    // Ownership first: the ATTACH needs it, and nothing of a table the
    // caller does not own (its rows) may show in our answer.  PostgreSQL's
    // own check then refuses with 42501.
    // SAFETY: a catalog ownership check.
    if !crate::pg::acl::is_owner(part) {
        return;
    }
    let mut leaves = crate::registry::partitions::members(part);
    leaves.push(part);
    if let Some(&full) = leaves.iter().find(|&&m| has_rows(m)) {
        errors::raise_full(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "cannot attach \"{}\" to gapless partitioned table \"{}\": \"{}\" holds rows",
                rel_name(part),
                rel_name(root),
                rel_name(full)
            ),
            Some("Its keys were not drawn by the table's pgkvx.next_key: they may repeat keys of the table, and a tail consumer skips one of two equal keys.".to_string()),
            Some("Attach it empty and move its rows in through the parent (INSERT INTO parent (...) SELECT ... FROM it), which draws their keys.".to_string()),
        );
    }
}

/// Whether the plain table `relid` holds a row visible to a fresh snapshot
/// (read under AccessShareLock, which the ATTACH's own lock follows).
fn has_rows(relid: Oid) -> bool {
    // SAFETY: a syscache probe.
    if unsafe { pg_sys::get_rel_relkind(relid) as u8 } != pg_sys::RELKIND_RELATION {
        return false;
    }
    let Some(rel) = OpenRel::try_open(relid, pg_sys::AccessShareLock) else { return false };
    // SAFETY: the relation is open and locked; the snapshot is registered
    // for the scan and released after it; one tuple is read, none kept.
    unsafe {
        let snap = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = pg_sys::heap_beginscan(
            rel.as_ptr(),
            snap,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            pg_sys::ScanOptions::SO_TYPE_SEQSCAN | pg_sys::ScanOptions::SO_ALLOW_PAGEMODE,
        );
        let found = !pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection).is_null();
        pg_sys::heap_endscan(scan);
        pg_sys::UnregisterSnapshot(snap);
        found
    }
}

extension_sql!(
    r#"
-- ATTACH PARTITION into a latched partition tree locks its root first.
CREATE FUNCTION pgkvx._on_alter_table() RETURNS event_trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'pgkvx_on_alter_table';
CREATE EVENT TRIGGER pgkvx_alter_table ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION pgkvx._on_alter_table();
"#,
    name = "partition_attach",
    requires = ["catalog"],
);
