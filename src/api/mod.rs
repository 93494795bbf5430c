//! The SQL surface: `enable`/`disable`, the latch triggers, `latch_span`,
//! `next_key`, the views, `stats()` and `check()`.

pub mod cursor;
pub mod enable;
pub mod head_blockers;
pub mod high_water;

pub mod key_bytes;
pub mod latch_span;
pub mod next_key;
pub mod partitions;
pub mod trigger;
pub mod views;
pub mod wait_for;

use pgrx::prelude::*;

/// The ways writes of a latched table escape latching, as check() and
/// every reader of the table (through the registry) report them.  Tables
/// that are gone or not latched have none.
#[pg_extern(stable, parallel_safe, schema = "pgkvx")]
fn _exposures(rel: crate::args::Regclass) -> SetOfIterator<'static, String> {
    let relid = rel.0;
    // Monitoring never waits on a table lock: a table locked by someone
    // else (DDL, TRUNCATE) is said to be so, and checked next time.
    let opened = crate::pg::OpenRel::try_open_nowait(relid, pgrx::pg_sys::AccessShareLock);
    if opened.is_none() && crate::registry::registration(relid).is_some() {
        // SAFETY: a syscache probe: a table that still exists is locked.
        if unsafe { !pgrx::pg_sys::get_rel_name(relid).is_null() } {
            return SetOfIterator::new(vec![
                "locked by another transaction (DDL or TRUNCATE in progress): not checked now".to_string(),
            ]);
        }
    }
    let found = match opened {
        Some(r) if crate::registry::registration(relid).is_some() => {
            let mut found = crate::registry::exposures(&r, relid);
            // A latched partitioned table: its partitions', each named.
            if r.relkind() == pgrx::pg_sys::RELKIND_PARTITIONED_TABLE {
                drop(r);
                found.extend(crate::registry::partitions::member_exposures(relid));
            }
            // check() only: readers cannot see a sequence moved back.
            found.extend(crate::gapless::sequence::sequence_behind(relid));
            if !crate::shmem::preloaded() {
                found.push(
                    "pgkvx is not in shared_preload_libraries: its reads are not protected and its writes fail until the server preloads pgkvx".to_string(),
                );
            }
            found
        }
        _ => Vec::new(),
    };
    SetOfIterator::new(found)
}

