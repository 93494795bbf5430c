//! The SQL surface: `enable`/`disable`, the latch triggers, `latch_span`,
//! `next_key`, the views, `stats()` and `check()`.

pub mod enable;
pub mod key_bytes;
pub mod latch_span;
pub mod next_key;
pub mod regclass;
pub mod registry;
pub mod spi;
pub mod trigger;
pub mod views;

use pgrx::prelude::*;

extension_sql!(
    r#"
GRANT USAGE ON SCHEMA pgkvx TO PUBLIC;

-- Latched tables.  pg_dump keeps it (extension config); restoring the
-- tables' triggers and this row restores the latching.
CREATE TABLE pgkvx.tables (
    relid      regclass    PRIMARY KEY,
    key_index  regclass,                          -- NULL: the primary key
    gapless    boolean     NOT NULL DEFAULT false,
    enabled_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE pgkvx.tables IS 'Tables latched by pgkvx.enable()';
SELECT pg_catalog.pg_extension_config_dump('pgkvx.tables', '');
-- Everyone may read it; owners may register and unregister their own tables
-- (enable/disable run as the caller).
ALTER TABLE pgkvx.tables ENABLE ROW LEVEL SECURITY;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgkvx.tables TO PUBLIC;
CREATE POLICY tables_read ON pgkvx.tables FOR SELECT USING (true);
CREATE POLICY tables_insert ON pgkvx.tables FOR INSERT
    WITH CHECK (pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = relid), 'USAGE'));
CREATE POLICY tables_update ON pgkvx.tables FOR UPDATE
    USING (pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = relid), 'USAGE'))
    WITH CHECK (pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = relid), 'USAGE'));
CREATE POLICY tables_delete ON pgkvx.tables FOR DELETE
    USING (pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = relid), 'USAGE'));
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
              WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0
                AND EXISTS (SELECT 1 FROM pgkvx.tables t WHERE t.relid::oid = d.objid)
    LOOP
        PERFORM pgkvx._forget_table(o.objid);
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION pgkvx._forget_table(oid) FROM PUBLIC;
CREATE EVENT TRIGGER pgkvx_sql_drop ON sql_drop EXECUTE FUNCTION pgkvx._on_sql_drop();

-- Latched tables whose writes could escape latching.
CREATE FUNCTION pgkvx.check() RETURNS TABLE (relid regclass, problem text)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.relid, format('latch trigger %s is missing: writes are not latched; run pgkvx.enable(%L) again', n.tgname, t.relid::text)
      FROM pgkvx.tables t CROSS JOIN (VALUES ('zz_pgkvx_latch'), ('zz_pgkvx_latch_truncate')) AS n(tgname)
     WHERE NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = t.relid AND g.tgname = n.tgname)
    UNION ALL
    SELECT t.relid, CASE g.tgenabled
               WHEN 'D' THEN format('latch trigger %s is disabled: writes are not latched', g.tgname)
               WHEN 'O' THEN format('latch trigger %s fires only in origin mode: session_replication_role = replica and logical replication apply write unlatched', g.tgname)
               WHEN 'R' THEN format('latch trigger %s fires only in replica mode: ordinary writes are not latched', g.tgname)
           END
      FROM pgkvx.tables t JOIN pg_trigger g ON g.tgrelid = t.relid
     WHERE g.tgname IN ('zz_pgkvx_latch', 'zz_pgkvx_latch_truncate') AND g.tgenabled <> 'A'
    UNION ALL
    -- Row triggers of one timing fire in name order: a BEFORE INSERT/UPDATE
    -- row trigger named after ours may change the key after it was latched.
    SELECT t.relid, format('BEFORE ROW trigger %I fires after the latch trigger and may change the key unlatched; rename it to sort before zz_pgkvx_latch', g.tgname)
      FROM pgkvx.tables t JOIN pg_trigger g ON g.tgrelid = t.relid
     WHERE NOT g.tgisinternal AND g.tgname COLLATE "C" > 'zz_pgkvx_latch'
       AND g.tgname NOT IN ('zz_pgkvx_latch_truncate') AND g.tgenabled <> 'D'
       AND (g.tgtype & 1) <> 0 AND (g.tgtype & 2) <> 0 AND (g.tgtype & (4 | 16)) <> 0
    UNION ALL
    SELECT t.relid, format('key index %s no longer exists; run pgkvx.enable again', t.key_index::oid)
      FROM pgkvx.tables t
     WHERE t.key_index IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indexrelid = t.key_index)
$$;
COMMENT ON FUNCTION pgkvx.check() IS 'Latched tables exposed to a way of writing without latching';
"#,
    name = "check_and_drop",
    requires = ["catalog", forget_table],
);
