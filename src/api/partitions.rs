//! Partitions created or attached under a latched partitioned table after
//! `enable`: PostgreSQL clones the row latch trigger onto them itself, but
//! not the TRUNCATE trigger (statement triggers are not cloned, and a
//! partition's TRUNCATE fires only its own).  An event trigger at the end
//! of every CREATE TABLE and ALTER TABLE (ATTACH PARTITION) gives the new
//! leaves theirs, in the same transaction, so no partition is ever
//! truncated unlatched.  A table detached keeps it, as a no-op (the trigger
//! latches nothing on a table that is not latched).

use crate::args::Regclass;
use pgrx::prelude::*;

/// Gives the partitions of latched partitioned table `rel` the triggers
/// they lack (called by the event trigger below).
#[pg_extern(volatile, parallel_unsafe, strict, name = "_enable_partitions", schema = "pgkvx")]
fn enable_partitions(rel: Regclass) {
    let relid = rel.0;
    if crate::registry::registration(relid).is_none() {
        return;
    }
    super::enable::enable_members(relid);
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
    FOR r IN SELECT DISTINCT u.relid
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
