-- pgkvx 0.1.0 -> 0.2.0.
--
-- pgkvx.tables: no row level security any more (enable/disable write it
-- directly, as the table's owner they checked), nobody but them writes
-- it, and each row keeps its key's columns so a rebuilt key index is
-- followed.  Functions: NULL arguments are errors instead of crashes,
-- next_key is strict, and DROP EXTENSION ... CASCADE gives gapless tables
-- their sequence default back.  The new library also serves 0.1.0's
-- objects until this script has run.
--
-- The pgkvx schema of a 0.1.0 installation was made by CREATE EXTENSION
-- outside the extension, as its nominal schema.  It becomes a member, as
-- in a fresh 0.2.0 install (whose nominal schema is pg_catalog), so that
-- DROP EXTENSION leaves nothing behind.  A schema that holds the extension
-- cannot join it: the extension's record moves to pg_catalog first (a
-- pinned schema, on which nothing records a dependency).

DELETE FROM pg_catalog.pg_depend
 WHERE classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
   AND objid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                      WHERE e.extname OPERATOR(pg_catalog.=) 'pgkvx')
   AND refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
   AND refobjid OPERATOR(pg_catalog.=) 'pgkvx'::pg_catalog.regnamespace;
UPDATE pg_catalog.pg_extension
   SET extnamespace = 'pg_catalog'::pg_catalog.regnamespace
 WHERE extname OPERATOR(pg_catalog.=) 'pgkvx';
ALTER EXTENSION pgkvx ADD SCHEMA pgkvx;

ALTER TABLE pgkvx.tables ADD COLUMN key_columns int2[];
UPDATE pgkvx.tables t
   SET key_columns = (SELECT (i.indkey::int2[])[0:i.indnkeyatts - 1]
                        FROM pg_catalog.pg_index i
                       WHERE (t.key_index IS NOT NULL AND i.indexrelid OPERATOR(pg_catalog.=) t.key_index::pg_catalog.oid)
                          OR (t.key_index IS NULL AND i.indrelid OPERATOR(pg_catalog.=) t.relid::pg_catalog.oid AND i.indisprimary));
DROP POLICY tables_read ON pgkvx.tables;
DROP POLICY tables_insert ON pgkvx.tables;
DROP POLICY tables_update ON pgkvx.tables;
DROP POLICY tables_delete ON pgkvx.tables;
ALTER TABLE pgkvx.tables DISABLE ROW LEVEL SECURITY;
REVOKE INSERT, UPDATE, DELETE ON pgkvx.tables FROM PUBLIC;


CREATE OR REPLACE FUNCTION pgkvx."arrow_query"(
	"query" TEXT, /* Option < & str > */
	"batch_rows" INT DEFAULT 65536 /* i32 */
) RETURNS SETOF bytea /* Vec < u8 > */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'arrow_query_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."latch_span"(
	"rel" regclass, /* Option < Regclass > */
	"lo" TEXT, /* Option < & str > */
	"hi" TEXT /* Option < & str > */
) RETURNS void
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'latch_span_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."stats"() RETURNS TABLE (
	"stat" TEXT,  /* String */
	"value" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stats_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."latch_list"(
	"include_tombstones" bool DEFAULT false /* bool */
) RETURNS TABLE (
	"relid" oid,  /* Oid */
	"span" TEXT,  /* Option < String > */
	"state" TEXT,  /* String */
	"holder_pid" INT,  /* i32 */
	"holder_xid" bigint,  /* i64 */
	"acquired_at" timestamp with time zone,  /* pgrx :: datum :: TimestampWithTimeZone */
	"range_id" INT  /* i32 */
)
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'latch_list_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."range_list"() RETURNS TABLE (
	"relid" oid,  /* Oid */
	"range_id" INT,  /* i32 */
	"lower" TEXT,  /* Option < String > */
	"upper" TEXT,  /* Option < String > */
	"live" INT,  /* i32 */
	"tombstones" INT,  /* i32 */
	"coalesced" INT,  /* i32 */
	"acquires" bigint,  /* i64 */
	"lock_waits" bigint,  /* i64 */
	"queue_state" TEXT  /* String */
)
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'range_list_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."key_bytes"(
	"rel" regclass, /* Regclass */
	"key" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'key_bytes_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."arrow_scan"(
	"rel" regclass, /* Option < crate :: api :: regclass :: Regclass > */
	"columns" TEXT[] DEFAULT NULL, /* :: std :: option :: Option < Vec < Option < String > > > */
	"lower" TEXT DEFAULT NULL, /* Option < String > */
	"upper" TEXT DEFAULT NULL, /* Option < String > */
	"max_rows" bigint DEFAULT NULL, /* Option < i64 > */
	"batch_rows" INT DEFAULT 65536 /* i32 */
) RETURNS SETOF bytea /* Vec < u8 > */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'arrow_scan_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."disable"(
	"rel" regclass /* Option < Regclass > */
) RETURNS void
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'disable_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."enable"(
	"rel" regclass, /* Option < Regclass > */
	"index" regclass DEFAULT NULL, /* Option < Regclass > */
	"gapless" bool DEFAULT false /* bool */
) RETURNS void
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'enable_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."next_key"(
	"rel" regclass /* Regclass */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'next_key_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."version"() RETURNS TEXT /* & '_ str */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'version_wrapper';

