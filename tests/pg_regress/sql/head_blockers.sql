-- requires: dblink
-- pgkvx.head_blockers: the writers in flight a tail consumer waits for,
-- in the order it meets them, with the committed rows behind each.  The
-- writers run on dblink connections, so that they are other sessions'
-- transactions (active or idle in transaction) as they would be for real.
CREATE EXTENSION IF NOT EXISTS dblink;
SET client_min_messages = warning;
DROP ROLE IF EXISTS pgkvx_hb_reader;
DROP ROLE IF EXISTS pgkvx_hb_tenant;
DROP ROLE IF EXISTS pgkvx_hb_monitor;
DROP ROLE IF EXISTS pgkvx_hb_nobody;
RESET client_min_messages;
CREATE ROLE pgkvx_hb_reader;
CREATE ROLE pgkvx_hb_tenant;
CREATE ROLE pgkvx_hb_monitor IN ROLE pg_monitor;
CREATE ROLE pgkvx_hb_nobody;
CREATE TABLE hb (id bigint PRIMARY KEY, tenant text NOT NULL DEFAULT 'a');
SELECT pgkvx.enable('hb');
INSERT INTO hb SELECT g FROM generate_series(1, 5) g;
GRANT SELECT ON hb TO pgkvx_hb_reader, pgkvx_hb_tenant;
ALTER TABLE hb ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON hb USING (tenant = 'a') ;
ALTER POLICY own ON hb TO pgkvx_hb_tenant;
CREATE POLICY everyone ON hb TO pgkvx_hb_reader USING (true);
-- Its surface: a view, and the function form with a cursor.
\d pgkvx.head_blockers
SELECT p.oid::regprocedure, pg_get_function_arguments(p.oid), p.proconfig
  FROM pg_proc p WHERE p.pronamespace = 'pgkvx'::regnamespace AND p.proname = 'head_blockers';
-- Nobody writes: nobody blocks.
SELECT count(*) FROM pgkvx.head_blockers;
SELECT count(*) FROM pgkvx.head_blockers('hb');
-- Two writers: w1 left idle in its transaction on key 7, w2 on 6 and 20
-- (and busy: a statement of its own that sleeps); rows 8..12 committed.
SELECT 'host=' || current_setting('unix_socket_directories') || ' port=' || current_setting('port')
       || ' dbname=' || current_database() AS conn \gset
SELECT dblink_connect('w1', :'conn');
SELECT dblink_connect('w2', :'conn');
SELECT dblink_exec('w1', 'BEGIN; INSERT INTO hb VALUES (7)');
SELECT dblink_exec('w2', 'BEGIN; INSERT INTO hb VALUES (6), (20)');
SELECT dblink_send_query('w2', 'SELECT pg_sleep(600)');
INSERT INTO hb SELECT g FROM generate_series(8, 12) g;
-- (wait until w2's sleep shows as its state)
DO $$
BEGIN
  WHILE NOT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query = 'SELECT pg_sleep(600)') LOOP
    PERFORM pg_sleep(0.01);
    PERFORM pg_stat_clear_snapshot();  -- activity is read once per transaction otherwise
  END LOOP;
END $$;
-- The head is 6 (w2, busy); 7 (w1, idle in transaction) is next; five
-- committed rows (8..12) sit behind both.
SELECT relid, rank, span, latches, state, rows_behind, rows_behind_capped,
       holder_xid > 0 AS has_xid, age >= '0' AS aged, xact_start <= latched_at AS xact_first
  FROM pgkvx.head_blockers;
