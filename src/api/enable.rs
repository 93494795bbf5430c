//! `pgkvx.enable` / `pgkvx.disable`: registering a latched table.
//!
//! The SQL these run is DDL on the caller's own table (the latch triggers,
//! the key's DEFAULT), with every name qualified and quoted and the
//! search_path pinned; the registration row is written straight into
//! `pgkvx.tables`.

use crate::args::{self, Regclass};
use crate::errors;
use crate::gapless::sequence::{check_sequence_cache, gapless_sequence, is_identity, key_sequence, refuse_gapless_key};
use crate::keys::KeyDesc;
use crate::pg::{list_iter, qualified_name, quote_ident, quote_literal, rel_name, with_pinned_settings, OpenRel};
use crate::registry::{self, partitions, ROW_TRIGGER, TRUNCATE_TRIGGER};
use crate::shmem::backend;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::ffi::CStr;

fn run_ddl(sql: &str) {
    with_pinned_settings(|| Spi::run(sql)).unwrap_or_else(|e| panic!("{e}"));
}

/// The columns of `relid`'s primary key, in key order.
fn primary_key_columns(relid: Oid) -> Vec<String> {
    with_pinned_settings(|| {
        Spi::get_one_with_args::<Vec<String>>(
            "SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.n)
               FROM pg_catalog.pg_index i,
                    pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n),
                    pg_catalog.pg_attribute a
              WHERE i.indrelid = $1 AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.attnum",
            &[relid.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or_default()
}

#[pg_extern(volatile, parallel_unsafe, schema = "pgkvx")]
fn enable(rel: Option<Regclass>, index: default!(Option<Regclass>, "NULL"), gapless: default!(Option<bool>, false)) {
    let rel = args::required(rel, "rel");
    let gapless = args::required_value(gapless, "gapless");
    Enabling::resolve(rel, index.map(|i| i.0), gapless).latch();
}

/// What latching a table needs to know of it, derived once, with the
/// table locked, before anything is changed: every refusal happens here.
struct Enabling {
    relid: Oid,
    /// Qualified and quoted, for the DDL.
    sql_name: String,
    key: KeyDesc,
    gapless: bool,
    partitioned: bool,
    /// An identity key keeps its identity default: the planner draws it
    /// through next_key (gapless/rewrite.rs).
    identity: bool,
    /// Whether the row and TRUNCATE triggers exist already.
    present: [bool; 2],
    /// The key index as registered: none for the primary key (the key
    /// columns name it): pg_restore loads pgkvx.tables before it creates
    /// indexes, and a regclass naming one not yet there fails the whole
    /// table's COPY.
    stored_index: Option<Oid>,
}

impl Enabling {
    fn resolve(rel: Oid, index: Option<Oid>, gapless: bool) -> Enabling {
        crate::pg::acl::require_owner(rel);
        // SHARE ROW EXCLUSIVE (what CREATE TRIGGER takes) up front, so
        // writers in flight finish before latching starts and none slips
        // through.  The lock lasts to the end of the transaction; the
        // relation itself is closed before the DDL, which refuses a table
        // in use.
        // SAFETY: standard lock acquisition; raises on a missing relation.
        unsafe { pg_sys::LockRelationOid(rel, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE) };
        let r = OpenRel::open(rel, pg_sys::NoLock);
        let name = rel_name(rel);
        if r.form().relpersistence as u8 == pg_sys::RELPERSISTENCE_TEMP {
            errors::raise_hint(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("pgkvx cannot latch temporary table \"{name}\""),
                "Only its own session can write a temporary table, so no write can commit behind a reader: it needs no latching.",
            );
        }
        let partitioned = r.relkind() == pg_sys::RELKIND_PARTITIONED_TABLE;
        // One latch identity per partition tree.
        partitions::refuse_overlap(rel);
        let (index, tail) = match index {
            None if gapless => gapless_key_index(rel, &name, partitioned),
            index => (index, None),
        };
        let key = partitions::narrow(KeyDesc::resolve(rel, index), tail.as_ref().map(std::slice::from_ref));
        if gapless {
            check_sequence_cache(gapless_sequence(&key));
        }
        let enabling = Enabling {
            relid: rel,
            sql_name: qualified_name(rel),
            identity: gapless && r.attrs()[key.cols[0].attnum as usize - 1].identity != 0,
            present: [ROW_TRIGGER, TRUNCATE_TRIGGER].map(|t| r.trigger_enabled(t).is_some()),
            stored_index: index.filter(|&i| Some(i) != r.primary_key_index()),
            key,
            gapless,
            partitioned,
        };
        r.close();
        enabling
    }

    /// Registers the table and gives it its triggers (and a gapless key
    /// its default).
    fn latch(self) {
        let Enabling { relid, sql_name: name, key, gapless, partitioned, identity, present, stored_index } = self;
        let columns: Vec<i16> = key.cols.iter().map(|c| c.attnum).collect();
        registry::register(relid, stored_index, &columns, gapless);
        for (i, (trigger, timing)) in [
            (ROW_TRIGGER, "BEFORE INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION pgkvx.latch_row()"),
            (TRUNCATE_TRIGGER, "BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION pgkvx.latch_truncate()"),
        ]
        .into_iter()
        .enumerate()
        {
            let trigger = quote_ident(trigger);
            if !present[i] {
                run_ddl(&format!("CREATE TRIGGER {trigger} {}", timing.replace("{t}", &name)));
            }
            // ALWAYS: also under session_replication_role = replica and in
            // logical replication apply, which would otherwise write unlatched.
            run_ddl(&format!("ALTER TABLE {name} ENABLE ALWAYS TRIGGER {trigger}"));
        }
        if partitioned {
            enable_members(relid);
        }
        if gapless && !identity {
            run_ddl(&format!(
                "ALTER TABLE {name} ALTER COLUMN {} SET DEFAULT pgkvx.next_key({}::pg_catalog.regclass)",
                quote_ident(&key.cols[0].name),
                quote_literal(&relid.to_u32().to_string())
            ));
        }
        // SAFETY: queues a relcache invalidation, sent at commit.
        unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    }
}

/// The key index of a gapless table named by no index, and the one column
/// of it to key on where that is not all of it.  A composite primary key
/// cannot be a tail key, whatever its types (which the key resolution
/// would complain of first) -- except on a partitioned table, whose
/// primary key must hold the partition key: there the key's one
/// sequence-fed column is.
fn gapless_key_index(rel: Oid, name: &str, partitioned: bool) -> (Option<Oid>, Option<i16>) {
    let pk = primary_key_columns(rel);
    if pk.len() <= 1 {
        return (None, None);
    }
    match partitions::tail_column(rel).filter(|_| partitioned) {
        Some((pk_index, column)) => (Some(pk_index), Some(column)),
        None => refuse_gapless_key(rel, name, &pk),
    }
}

/// The partitions of latched partitioned table `rel`: PostgreSQL clones
/// the row trigger onto each (and onto partitions created or attached
/// later, with the parent's firing mode); TRUNCATE of a partition fires
/// only the partition's own statement triggers, so each leaf gets one.
pub fn enable_members(rel: Oid) {
    enable_new_members(&partitions::members(rel));
}

/// Gives each of `members` (partitions of a latched tree) the latch
/// triggers, always enabled; each one's state is read just before it is
/// changed (the DDL below fires the event trigger again).
pub fn enable_new_members(members: &[Oid]) {
    for &m in members {
        let name = qualified_name(m);
        let (row, truncate, leaf) = {
            let Some(r) = OpenRel::try_open(m, pg_sys::AccessShareLock) else { continue };
            (
                r.trigger_enabled(ROW_TRIGGER),
                r.trigger_enabled(TRUNCATE_TRIGGER),
                r.relkind() == pg_sys::RELKIND_RELATION,
            )
        };
        if row.is_some_and(|e| e != b'A') {
            run_ddl(&format!("ALTER TABLE {name} ENABLE ALWAYS TRIGGER {}", quote_ident(ROW_TRIGGER)));
        }
        if leaf {
            if truncate.is_none() {
                run_ddl(&format!(
                    "CREATE TRIGGER {} BEFORE TRUNCATE ON {name} FOR EACH STATEMENT EXECUTE FUNCTION pgkvx.latch_truncate()",
                    quote_ident(TRUNCATE_TRIGGER)
                ));
            }
            if truncate != Some(b'A') {
                run_ddl(&format!("ALTER TABLE {name} ENABLE ALWAYS TRIGGER {}", quote_ident(TRUNCATE_TRIGGER)));
            }
        }
    }
}

/// Puts a gapless table's plain sequence default back.
pub fn restore_sequence_default(rel: Oid) {
    let Some(reg) = registry::registration(rel).filter(|r| r.gapless) else { return };
    // A key index dropped since falls back to the primary key.
    // SAFETY: a syscache probe.
    let index = reg.key_index.filter(|&i| unsafe { !pg_sys::get_rel_name(i).is_null() });
    let key = partitions::narrow(KeyDesc::resolve(rel, index), reg.key_columns.as_deref());
    // An identity key kept its own default throughout.
    if is_identity(rel, key.cols[0].attnum) {
        return;
    }
    if let Some(seq) = key_sequence(&key) {
        run_ddl(&format!(
            "ALTER TABLE {} ALTER COLUMN {} SET DEFAULT pg_catalog.nextval({}::pg_catalog.regclass)",
            qualified_name(rel),
            quote_ident(&key.cols[0].name),
            quote_literal(&seq.to_u32().to_string())
        ));
    }
}

#[pg_extern(volatile, parallel_unsafe, schema = "pgkvx")]
fn disable(rel: Option<Regclass>) {
    let rel = args::required(rel, "rel");
    crate::pg::acl::require_owner(rel);
    // No reader may be validating and no writer latching while we go.
    // SAFETY: standard lock acquisition, held to the end of the transaction.
    unsafe { pg_sys::LockRelationOid(rel, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE) };
    let present = {
        let r = OpenRel::open(rel, pg_sys::NoLock);
        [ROW_TRIGGER, TRUNCATE_TRIGGER].map(|t| r.trigger_enabled(t).is_some())
    };
    if let Some(root) = registry::lookup(rel).map(|l| l.root).filter(|&r| r != rel) {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("\"{}\" is latched as a partition of \"{}\"", rel_name(rel), rel_name(root)),
            format!(
                "SELECT pgkvx.disable({}); stops latching the whole partitioned table.",
                quote_literal(&crate::pg::regclass_text(root))
            ),
        );
    }
    let name = qualified_name(rel);
    restore_sequence_default(rel);
    for (i, trigger) in [ROW_TRIGGER, TRUNCATE_TRIGGER].into_iter().enumerate() {
        if present[i] {
            run_ddl(&format!("DROP TRIGGER {} ON {name}", quote_ident(trigger)));
        }
    }
    // The row trigger's clones went with it; the leaves' TRUNCATE triggers
    // are their own.
    for m in partitions::members(rel) {
        let has = OpenRel::try_open(m, pg_sys::AccessShareLock)
            .is_some_and(|r| r.trigger_enabled(TRUNCATE_TRIGGER).is_some());
        if has {
            run_ddl(&format!("DROP TRIGGER {} ON {}", quote_ident(TRUNCATE_TRIGGER), qualified_name(m)));
        }
    }
    registry::unregister(rel);
    backend::purge_at_commit(backend::rel_id(rel));
    // SAFETY: queues a relcache invalidation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(rel) };
}

/// Called by the `sql_drop` event trigger for every dropped table: its
/// registry row and its latches go with it.
#[pg_extern(volatile, parallel_unsafe, strict, name = "_forget_table", schema = "pgkvx")]
fn forget_table(rel: Oid) {
    registry::unregister(rel);
    backend::purge_at_commit(backend::rel_id(rel));
}

#[no_mangle]
pub extern "C" fn pg_finfo_pgkvx_on_drop_extension() -> &'static pg_sys::Pg_finfo_record {
    static V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `ddl_command_start` event trigger for DROP EXTENSION: when pgkvx goes
/// with CASCADE, which drops the `next_key()` defaults of gapless tables,
/// those tables get their sequence default back first, and every latched
/// table's latches are forgotten at commit.  Without CASCADE Postgres
/// refuses the drop itself (the latch triggers depend on the extension).
///
/// # Safety
/// Called by the function manager as an event trigger.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn pgkvx_on_drop_extension(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the event trigger protocol: context is EventTriggerData and
    // its parse tree a DropStmt (the trigger is created WHEN TAG IN
    // ('DROP EXTENSION')); nodes are checked by tag before each cast.
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_EventTriggerData {
            return pg_sys::Datum::from(0);
        }
        let tree = (*(ctx as *mut pg_sys::EventTriggerData)).parsetree;
        if tree.is_null() || (*tree).type_ != pg_sys::NodeTag::T_DropStmt {
            return pg_sys::Datum::from(0);
        }
        let stmt = &*(tree as *mut pg_sys::DropStmt);
        let ours = stmt.removeType == pg_sys::ObjectType::OBJECT_EXTENSION
            && list_iter::<pg_sys::Node>(stmt.objects).any(|n| {
                (*n).type_ == pg_sys::NodeTag::T_String
                    && CStr::from_ptr((*(n as *mut pg_sys::String)).sval).to_bytes() == b"pgkvx"
            });
        if !ours || stmt.behavior != pg_sys::DropBehavior::DROP_CASCADE {
            return pg_sys::Datum::from(0);
        }
        for (rel, reg) in registry::registered() {
            if reg.gapless {
                restore_sequence_default(rel);
            }
            backend::purge_at_commit(backend::rel_id(rel));
        }
        pg_sys::Datum::from(0)
    }
}