extension_sql!(
    r#"
-- The extension's own schema: created here, so that it belongs to the
-- extension (DROP EXTENSION takes it along) and so that a schema of that
-- name made beforehand by someone else makes CREATE EXTENSION fail instead
-- of being used.
CREATE SCHEMA pgkvx;
GRANT USAGE ON SCHEMA pgkvx TO PUBLIC;

-- Latched tables.  pg_dump keeps it (extension config); restoring the
-- tables' triggers and this row restores the latching.  Written only by
-- pgkvx.enable/disable (as the table's owner, checked there); readable by
-- everyone, with no row level security, so that neither row_security nor a
-- non-superuser's pg_dump trips over it.
CREATE TABLE pgkvx.tables (
    relid       regclass    PRIMARY KEY,
    key_index   regclass,                          -- NULL: the primary key
    gapless     boolean     NOT NULL DEFAULT false,
    enabled_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    key_columns int2[]                             -- the key's columns, to follow a rebuilt key index
);
COMMENT ON TABLE pgkvx.tables IS 'Tables latched by pgkvx.enable()';
SELECT pg_catalog.pg_extension_config_dump('pgkvx.tables', '');
GRANT SELECT ON pgkvx.tables TO PUBLIC;
"#,
    name = "catalog",
    bootstrap,
);

extension_sql!(
    r#"
-- A dropped table takes its registration and its latches with it.
CREATE FUNCTION pgkvx._on_sql_drop() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
BEGIN
    FOR o IN SELECT d.objid FROM pg_catalog.pg_event_trigger_dropped_objects() d
              WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0
                AND EXISTS (SELECT 1 FROM pgkvx.tables t WHERE t.relid::pg_catalog.oid = d.objid)
    LOOP
        PERFORM pgkvx._forget_table(o.objid);
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION pgkvx._forget_table(oid) FROM PUBLIC;
CREATE EVENT TRIGGER pgkvx_sql_drop ON sql_drop EXECUTE FUNCTION pgkvx._on_sql_drop();

-- DROP EXTENSION pgkvx CASCADE drops the next_key() defaults of gapless
-- tables; they get their sequence default back first, so inserts go on.
CREATE FUNCTION pgkvx._on_drop_extension() RETURNS event_trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'pgkvx_on_drop_extension';
CREATE EVENT TRIGGER pgkvx_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION') EXECUTE FUNCTION pgkvx._on_drop_extension();

-- Latched tables whose writes could escape latching, or whose reads pgkvx
-- cannot protect.
CREATE FUNCTION pgkvx.check() RETURNS TABLE (relid regclass, problem text)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    -- Writes that escape latching: the rule every reader asks too.
    SELECT t.relid, e.problem FROM pgkvx.tables t, LATERAL pgkvx._exposures(t.relid) AS e(problem)
    UNION ALL
    -- Row triggers of one timing fire in name order: a BEFORE INSERT/UPDATE
    -- row trigger named after ours may change the key after it was latched.
    SELECT t.relid, format('BEFORE ROW trigger %I fires after the latch trigger and may change the key unlatched; rename it to sort before zz_pgkvx_latch', g.tgname)
      FROM pgkvx.tables t JOIN pg_trigger g ON g.tgrelid = t.relid
     WHERE NOT g.tgisinternal AND g.tgname COLLATE "C" > 'zz_pgkvx_latch'
       AND g.tgname NOT IN ('zz_pgkvx_latch_truncate') AND g.tgenabled <> 'D'
       AND (g.tgtype & 1) <> 0 AND (g.tgtype & 2) <> 0 AND (g.tgtype & (4 | 16)) <> 0
    UNION ALL
    -- The key index: the one named at enable, or a rebuild of it on the
    -- same columns, or the primary key.
    SELECT t.relid, CASE WHEN t.key_index IS NULL
               THEN 'it has no primary key any more: reads and writes fail until it gets one or pgkvx.disable runs'
               ELSE 'its key index no longer exists and no unique index is on its key columns: reads and writes fail until pgkvx.enable runs again with a new key index, or pgkvx.disable'
           END
      FROM pgkvx.tables t
     WHERE CASE WHEN t.key_index IS NULL
               THEN NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = t.relid AND i.indisprimary)
               ELSE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indexrelid = t.key_index AND i.indisvalid)
                AND NOT EXISTS (SELECT 1 FROM pg_index i
                                 WHERE i.indrelid = t.relid AND i.indisunique AND i.indisvalid
                                   AND i.indpred IS NULL AND i.indexprs IS NULL
                                   AND i.indnkeyatts = pg_catalog.cardinality(t.key_columns)
                                   AND (i.indkey::int2[])[0:i.indnkeyatts - 1] = t.key_columns)
           END
    UNION ALL
    -- Gapless keys come from next_key(); any other default is refused
    -- (an identity key keeps its own: the planner draws it through next_key).
    SELECT t.relid, format('gapless key column %I does not default to pgkvx.next_key(): inserts that leave it to its default are refused; run pgkvx.enable(%L, gapless => true) again', a.attname, t.relid::text)
      FROM pgkvx.tables t
      JOIN pg_attribute a ON a.attrelid = t.relid AND a.attnum = t.key_columns[1]
     WHERE t.gapless AND a.attidentity = '' AND NOT EXISTS (
           SELECT 1 FROM pg_attrdef d JOIN pg_depend dep
                ON dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid
               AND dep.refclassid = 'pg_proc'::regclass
               AND dep.refobjid = 'pgkvx.next_key(pg_catalog.regclass)'::regprocedure
            WHERE d.adrelid = t.relid AND d.adnum = a.attnum)
    UNION ALL
    -- A read through a partitioned or inheritance parent reads every table
    -- under it: one that is not latched leaves the read unprotected there.
    SELECT DISTINCT m.member, format('%s is not latched, but is read with latched %s through %s: a read in key order through %s can skip its rows; run pgkvx.enable(%L)',
                  m.member, t.relid, m.parent, m.parent, m.member::text)
      FROM pgkvx.tables t
      CROSS JOIN LATERAL (
          SELECT p.relid AS member, pg_catalog.pg_partition_root(t.relid) AS parent
            FROM pg_catalog.pg_partition_tree(pg_catalog.pg_partition_root(t.relid)) p
           WHERE p.isleaf
          UNION ALL
          SELECT s.inhrelid::pg_catalog.regclass, i.inhparent::pg_catalog.regclass
            FROM pg_inherits i JOIN pg_inherits s ON s.inhparent = i.inhparent
            JOIN pg_class pc ON pc.oid = i.inhparent AND pc.relkind = 'r'
           WHERE i.inhrelid = t.relid OR i.inhparent = t.relid
          UNION ALL
          SELECT i.inhparent::pg_catalog.regclass, i.inhparent::pg_catalog.regclass
            FROM pg_inherits i JOIN pg_class pc ON pc.oid = i.inhparent AND pc.relkind = 'r'
           WHERE i.inhrelid = t.relid OR i.inhparent = t.relid) m
      JOIN pg_class c ON c.oid = m.member AND c.relkind = 'r'
     WHERE m.member IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgkvx.tables u WHERE u.relid = m.member)
       -- A partition of a latched partitioned table latches under it.
       AND NOT EXISTS (SELECT 1 FROM pgkvx.tables u, pg_catalog.pg_partition_ancestors(m.member) a
                        WHERE u.relid = a.relid)
$$;
COMMENT ON FUNCTION pgkvx.check() IS 'Latched tables exposed to a way of writing without latching, or whose reads cannot be protected';
"#,
    name = "check_and_drop",
    requires = ["catalog", forget_table, next_key, _exposures],
);