CREATE OR REPLACE FUNCTION pgkvx."_forget_table"(
	"rel" oid /* Oid */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'forget_table_wrapper';

CREATE OR REPLACE FUNCTION pgkvx._on_sql_drop() RETURNS event_trigger
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

-- DROP EXTENSION pgkvx CASCADE drops the next_key() defaults of gapless
-- tables; they get their sequence default back first, so inserts go on.
CREATE FUNCTION pgkvx._on_drop_extension() RETURNS event_trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'pgkvx_on_drop_extension';
CREATE EVENT TRIGGER pgkvx_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION') EXECUTE FUNCTION pgkvx._on_drop_extension();

-- The rule check() and every reader of a latched table share.
CREATE FUNCTION pgkvx."_exposures"(
	"rel" regclass
) RETURNS SETOF TEXT
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', '_exposures_wrapper';

CREATE OR REPLACE FUNCTION pgkvx.check() RETURNS TABLE (relid regclass, problem text)
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

COMMENT ON VIEW pgkvx.latches IS 'Live write latches on tables you may SELECT (all with pg_monitor); spans only where you may read every row';

COMMENT ON VIEW pgkvx.ranges IS 'Latch ranges of tables you may SELECT (all with pg_monitor); bounds only where you may read every row';

-- Wake-ups (issue 23): pgkvx.wait_for, its per-table statistics and the
-- sessions waiting now.  Kept identical to what the 0.2.0 install script
-- generates from src/api/wait_for.rs.
CREATE FUNCTION pgkvx."wait_for"(
	"rel" regclass, /* Option < Regclass > */
	"after" TEXT DEFAULT NULL, /* Option < & str > */
	"timeout" interval DEFAULT '10 seconds', /* Option < Interval > */
	"before" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'wait_for_wrapper';

CREATE FUNCTION pgkvx."wait_list"() RETURNS TABLE (
	"pid" INT,  /* i32 */
	"relid" oid,  /* Oid */
	"waiting_since" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"wakeups" INT  /* i32 */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'wait_list_wrapper';

CREATE FUNCTION pgkvx."wait_stats"() RETURNS TABLE (
	"relid" oid,  /* Option < Oid > */
	"waiting" INT,  /* i32 */
	"calls" bigint,  /* i64 */
	"immediate" bigint,  /* i64 */
	"woken" bigint,  /* i64 */
	"timeouts" bigint,  /* i64 */
	"wait_micros" bigint,  /* i64 */
	"broadcasts" bigint,  /* i64 */
	"spurious_wakeups" bigint,  /* i64 */
	"read_waits" bigint,  /* i64 */
	"read_wait_micros" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'wait_stats_wrapper';

CREATE VIEW pgkvx.waiters AS
    SELECT pid, relid::regclass AS relid, waiting_since,
           pg_catalog.clock_timestamp() - waiting_since AS age, wakeups
      FROM pgkvx.wait_list();
COMMENT ON VIEW pgkvx.waiters IS 'Sessions waiting in pgkvx.wait_for() on tables you may SELECT (all with pg_monitor)';
GRANT SELECT ON pgkvx.waiters TO PUBLIC;

-- Partitioned tables (issue 24): partitions created or attached under a
-- latched partitioned table get its TRUNCATE latch trigger.  Kept
-- identical to what the 0.2.0 install script generates from
-- src/api/partitions.rs.
CREATE FUNCTION pgkvx."_enable_partitions"(
	"rel" regclass
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'enable_partitions_wrapper';
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
-- ATTACH PARTITION into a latched partition tree locks its root first.
CREATE FUNCTION pgkvx._on_alter_table() RETURNS event_trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'pgkvx_on_alter_table';
CREATE EVENT TRIGGER pgkvx_alter_table ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION pgkvx._on_alter_table();

-- Who blocks the head (issue 23): one table's waits in pgkvx.stats(rel),
-- and the writers in flight a consumer waits for.  Kept identical to what
-- the 0.2.0 install script generates from src/api/wait_for.rs and
-- src/api/head_blockers.rs.
CREATE FUNCTION pgkvx."stats"(
	"rel" regclass /* Option < Regclass > */
) RETURNS TABLE (
	"stat" TEXT,  /* String */
	"value" bigint  /* i64 */
)
VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'table_stats_wrapper';

CREATE FUNCTION pgkvx."head_blocker_list"(
	"rel" regclass, /* Option < Regclass > */
	"after" TEXT /* Option < & str > */
) RETURNS TABLE (
	"relid" oid,  /* Oid */
	"rank" INT,  /* i32 */
	"holder_pid" INT,  /* i32 */
	"holder_xid" bigint,  /* i64 */
	"span" TEXT,  /* Option < String > */
	"latches" INT,  /* i32 */
	"latched_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"rows_behind" bigint,  /* Option < i64 > */
	"rows_behind_capped" bool  /* Option < bool > */
)
VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'head_blocker_list_wrapper';

CREATE FUNCTION pgkvx.head_blockers(rel regclass, after text DEFAULT NULL)
RETURNS TABLE (relid regclass, rank integer, holder_pid integer, holder_xid bigint, span text,
               latches integer, state text, wait_event_type text, wait_event text,
               xact_start timestamp with time zone, latched_at timestamp with time zone,
               age interval, rows_behind bigint, rows_behind_capped boolean)
LANGUAGE sql VOLATILE PARALLEL RESTRICTED
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.relid::pg_catalog.regclass, b.rank, b.holder_pid, b.holder_xid, b.span, b.latches,
           a.state, a.wait_event_type, a.wait_event, a.xact_start, b.latched_at,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) b.latched_at, b.rows_behind,
           b.rows_behind_capped
      FROM pgkvx.head_blocker_list(rel, after) AS b
      LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) b.holder_pid
     ORDER BY b.relid, b.rank
$$;
COMMENT ON FUNCTION pgkvx.head_blockers(regclass, text) IS 'Writers in flight a consumer of rel at cursor after waits for, in the order it meets them (rank 1 is the head), with the committed rows behind each';
CREATE VIEW pgkvx.head_blockers AS
    SELECT * FROM pgkvx.head_blockers(NULL::pg_catalog.regclass);
COMMENT ON VIEW pgkvx.head_blockers IS 'Writers in flight that hold up the head of each latched table you may SELECT (all with pg_monitor); spans and row counts only where you may read every row';
GRANT SELECT ON pgkvx.head_blockers TO PUBLIC;

-- Where a consumer that starts at the end of a stream begins: as the
-- 0.2.0 install script generates from src/api/high_water.rs.
CREATE FUNCTION pgkvx."high_water"(
	"rel" regclass /* Regclass */
) RETURNS TEXT /* Option < String > */
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'high_water_wrapper';
