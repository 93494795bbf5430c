//! `pgkvx.enable` / `pgkvx.disable`: registering a latched table.

use super::regclass::Regclass;
use super::registry::{self, ROW_TRIGGER, TRUNCATE_TRIGGER};
use crate::errors;
use crate::keys::{KeyDesc, KeyKind};
use crate::shmem::backend;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

/// Only the table's owner may change how its writes behave.
fn require_owner(relid: Oid) {
    // SAFETY: catalog checks; aclcheck_error raises the standard 42501 error.
    unsafe {
        if !pg_sys::pg_class_ownercheck(relid, pg_sys::GetUserId()) {
            let kind = pg_sys::get_rel_relkind(relid);
            pg_sys::aclcheck_error(
                pg_sys::AclResult::ACLCHECK_NOT_OWNER,
                pg_sys::get_relkind_objtype(kind),
                pg_sys::get_rel_name(relid),
            );
        }
    }
}

/// `schema.table`, quoted for SQL.
fn qualified(relid: Oid) -> String {
    super::spi::one::<String>("SELECT $1::regclass::text", &[relid.into()])
        .unwrap_or_else(|| errors::raise(PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE, "relation does not exist"))
}

/// The sequence that feeds the key column (serial/bigserial or identity).
pub fn key_sequence(key: &KeyDesc) -> Option<Oid> {
    let col = &key.cols[0];
    super::spi::one::<Oid>(
        "SELECT pg_catalog.pg_get_serial_sequence($1::regclass::text, $2)::regclass::oid",
        &[key.relid.into(), col.name.clone().into()],
    )
}

/// Checks `key` can be drawn gaplessly and returns its sequence.
pub fn gapless_sequence(key: &KeyDesc) -> Oid {
    if key.cols.len() != 1 || key.cols[0].kind != KeyKind::Int {
        errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("gapless keys need a single integer key column; \"{}\" has another key", key.relname),
        );
    }
    let Some(seq) = key_sequence(key) else {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("key column \"{}\" of \"{}\" has no sequence", key.cols[0].name, key.relname),
            "Declare the key column bigserial (or attach a sequence with OWNED BY).",
        );
    };
    seq
}

#[pg_extern(volatile, parallel_unsafe)]
fn enable(rel: Regclass, index: default!(Option<Regclass>, "NULL"), gapless: default!(bool, false)) {
    let (rel, index) = (rel.0, index.map(|i| i.0));
    require_owner(rel);
    let key = KeyDesc::resolve(rel, index);
    let name = qualified(rel);
    // SHARE ROW EXCLUSIVE (what CREATE TRIGGER takes) up front, so writers
    // in flight finish before latching starts and none slips through.
    Spi::run(&format!("LOCK TABLE {name} IN SHARE ROW EXCLUSIVE MODE")).unwrap_or_else(|e| panic!("{e}"));
    if gapless {
        let seq = gapless_sequence(&key);
        check_sequence_cache(seq);
        let identity = super::spi::one::<bool>(
            "SELECT attidentity <> '' FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attnum = $2",
            &[rel.into(), key.cols[0].attnum.into()],
        )
        .unwrap_or(false);
        if identity {
            errors::raise_hint(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("key column \"{}\" of \"{}\" is an identity column", key.cols[0].name, key.relname),
                "An identity column's default cannot be replaced; use bigserial (a sequence DEFAULT) for gapless keys.",
            );
        }
    }
    Spi::run_with_args(
        "INSERT INTO pgkvx.tables (relid, key_index, gapless) VALUES ($1, $2, $3)
         ON CONFLICT (relid) DO UPDATE SET key_index = excluded.key_index, gapless = excluded.gapless",
        &[rel.into(), index.into(), gapless.into()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for (trigger, timing) in [
        (ROW_TRIGGER, "BEFORE INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION pgkvx.latch_row()"),
        (TRUNCATE_TRIGGER, "BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION pgkvx.latch_truncate()"),
    ] {
        let exists = super::spi::one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = $1 AND tgname = $2)",
            &[rel.into(), trigger.into()],
        )
        .unwrap_or(false);
        if !exists {
            let body = timing.replace("{t}", &name);
            Spi::run(&format!("CREATE TRIGGER {trigger} {body}")).unwrap_or_else(|e| panic!("{e}"));
        }
        // ALWAYS: also under session_replication_role = replica and in
        // logical replication apply, which would otherwise write unlatched.
        Spi::run(&format!("ALTER TABLE {name} ENABLE ALWAYS TRIGGER {trigger}")).unwrap_or_else(|e| panic!("{e}"));
    }
    if gapless {
        Spi::run(&format!(
            "ALTER TABLE {name} ALTER COLUMN {} SET DEFAULT pgkvx.next_key({})",
            quote_ident(&key.cols[0].name),
            quote_literal(&name)
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }
    // SAFETY: queues a relcache invalidation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(rel) };
}

#[pg_extern(volatile, parallel_unsafe)]
fn disable(rel: Regclass) {
    let rel = rel.0;
    require_owner(rel);
    let name = qualified(rel);
    // No reader may be validating and no writer latching while we go.
    Spi::run(&format!("LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")).unwrap_or_else(|e| panic!("{e}"));
    let gapless = super::spi::one::<bool>("SELECT gapless FROM pgkvx.tables WHERE relid = $1", &[rel.into()]);
    if gapless == Some(true) {
        // Put the plain sequence default back.
        if let Some(l) = registry::lookup(rel) {
            if let Some(seq) = key_sequence(&l.key) {
                Spi::run_with_args(
                    &format!(
                        "ALTER TABLE {name} ALTER COLUMN {} SET DEFAULT pg_catalog.nextval({})",
                        quote_ident(&l.key.cols[0].name),
                        quote_literal(
                            &super::spi::one::<String>("SELECT $1::regclass::text", &[seq.into()]).unwrap_or_default()
                        )
                    ),
                    &[],
                )
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
    for trigger in [ROW_TRIGGER, TRUNCATE_TRIGGER] {
        Spi::run(&format!("DROP TRIGGER IF EXISTS {trigger} ON {name}")).unwrap_or_else(|e| panic!("{e}"));
    }
    Spi::run_with_args("DELETE FROM pgkvx.tables WHERE relid = $1", &[rel.into()]).unwrap_or_else(|e| panic!("{e}"));
    backend::purge_at_commit(backend::rel_id(rel));
    // SAFETY: queues a relcache invalidation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(rel) };
}

/// Called by the `sql_drop` event trigger for every dropped table: its
/// registry row and its latches go with it.
#[pg_extern(volatile, parallel_unsafe, name = "_forget_table")]
fn forget_table(rel: Oid) {
    Spi::run_with_args("DELETE FROM pgkvx.tables WHERE relid::oid = $1", &[rel.into()])
        .unwrap_or_else(|e| panic!("{e}"));
    backend::purge_at_commit(backend::rel_id(rel));
}

/// Refuses sequences whose values are cached per backend: a backend can
/// then hand out a smaller value after another committed a larger one,
/// which is exactly the gap gapless keys exist to prevent.
pub fn check_sequence_cache(seq: Oid) {
    let cache =
        super::spi::one::<i64>("SELECT seqcache FROM pg_catalog.pg_sequence WHERE seqrelid = $1", &[seq.into()])
            .unwrap_or(1);
    if cache != 1 {
        let name = registry::rel_name(seq);
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("sequence \"{name}\" caches {cache} values per session; gapless keys need CACHE 1"),
            format!("ALTER SEQUENCE {name} CACHE 1;"),
        );
    }
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