-- From a cursor: past 6 the head is 7; past 7 it is 20, with nothing behind.
SELECT rank, span, state, rows_behind FROM pgkvx.head_blockers('hb', '6');
SELECT rank, span, state, rows_behind FROM pgkvx.head_blockers('hb', '7');
SELECT count(*) FROM pgkvx.head_blockers('hb', '20');
-- One holder per transaction, even with several latches past the cursor.
SELECT count(*) = count(DISTINCT holder_xid) AS one_row_per_holder FROM pgkvx.head_blockers('hb');
-- Immune to search_path: the function pins its own.
SET search_path = public;
CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$;
CREATE VIEW public.pg_stat_activity AS SELECT 0 AS pid, 'fake' AS state;
SELECT span, state FROM pgkvx.head_blockers('hb') WHERE rank = 1;
DROP VIEW public.pg_stat_activity;
DROP FUNCTION public.clock_timestamp();
RESET search_path;
-- Who may see what.  Keys (spans, the rows behind, a cursor) are table
-- data: only for roles that may read every row of the key.
SET ROLE pgkvx_hb_reader;   -- SELECT, and a policy that shows every row, but policies apply
SELECT rank, span, rows_behind, rows_behind_capped FROM pgkvx.head_blockers ORDER BY rank;
SELECT pgkvx.head_blockers('hb', '6');
RESET ROLE;
SET ROLE pgkvx_hb_tenant;   -- row level security applies
SELECT rank, span, rows_behind FROM pgkvx.head_blockers('hb') ORDER BY rank;
RESET ROLE;
SET ROLE pgkvx_hb_monitor;  -- pg_monitor without SELECT: holders, no keys
SELECT rank, span, state, rows_behind FROM pgkvx.head_blockers ORDER BY rank;
RESET ROLE;
SET ROLE pgkvx_hb_nobody;   -- nothing of the table at all
SELECT count(*) FROM pgkvx.head_blockers;
SELECT * FROM pgkvx.head_blockers('hb');
RESET ROLE;
-- Bad calls.
SELECT * FROM pgkvx.head_blockers(NULL, '6');
CREATE TABLE hb_plain (id int PRIMARY KEY);
SELECT * FROM pgkvx.head_blockers('hb_plain');
-- The writers end: w2 is cancelled out of its sleep and rolls back, w1
-- commits; nobody blocks any more.
SELECT dblink_cancel_query('w2');
SELECT * FROM dblink_get_result('w2', false) AS t(x text);
SELECT * FROM dblink_get_result('w2', false) AS t(x text);
SELECT dblink_exec('w2', 'ROLLBACK');
SELECT dblink_exec('w1', 'COMMIT');
SELECT count(*) FROM pgkvx.head_blockers;
SELECT dblink_disconnect('w1');
SELECT dblink_disconnect('w2');
-- A latched partitioned table: rows behind a blocker are counted in each
-- partition (the parent's index has no storage to scan).
CREATE TABLE hbp (id bigint GENERATED ALWAYS AS IDENTITY, c int NOT NULL, PRIMARY KEY (id, c))
    PARTITION BY LIST (c);
CREATE TABLE hbp1 PARTITION OF hbp FOR VALUES IN (1);
CREATE TABLE hbp2 PARTITION OF hbp FOR VALUES IN (2);
SELECT pgkvx.enable('hbp', gapless => true);
INSERT INTO hbp (c) VALUES (1), (2);
SELECT dblink_connect('w3', :'conn');
SELECT dblink_exec('w3', 'BEGIN; INSERT INTO hbp (c) VALUES (2)');
INSERT INTO hbp (c) VALUES (1), (2), (1);
SELECT rank, span, latches, rows_behind, rows_behind_capped FROM pgkvx.head_blockers('hbp');
SELECT relid, rank, rows_behind FROM pgkvx.head_blockers WHERE relid = 'hbp'::regclass;
SELECT dblink_exec('w3', 'COMMIT');
SELECT dblink_disconnect('w3');
SELECT count(*) FROM pgkvx.head_blockers('hbp');
DROP TABLE hbp;
-- pgkvx.stats(rel): one table's waits, as pgkvx.stats() has them for all.
SELECT stat FROM pgkvx.stats('hb');
SELECT pgkvx.stats(NULL);
SELECT pgkvx.stats('hb_plain');
SET ROLE pgkvx_hb_nobody;
SELECT pgkvx.stats('hb');
RESET ROLE;
DROP TABLE hb, hb_plain;
DROP ROLE pgkvx_hb_reader, pgkvx_hb_tenant, pgkvx_hb_monitor, pgkvx_hb_nobody;
DROP EXTENSION dblink;
